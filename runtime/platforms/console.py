"""The console codec: the built-in web chat (``GET /console``) as a platform like any other.

Inbound: the browser POSTs JSON to the ingress webhook ``/webhooks/console/{bot_id}``::

    {"message_id": "c-3f2a…", "user": "alice", "scene": "private" | "group",
     "group_id": "lobby", "text": "hello @console", "mention_bot": true, "time_ms": 1767000000000}

* ``user`` is the sender id and name (1–32 letters, digits, ``_ . -``; it becomes part of the
  session key, so no spaces, ``:`` or ``#``); ``group_id`` the same rule, required for ``group``.
* ``message_id`` is made by the browser (it is the dedup key); ``time_ms`` defaults to 0.
* A group message mentions the bot when ``mention_bot`` is true or the text contains
  ``@<bot_id>``; it then becomes a ``mention`` segment. Groups trigger per ``trigger``.
* With ``secret_env`` configured the page must send ``X-Console-Token`` (verified in constant
  time); the default console (no secret) is meant for 127.0.0.1.

Outbound: the console "platform API" is an endpoint on the ingress itself
(``POST {api_base}/console/api/deliver``, served by ``actors/console.py``) that DeliveryActors
call like any platform API. The body carries the canonical segments — the browser renders all 13
types, so nothing is degraded — except that ``path`` media are inlined as ``base64`` (a browser
cannot read the server's media directory)::

    {"bot_id": "console", "scene_type": "group", "scene_id": "lobby", "reply_to": "c-3f2a…",
     "segments": [{"type": "text", "data": {"text": "hi"}}, ...]}

Answer ``{"ok": true, "message_id": "console-17"}``.

Agent events (tool calls, correction/fallback notices) reach the browser the same way:
:func:`agent_event_call` builds a ``POST {api_base}/console/api/events`` call from a
:func:`agent_event_payload` of a ``runtime.agent_events`` event.
"""

from __future__ import annotations

import base64
import hmac
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtime.platforms.base import (
    ApiCall,
    InboundMessage,
    MalformedEvent,
    RenderTarget,
    Sender,
    SendResult,
    SignatureError,
    header,
    read_env,
)
from runtime.platforms.common import (
    MediaPathError,
    check_trigger,
    http_send_result,
    is_triggered,
    media_unavailable,
    read_media_path,
    setting,
    trigger_settings,
)
from runtime.segments import SEGMENT_TYPES, MediaSegment, Reply

__all__ = [
    "CODEC_FACTORY",
    "DELIVER_PATH",
    "EVENTS_PATH",
    "NAME_RULE",
    "ConsoleCodec",
    "agent_event_call",
    "agent_event_payload",
]

PLATFORM = "console"
DELIVER_PATH = "/console/api/deliver"
"""The console platform API endpoint on the ingress (DeliveryActors POST replies here)."""
EVENTS_PATH = "/console/api/events"
"""Where agent events for the console are POSTed (``{"session_key", "event"}``)."""
NAME_RULE = re.compile(r"^[\w.-]{1,32}$")
"""Console user names and group ids: 1–32 word characters, ``.`` or ``-`` (session-key safe)."""


