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
* A name in ``masters`` alone is not a master: the sender gets the ``master`` role only when the
  request also carries ``X-Console-Master-Token`` equal to the value of the bot's
  ``master_token_env`` (default: the admin token's variable, ``server.admin_token_env``), checked
  in constant time by :func:`master_token_matches` (docs/decisions.md#security-console-master-proof).

Outbound: the console "platform API" is an endpoint on the ingress itself
(``POST {api_base}/console/api/deliver``, served by ``actors/http/console.py``) that DeliveryActors
call like any platform API. The body carries the canonical segments — the browser renders all 13
types, so nothing is degraded — except that ``path`` media are inlined as ``base64`` (a browser
cannot read the server's media directory)::

    {"bot_id": "console", "scene_type": "group", "scene_id": "lobby", "reply_to": "c-3f2a…",
     "segments": [{"type": "text", "data": {"text": "hi"}}, ...]}

Answer ``{"ok": true, "message_id": "console-1a2b3c4d-17"}``.

``/console/api/deliver`` and ``/console/api/events`` are internal (callers: DeliveryActors and
console sessions, never a browser): every call carries ``X-Console-Api-Token`` with the value of
the environment variable ``SESSIONRAY_CONSOLE_API_TOKEN`` (:func:`console_api_token`).
``sessionray serve`` generates one at start when it is unset and hands it to its Ray workers; when
several ingress processes serve the console (Ray Serve replicas, or ``--address`` onto a cluster
whose detached actors outlive one ``serve``), set the variable yourself on every node. Outside
``sessionray serve`` an ingress with a console bot refuses to start without it
(:func:`require_console_api_token`); every check of the header is :func:`api_token_matches`.

Agent events (tool calls, correction/fallback notices) reach the browser the same way:
:func:`agent_event_call` builds a ``POST {api_base}/console/api/events`` call from a
:func:`agent_event_payload` of a ``runtime.agent.events`` event.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import re
import secrets
from collections.abc import Iterable, Mapping
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
    MAX_EVENT_TIME_MS,
    MediaPathError,
    check_trigger,
    event_time_in_range,
    http_send_result,
    is_triggered,
    load_event,
    media_unavailable,
    read_media_path,
    setting,
    trigger_settings,
    valid_unicode,
    with_master_role,
)
from runtime.reply.leak import CONSOLE_API_TOKEN_ENV
from runtime.reply.segments import SEGMENT_TYPES, MediaSegment, Reply

__all__ = [
    "API_TOKEN_ENV",
    "API_TOKEN_HEADER",
    "CODEC_FACTORY",
    "DELIVER_PATH",
    "EVENTS_PATH",
    "MASTER_TOKEN_HEADER",
    "MAX_MESSAGE_ID_CHARS",
    "NAME_RULE",
    "TOOL_RESULT_PREVIEW_CHARS",
    "ConsoleCodec",
    "agent_event_call",
    "agent_event_payload",
    "api_token_matches",
    "console_api_token",
    "master_name_unproven",
    "master_token_matches",
    "require_console_api_token",
    "tool_result_text",
]

PLATFORM = "console"
DELIVER_PATH = "/console/api/deliver"
"""The console platform API endpoint on the ingress (DeliveryActors POST replies here)."""
EVENTS_PATH = "/console/api/events"
"""Where agent events for the console are POSTed (``{"session_key", "event"}``)."""
NAME_RULE = re.compile(r"\A[\w.-]{1,32}\Z")
"""Console user names and group ids: 1–32 word characters, ``.`` or ``-`` (session-key safe).
Anchored with ``\\A``/``\\Z``, so ``NAME_RULE.match`` is a full match (``$`` would also accept a
trailing newline, e.g. ``"admin\\n"``, which no session key may contain)."""
API_TOKEN_ENV = CONSOLE_API_TOKEN_ENV
"""Environment variable holding the shared secret of the internal console endpoints."""
API_TOKEN_HEADER = "X-Console-Api-Token"
"""Header carrying :data:`API_TOKEN_ENV`'s value on ``/console/api/deliver`` and ``/events``."""
MASTER_TOKEN_HEADER = "X-Console-Master-Token"
"""Header carrying a console master's proof: the value of the bot's ``master_token_env``."""
TOOL_RESULT_PREVIEW_CHARS = 2000
"""Characters of a tool's result shown in the console's live events (the rest is cut, ``…``)."""
MAX_MESSAGE_ID_CHARS = 128
"""Longest accepted browser ``message_id`` (the browser sends ``c-<uuid>``, 38 characters)."""


def console_api_token(*, create: bool = False) -> str | None:
    """The shared secret of ``/console/api/deliver`` and ``/console/api/events``: the value of
    ``$SESSIONRAY_CONSOLE_API_TOKEN``.

    Args:
        create: When the variable is unset, generate a random token (32 url-safe bytes) and store
            it in this process's environment, so this process and the processes it starts agree.

    Returns:
        The token, or None when unset and ``create`` is false.
    """
    token = os.environ.get(API_TOKEN_ENV)
    if not token and create:
        token = secrets.token_urlsafe(32)
        os.environ[API_TOKEN_ENV] = token
    return token or None


def _secret_matches(got: str | bytes | None, expected: str | None) -> bool:
    """``got`` equals ``expected`` (compared in constant time); False when either is missing or
    empty. A str ``got`` is encoded as latin-1, as Starlette decodes header bytes."""
    if not expected or not got:
        return False
    try:  # strict: a character outside latin-1 never came from a header, and matches nothing
        raw = got if isinstance(got, bytes) else got.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(raw, expected.encode("utf-8"))


def api_token_matches(got: str | bytes | None) -> bool:
    """The one check of an ``X-Console-Api-Token`` value (``actors/http/console.py``'s internal
    endpoints and ``actors.inbound.guard.trusted_internal_call``): True when ``got`` equals
    ``$SESSIONRAY_CONSOLE_API_TOKEN`` as it is now (read per call, so both places always agree),
    compared in constant time. False when ``got`` is missing or the variable is unset.

    Args:
        got: The header value: raw header bytes, or a str as Starlette decodes them (latin-1).
    """
    return _secret_matches(got, console_api_token())


def master_token_matches(got: str | bytes | None, env_name: str | None) -> bool:
    """The one check of a console master's proof (``X-Console-Master-Token``; the codec's
    ``parse`` and the console's master routes, docs/decisions.md#security-console-master-proof):
    True when ``got`` equals the value of the environment variable ``env_name`` as it is now (read
    per call: ``sessionray serve --dev-admin-token`` sets it before the ingress starts), compared in
    constant time. False when ``got`` is missing, ``env_name`` is None or the variable is unset or
    empty — then no console user is a master.

    Args:
        got: The header value (raw bytes, or a str as Starlette decodes them).
        env_name: The console bot's ``master_token_env``.
    """
    return _secret_matches(got, os.environ.get(env_name) if env_name else None)


def master_name_unproven(
    user: str, masters: Iterable[str], got: str | bytes | None, env_name: str | None
) -> bool:
    """``user`` is one of ``masters``, a master token is set (``env_name``'s value) and ``got`` is
    not it: a master's name without the proof, refused wherever it reads or writes under that name
    (the webhook, the console's history: docs/decisions.md#security-console-master-proof)."""
    token_set = bool(env_name and os.environ.get(env_name))
    return user in masters and token_set and not master_token_matches(got, env_name)


def require_console_api_token(config: Any) -> str | None:
    """``$SESSIONRAY_CONSOLE_API_TOKEN`` when ``config`` has a ``console`` bot (None without one).

    Outside ``sessionray serve`` — Ray Serve replicas (``actors/serve/app.py``), an ingress built
    with ``actors.inbound.ingress.build_app`` in a process of your own — nothing generates the token, and
    a token made up by one process would never reach the others: the ingress, its delivery actors
    and the console sessions must all read the same value (``sessionray serve`` generates one
    before it starts Ray and hands it to its workers). So a missing variable stops the start.

    Raises:
        ValueError: a console bot is configured and the variable is unset or empty; the message
            names the variable and how to set it.
    """
    if not any(str(setting(bot, "platform", "")) == PLATFORM for bot in getattr(config, "bots", ())):
        return None
    token = console_api_token()
    if token is None:
        raise ValueError(
            f"environment variable {API_TOKEN_ENV} is not set: a console bot is configured, and its "
            "internal endpoints (/console/api/deliver, /console/api/events) need one shared token in "
            "the ingress and in every Ray worker. `sessionray serve` generates it; anywhere else (Ray "
            f"Serve, a cluster) set {API_TOKEN_ENV} to the same random value on every node, e.g. "
            "`openssl rand -hex 24`"
        )
    return token


class ConsoleCodec:
    """The console :class:`~runtime.platforms.base.PlatformCodec` (see module docstring).

    Args:
        bot_id: The console bot's id (default ``console``).
        api_base: Base URL of the ingress serving ``/console/api/deliver``.
        secret: Expected ``X-Console-Token`` (None: not checked).
        trigger: ``always`` | ``mention`` | ``keyword`` for group scenes.
        keywords: Words that trigger in ``keyword`` mode.
        masters: Console user names that may act as masters (default config: ``["admin"]``) —
            with the master token only.
        master_token_env: The variable whose value a master sends as ``X-Console-Master-Token``
            (None: no console user is a master).
        media_dir: Directory that ``path`` media must lie under (inlined as base64).
        api_token: Sent as ``X-Console-Api-Token`` on every deliver call (None: not sent;
            :func:`from_config` passes :func:`console_api_token`).
    """

    platform = PLATFORM
    supported_segments = frozenset(SEGMENT_TYPES)
    browser_facing = True
    """A browser posts to this webhook: the ingress requires a JSON ``Content-Type`` (a cross-site
    page can send ``text/plain`` or forms without a CORS preflight, never JSON)."""

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
        api_token: str | None = None,
        master_token_env: str | None = None,
    ) -> None:
        check_trigger("console", trigger)
        self.bot_id = bot_id
        self.api_base = api_base
        self._secret = secret
        self.trigger = trigger
        self.keywords = tuple(keywords)
        self.masters = frozenset(masters)
        self.media_dir = Path(media_dir) if media_dir else None
        self._api_token = api_token
        self.master_token_env = master_token_env

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """Check ``X-Console-Token`` when a secret is configured.

        Raises:
            SignatureError: missing or wrong token.
        """
        if self._secret:
            got = header(headers, "X-Console-Token") or ""
            if not hmac.compare_digest(got.encode(), self._secret.encode()):
                raise SignatureError("missing or wrong X-Console-Token")
        self._verify_master_name(headers, body)

    def _verify_master_name(self, headers: Mapping[str, str], body: bytes) -> None:
        """A master's name is reserved for whoever holds the master token: while a master token is
        set, a message under a name in ``masters`` without the proof is refused, so that nobody
        speaks in (or ``/new``-s) a master's own session by typing the name
        (docs/decisions.md#security-console-master-proof). A body that is not a JSON object with a
        string ``user`` is left to :meth:`parse` to reject.

        Raises:
            SignatureError: a master's name without the master token.
        """
        if not self.masters or not self.master_token_env or not os.environ.get(self.master_token_env):
            return
        try:
            user = json.loads(body).get("user")
        except (ValueError, AttributeError, RecursionError):
            return
        proof = header(headers, MASTER_TOKEN_HEADER)
        if isinstance(user, str) and master_name_unproven(user, self.masters, proof, self.master_token_env):
            raise SignatureError(
                f"{user!r} is a master's name: a message under it needs the master token in "
                f"{MASTER_TOKEN_HEADER}"
            )

    def parse(self, headers: Mapping[str, str], body: bytes) -> InboundMessage | None:
        """Parse a browser message (shape in the module docstring).

        Raises:
            MalformedEvent: not JSON (:func:`~runtime.platforms.common.load_event`, lone
                surrogates kept), a bad ``user``/``group_id``/``scene`` (names must match
                :data:`NAME_RULE` in full), no ``message_id`` (or one longer than 128 characters),
                a ``text`` that is not a non-empty string, a ``message_id``/``text`` that is not
                valid Unicode (a lone surrogate), or a ``time_ms`` that is not an integer in
                ``[0,`` :data:`~runtime.platforms.common.MAX_EVENT_TIME_MS` ``)`` (Unix ms).
        """
        event = load_event(headers, body, PLATFORM, replace_lone_surrogates=False)
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
        if len(message_id) > MAX_MESSAGE_ID_CHARS or not valid_unicode(message_id):
            raise MalformedEvent(
                f"console 'message_id' must be valid Unicode of at most {MAX_MESSAGE_ID_CHARS} characters"
            )
        if not isinstance(text, str) or not text.strip():
            raise MalformedEvent("console 'text' must be a non-empty string")
        if not valid_unicode(text):
            raise MalformedEvent("console 'text' is not valid Unicode (lone surrogate)")
        time_ms = event.get("time_ms", 0)
        if isinstance(time_ms, bool) or not isinstance(time_ms, int) or not event_time_in_range(time_ms):
            limit = MAX_EVENT_TIME_MS
            raise MalformedEvent(f"console 'time_ms' must be an integer in [0, {limit}) (Unix ms)")
        proven = master_token_matches(header(headers, MASTER_TOKEN_HEADER), self.master_token_env)
        roles = with_master_role([], user, self.masters if proven else ())
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
        as ``base64``) and the ``X-Console-Api-Token`` header when the codec has a token. Empty
        reply → ``[]``.

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
        if self._api_token:
            headers[API_TOKEN_HEADER] = self._api_token
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


