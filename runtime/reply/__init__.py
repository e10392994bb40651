"""The reply contract: the IM :class:`Reply` and its segments, the turn's reply contract (one
correction call, then the fixed failure text), generic structured output with capability tiers
(native → tool → prompt), strict JSON, mention identity, media provenance, the sender prefix
the model reads and the forged-prefix check (:mod:`runtime.reply.sender`), the outbound leak
check, look-alike text folding, and the outbound media checks and guarded fetch (import those
from :mod:`runtime.reply.media`: they bring httpx, which a session process does not need).
Nothing here knows a platform's wire format (`docs/decisions.md#reply-segments`).
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from runtime.reply.capability import (
        CAPABILITIES,
        TIERS,
        Tier,
    )
    from runtime.reply.im_reply import (
        ImReplyConfig,
        ImReplyContract,
        ReplyOutcome,
    )
    from runtime.reply.leak import (
        LeakPolicy,
        LeakResult,
        scan_reply,
        scan_text,
    )
    from runtime.reply.mentions import (
        MentionIdentity,
    )
    from runtime.reply.probe import probe_capability
    from runtime.reply.segments import (
        SEGMENT_TYPES,
        Reply,
        Segment,
    )
    from runtime.reply.structured import (
        StructuredOutputError,
        complete_structured,
    )
else:  # each name is imported on first use (docs/decisions.md#ops-lazy-exports)
    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "CAPABILITIES",
    "SEGMENT_TYPES",
    "TIERS",
    "ImReplyConfig",
    "ImReplyContract",
    "LeakPolicy",
    "LeakResult",
    "MentionIdentity",
    "Reply",
    "ReplyOutcome",
    "Segment",
    "StructuredOutputError",
    "Tier",
    "complete_structured",
    "probe_capability",
    "scan_reply",
    "scan_text",
]