class ConsoleCodec:
    """The console :class:`~runtime.platforms.base.PlatformCodec` (see module docstring).

    Args:
        bot_id: The console bot's id (default ``console``).
        api_base: Base URL of the ingress serving ``/console/api/deliver``.
        secret: Expected ``X-Console-Token`` (None: not checked).
        trigger: ``always`` | ``mention`` | ``keyword`` for group scenes.
        keywords: Words that trigger in ``keyword`` mode.
        masters: Console user names allowed to steer (default config: ``["admin"]``).
        media_dir: Directory that ``path`` media must lie under (inlined as base64).
    """

    platform = PLATFORM
    supported_segments = frozenset(SEGMENT_TYPES)

    def __init__(
        self,
        *,
        bot_id: str = "console",
        api_base: str = "http://127.0.0.1:8000",
        secret: str | None = None,
        trigger: str = "mention",
        keywords: list[str] | tuple[str, ...] = (),
        masters: list[str] | tuple[str, ...] = ("admin",),
        media_dir: Path | str | None = None,
    ) -> None:
        check_trigger("console", trigger)
        self.bot_id = bot_id
        self.api_base = api_base
        self._secret = secret
        self.trigger = trigger
        self.keywords = tuple(keywords)
        self.masters = frozenset(masters)
        self.media_dir = Path(media_dir) if media_dir else None

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """Check ``X-Console-Token`` when a secret is configured.

        Raises:
            SignatureError: missing or wrong token.
        """
        if not self._secret:
            return
        got = header(headers, "X-Console-Token") or ""
        if not hmac.compare_digest(got.encode(), self._secret.encode()):
            raise SignatureError("missing or wrong X-Console-Token")

    def parse(self, headers: Mapping[str, str], body: bytes) -> InboundMessage | None:
        """Parse a browser message (shape in the module docstring).

        Raises:
            MalformedEvent: not JSON, a bad ``user``/``group_id``/``scene``, no ``message_id``,
                or a ``text`` that is not a non-empty string.
        """
        try:
            event = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedEvent(f"console message is not valid JSON: {exc}") from exc
        if not isinstance(event, dict):
            raise MalformedEvent("console message must be a JSON object")
        user = event.get("user")
        if not isinstance(user, str) or not NAME_RULE.match(user):
            raise MalformedEvent("console 'user' must be 1-32 letters, digits, '_', '.' or '-'")
        scene = event.get("scene", "private")
        if scene == "private":
            scene_id = user
        elif scene == "group":
            group_id = event.get("group_id")
            if not isinstance(group_id, str) or not NAME_RULE.match(group_id):
                raise MalformedEvent("console 'group_id' must be 1-32 letters, digits, '_', '.' or '-'")
            scene_id = group_id
        else:
            raise MalformedEvent("console 'scene' must be 'private' or 'group'")
        message_id = event.get("message_id")
        text = event.get("text")
        if not isinstance(message_id, str) or not message_id:
            raise MalformedEvent("console 'message_id' must be a non-empty string")
        if not isinstance(text, str) or not text.strip():
            raise MalformedEvent("console 'text' must be a non-empty string")
        time_ms = event.get("time_ms", 0)
        if not isinstance(time_ms, int):
            raise MalformedEvent("console 'time_ms' must be an integer (Unix ms)")
        tag = "@" + self.bot_id
        mentioned = scene == "group" and (event.get("mention_bot") is True or tag in text)
        segments: list[dict[str, Any]] = []
        if mentioned:
            segments.append({"type": "mention", "data": {"target": self.bot_id}})
            body_text = text.replace(tag, "").strip() if tag in text else text
        else:
            body_text = text
        segments.append({"type": "text", "data": {"text": body_text}})
        triggered = is_triggered(scene, self.trigger, mentioned, text, self.keywords)
        roles = ["master"] if user in self.masters else []
        return InboundMessage(
            platform=PLATFORM,
            bot_id=self.bot_id,
            message_id=message_id,
            scene_type=scene,
            scene_id=scene_id,
            sender=Sender(id=user, name=user, roles=roles),
            text=text,
            segments=segments,
            reply_to=None,
            mentioned_bot=mentioned,
            triggered=triggered,
            time_ms=time_ms,
        )

    def render(self, reply: Reply, target: RenderTarget) -> list[ApiCall]:
        """One ``POST /console/api/deliver`` with the canonical segments (``path`` media inlined
        as ``base64``). Empty reply → ``[]``.

        An unreadable ``path`` medium becomes the "attachment unavailable" text (counted).
        """
        if reply.is_empty():
            return []
        segments: list[dict[str, Any]] = []
        for seg in reply.segments:
            data = seg.model_dump(mode="json")
            if isinstance(seg, MediaSegment) and seg.data.media.kind == "path":
                try:
                    raw = read_media_path(seg.data.media.value, self.media_dir)
                except MediaPathError as exc:
                    data = {"type": "text", "data": {"text": media_unavailable(PLATFORM, seg.type, exc)}}
                else:
                    data["data"]["media"] = {"kind": "base64", "value": base64.b64encode(raw).decode()}
            segments.append(data)
        body = {
            "bot_id": self.bot_id,
            "scene_type": target.scene_type,
            "scene_id": target.scene_id,
            "reply_to": target.reply_to,
            "segments": segments,
        }
        headers = {"X-Console-Token": self._secret} if self._secret else {}
        return [ApiCall(base_url=self.api_base, path=DELIVER_PATH, json_body=body, headers=headers)]

    def parse_send_result(self, status: int, headers: Mapping[str, str], body: bytes) -> SendResult:
        """``{"ok": true, "message_id"}`` → ok; anything else → failed (5xx/429 retryable)."""
        if status != 200:
            return http_send_result(status, headers, body)
        try:
            answer = json.loads(body)
        except ValueError:
            return SendResult(ok=False, error=f"console API answered non-JSON: {body[:200]!r}")
        if isinstance(answer, dict) and answer.get("ok") is True:
            mid = answer.get("message_id")
            return SendResult(ok=True, message_id=None if mid is None else str(mid))
        return SendResult(ok=False, error=f"console API: {answer!r}")


