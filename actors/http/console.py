"""The built-in web console: starlette routes the ingress mounts (``console_routes(runtime, config)``).

Routes::

    GET  /console                    the single-page chat (plain HTML + JS, no build step)
    GET  /console/static/{name}      console.js / console.css / favicon.svg
    GET  /favicon.ico                the console's icon (SVG, ``image/svg+xml``)
    GET  /console/api/info           {"bots": [...], "token_required": bool, "master_token": bool}
    GET  /console/api/me             ?user=&bot= → {"user", "bot", "master": bool, "master_name": bool}
    GET  /console/api/history        ?user=&bot=&scene=private|group&group=&limit= → {"messages": [...]}
    GET  /console/api/stream         Server-Sent Events for one browser: ?user=&group=
    POST /console/api/echo           a user's message, shown to the other members of its group scene
    POST /console/api/deliver        the console "platform API": DeliveryActors POST replies here  (internal)
    POST /console/api/events         agent events for a session ({"session_key", "event"})       (internal)
    GET  /console/api/sessions       ?user= → live console sessions of the bots ``user`` is a master of
    POST /console/api/steer          {"user", "session_key", "text"} → a steer ControlRequest (console:* keys)
    POST /console/api/follow_up      same → a follow_up ControlRequest

The browser sends its chat messages to the regular webhook ``POST /webhooks/console/{bot_id}``
(verified and parsed by :mod:`runtime.platforms.console`, like any platform). Replies come back
the way every platform gets them: the DeliveryActor renders the reply with the console codec and
POSTs it to ``/console/api/deliver``, which fans it out to the browsers whose scene it is (a
private scene to that user's tabs; a group scene to every member watching the group).

Master actions need proof, never a name alone (docs/decisions.md#security-console-master-proof):
a console user is a master of a bot when the name is in its ``masters`` **and** the request carries
``X-Console-Master-Token`` equal to the value of the bot's ``master_token_env`` (default
``server.admin_token_env``: the admin token, which ``sessionray serve --dev-admin-token`` — ``make
run`` — generates and prints). ``/console/api/me`` answers ``master`` (name and token) and
``master_name`` (the name alone, so the page can ask for the token); ``/console/api/sessions``,
``/console/api/steer`` and ``/console/api/follow_up`` answer 403 without the proof, naming what is
missing; the console webhook gives the sender the ``master`` role (``/steer``, ``/followup``,
``/new`` in groups, master-only tools) on the same condition (:mod:`runtime.platforms.console`).
``/console/api/info`` says whether any console bot has a master token set (``master_token``).

Steer and follow-up are sent with the console user's name as ``sender_id`` (the runtime checks it
against ``masters`` once more). The console may act on **console sessions only** (``console:*``
keys; docs/decisions.md#security-console-scope): any other platform's session key answers 403 and
points to the admin API (bearer token). ``/console/api/sessions`` lists the console sessions of
the bots the caller proved to be a master of; the page shows the live-session list and the master
controls only when ``/console/api/me`` says ``master`` (docs/decisions.md#security-console-masters).
With ``secret_env`` set on the console bot, every browser-facing ``/console/api`` call (and the
webhook) needs ``X-Console-Token``; without it the console is meant for 127.0.0.1 only.

``/console/api/deliver`` and ``/console/api/events`` are not for browsers: they need
``X-Console-Api-Token`` equal to ``$SESSIONRAY_CONSOLE_API_TOKEN``, else 401 (the one check
:func:`runtime.platforms.console.api_token_matches`, reading the variable per request, as the
ingress's body-size exemption does). ``sessionray serve`` generates the variable before it starts
Ray; anywhere else (Ray Serve replicas, your own process) :func:`console_routes` refuses to start
without it (:func:`runtime.platforms.console.require_console_api_token`): a token made up by one
process never reaches the delivery actors, and every console reply would be refused.

``/console/api/history`` returns the caller's own scene only — the private chat of ``user`` with
``bot``, or the group the browser's stream follows (docs/decisions.md#security-console-own-scene)
— read from ``im_transcripts`` (:mod:`actors.http.console_history`: the last ``limit`` messages,
default 50, at most 200). Everything it returns, and every live agent event (tool arguments and
results), passes the leak check (docs/decisions.md#security-console-leak-check).

Bad input answers 400 naming the field: a body nested too deeply to parse, names that do not match
``NAME_RULE`` in full, steer/follow-up/echo text that is not valid Unicode; text longer than
``server.max_text_chars`` (default 16000) answers 413.

The fan-out hub lives in this process: with several ingress replicas (Ray Serve), a browser sees
the replies delivered to its own replica only — run the console on one replica.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from actors.http.admin import error_status
from actors.http.console_history import HISTORY_LIMIT, HISTORY_MAX, read_history, scrub
from actors.http.console_masters import ConsoleMasters
from actors.http.input_checks import InputError, check_text, loads_json, max_text_chars, valid_session_key
from runtime.keys import SessionKeyError, parse_session_key
from runtime.memory.transcripts import TranscriptStore
from runtime.platforms.base import read_env
from runtime.platforms.common import is_json_content_type, valid_unicode
from runtime.platforms.console import (
    API_TOKEN_ENV,
    API_TOKEN_HEADER,
    NAME_RULE,
    api_token_matches,
    require_console_api_token,
)
from runtime.reply.leak import LeakPolicy
from runtime.session.control import ControlError, ControlKind, ControlRequest

__all__ = ["ConsoleHub", "console_routes"]

log = logging.getLogger("sessionray.console")

_STATIC = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
_NAMES = "must be 1-32 letters, digits, '_', '.' or '-'"
_KEEPALIVE_S = 15.0
_QUEUE_MAX = 256


@dataclass(eq=False)
class _Subscriber:
    user: str
    group: str | None
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=lambda: asyncio.Queue(_QUEUE_MAX))

    def wants(self, scene_type: str, scene_id: str) -> bool:
        if scene_type == "private":
            return scene_id == self.user
        return self.group is not None and scene_id == self.group


class ConsoleHub:
    """In-process fan-out of console events to the browsers' SSE streams, by scene.

    A slow browser whose queue is full (256 events) loses the oldest event rather than blocking
    delivery (counted in the log).
    """

    def __init__(self) -> None:
        self._subs: set[_Subscriber] = set()
        self._ids = itertools.count(1)
        self._prefix = f"console-{secrets.token_hex(4)}"

    def subscribe(self, user: str, group: str | None) -> _Subscriber:
        """Register one browser stream."""
        sub = _Subscriber(user, group)
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: _Subscriber) -> None:
        """Forget a browser stream."""
        self._subs.discard(sub)

    def next_message_id(self) -> str:
        """A console message id for a delivered reply: ``console-<8 hex digits of this hub>-<n>``.

        Unique across restarts and replicas: the id keys the outbound transcript row (unique per
        platform, bot, message id and direction), so a counter that starts again at 1 would
        make every reply after a restart a "duplicate" that history never shows."""
        return f"{self._prefix}-{next(self._ids)}"

    def publish(self, scene_type: str, scene_id: str, event: dict[str, Any]) -> int:
        """Queue ``event`` to every subscriber of the scene; returns how many got it."""
        n = 0
        for sub in list(self._subs):
            if not sub.wants(scene_type, scene_id):
                continue
            if sub.queue.full():
                sub.queue.get_nowait()
                log.warning("console stream of %s is full: dropped its oldest event", sub.user)
            sub.queue.put_nowait(event)
            n += 1
        return n


def _sse_data(event: dict[str, Any]) -> bytes:
    """One SSE ``data:`` frame. Text that UTF-8 cannot carry (a lone surrogate) falls back to
    ``\\u`` escapes, so one odd event never ends a browser's stream."""
    data = json.dumps(event, ensure_ascii=False)
    if not valid_unicode(data):
        data = json.dumps(event)
    return f"data: {data}\n\n".encode()


