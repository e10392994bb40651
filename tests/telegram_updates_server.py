"""The Telegram Bot API stand-in of :mod:`tests.platform_api_server`, plus ``getUpdates`` and
``deleteWebhook`` as a polling bot sees them (on 127.0.0.1, real HTTP).

``getUpdates`` follows the Bot API's rules: an update counts as confirmed (and is never returned
again) once ``getUpdates`` is called with an ``offset`` above its ``update_id``; the answer is the
pending updates of the ``allowed_updates`` types, oldest first (at most ``limit``, default 100);
with none pending the call waits up to ``timeout`` seconds for one (long polling) and answers
``[]``. ``send*`` methods answer as :class:`~tests.platform_api_server.PlatformApiServer` does
(recorded in ``requests``, distinct message ids).

Scripts for tests:

* :meth:`push` — queue updates (all at once: one ``getUpdates`` can return them together);
* :meth:`fail_polls` — the next ``n`` ``getUpdates`` calls answer ``status`` with a JSON body;
* :meth:`hold` / :meth:`release` — calls of a method wait (the caller is parked) until released;
  :meth:`arrivals` counts calls that reached the server (held or not).

Every ``getUpdates`` is recorded in :attr:`polls` (arrival time on ``time.monotonic()`` and the
JSON payload); waits are event-driven (:meth:`wait_until`), never sleep-polling.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.platform_api_server import TELEGRAM_PATH, PlatformApiServer

__all__ = ["Poll", "TelegramUpdatesServer"]

T = TypeVar("T")
_POLL_METHODS = frozenset({"getUpdates", "deleteWebhook"})


@dataclass(frozen=True)
class Poll:
    """One ``getUpdates`` call: when it arrived (``time.monotonic()``) and its payload."""

    at: float
    payload: dict[str, Any]

    @property
    def offset(self) -> int | None:
        """The ``offset`` asked for (None: none given)."""
        value = self.payload.get("offset")
        return value if isinstance(value, int) else None


class TelegramUpdatesServer(PlatformApiServer):
    """See the module docstring. Start with ``with`` or :meth:`start`."""

    def __init__(self, fixtures_dir: Path) -> None:
        super().__init__(fixtures_dir, vary_message_ids=True)
        # re-entrant: wait_until's predicates may call arrivals() under the lock
        self._lock = threading.RLock()  # type: ignore[assignment]
        self._cond = threading.Condition(self._lock)
        self.pending: list[dict[str, Any]] = []
        """Updates not confirmed yet, oldest first."""
        self.polls: list[Poll] = []
        self._poll_failures: list[tuple[int, bytes]] = []
        self._held: set[str] = set()
        self._arrivals: Counter[str] = Counter()
        self._closed = False

    # ------------------------------------------------------------------ scripting

    def push(self, *updates: dict[str, Any]) -> None:
        """Queue ``updates`` (each with its ``update_id``) at once."""
        with self._cond:
            self.pending.extend(updates)
            self._cond.notify_all()

    def fail_polls(self, n: int, status: int, body: dict[str, Any]) -> None:
        """Answer the next ``n`` ``getUpdates`` calls with ``status`` and ``body`` (JSON)."""
        with self._cond:
            self._poll_failures += [(status, json.dumps(body).encode())] * n

    def hold(self, method: str) -> None:
        """Park every call of ``method`` (``getUpdates`` / ``deleteWebhook``) until :meth:`release`."""
        with self._cond:
            self._held.add(method)

    def release(self, method: str) -> None:
        """Let the parked and later calls of ``method`` through."""
        with self._cond:
            self._held.discard(method)
            self._cond.notify_all()

    def arrivals(self, method: str) -> int:
        """Calls of ``method`` that reached the server so far (held ones included)."""
        with self._cond:
            return self._arrivals[method]

    def wait_until(self, predicate: Callable[[], T], timeout_s: float = 60.0, what: str = "condition") -> T:
        """Block until ``predicate()`` (called under the server's lock) is truthy; its value.

        Raises:
            TimeoutError: not within ``timeout_s`` seconds.
        """
        with self._cond:
            value = self._cond.wait_for(predicate, timeout=timeout_s)
        if not value:
            raise TimeoutError(f"{what} not reached within {timeout_s} s")
        return value

    def stop(self) -> None:
        """Wake every parked call (they answer at once), then stop the server."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        super().stop()

    # ------------------------------------------------------------------ answering

    def _answer(
        self, method: str, path: str, raw_headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        match = TELEGRAM_PATH.match(path.split("?", 1)[0])
        name = match.group("method") if match else ""
        if name not in _POLL_METHODS:
            return super()._answer(method, path, raw_headers, body)
        payload = json.loads(body) if body else {}
        with self._cond:
            self._arrivals[name] += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: name not in self._held or self._closed)
            if name == "deleteWebhook":
                return 200, b'{"ok":true,"result":true,"description":"Webhook was deleted"}', {}
            self.polls.append(Poll(time.monotonic(), payload))
            self._cond.notify_all()
            if self._poll_failures:
                status, out = self._poll_failures.pop(0)
                return status, out, {}
            offset = payload.get("offset")
            if isinstance(offset, int):
                self.pending = [u for u in self.pending if u["update_id"] >= offset]
            allowed = payload.get("allowed_updates") or []
            limit = int(payload.get("limit", 100))

            def ready() -> list[dict[str, Any]]:
                return [u for u in self.pending if not allowed or any(k in u for k in allowed)][:limit]

            self._cond.wait_for(lambda: ready() or self._closed, timeout=float(payload.get("timeout", 0)))
            return 200, json.dumps({"ok": True, "result": ready()}).encode(), {}
