"""``sessionray chat``: the terminal client of the console platform.

With ``--url`` (e.g. ``sessionray chat --url http://127.0.0.1:8000``) the terminal talks to a
running ``sessionray serve`` exactly like the web console does: each line is POSTed to
``/webhooks/console/{bot}`` (so it goes through the ingress, the router, a session host, the
structured reply and a DeliveryActor), replies and live agent events arrive on the console's
Server-Sent-Events stream ``/console/api/stream`` and are printed segment by segment. ``/steer TEXT``
and ``/followup TEXT`` send control messages for the user's own session (masters only: a name in
``masters`` and the master token, ``X-Console-Master-Token`` from ``--master-token-env``, default
``$SESSIONRAY_ADMIN_TOKEN``, sent with every request over https or to this machine only; the
server answers 403 otherwise,
docs/decisions.md#security-console-master-proof). ``/help`` lists these commands (answered here,
never sent to the bot); ``/quit`` or Ctrl-D leaves. Agent events print as the standalone chat prints them
(:func:`actors.cli.chat.tool_call_line` / :func:`~actors.cli.chat.tool_result_line`). When stdin is
not a terminal (piped input), each line waits for its reply (up to ``--reply-timeout`` seconds)
before the next line is read, so ``echo hi | sessionray chat --url …`` prints the reply before it
exits.

Without ``--url`` the command runs the standalone terminal agent of :mod:`actors.cli.chat`.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import sys
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TextIO

import httpx

from actors.cli import chat as chat_cli
from runtime.keys import SessionKeyError, make_session_key
from runtime.platforms.console import MASTER_TOKEN_HEADER

__all__ = ["HELP", "build_parser", "describe_event", "main", "render_segments", "run_console_chat"]

HELP = (
    "commands: /steer TEXT (steer your session's running turn; masters only), "
    "/followup TEXT (queue a follow-up; masters only), /help, /quit or /exit (or Ctrl-D) to leave"
)
"""What ``/help`` prints in the console client (the standalone chat has its own commands)."""


def build_parser() -> argparse.ArgumentParser:
    """The ``sessionray chat`` parser: the standalone agent's options plus the console client's."""
    base = chat_cli.build_parser()
    p = argparse.ArgumentParser(
        prog="sessionray chat",
        description=(base.description or "")
        + " With --url it is instead the terminal client of a running `sessionray serve` "
        "(the console platform).",
        epilog=base.epilog,
        parents=[base],
        conflict_handler="resolve",
    )
    g = p.add_argument_group("console client (talk to a running `sessionray serve`)")
    g.add_argument("--url", help="base URL of the ingress, e.g. http://127.0.0.1:8000")
    g.add_argument(
        "--user",
        default="admin",
        help="your console user name (default: admin, the master with the master token)",
    )
    g.add_argument("--group", help="chat in this group scene instead of a private chat")
    g.add_argument("--bot", default="console", help="console bot id (default: console)")
    g.add_argument(
        "--token-env", default="CONSOLE_TOKEN", help="env var holding X-Console-Token, if the bot has one"
    )
    g.add_argument(
        "--master-token-env",
        default="SESSIONRAY_ADMIN_TOKEN",
        help="env var holding the console master token (X-Console-Master-Token; default "
        "SESSIONRAY_ADMIN_TOKEN, the admin token `make run` prints): a master name needs it to steer",
    )
    g.add_argument(
        "--reply-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="with piped input: how long to wait for each line's reply (default 120)",
    )
    return p


def render_segments(segments: list[dict[str, Any]]) -> str:
    """Plain-text rendering of canonical segments for a terminal (images as ``[image …]``,
    mentions as ``@id``); unknown types are shown by name, never dropped."""
    out: list[str] = []
    for seg in segments:
        kind, data = seg.get("type"), seg.get("data") or {}
        if kind == "text":
            out.append(str(data.get("text", "")))
        elif kind == "markdown":
            out.append(str(data.get("content", "")))
        elif kind == "mention":
            out.append(f"@{data.get('target', '')}")
        elif kind in ("image", "audio", "video", "file"):
            media = data.get("media") or {}
            value = str(media.get("value", ""))
            shown = value if media.get("kind") != "base64" else f"{len(value)} base64 chars"
            out.append(f"[{kind} {shown}]")
        elif kind == "share":
            out.append(f"{data.get('title', '')} <{data.get('url', '')}>")
        else:
            out.append(f"[{kind}{' ' + json.dumps(data, ensure_ascii=False) if data else ''}]")
    return "".join(out)


def describe_event(event: dict[str, Any]) -> str | None:
    """One console stream event as a terminal line (None: not shown): a reply as ``bot> TEXT``; an
    agent event (:func:`runtime.platforms.console.agent_event_payload`) as the standalone chat
    shows it: tool calls by :func:`actors.cli.chat.tool_call_line` /
    :func:`~actors.cli.chat.tool_result_line`, status and notices as ``[TEXT]``."""
    if event.get("type") == "reply":
        return "bot> " + render_segments(list(event.get("segments") or []))
    if event.get("type") != "agent":
        return None
    inner = event.get("event")
    if not isinstance(inner, dict):
        return None
    kind, name = inner.get("type"), str(inner.get("name", ""))
    if kind == "tool_call":
        return chat_cli.tool_call_line(name, inner.get("args"))
    if kind == "tool_result":
        result = inner.get("result")
        return chat_cli.tool_result_line(name, str(result or ""), is_error=bool(inner.get("is_error")))
    if kind in ("status", "notice"):
        return f"[{inner.get('text', '')}]"
    return f"[{kind}]" if isinstance(kind, str) else None


def _safe_for_secrets(url: str) -> bool:
    """``url`` is https, or plain http to this machine (a loopback address or ``localhost``): the
    only places the master token (by default the admin token) is sent to
    (docs/decisions.md#security-console-master-proof)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def run_console_chat(
    url: str,
    user: str,
    lines: AsyncIterator[str],
    write: Callable[[str], None],
    *,
    group: str | None = None,
    bot: str = "console",
    token: str | None = None,
    master_token: str | None = None,
    wait_replies: bool = False,
    reply_timeout_s: float = 120.0,
) -> int:
    """Chat with a running ingress as console user ``user``.

    Args:
        url: Ingress base URL.
        user: Console user name (1-32 letters, digits, ``_ . -``).
        lines: The user's input lines; the chat ends when it is exhausted or yields ``/quit``.
        write: Prints one output line.
        group: Group scene id, or None for the private chat with the bot.
        bot: Console bot id.
        token: ``X-Console-Token`` value when the bot has a secret.
        master_token: ``X-Console-Master-Token`` value: the proof a master name needs.
        wait_replies: After each message, wait for a reply on the stream (at most
            ``reply_timeout_s`` seconds; then ``[no reply within N s]`` is printed) before reading
            the next line: piped input, so the chat does not end before its replies arrive.
        reply_timeout_s: See ``wait_replies``.

    Returns:
        0; 1 when the server could not be reached; 2 when ``user``/``group``/``bot`` cannot form a
        session key.
    """
    headers: dict[bytes, bytes] = {b"X-Console-Token": token.encode()} if token else {}
    if master_token and _safe_for_secrets(url):
        headers[MASTER_TOKEN_HEADER.encode()] = master_token.encode()  # UTF-8: the server compares bytes
    elif master_token:
        write("note: the master token is not sent over plain http to another host (use https)")
    scene = {"scene": "group", "group_id": group} if group else {"scene": "private"}
    try:
        session_key = make_session_key("console", bot, "group" if group else "private", group or user)
    except SessionKeyError as exc:
        write(f"error: {exc}")
        return 2
    params = {"user": user, **({"group": group} if group else {})}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=httpx.Timeout(30, read=None)
    ) as client:
        try:
            async with client.stream("GET", "/console/api/stream", params=params) as stream:
                if stream.status_code != 200:
                    write(f"error: the event stream answered {stream.status_code}")
                    return 1
                replied = asyncio.Event()
                reader = asyncio.create_task(_read_events(stream.aiter_lines(), write, replied))
                try:
                    write(f"connected to {url} as {user} ({session_key}); /quit to leave")
                    async for line in lines:
                        text = line.strip()
                        if not text:
                            continue
                        if text in ("/quit", "/exit"):
                            break
                        if text == "/help":
                            write(HELP)
                            continue
                        replied.clear()
                        sent = await _send(client, text, user, bot, scene, session_key, write)
                        if sent and wait_replies:
                            try:
                                await asyncio.wait_for(replied.wait(), reply_timeout_s)
                            except TimeoutError:
                                write(f"[no reply within {reply_timeout_s:g} s]")
                finally:
                    reader.cancel()
        except httpx.TransportError as exc:
            write(f"error: cannot reach {url}: {exc}")
            return 1
    return 0


