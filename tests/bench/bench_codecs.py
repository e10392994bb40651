"""Platform codecs: cost of parsing large inbound bodies (a ~1 MB CQ-code body took
seconds: docs/decisions.md#platform-linear-parsing).

Figures (medians of CPU time, ms): ``parse_cq_80k_ms`` (``cqcode.parse_cq`` of
``"[CQ:at,qq=1]" * 80000``, ~1 MB, 80,000 segments), ``onebot_1mb_cq_body_ms`` (the OneBot codec's
``parse`` of that body as a signed-off event: refused as over ``MAX_SEGMENTS``),
``onebot_max_segments_ms`` (``parse`` of a message with exactly ``MAX_SEGMENTS`` segments),
``onebot_1mb_text_ms`` (``parse`` of one ~1 MB text segment with surrogate-pair escapes),
``telegram_1mb_entities_ms`` (``parse`` of a ~1 MB text with 20,000 entities, a ~2 MB body).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable
from typing import Any


def _median_ms(fn: Callable[[], Any], n: int = 5) -> float:
    times = []
    for _ in range(n):
        t0 = time.process_time()
        with contextlib.suppress(ValueError):  # MalformedEvent: a refused body is measured too
            fn()
        times.append(time.process_time() - t0)
    return round(statistics.median(times) * 1000, 2)


def _onebot_body(message: Any) -> bytes:
    event: dict[str, Any] = {"self_id": 10001, "user_id": 7301, "time": 1756168635, "message_id": 1}
    event.update({"message_type": "private", "message": message, "post_type": "message"})
    return json.dumps(event).encode()


def run() -> dict[str, float]:
    """Return the figures described in the module docstring."""
    from runtime.platforms import cqcode
    from runtime.platforms.onebot11 import MAX_SEGMENTS, OneBot11Codec
    from runtime.platforms.telegram import TelegramCodec

    onebot = OneBot11Codec(self_id="10001")
    telegram = TelegramCodec(bot_id="123456789", token="123456789:x", username="sessionray_bot")
    codes = "[CQ:at,qq=1]" * 80_000
    cq_body = _onebot_body(codes)
    max_body = _onebot_body("[CQ:face,id=1]x" * (MAX_SEGMENTS // 2))
    text_body = _onebot_body([{"type": "text", "data": {"text": "😀ab" * 80_000}}])
    words = "@sessionray_bot hello world " * 40_000
    entities = [{"offset": 28 * i, "length": 15, "type": "mention"} for i in range(20_000)]
    update = {"message_id": 1, "date": 1756168635, "chat": {"id": -100, "type": "group"}, "text": words}
    tg_body = json.dumps({"update_id": 1, "message": {**update, "entities": entities}}).encode()
    return {
        "parse_cq_80k_ms": _median_ms(lambda: cqcode.parse_cq(codes)),
        "onebot_1mb_cq_body_ms": _median_ms(lambda: onebot.parse({}, cq_body)),
        "onebot_max_segments_ms": _median_ms(lambda: onebot.parse({}, max_body)),
        "onebot_1mb_text_ms": _median_ms(lambda: onebot.parse({}, text_body)),
        "telegram_1mb_entities_ms": _median_ms(lambda: telegram.parse({}, tg_body)),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
