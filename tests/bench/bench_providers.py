"""Stream-parse throughput: our providers vs the official SDKs, side by side in one run.

For each api the largest fixture the official SDK accepts is replayed in memory ``REPEAT`` times,
cut into the same 1 KiB pieces for both sides:

* **ours**: :class:`providers.transport.SSEDecoder` → the api's parser → :class:`MessageBuilder`
  (events pushed into a real :class:`AssistantMessageEventStream`) → final ``AssistantMessage``;
* **sdk**: the SDK's own ``SSEDecoder`` → ``construct_type`` of each chunk/event (what the SDK's
  ``Stream`` does) → its accumulator (openai ``ChatCompletionStreamState.handle_chunk`` +
  ``get_final_completion``; anthropic ``accumulate_event`` + ``build_events``, as ``MessageStream``).

Fixtures: openai ``chat_stream_deepseek_reasoning.sse`` (70 KB, the largest); anthropic
``messages_stream_tool_use.sse`` (the largest, ``messages_stream_thinking_docs.sse``, has a
``message_delta`` without ``usage`` on which the SDK's accumulator raises ``AttributeError``).

Ours always runs ``REPEAT`` (1,000) replays; the SDK side stops early after ``SDK_BUDGET_S``.

``run()`` returns ``{"openai-completions": {"ours_mb_s", "sdk_mb_s", "ratio", ...},
"anthropic-messages": {...}}``
(MB = 10^6 bytes of SSE input per second of CPU wall time).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(os.environ.get("SESSIONRAY_FIXTURES", ROOT / "tests" / "fixtures"))
REPEAT = int(os.environ.get("BENCH_PROVIDERS_REPEAT", "1000"))
SDK_BUDGET_S = float(os.environ.get("BENCH_PROVIDERS_SDK_BUDGET_S", "20"))
"""Cap on the SDK side's time per api: its chat accumulator re-copies the growing snapshot on every
chunk (≈ 0.2 MB/s here), so 1,000 replays of the 70 KB fixture would take minutes. MB/s is a rate,
so fewer replays measure the same figure; ``sdk_repeat`` records how many ran. 0 = no cap."""
PIECE = 1024


def _pieces(body: bytes) -> list[bytes]:
    return [body[i : i + PIECE] for i in range(0, len(body), PIECE)]


def _ours(api: str) -> Callable[[list[bytes]], Any]:
    from providers.anthropic_messages import AnthropicMessagesParser
    from providers.openai_completions import OpenAICompletionsParser
    from providers.transport import SSEDecoder
    from runtime.llm.builder import MessageBuilder
    from runtime.llm.events import AssistantMessageEventStream
    from runtime.llm.types import Model

    model = Model(id="bench", api=api, provider="bench")
    parser_cls: Any = OpenAICompletionsParser if api == "openai-completions" else AnthropicMessagesParser

    def once(pieces: list[bytes]) -> Any:
        stream = AssistantMessageEventStream()
        builder = MessageBuilder(stream, model)
        parser = parser_cls(builder, model)
        decoder = SSEDecoder()
        for piece in pieces:
            for ev, data in decoder.feed(piece):
                parser.on_event(ev, data)
        for ev, data in decoder.flush():
            parser.on_event(ev, data)
        parser.on_end()
        return builder.message

    return once


def _sdk(api: str) -> Callable[[list[bytes]], Any]:
    if api == "openai-completions":
        from openai._models import construct_type as oa_construct
        from openai._streaming import SSEDecoder as OaDecoder
        from openai.lib.streaming.chat import ChatCompletionStreamState
        from openai.types.chat import ChatCompletionChunk

        def once_openai(pieces: list[bytes]) -> Any:
            state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
            for sse in OaDecoder().iter_bytes(iter(pieces)):
                if sse.data.startswith("[DONE]"):
                    break
                chunk = oa_construct(type_=ChatCompletionChunk, value=sse.json())
                for _ in state.handle_chunk(chunk):
                    pass
            return state.get_final_completion()

        return once_openai

    from anthropic._models import construct_type as an_construct
    from anthropic._streaming import SSEDecoder as AnDecoder
    from anthropic.lib.streaming._messages import accumulate_event, build_events
    from anthropic.types import RawMessageStreamEvent

    def once_anthropic(pieces: list[bytes]) -> Any:
        snapshot: Any = None
        bufs: dict[int, bytes] = {}
        for sse in AnDecoder().iter_bytes(iter(pieces)):
            if sse.event in (None, "ping"):
                continue
            event: Any = an_construct(type_=RawMessageStreamEvent, value=sse.json())  # type: ignore[arg-type]
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
            build_events(event=event, message_snapshot=snapshot)
        return snapshot

    return once_anthropic


def _measure(
    fn: Callable[[list[bytes]], Any], pieces: list[bytes], size: int, repeat: int, budget_s: float
) -> tuple[float, int]:
    """Return (MB/s, replays done): ``repeat`` replays, or fewer if ``budget_s`` (> 0) runs out."""
    fn(pieces)  # warm-up (imports, caches)
    done = 0
    t0 = time.perf_counter()
    while done < repeat:
        fn(pieces)
        done += 1
        if budget_s > 0 and time.perf_counter() - t0 > budget_s:
            break
    return size * done / (time.perf_counter() - t0) / 1e6, done


async def _run_async(repeat: int) -> dict[str, Any]:
    cases = {
        "openai-completions": FIXTURES / "openai" / "chat_stream_deepseek_reasoning.sse",
        "anthropic-messages": FIXTURES / "anthropic" / "messages_stream_tool_use.sse",
    }
    out: dict[str, Any] = {}
    for api, path in cases.items():
        body = path.read_bytes()
        pieces = _pieces(body)
        ours, ours_n = _measure(_ours(api), pieces, len(body), repeat, 0)
        sdk, sdk_n = _measure(_sdk(api), pieces, len(body), repeat, SDK_BUDGET_S)
        out[api] = {
            "fixture": f"{path.parent.name}/{path.name}",
            "bytes": len(body),
            "repeat": ours_n,
            "sdk_repeat": sdk_n,
            "ours_mb_s": round(ours, 2),
            "sdk_mb_s": round(sdk, 2),
            "ratio": round(ours / sdk, 2),
        }
    return out


def run() -> dict[str, Any]:
    """Measure both apis and print a table; returns the ``providers`` section of results.json."""
    sys.path.insert(0, str(ROOT))
    result = asyncio.run(_run_async(REPEAT))
    print(f"   {'api':<22}{'fixture':<48}{'ours MB/s':>10}{'sdk MB/s':>10}{'ratio':>8}")
    for api, r in result.items():
        print(
            f"   {api:<22}{r['fixture']:<48}{r['ours_mb_s']:>10.2f}{r['sdk_mb_s']:>10.2f}{r['ratio']:>8.2f}"
        )
    return result


if __name__ == "__main__":
    run()