def tool_result_text(result: Any) -> str:
    """What a tool returned, as the console shows it: the text blocks of a ``ToolResultMessage``
    joined by newlines, an image block as ``[image <mime type>]``; cut to
    :data:`TOOL_RESULT_PREVIEW_CHARS` characters (``…`` appended). ``""`` when there is nothing."""
    parts: list[str] = []
    for block in getattr(result, "content", None) or ():
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        elif kind == "image":
            mime = getattr(block, "mime_type", "")
            parts.append(f"[image {mime}]" if mime else "[image]")
    text = "\n".join(parts)
    if len(text) > TOOL_RESULT_PREVIEW_CHARS:
        text = text[:TOOL_RESULT_PREVIEW_CHARS] + "…"
    return text


def agent_event_payload(event: Any) -> dict[str, Any] | None:
    """A small JSON view of a ``runtime.agent.events`` event for the console (None: not shown).

    ``tool_execution_start`` → ``{"type": "tool_call", "name", "args"}``; ``tool_execution_end`` →
    ``{"type": "tool_result", "name", "is_error", "result"}`` (``result``: :func:`tool_result_text`
    of the tool's ``ToolResultMessage``); ``turn_start``/``agent_end`` → status events; a dict
    already shaped ``{"type": "notice", "text"}`` (correction/fallback notices) passes through.
    """
    if isinstance(event, dict):
        return event if isinstance(event.get("type"), str) else None
    etype = getattr(event, "type", None)
    if etype == "tool_execution_start":
        name, args = getattr(event, "tool_name", ""), getattr(event, "args", None)
        return {"type": "tool_call", "name": name, "args": args}
    if etype == "tool_execution_end":
        return {"type": "tool_result", "name": getattr(event, "tool_name", ""),
                "is_error": bool(getattr(event, "is_error", False)),
                "result": tool_result_text(getattr(event, "result", None))}  # fmt: skip
    if etype == "agent_start":
        return {"type": "status", "text": "thinking…"}
    if etype == "agent_end":
        return {"type": "status", "text": f"done ({getattr(event, 'reason', 'stop')})"}
    return None