def _static(name: str) -> str:
    return resources.files("actors.http.static").joinpath(name).read_text(encoding="utf-8")


def console_routes(
    runtime: Any,
    config: Any,
    hub: ConsoleHub | None = None,
    *,
    transcripts: TranscriptStore | None = None,
) -> list[BaseRoute]:
    """The console routes (module docstring) over a ``SessionRuntime`` and the config.

    Returns ``[]`` when no ``console`` bot is configured. The internal endpoints check
    ``$SESSIONRAY_CONSOLE_API_TOKEN`` per request (:func:`~runtime.platforms.console.api_token_matches`).
    ``transcripts`` is where ``/console/api/history`` reads (the ingress passes its own store;
    without one that endpoint answers 503).

    Raises:
        ValueError: the console bot's ``secret_env`` names an unset variable, or
            ``$SESSIONRAY_CONSOLE_API_TOKEN`` is not set (``sessionray serve`` sets it before
            this runs; elsewhere set it on every node:
            :func:`~runtime.platforms.console.require_console_api_token`).
    """
    bots = [b for b in config.bots if str(b.platform) == "console"]
    if not bots:
        return []
    require_console_api_token(config)
    hub = hub or ConsoleHub()
    token = read_env(getattr(bots[0], "secret_env", None), what="console token")
    bot_ids = [str(b.self_id) for b in bots]
    masters = ConsoleMasters(bots)
    text_limit = max_text_chars(config)
    leak_policy = LeakPolicy.from_config(config)

    def authorized(request: Request) -> bool:
        if not token:
            return True
        got = request.headers.get("x-console-token") or request.query_params.get("token") or ""
        return hmac.compare_digest(got.encode(), token.encode())

    def denied() -> Response:
        return JSONResponse({"error": "missing or wrong X-Console-Token"}, status_code=401)

    def internal(request: Request) -> bool:
        return api_token_matches(request.headers.get(API_TOKEN_HEADER))

    def internal_denied() -> Response:
        return JSONResponse(
            {"error": f"internal console endpoint: missing or wrong {API_TOKEN_HEADER} "
                      f"(the value of ${API_TOKEN_ENV} on the server)"},
            status_code=401,
        )  # fmt: skip

    async def json_body(request: Request) -> dict[str, Any] | Response:
        """The body as a JSON object, or the 4xx to answer (415 unless the request says JSON:
        a cross-site page can post ``text/plain`` or forms without a CORS preflight)."""
        if not is_json_content_type(request.headers.get("content-type")):
            return JSONResponse({"error": "send the body as application/json"}, status_code=415)
        try:
            body = loads_json(await request.body())
        except InputError as exc:
            return exc.response()
        except ValueError:
            return bad("expected a JSON object")
        return body if isinstance(body, dict) else bad("expected a JSON object")

    def bad(message: str) -> Response:
        return JSONResponse({"error": message}, status_code=400)

    async def page(request: Request) -> Response:
        return HTMLResponse(_static("console.html"))

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return JSONResponse({"error": "not found"}, status_code=404)
        return Response(_static(name), media_type=_STATIC[name])

    async def favicon(request: Request) -> Response:
        return Response(_static("favicon.svg"), media_type=_STATIC["favicon.svg"])

    async def info(request: Request) -> Response:
        master_token = masters.any_token_set()
        return JSONResponse({"bots": bot_ids, "token_required": bool(token), "master_token": master_token})

    def who(request: Request) -> tuple[str, str] | Response:
        """``(user, bot)`` from the query (``bot`` defaults to the first console bot), or a 400."""
        user = request.query_params.get("user", "")
        bot = request.query_params.get("bot") or bot_ids[0]
        if not NAME_RULE.fullmatch(user):
            return bad(f"`user` {_NAMES}")
        if bot not in masters.names:
            return bad(f"`bot`: no console bot {bot!r} is configured")
        return user, bot

    async def me(request: Request) -> Response:
        if not authorized(request):
            return denied()
        found = who(request)
        if isinstance(found, Response):
            return found
        user, bot = found
        master = masters.is_master(request, user, bot)
        named = user in masters.names[bot]
        return JSONResponse({"user": user, "bot": bot, "master": master, "master_name": named})

    async def history(request: Request) -> Response:
        if not authorized(request):
            return denied()
        found = who(request)
        if isinstance(found, Response):
            return found
        user, bot = found
        if masters.unproven(request, user, bot):
            return masters.refusal(user, bot, "read its history")
        scene, group = request.query_params.get("scene", "private"), request.query_params.get("group", "")
        if scene not in ("private", "group"):
            return bad("`scene` must be private or group")
        if scene == "group" and not NAME_RULE.fullmatch(group):
            return bad(f"`group` {_NAMES}")
        raw = request.query_params.get("limit", str(HISTORY_LIMIT))
        if not (raw.isdecimal() and 1 <= int(raw) <= HISTORY_MAX):
            return bad(f"`limit` must be a whole number from 1 to {HISTORY_MAX}")
        if transcripts is None:
            return JSONResponse({"error": "no transcript store: history unavailable"}, status_code=503)
        try:
            messages = await read_history(
                transcripts,
                bot_id=bot,
                scene_type=scene,
                scene_id=user if scene == "private" else group,
                limit=int(raw),
                policy=leak_policy,
            )
        except Exception:  # the database is down or busy: the page says so and keeps working
            log.exception("console history of %s/%s unavailable", bot, user)
            return JSONResponse({"error": "history unavailable, try again"}, status_code=503)
        return JSONResponse({"messages": messages})

    async def stream(request: Request) -> Response:
        if not authorized(request):
            return denied()
        user = request.query_params.get("user", "")
        group = request.query_params.get("group") or None
        if not NAME_RULE.fullmatch(user) or (group is not None and not NAME_RULE.fullmatch(group)):
            return bad("user and group must be 1-32 letters, digits, '_', '.' or '-'")
        sub = hub.subscribe(user, group)

        async def events() -> AsyncIterator[bytes]:
            try:
                yield b": connected\n\n"
                while True:
                    try:
                        event = await asyncio.wait_for(sub.queue.get(), _KEEPALIVE_S)
                    except TimeoutError:
                        yield b": keepalive\n\n"
                        continue
                    yield _sse_data(event)
            finally:
                hub.unsubscribe(sub)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def echo(request: Request) -> Response:
        if not authorized(request):
            return denied()
        body = await json_body(request)
        if isinstance(body, Response):
            return body
        user, group, text = body.get("user"), body.get("group_id"), body.get("text")
        if not (isinstance(user, str) and NAME_RULE.fullmatch(user) and isinstance(group, str)
                and NAME_RULE.fullmatch(group) and isinstance(text, str)):  # fmt: skip
            return bad("echo needs user, group_id (names) and text")
        try:
            check_text("text", text, max_chars=text_limit)
        except InputError as exc:
            return exc.response()
        event = {"type": "message", "scene_type": "group", "scene_id": group, "user": user, "text": text,
                 "message_id": str(body.get("message_id", ""))}  # fmt: skip
        return JSONResponse({"ok": True, "receivers": hub.publish("group", group, event)})

    async def deliver(request: Request) -> Response:
        if not internal(request):
            return internal_denied()
        body = await json_body(request)
        if isinstance(body, Response):
            return body
        scene_type, scene_id, segments = body.get("scene_type"), body.get("scene_id"), body.get("segments")
        if scene_type not in ("private", "group", "channel") or not isinstance(scene_id, str):
            return bad("deliver needs scene_type (private|group|channel) and scene_id")
        if not isinstance(segments, list):
            return bad("deliver needs a segments array")
        message_id = hub.next_message_id()
        event = {"type": "reply", "scene_type": scene_type, "scene_id": scene_id, "message_id": message_id,
                 "bot_id": body.get("bot_id"), "reply_to": body.get("reply_to"),
                 "segments": segments}  # fmt: skip
        hub.publish(scene_type, scene_id, event)
        return JSONResponse({"ok": True, "message_id": message_id})

    async def agent_events(request: Request) -> Response:
        if not internal(request):
            return internal_denied()
        body = await json_body(request)
        if isinstance(body, Response):
            return body
        if not isinstance(body.get("event"), dict):
            return bad("events needs {session_key, event: {...}}")
        try:
            key = parse_session_key(str(body.get("session_key", "")))
        except SessionKeyError as exc:
            return bad(str(exc))
        event = {"type": "agent", "session_key": str(key), "event": scrub(body["event"], leak_policy)}
        return JSONResponse({"ok": True, "receivers": hub.publish(key.scope, key.scene_id, event)})

    async def sessions(request: Request) -> Response:
        if not authorized(request):
            return denied()
        user = request.query_params.get("user", "")
        if not NAME_RULE.fullmatch(user):
            return bad(f"`user` {_NAMES}")
        mastered = {bot for bot in masters.names if masters.is_master(request, user, bot)}
        if not mastered:
            named = [bot for bot, names in masters.names.items() if user in names]
            if named:
                return masters.refusal(user, named[0], "see live sessions")
            return JSONResponse(
                {"error": f"{user!r} is not a master of a console bot; only masters see live sessions"},
                status_code=403,
            )
        infos = [
            i.model_dump(mode="json") if hasattr(i, "model_dump") else i for i in await runtime.sessions()
        ]
        mine = [
            i
            for i in infos
            if valid_session_key(key := i.get("session_key"), "console")
            and parse_session_key(key).bot_id in mastered
        ]
        return JSONResponse({"sessions": mine})

    async def control(request: Request) -> Response:
        if not authorized(request):
            return denied()
        kind = request.path_params["kind"]
        if kind not in (ControlKind.STEER, ControlKind.FOLLOW_UP):
            return JSONResponse({"error": "not found"}, status_code=404)
        body = await json_body(request)
        if isinstance(body, Response):
            return body
        user, key, text = body.get("user"), body.get("session_key"), body.get("text")
        if not (isinstance(user, str) and isinstance(key, str) and isinstance(text, str) and text.strip()):
            return bad(f"{kind} needs user, session_key and a non-empty text")
        if not NAME_RULE.fullmatch(user):
            return bad("`user` must be 1-32 letters, digits, '_', '.' or '-'")
        try:
            parsed = parse_session_key(key)
        except SessionKeyError as exc:
            return bad(f"`session_key`: {exc}")
        platform = parsed.platform
        if platform != "console":
            return JSONResponse(
                {"error": f"the console may {kind} console sessions only (console:*), not {platform} "
                          f"ones: use the admin API (POST /admin/sessions/{{session_key}}/{kind} with "
                          "Authorization: Bearer <admin token>)"},
                status_code=403,
            )  # fmt: skip
        if not masters.is_master(request, user, parsed.bot_id):
            return masters.refusal(user, parsed.bot_id, kind.replace("_", "-"))
        try:
            check_text("text", text, max_chars=text_limit)
        except InputError as exc:
            return exc.response()
        try:
            asked = ControlRequest(kind=kind, session_key=key, text=text, sender_id=user)
            reply = await runtime.control(asked)
        except ControlError as exc:  # not a master 403, no live session 404 (the admin API's table)
            status = error_status(exc)
            if status is None:
                raise
            return JSONResponse({"error": str(exc) or type(exc).__name__}, status_code=status)
        return JSONResponse({"ok": True, "outcome": reply.result})

    return [
        Route("/console", page, methods=["GET"]),
        Route("/console/static/{name}", static, methods=["GET"]),
        Route("/favicon.ico", favicon, methods=["GET"]),
        Route("/console/api/info", info, methods=["GET"]),
        Route("/console/api/me", me, methods=["GET"]),
        Route("/console/api/history", history, methods=["GET"]),
        Route("/console/api/stream", stream, methods=["GET"]),
        Route("/console/api/echo", echo, methods=["POST"]),
        Route("/console/api/deliver", deliver, methods=["POST"]),
        Route("/console/api/events", agent_events, methods=["POST"]),
        Route("/console/api/sessions", sessions, methods=["GET"]),
        Route("/console/api/{kind:str}", control, methods=["POST"]),  # steer | follow_up
    ]
