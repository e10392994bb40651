"""The admin API's session controls: ``POST /admin/sessions/{session_key}/{kind}`` for every
:class:`~runtime.session.control.ControlKind` — ``steer`` and ``follow_up`` take
``{"text", "sender_id"}`` (masters only: docs/decisions.md#steer-masters-only), ``abort`` and
``archive`` no body (``archive`` of a passivated session archives its stored epoch through the
key's router shard). Each builds one ControlRequest and answers
``{"status": "ok", "kind", "session_key", "result"}``. Mounted by
:func:`actors.http.admin.admin_routes` behind its guard.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from actors.http.admin_guard import Guard, Handler, checked_key, error
from actors.http.admin_sessions import SESSION_PATH, StoredView
from actors.http.input_checks import InputError, check_text, check_unicode, loads_json, max_text_chars
from runtime.session.control import ControlKind, ControlReply, ControlRequest, UnknownSessionError

__all__ = ["control_routes"]


def _answer(reply: ControlReply) -> Response:
    """``{"status": "ok", "kind", "session_key", "result"}``."""
    return JSONResponse({"status": "ok", **reply.model_dump(mode="json")})


async def _text_and_sender(request: Request, runtime: Any) -> tuple[str, str] | Response:
    """``(text, sender_id)`` of a steer / follow-up body, or the 400/413 naming what is wrong."""
    try:
        body = loads_json(await request.body() or b"null")
    except InputError as exc:
        return exc.response()
    except ValueError:
        return error(400, 'body must be JSON: {"text": ..., "sender_id": ...}')
    if not isinstance(body, dict):
        return error(400, 'body must be a JSON object: {"text": ..., "sender_id": ...}')
    text, sender = body.get("text"), body.get("sender_id")
    try:
        text = check_text("text", text, max_chars=max_text_chars(getattr(runtime, "config", None)))
    except InputError as exc:
        return exc.response()
    if not isinstance(sender, str | int) or isinstance(sender, bool) or not str(sender).strip():
        return error(400, "`sender_id` must be a non-empty string")
    try:
        check_unicode("sender_id", str(sender))
    except InputError as exc:
        return exc.response()
    return text, str(sender)


def control_routes(guarded: Guard, runtime: Any, stored: StoredView) -> list[BaseRoute]:
    """One route per control kind, each wrapped by ``guarded``.

    Args:
        guarded: :func:`~actors.http.admin_guard.bearer_guard`'s wrapper.
        runtime: The session runtime handle (``control``, and ``config`` for the text limit).
        stored: Archives the stored epoch of a session that is not live.
    """

    def with_text(kind: ControlKind) -> Handler:
        async def endpoint(request: Request) -> Response:
            key = checked_key(request.path_params["session_key"])
            found = await _text_and_sender(request, runtime)
            if isinstance(found, Response):
                return found
            text, sender = found
            asked = ControlRequest(kind=kind, session_key=key, text=text, sender_id=sender)
            return _answer(await runtime.control(asked))

        return endpoint

    def simple(kind: ControlKind) -> Handler:
        async def endpoint(request: Request) -> Response:
            key = checked_key(request.path_params["session_key"])
            try:
                reply = await runtime.control(ControlRequest(kind=kind, session_key=key))
            except UnknownSessionError:
                # archive of a passivated session: its stored epoch, through its router shard
                if kind is not ControlKind.ARCHIVE:
                    raise
                new_id = await stored.archive(key)
                if new_id is None:
                    raise
                reply = ControlReply(kind=kind, session_key=key, result=new_id)
            return _answer(reply)

        return endpoint

    return [
        Route(
            f"{SESSION_PATH}/{kind}",
            guarded(with_text(kind) if kind.master_only else simple(kind)),
            methods=["POST"],
        )
        for kind in ControlKind
    ]
