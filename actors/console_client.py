"""``sessionray chat``: the terminal client of the console platform.

With ``--url`` (e.g. ``sessionray chat --url http://127.0.0.1:8000``) the terminal talks to a
running ``sessionray serve`` exactly like the web console does: each line is POSTed to
``/webhooks/console/{bot}`` (so it goes through the ingress, the router, a SessionActor, the
structured reply and a DeliveryActor), replies and live agent events arrive on the console's
Server-Sent-Events stream ``/console/api/stream`` and are printed segment by segment. ``/steer TEXT``
and ``/followup TEXT`` send control messages for the user's own session (masters only: the server
answers 403 otherwise). ``/quit`` or Ctrl-D leaves.

Without ``--url`` the command runs the standalone terminal agent of :mod:`actors.chat_cli`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TextIO

import httpx

from actors import chat_cli
from runtime.keys import SessionKeyError, make_session_key

__all__ = ["build_parser", "main", "render_segments", "run_console_chat"]


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
    g.add_argument("--user", default="admin", help="your console user name (default: admin, the master)")
    g.add_argument("--group", help="chat in this group scene instead of a private chat")
    g.add_argument("--bot", default="console", help="console bot id (default: console)")
    g.add_argument(
        "--token-env", default="CONSOLE_TOKEN", help="env var holding X-Console-Token, if the bot has one"
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


def _describe(event: dict[str, Any]) -> str | None:
    if event.get("type") == "reply":
        return "bot> " + render_segments(list(event.get("segments") or []))
    if event.get("type") == "agent":
        return f"[agent {json.dumps(event.get('event'), ensure_ascii=False)}]"
    return None


async def run_console_chat(
    url: str,
    user: str,
    lines: AsyncIterator[str],
    write: Callable[[str], None],
    *,
    group: str | None = None,
    bot: str = "console",
    token: str | None = None,
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

    Returns:
        0; 1 when the server could not be reached; 2 when ``user``/``group``/``bot`` cannot form a
        session key.
    """
    headers = {"X-Console-Token": token} if token else {}
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
                reader = asyncio.create_task(_read_events(stream.aiter_lines(), write))
                try:
                    write(f"connected to {url} as {user} ({session_key}); /quit to leave")
                    async for line in lines:
                        text = line.strip()
                        if not text:
                            continue
                        if text in ("/quit", "/exit"):
                            break
                        await _send(client, text, user, bot, scene, session_key, write)
                finally:
                    reader.cancel()
        except httpx.TransportError as exc:
            write(f"error: cannot reach {url}: {exc}")
            return 1
    return 0


async def _read_events(lines: AsyncIterator[str], write: Callable[[str], None]) -> None:
    async for line in lines:
        if line.startswith("data:"):
            try:
                shown = _describe(json.loads(line[5:].strip()))
            except ValueError:
                continue
            if shown is not None:
                write(shown)


async def _send(
    client: httpx.AsyncClient,
    text: str,
    user: str,
    bot: str,
    scene: dict[str, Any],
    session_key: str,
    write: Callable[[str], None],
) -> None:
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
            return
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
        )
    )
