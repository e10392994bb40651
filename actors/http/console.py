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

from typing import Any

from starlette.routing import BaseRoute

from actors.http.console_context import ConsoleContext
from actors.http.console_control import control_routes
from actors.http.console_history import history_routes
from actors.http.console_hub import ConsoleHub
from actors.http.console_login import login_routes
from actors.http.console_page import page_routes
from actors.http.console_publish import publish_routes
from actors.http.console_stream import stream_routes
from runtime.memory.transcripts import TranscriptStore
from runtime.platforms.console import require_console_api_token

__all__ = ["ConsoleHub", "console_routes"]


def console_routes(
    runtime: Any,
    config: Any,
    hub: ConsoleHub | None = None,
    *,
    transcripts: TranscriptStore | None = None,
) -> list[BaseRoute]:
    """The console routes (module docstring) over a ``SessionRuntime`` and the config: the route
    groups of the page (:mod:`~actors.http.console_page`), who the browser is
    (:mod:`~actors.http.console_login`), history (:mod:`~actors.http.console_history`), the live
    stream (:mod:`~actors.http.console_stream`), what the hub fans out
    (:mod:`~actors.http.console_publish`) and the masters' controls
    (:mod:`~actors.http.console_control`, last: its ``/console/api/{kind}`` matches any name).

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
    ctx = ConsoleContext.build(runtime, config, bots, hub or ConsoleHub(), transcripts)
    return [
        *page_routes(),
        *login_routes(ctx),
        *history_routes(ctx),
        *stream_routes(ctx),
        *publish_routes(ctx),
        *control_routes(ctx),
    ]
