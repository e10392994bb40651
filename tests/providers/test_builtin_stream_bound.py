"""The built-in offline model streams a long echo in a bounded number of deltas
(docs/decisions.md#llm-builtin-model: a multi-MB message in 4-character deltas kept a session actor
busy for minutes); short replies stream as before, and the text is unchanged."""

from __future__ import annotations

from providers.builtin import BUILTIN_MAX_CHUNKS, builtin_model
from providers.faux import faux_assistant_message, register_faux_provider
from runtime.llm.stream import stream
from runtime.llm.types import Context, UserMessage


async def deltas(text: str) -> tuple[list[str], str]:
    """The text deltas of the built-in model's answer to ``text``, and the final text."""
    events = stream(builtin_model(), Context(messages=[UserMessage(content=text)]))
    seen = [ev.delta async for ev in events if ev.type == "text_delta"]
    final = await events.result()
    return seen, final.text()


async def test_long_echo_streams_in_at_most_max_chunks_deltas() -> None:
    text = "abcdefghij" * 100_000  # 1 MB
    seen, final = await deltas(text)
    assert final == f"You said: {text}"
    assert "".join(seen) == final
    assert len(seen) == BUILTIN_MAX_CHUNKS == 64
    assert {len(d) for d in seen[:-1]} == {-(-len(final) // 64)}


async def test_short_echo_still_streams_in_4_character_chunks() -> None:
    seen, final = await deltas("hello there")
    assert final == "You said: hello there"
    assert seen == ["You ", "said", ": he", "llo ", "ther", "e"]


async def test_faux_provider_without_max_chunks_is_unchanged() -> None:
    h = register_faux_provider([faux_assistant_message("x" * 40)], provider="bound-test", chunk_size=4)
    events = stream(h.get_model(), Context(messages=[UserMessage(content="q")]))
    seen = [ev.delta async for ev in events if ev.type == "text_delta"]
    assert seen == ["xxxx"] * 10