async def _read_events(
    lines: AsyncIterator[str], write: Callable[[str], None], replied: asyncio.Event
) -> None:
    """Print the stream's events (:func:`describe_event`); set ``replied`` on each reply."""
    async for line in lines:
        if line.startswith("data:"):
            try:
                event = json.loads(line[5:].strip())
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            shown = describe_event(event)
            if shown is not None:
                write(shown)
            if event.get("type") == "reply":
                replied.set()


async def _send(
    client: httpx.AsyncClient,
    text: str,
    user: str,
    bot: str,
    scene: dict[str, Any],
    session_key: str,
    write: Callable[[str], None],
) -> bool:
    """Send one line: a ``/steer`` / ``/followup`` control request (its answer is printed), else a
    chat message through the console webhook. Returns whether a chat message was accepted or
    queued (a reply is to be expected; a queued one is routed by the inbox recovery loop)."""
    for command, kind in (("/steer ", "steer"), ("/followup ", "follow_up")):
        if text.startswith(command):
            body = {"user": user, "session_key": session_key, "text": text[len(command) :]}
            r = await client.post(f"/console/api/{kind}", json=body)
            try:
                answer = r.json()
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                answer = {"error": f"HTTP {r.status_code}: {r.text.strip()[:200]}"}
            write(f"[{kind}: {answer.get('outcome') or answer.get('error')}]")
            return False
    event = {
        "user": user,
        **scene,
        "message_id": uuid.uuid4().hex,
        "text": text,
        "time_ms": int(time.time() * 1000),
    }
    r = await client.post(f"/webhooks/console/{bot}", json=event)
    if r.status_code != 200:
        write(f"error: the ingress answered {r.status_code}: {r.text.strip()}")
        return False
    try:
        accepted = r.json().get("status") in ("accepted", "queued")
    except (ValueError, AttributeError):
        accepted = False
    return accepted


async def _stdin_lines(stream: TextIO) -> AsyncIterator[str]:
    while True:
        line = await asyncio.to_thread(stream.readline)
        if not line:
            return
        yield line


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sessionray chat`` (uvloop); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if not args.url:
        return chat_cli.main(argv)
    import uvloop

    def write(line: str) -> None:
        print(line, flush=True)

    return uvloop.run(
        run_console_chat(
            args.url.rstrip("/"),
            args.user,
            _stdin_lines(sys.stdin),
            write,
            group=args.group,
            bot=args.bot,
            token=os.environ.get(args.token_env) or None,
            master_token=os.environ.get(args.master_token_env) or None,
            wait_replies=not sys.stdin.isatty(),
            reply_timeout_s=args.reply_timeout,
        )
    )
