"""Live agent events of console sessions: the ``SessionSetup.on_event`` hook
(docs/decisions.md#live-events-never-break-turns).

A session whose platform is ``console`` gets a :class:`ConsoleEventSink` as its ``on_event``
(built by :func:`console_event_hook`; ``actors/placement/hosts/setup.py`` wires it). The turn path calls it
with every agent-loop event and with the turn's :class:`runtime.reply.im_reply.ReplyOutcome`; the sink keeps
only what the console shows (:func:`console_payload`) and POSTs it to the console bot's
``{api_base}/console/api/events`` (the call of :func:`runtime.platforms.console.agent_event_call`),
which fans it out to the browsers of the session's scene.

Every payload passes the leak check before it is queued
(:func:`runtime.reply.leak.scrub` with the policy of the configuration,
docs/decisions.md#security-console-leak-check): a configured secret or a key format in a tool
argument, a tool result, a thinking preview or a notice reason leaves the session as
``[redacted]`` — it never reaches the console's event stream (the console scrubs again on receipt).

The completed-reply view: the sink holds a :class:`runtime.reply.preview.ReplyPreview` per turn;
streamed text is held back, and only the turn's validated reply (its ``ReplyOutcome``) releases
``{"type": "reply_preview", "text": <Reply.preview_text()>, "outcome", "tier"}`` — never half JSON
(docs/decisions.md#reply-final-output). An empty (aborted) reply releases nothing.

Posting is fire-and-forget: :meth:`ConsoleEventSink.__call__` never blocks and never raises. One
background task per sink drains a bounded queue in order (so a tool's end never overtakes its
start), each POST bounded by ``timeout_s``; a full queue, an unreachable console or an error
answer is logged at debug level and the event is dropped — a console event never breaks or slows
a turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from runtime.platforms.console import agent_event_call, agent_event_payload
from runtime.reply.leak import LeakPolicy, scrub
from runtime.reply.preview import ReplyPreview

__all__ = ["THINKING_PREVIEW_CHARS", "ConsoleEventSink", "console_event_hook", "console_payload"]

log = logging.getLogger("sessionray.console.events")

THINKING_PREVIEW_CHARS = 200
"""Characters of a thinking block shown in the console (the rest is cut, ``…`` appended)."""
_NOTICE_OUTCOMES = ("corrected", "failed", "default")
_QUEUE_MAX = 64


def console_payload(event: Any, *, thinking: bool = False) -> dict[str, Any] | None:
    """The console view of one turn event, or ``None`` when the console does not show it.

    * ``tool_execution_start`` / ``tool_execution_end`` → ``tool_call`` / ``tool_result``
      (:func:`runtime.platforms.console.agent_event_payload`);
    * ``message_end`` of an assistant message with thinking, only when ``thinking`` →
      ``{"type": "thinking", "text": <first 200 characters>}``;
    * a ``ReplyOutcome`` (duck-typed: ``outcome``, ``tier``, ``reason``) whose outcome is
      ``corrected``/``failed``/``default`` → ``{"type": "notice", "text", "outcome", "tier"}``
      (the format-correction call and the fixed failure message:
      docs/decisions.md#reply-one-correction); ``first_try``, ``plain`` and ``aborted`` show
      nothing.
    """
    etype = getattr(event, "type", None)
    if etype in ("tool_execution_start", "tool_execution_end"):
        return agent_event_payload(event)
    if etype == "message_end":
        if not thinking:
            return None
        blocks = getattr(getattr(event, "message", None), "content", None)
        if not isinstance(blocks, list):
            return None
        text = "\n".join(b.thinking for b in blocks if getattr(b, "type", None) == "thinking" and b.thinking)
        if not text:
            return None
        if len(text) > THINKING_PREVIEW_CHARS:
            text = text[:THINKING_PREVIEW_CHARS] + "…"
        return {"type": "thinking", "text": text}
    if _is_outcome(event):
        outcome = event.outcome
        if outcome not in _NOTICE_OUTCOMES:
            return None
        words = {
            "corrected": "reply format was invalid; corrected by one extra call",
            "failed": "reply could not be validated; sent the fixed failure message",
            "default": "reply could not be validated; sent the default reply",
        }
        text = f"{words[outcome]} ({event.tier} tier)"
        reason = getattr(event, "reason", None)
        if reason:
            text += f": {str(reason)[:200]}"
        return {"type": "notice", "text": text, "outcome": outcome, "tier": str(event.tier)}
    return None


def _is_outcome(event: Any) -> bool:
    """Whether ``event`` is a turn's ``ReplyOutcome`` (duck-typed: ``outcome``, ``tier``, ``reply``)."""
    return (
        isinstance(getattr(event, "outcome", None), str)
        and hasattr(event, "tier")
        and hasattr(event, "reply")
    )


class ConsoleEventSink:
    """``SessionSetup.on_event`` of one console session (see the module docstring).

    Args:
        api_base: The console bot's ``api_base`` (the ingress), e.g. ``http://127.0.0.1:8000``.
        session_key: ``console:<bot_id>:<scope>:<scene_id>``.
        token: ``X-Console-Token`` to send (the bot's ``secret_env`` value) or ``None``.
        thinking: Also post thinking previews (config ``bots[].thinking_preview``).
        timeout_s: Bound of each POST (seconds).
        api_token: ``X-Console-Api-Token`` to send (``$SESSIONRAY_CONSOLE_API_TOKEN``, which the
            console's ``/console/api/events`` requires) or ``None``.
        leak: The leak policy every payload passes (default :class:`LeakPolicy` ``()``: the key
            formats only; :func:`console_event_hook` passes the configuration's secrets too).
    """

    def __init__(
        self,
        api_base: str,
        session_key: str,
        *,
        token: str | None = None,
        thinking: bool = False,
        timeout_s: float = 2.0,
        api_token: str | None = None,
        leak: LeakPolicy | None = None,
    ) -> None:
        self.api_base = api_base
        self.leak = leak or LeakPolicy()
        self._preview = ReplyPreview()
        self.api_token = api_token
        self.session_key = session_key
        self.token = token
        self.thinking = thinking
        self.timeout_s = timeout_s
        self._queue: asyncio.Queue[dict[str, Any]] | None = None
        self._task: asyncio.Task[None] | None = None

    def __call__(self, event: Any) -> None:
        """Queue ``event``'s console payload (leak-checked) for posting, and the completed-reply
        preview when ``event`` is the turn's outcome; returns at once, never raises."""
        try:
            payloads = [console_payload(event, thinking=self.thinking)]
            if _is_outcome(event):
                preview, self._preview = self._preview, ReplyPreview()  # the next turn starts afresh
                text = preview.take(event)
                if text is not None:
                    payloads.append(
                        {
                            "type": "reply_preview",
                            "text": text,
                            "outcome": event.outcome,
                            "tier": str(event.tier),
                        }
                    )
            else:
                self._preview.on_event(event)  # streamed text is held back
            for payload in payloads:
                if payload is not None:
                    self._put(scrub(payload, self.leak))
        except Exception as exc:  # QueueFull, no running loop, a strange event: drop it
            log.debug("console event of %s dropped: %r", self.session_key, exc)

    def _put(self, payload: dict[str, Any]) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue(_QUEUE_MAX)
        self._queue.put_nowait(payload)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def drained(self) -> None:
        """Wait until every queued event was posted or dropped (tests, passivation)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        queue = self._queue
        assert queue is not None
        try:
            await self._post_all(queue)
        except Exception as exc:  # never an unretrieved task exception
            log.debug("console events of %s dropped: %r", self.session_key, exc)

    async def _post_all(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        import httpx

        headers = {"X-Console-Token": self.token} if self.token else {}
        while not queue.empty():  # again after closing the client: events may arrive meanwhile
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                while not queue.empty():
                    payload = queue.get_nowait()
                    call = agent_event_call(
                        self.api_base, self.session_key, payload, api_token=self.api_token
                    )
                    try:
                        resp = await client.post(
                            call.url, json=call.json_body, headers={**headers, **call.headers}
                        )
                        if resp.status_code != 200:
                            log.debug(
                                "console event of %s refused: HTTP %s", self.session_key, resp.status_code
                            )
                    except Exception as exc:
                        log.debug("console event of %s not posted: %r", self.session_key, exc)


def console_event_hook(config: Any, session_key: str) -> Callable[[Any], None] | None:
    """The ``on_event`` hook of ``session_key``: a :class:`ConsoleEventSink` when its platform is
    ``console`` and ``config.bots`` has that console bot; ``None`` otherwise (other platforms get
    no live events). Its payloads pass the leak check with
    :meth:`runtime.reply.leak.LeakPolicy.from_config` of ``config``. A ``secret_env`` naming an
    unset variable sends no token (the console then refuses the events; logged at debug level).
    The sink sends ``$SESSIONRAY_CONSOLE_API_TOKEN``
    (:func:`runtime.platforms.console.console_api_token`) as ``X-Console-Api-Token``."""
    from runtime.keys import parse_session_key
    from runtime.platforms.base import read_env
    from runtime.platforms.console import console_api_token

    key = parse_session_key(session_key)
    if key.platform != "console":
        return None
    for bot in getattr(config, "bots", ()):
        if str(bot.platform) == "console" and str(bot.self_id) == key.bot_id and bot.api_base:
            try:
                token = read_env(getattr(bot, "secret_env", None), what="console token")
            except ValueError as exc:
                log.debug("console events of %s: %s", session_key, exc)
                token = None
            thinking = bool(getattr(bot, "thinking_preview", False))
            return ConsoleEventSink(
                str(bot.api_base),
                session_key,
                token=token,
                thinking=thinking,
                api_token=console_api_token(),
                leak=LeakPolicy.from_config(config),
            )
    return None