def agent_event_call(
    api_base: str, session_key: str, payload: dict[str, Any], *, api_token: str | None = None
) -> ApiCall:
    """The ``POST {api_base}/console/api/events`` call carrying one agent event payload (with
    ``X-Console-Api-Token: api_token`` when given)."""
    body = {"session_key": session_key, "event": payload}
    headers = {API_TOKEN_HEADER: api_token} if api_token else {}
    return ApiCall(base_url=api_base, path=EVENTS_PATH, json_body=body, kind="event", headers=headers)


def from_config(bot: Any) -> ConsoleCodec:
    """Build the codec from a ``bots:`` entry (``platform: console``): ``self_id`` (default
    ``console``), ``api_base`` (default ``http://127.0.0.1:8000``, the ingress), ``secret_env``,
    ``trigger``, ``keyword``, ``masters``, ``master_token_env``, ``media_dir``; the internal API token from
    ``$SESSIONRAY_CONSOLE_API_TOKEN`` (:func:`console_api_token`)."""
    return ConsoleCodec(
        bot_id=str(setting(bot, "self_id", None) or "console"),
        api_base=setting(bot, "api_base", None) or "http://127.0.0.1:8000",
        secret=read_env(setting(bot, "secret_env", None), what="console token"),
        api_token=console_api_token(),
        master_token_env=setting(bot, "master_token_env", None),
        **trigger_settings(bot),
    )


CODEC_FACTORY = from_config
"""Registry hook used by :func:`runtime.platforms.base.get_codec`."""
