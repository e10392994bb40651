"""Console live events leave a session leak-checked, and the console's completed-reply line comes
from the validated reply only (docs/decisions.md#security-console-leak-check,
docs/decisions.md#reply-final-output). The sink posts to a loopback HTTP server that records the
raw bodies, so the assertions are on the bytes that left the session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.agent.events import (
    MessageEndEvent,
    MessageUpdateEvent,
    ToolExecutionEndEvent,
    ToolExecutionStartEvent,
)
from runtime.config import Config
from runtime.llm.events import TextDeltaEvent
from runtime.llm.types import AssistantMessage, TextContent, ThinkingContent, ToolResultMessage
from runtime.reply.im_reply import ReplyOutcome
from runtime.reply.segments import Reply

SECRET = "provider-secret-0123456789"
KEY_FORMAT = "sk-proj-abcdefghijklmnopqrstuvwxyz012345"
KEY = "console:console:private:alice"


def sink_for(tmp_path: Path, api_base: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    from runtime.session.console_events import ConsoleEventSink, console_event_hook

    monkeypatch.setenv("SR_LEAK_TEST_KEY", SECRET)
    cfg = Config.model_validate(
        {
            "database": {"url": f"sqlite:///{tmp_path / 'db.sqlite'}"},
            "ai": {"providers": {"oa": {"api": "openai-completions", "api_key_env": "SR_LEAK_TEST_KEY"}}},
            "bots": [{"platform": "console", "api_base": api_base, "thinking_preview": True}],
        }
    )
    sink = console_event_hook(cfg, KEY)
    assert isinstance(sink, ConsoleEventSink)
    return sink


def posted(api_server: Any) -> list[Any]:
    return [r for r in api_server.requests if r.path == "/console/api/events"]


async def test_a_secret_in_a_tool_argument_never_reaches_the_console(
    tmp_path: Path, api_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    api_server.respond_with("/console/api/events", 200, b'{"ok": true, "receivers": 1}')
    sink = sink_for(tmp_path, api_server.base_url, monkeypatch)
    args = {"query": f"login with {SECRET}", "headers": [{"authorization": f"Bearer {KEY_FORMAT}"}], "n": 3}
    sink(ToolExecutionStartEvent(tool_call_id="c1", tool_name="http_get", args=args))
    result = ToolResultMessage(
        tool_call_id="c1", tool_name="http_get", content=[TextContent(text=f"echo {SECRET}")]
    )
    sink(ToolExecutionEndEvent(tool_call_id="c1", tool_name="http_get", result=result, is_error=False))
    thought = AssistantMessage(
        content=[ThinkingContent(thinking=f"the key is {SECRET}"), TextContent(text="x")]
    )
    sink(MessageEndEvent(message=thought))
    reply = Reply.of_text(f"done: {KEY_FORMAT}")
    sink(ReplyOutcome(reply, "native", "corrected", "raw", f"bad field near {SECRET}"))  # type: ignore[arg-type]
    await sink.drained()

    sent = posted(api_server)
    assert len(sent) == 5
    for request in sent:
        assert SECRET.encode() not in request.body and KEY_FORMAT.encode() not in request.body
    events = [r.json["event"] for r in sent]
    assert events[0] == {
        "type": "tool_call",
        "name": "http_get",
        "args": {
            "query": "login with [redacted]",
            "headers": [{"authorization": "Bearer [redacted]"}],
            "n": 3,
        },
    }
    assert events[1] == {
        "type": "tool_result",
        "name": "http_get",
        "is_error": False,
        "result": "echo [redacted]",
    }
    assert events[2] == {"type": "thinking", "text": "the key is [redacted]"}
    assert events[3]["type"] == "notice" and events[3]["text"].endswith("bad field near [redacted]")
    assert events[4] == {
        "type": "reply_preview",
        "text": "done: [redacted]",
        "outcome": "corrected",
        "tier": "native",
    }


async def test_only_the_validated_reply_is_previewed(
    tmp_path: Path, api_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    api_server.respond_with("/console/api/events", 200, b'{"ok": true, "receivers": 1}')
    sink = sink_for(tmp_path, api_server.base_url, monkeypatch)
    partial = AssistantMessage(content=[TextContent(text='{"segments": [{"type": "te')])
    for delta in ('{"segments": ', '[{"type": "te'):  # streamed half JSON: held back
        sink(MessageUpdateEvent(message=partial, assistant_message_event=TextDeltaEvent(0, delta, partial)))
    await sink.drained()
    assert posted(api_server) == []
    reply = Reply.model_validate({"segments": [{"type": "text", "data": {"text": "hello "}},
                                               {"type": "mention", "data": {"target": "bob"}}]})  # fmt: skip
    sink(ReplyOutcome(reply, "tool", "first_try", "raw"))  # type: ignore[arg-type]
    sink(ReplyOutcome(Reply(segments=[]), "tool", "aborted", ""))  # an aborted turn previews nothing
    await sink.drained()
    assert [r.json["event"] for r in posted(api_server)] == [
        {"type": "reply_preview", "text": reply.preview_text(), "outcome": "first_try", "tier": "tool"}
    ]
    assert reply.preview_text() == "hello @bob"