def agent_event_payload(event: Any) -> dict[str, Any] | None:
    """A small JSON view of a ``runtime.agent_events`` event for the console (None: not shown).

    ``tool_execution_start`` → ``{"type": "tool_call", "name", "args"}``; ``tool_execution_end`` →
    ``{"type": "tool_result", "name", "is_error"}``; ``turn_start``/``agent_end`` → status events;
    a dict already shaped ``{"type": "notice", "text"}`` (correction/fallback notices) passes through.
    """
    if isinstance(event, dict):
        return event if isinstance(event.get("type"), str) else None
    etype = getattr(event, "type", None)
    if etype == "tool_execution_start":
        name, args = getattr(event, "tool_name", ""), getattr(event, "args", None)
        return {"type": "tool_call", "name": name, "args": args}
    if etype == "tool_execution_end":
        return {"type": "tool_result", "name": getattr(event, "tool_name", ""),
                "is_error": bool(getattr(event, "is_error", False))}  # fmt: skip
    if etype == "agent_start":
        return {"type": "status", "text": "thinking…"}
    if etype == "agent_end":
        return {"type": "status", "text": f"done ({getattr(event, 'reason', 'stop')})"}
    return None


def agent_event_call(api_base: str, session_key: str, payload: dict[str, Any]) -> ApiCall:
    """The ``POST {api_base}/console/api/events`` call carrying one agent event payload."""
    body = {"session_key": session_key, "event": payload}
    return ApiCall(base_url=api_base, path=EVENTS_PATH, json_body=body, kind="event")


def from_config(bot: Any) -> ConsoleCodec:
    """Build the codec from a ``bots:`` entry (``platform: console``): ``self_id`` (default
    ``console``), ``api_base`` (default ``http://127.0.0.1:8000``, the ingress), ``secret_env``,
    ``trigger``, ``keyword``, ``masters``, ``media_dir``."""
    return ConsoleCodec(
        bot_id=str(setting(bot, "self_id", None) or "console"),
        api_base=setting(bot, "api_base", None) or "http://127.0.0.1:8000",
        secret=read_env(setting(bot, "secret_env", None), what="console token"),
        **trigger_settings(bot),
    )


CODEC_FACTORY = from_config
"""Registry hook used by :func:`runtime.platforms.base.get_codec`."""
