"""Telegram long polling: one ``getUpdates`` loop per polling bot across the cluster
(``mode: polling``; docs/decisions.md#platform-telegram-polling).

:class:`TelegramPoller` is a detached named Ray actor, ``{prefix}-tgpoll-{self_id}`` in namespace
``sessionray`` (``sessionray-tgpoll-<bot id>`` under ``sessionray serve``), created with
``get_if_exists`` by :func:`start_pollers` — so every process that starts it gets the one poller
of that bot, and Ray restarts it after a crash (``max_restarts=-1``). Each incarnation:

1. calls ``deleteWebhook`` once (a set webhook makes ``getUpdates`` answer 409);
2. reads the committed offset (``runtime.memory.poll_offsets``) and loops ``getUpdates(offset,
   timeout=poll_timeout_s, allowed_updates)``;
3. runs each update through the webhook's own steps (:meth:`actors.inbound.ingress.Ingress.handle_event`:
   decode → size/storability checks → the bot's inbound policy → store → submit), as the bytes
   of its JSON (``verified=True``: the update came from an HTTPS call made with the bot token;
   it carries no webhook secret);
4. while the answer is 503 (the update could not be stored: SQL momentarily unavailable) it
   waits its ``Retry-After`` and runs the same update again — it never moves past an
   update that is not stored; any other answer (accepted, duplicate, queued — stored in the
   durable inbox, routed later by the recovery loop: docs/decisions.md#inbox-durable —, ignored,
   untriggered, denied, rate_limited, malformed) is final, and only then is
   ``offset = update_id + 1`` committed to SQL.

A crash between storing an update and committing its offset makes the next incarnation read the
update again: the inbox answers ``duplicate`` for a message it already holds (nothing is stored
or routed twice), so the update is neither skipped nor answered twice.

Failures of the Bot API calls: 429 waits ``parameters.retry_after`` (or ``Retry-After``); 5xx,
network errors and other 4xx back off exponentially (1 s doubling to 30 s); **409 Conflict**
(another ``getUpdates`` poller on the same token, or a webhook set again) is logged at ERROR with
Telegram's description, sets ``sessionray_telegram_poll_conflict{bot_id}`` to 1 and shows as
``state: "conflict"`` in :meth:`TelegramPoller.status` and ``GET /healthz``
(:func:`polling_health`); polling goes on with the back-off, so the poller takes over once the
other one stops. Every failure is counted in ``sessionray_telegram_poll_errors_total{reason}``.
The token is part of every URL: nothing here logs a URL (httpx's request log is silenced).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import httpx
import ray

from actors.inbound.ingress import Ingress
from actors.inbound.telegram_poll_status import NAMESPACE, poller_name, polling_bots
from actors.raylife.self_kick import kick_self
from runtime import metrics
from runtime.memory.poll_offsets import PollOffsetStore, create_poll_offsets_table
from runtime.platforms.base import get_codec
from runtime.platforms.common import parse_retry_after
from runtime.platforms.telegram_inbound import HANDLED_UPDATES, PLATFORM

__all__ = ["BACKOFF_MAX_S", "PollLoop", "TelegramPoller", "start_pollers", "stop_pollers"]

log = logging.getLogger("sessionray.telegram_poll")

BACKOFF_MAX_S = 30.0
"""Longest wait between failed Bot API calls (seconds); the first waits 1 s, then doubling."""
_HEADERS = {"content-type": "application/json"}
_RECENT_WAITS = 20


class _Failed(Exception):
    """A Bot API call that did not answer ``ok``: ``reason`` (metric label), ``wait_s``, ``text``."""

    def __init__(self, reason: str, wait_s: float | None, text: str) -> None:
        super().__init__(text)
        self.reason, self.wait_s, self.text = reason, wait_s, text


def _failure(status: int, headers: httpx.Headers, raw: bytes) -> _Failed:
    """Classify a Bot API answer that is not ``{"ok": true}`` (see the module docstring)."""
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    answer = answer if isinstance(answer, dict) else {}
    code = answer.get("error_code") if isinstance(answer.get("error_code"), int) else status
    text = f"HTTP {status}: {answer.get('description') or raw[:200].decode('utf-8', 'replace')!s}"
    if code == 409:
        return _Failed("conflict", None, text)
    if code == 429:
        params = answer.get("parameters")
        wait = params.get("retry_after") if isinstance(params, dict) else None
        if not isinstance(wait, int | float) or isinstance(wait, bool):
            wait = parse_retry_after(headers.get("retry-after"))
        return _Failed("rate_limited", None if wait is None else max(1.0, float(wait)), text)
    return _Failed("server_error" if status >= 500 else "http_error", None, text)


class PollLoop:
    """The polling loop of one bot (Ray-free; :class:`TelegramPoller` runs it).

    Args:
        bot: The ``bots:`` entry (``mode: polling``).
        config: The whole ``runtime.config.Config`` (database URL, server limits).
        runtime: A ``SessionRuntime`` (or anything with ``submit``), or a zero-argument callable
            returning one (called until it stops raising: the runtime may still be starting).
    """

    def __init__(self, bot: Any, config: Any, runtime: Any) -> None:
        self.bot = bot
        self.codec: Any = get_codec(bot)
        self.bot_id = str(bot.self_id)
        self.timeout_s = int(bot.poll_timeout_s)
        self.allowed = list(bot.allowed_updates) if bot.allowed_updates is not None else list(HANDLED_UPDATES)
        self.max_body_bytes = int(config.server.max_body_bytes)
        self.ingress = Ingress(None, config)  # the webhook's steps; its runtime is set on connect
        assert self.ingress.db is not None  # (it made its own: no transcript store was given)
        self.db = self.ingress.db
        self.offsets = PollOffsetStore(self.db)
        self._runtime = runtime
        self.offset: int | None = None
        self.state = "starting"
        self.error: str | None = None
        self.holding: int | None = None
        """The update id being retried (its turn refused for now), else None."""
        self.updates = 0
        self.waits: list[dict[str, Any]] = []
        self._backoff = 1.0

    def status(self) -> dict[str, Any]:
        """``{"bot_id", "state", "offset", "error", "holding", "updates", "waits"}`` — ``state``:
        ``starting`` | ``polling`` | ``conflict`` | ``rate_limited`` | ``server_error`` |
        ``network`` | ``http_error`` | ``retrying`` (an update's turn refused for now) |
        ``error``; ``waits``: the last 20 waits ``{"reason", "wait_s"}``."""
        return {
            "bot_id": self.bot_id,
            "state": self.state,
            "offset": self.offset,
            "error": self.error,
            "holding": self.holding,
            "updates": self.updates,
            "waits": list(self.waits),
        }

    async def _wait(self, reason: str, wait_s: float | None) -> None:
        """Sleep ``wait_s`` (None: the exponential back-off, which then doubles up to 30 s)."""
        if wait_s is None:
            wait_s, self._backoff = self._backoff, min(BACKOFF_MAX_S, self._backoff * 2)
        self.waits = [*self.waits[-(_RECENT_WAITS - 1) :], {"reason": reason, "wait_s": wait_s}]
        await asyncio.sleep(wait_s)

    async def _api(self, client: httpx.AsyncClient, method: str, payload: dict[str, Any]) -> Any:
        """One Bot API call; its ``result``. A failure is recorded, waited out, then raised.

        Raises:
            _Failed: the call failed (after the wait it asks for).
        """
        try:
            resp = await client.post(self.codec.method_path(method), json=payload)
            failed = (
                None if resp.status_code == 200 else _failure(resp.status_code, resp.headers, resp.content)
            )
            answer = resp.json() if failed is None else None
            if failed is None and not (isinstance(answer, dict) and answer.get("ok") is True):
                failed = _Failed("http_error", None, f"{method}: not an ok answer")
        except httpx.TransportError as exc:
            failed = _Failed("network", None, f"{method}: {type(exc).__name__}")
        except ValueError:
            failed = _Failed("http_error", None, f"{method}: the answer is not JSON")
        if failed is None:
            if self.state == "conflict":
                log.warning("telegram bot %s: polling again (the conflict is over)", self.bot_id)
            metrics.TELEGRAM_POLL_CONFLICT.set(0, bot_id=self.bot_id)
            self.state, self.error, self._backoff = "polling", None, 1.0
            return answer.get("result") if isinstance(answer, dict) else None
        metrics.TELEGRAM_POLL_ERRORS.inc(reason=failed.reason)
        self.state, self.error = failed.reason, failed.text
        if failed.reason == "conflict":
            metrics.TELEGRAM_POLL_CONFLICT.set(1, bot_id=self.bot_id)
            log.error(
                "telegram bot %s: %s answered 409 Conflict (%s) — another getUpdates poller uses this "
                "token, or a webhook is set; stop the other one (polling retries with back-off)",
                self.bot_id, method, failed.text,
            )  # fmt: skip
        else:
            log.warning(
                "telegram bot %s: %s failed (%s): %s", self.bot_id, method, failed.reason, failed.text
            )
        await self._wait(failed.reason, failed.wait_s)
        raise failed

    async def _connect(self) -> None:
        """Tables, the committed offset and the session runtime (retried until they are there)."""
        while True:
            try:
                await self.db.run(self.db.create_tables)
                await self.db.run(lambda: create_poll_offsets_table(self.db))
                self.offset = await self.offsets.load(PLATFORM, self.bot_id)
                runtime = self._runtime() if callable(self._runtime) else self._runtime
                self.ingress.runtime = runtime
                return
            except Exception as exc:
                log.warning("telegram bot %s: not ready to poll yet: %r", self.bot_id, exc)
                self.state, self.error = "error", f"not ready: {type(exc).__name__}"
                await self._wait("starting", None)

    async def run(self) -> None:
        """Poll until cancelled (see the module docstring); never returns otherwise."""
        logging.getLogger("httpx").setLevel(logging.WARNING)  # its request log line holds the token
        timeout = httpx.Timeout(10.0, read=self.timeout_s + 15.0)
        async with httpx.AsyncClient(base_url=self.codec.api_base, timeout=timeout) as client:
            while True:
                with contextlib.suppress(_Failed):
                    await self._api(client, "deleteWebhook", {"drop_pending_updates": False})
                    break
            await self._connect()  # the committed offset is read once the webhook is gone
            while True:
                try:
                    await self._poll_once(client)
                except _Failed:
                    continue
                except Exception as exc:  # SQL down for longer than its retries, a bug: re-read
                    log.exception("telegram bot %s: polling failed", self.bot_id)
                    self.state, self.error = "error", type(exc).__name__
                    await self._wait("error", None)
                    self.offset = await _or_none(self.offsets.load(PLATFORM, self.bot_id), self.offset)

    async def _poll_once(self, client: httpx.AsyncClient) -> None:
        payload: dict[str, Any] = {"timeout": self.timeout_s, "allowed_updates": self.allowed}
        if self.offset is not None:
            payload["offset"] = self.offset
        result = await self._api(client, "getUpdates", payload)
        for update in result if isinstance(result, list) else []:
            await self._take(update)

    async def _take(self, update: Any) -> None:
        """Run one update through the webhook's steps until its answer is final, then commit its offset."""
        uid = update.get("update_id") if isinstance(update, dict) else None
        if not isinstance(uid, int) or isinstance(uid, bool) or not 0 <= uid < 2**63 - 1:
            uid = None  # the codec refuses it as malformed; there is no offset to move past it by
        elif self.offset is not None and uid < self.offset:
            return  # stored and committed before
        body = json.dumps(update, ensure_ascii=True).encode()  # \ud800 stays an escape, as sent
        if len(body) > self.max_body_bytes:
            log.warning("telegram bot %s: update %s over server.max_body_bytes: dropped", self.bot_id, uid)
            metrics.INBOUND.inc(platform=PLATFORM, outcome="malformed")
        else:
            await self._until_final(uid, body)
        if uid is not None:
            await self.offsets.commit(PLATFORM, self.bot_id, uid + 1)
            self.offset = uid + 1
        self.updates += 1

    async def _until_final(self, uid: int | None, body: bytes) -> None:
        while True:
            try:
                answer = await self.ingress.handle_event(PLATFORM, self.codec, _HEADERS, body, verified=True)
            except Exception as exc:  # what the webhook answers 500: run the same update again
                log.exception("telegram bot %s: update %s failed", self.bot_id, uid)
                metrics.INBOUND.inc(platform=PLATFORM, outcome="error")
                self.holding, self.state, self.error = uid, "retrying", type(exc).__name__
                await self._wait("error", None)
                continue
            if answer.status_code != 503:
                break
            reason = (
                "backpressure" if json.loads(bytes(answer.body)).get("status") == "busy" else "unavailable"
            )
            self.holding, self.state, self.error = uid, "retrying", reason
            await self._wait(reason, parse_retry_after(answer.headers.get("retry-after")) or 1.0)
        self.holding, self._backoff = None, 1.0
        if self.state == "retrying":
            self.state, self.error = "polling", None


async def _or_none(coro: Any, default: Any) -> Any:
    try:
        return await coro
    except Exception:
        return default


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class TelegramPoller:
    """The poller actor of one bot (see the module docstring).

    Args:
        config: ``runtime.config.Config``.
        self_id: The polling bot's ``self_id``.
        prefix: Name prefix of the session runtime's actors it submits to (``sessionray``).

    Raises:
        ValueError: no ``mode: polling`` bot ``self_id``; its token variable is unset.
    """

    def __init__(self, config: Any, self_id: str, prefix: str = "sessionray") -> None:
        from actors.placement.runtime import SessionRuntime
        from actors.raylife.metrics import install_ray_metrics

        install_ray_metrics()
        logging.basicConfig(level=logging.INFO)
        bot = next((b for b in polling_bots(config) if str(b.self_id) == str(self_id)), None)
        if bot is None:
            raise ValueError(f"no telegram bot {self_id} with mode: polling is configured")
        self.loop = PollLoop(bot, config, lambda: SessionRuntime.connect(config, prefix))
        self._task: asyncio.Task[None] | None = None
        # Start polling as soon as this incarnation runs (also after a restart, when no one calls).
        kick_self("ready", f"the poller of telegram bot {self_id}")

    async def ready(self) -> dict[str, Any]:
        """Start the loop (idempotent); :meth:`status`."""
        if self._task is None:
            self._task = asyncio.create_task(self.loop.run())
        return self.loop.status()

    async def status(self) -> dict[str, Any]:
        """:meth:`PollLoop.status` of this incarnation."""
        return self.loop.status()

    async def stop(self) -> None:
        """Cancel the loop (an update in progress is read again by the next poller)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    async def pid(self) -> int:
        """This actor's OS process id (tests kill it with SIGKILL)."""
        import os

        return os.getpid()


def start_pollers(config: Any, prefix: str = "sessionray") -> list[Any]:
    """Create (or attach to) the poller of every ``mode: polling`` bot; their handles. Ray must be
    initialized and the session runtime started under ``prefix`` (a poller waits for it)."""
    return [
        TelegramPoller.options(  # type: ignore[attr-defined]
            name=poller_name(str(b.self_id), prefix),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
        ).remote(config, str(b.self_id), prefix)
        for b in polling_bots(config)
    ]


async def stop_pollers(config: Any, prefix: str = "sessionray") -> None:
    """Stop and kill the poller of every ``mode: polling`` bot that runs (no restart)."""
    for bot in polling_bots(config):
        try:
            handle = ray.get_actor(poller_name(str(bot.self_id), prefix), namespace=NAMESPACE)
        except ValueError:
            continue
        with contextlib.suppress(Exception):
            await asyncio.wait_for(handle.stop.remote(), timeout=5)
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)
