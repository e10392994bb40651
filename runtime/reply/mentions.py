"""Mention identity for IM replies (docs/decisions.md#reply-mention-identity).

A ``mention`` segment must target the current sender, an id already present in the session, or an
id returned by a member-lookup tool this turn. An unknown target is a contract violation, handled
like an invalid reply by :mod:`runtime.reply.im_reply` (one correction call, then the fixed failure
message) — never guessed from a nickname. The schema checks types and shape; it does not prove an
id is real or a member of the group, and peer roles or bot endpoint ids are never turned into user
ids automatically.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runtime.llm.types import AgentMessage, ToolResultMessage, UserMessage

__all__ = ["MentionIdentity"]


@dataclass(frozen=True)
class MentionIdentity:
    """Who may be mentioned in this turn
    (docs/decisions.md#reply-mention-identity).

    Attributes:
        sender_id: The current turn's sender platform id.
        known_ids: Ids already present in the session context (earlier senders, inbound mentions).
        lookup_ids: Ids returned by member-lookup tools this turn.
    """

    sender_id: str | None = None
    known_ids: frozenset[str] = frozenset()
    lookup_ids: frozenset[str] = frozenset()

    @classmethod
    def from_messages(
        cls, sender_id: str | None, messages: Iterable[AgentMessage], extra_ids: Iterable[str] = ()
    ) -> MentionIdentity:
        """Collect ids from a session's messages.

        Known ids: every ``UserMessage.sender["id"]`` plus ``extra_ids`` (e.g. inbound mention
        targets). Lookup ids: ``details["member_ids"]`` (a list of ids) of any
        :class:`ToolResultMessage` — the convention a member-lookup tool follows to declare the
        platform ids it returned. Peer roles or bot endpoint ids are never added automatically.
        """
        known: set[str] = {str(i) for i in extra_ids}
        lookup: set[str] = set()
        for m in messages:
            if isinstance(m, UserMessage) and m.sender and m.sender.get("id") is not None:
                known.add(str(m.sender["id"]))
            elif isinstance(m, ToolResultMessage) and isinstance(m.details, dict) and not m.is_error:
                ids = m.details.get("member_ids")
                if isinstance(ids, list):
                    lookup.update(
                        str(i) for i in ids if i is not None and not isinstance(i, bool | dict | list)
                    )
        return cls(sender_id=sender_id, known_ids=frozenset(known), lookup_ids=frozenset(lookup))

    def allowed(self) -> frozenset[str]:
        """Every id a mention may target. Blank ids (``""``, whitespace) are never allowed: an empty
        sender id or a tool's empty entry must not make ``{"target": ""}`` a valid mention."""
        base = self.known_ids | self.lookup_ids
        if self.sender_id:
            base = base | {self.sender_id}
        return frozenset(i for i in base if i.strip())

    def check(self, reply: Any) -> str | None:
        """Return an error text naming the first unknown mention target, or ``None``."""
        allowed = self.allowed()
        for target in reply.mentions():
            if target not in allowed:
                return (
                    f"mention target {target!r} is not a known user id (allowed: the sender, ids in "
                    "this conversation, member-lookup results); never guess an id from a nickname"
                )
        return None
