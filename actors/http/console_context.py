"""What every console route group shares: the console bots, their tokens and masters, the hub, the
limits — and the checks each route starts with (browser token, internal token, JSON body, the
``(user, bot)`` of a query). Built once per app by :meth:`ConsoleContext.build`; the route groups
(:mod:`~actors.http.console`) close over it.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from actors.http.console_hub import ConsoleHub
from actors.http.console_masters import ConsoleMasters
from actors.http.input_checks import InputError, loads_json, max_text_chars
from runtime.memory.transcripts import TranscriptStore
from runtime.platforms.base import read_env
from runtime.platforms.common import is_json_content_type
from runtime.platforms.console import API_TOKEN_ENV, API_TOKEN_HEADER, NAME_RULE, api_token_matches
from runtime.reply.leak import LeakPolicy

__all__ = ["NAMES", "ConsoleContext", "bad"]

NAMES = "must be 1-32 letters, digits, '_', '.' or '-'"
"""How a 400 describes a name that does not match ``NAME_RULE``."""


def bad(message: str) -> Response:
    """A 400 naming what is wrong: ``{"error": message}``."""
    return JSONResponse({"error": message}, status_code=400)


@dataclass(frozen=True)
class ConsoleContext:
    """The console's shared state over a ``SessionRuntime`` (``runtime``).

    ``token`` is the browser token (``secret_env``'s value, ``None`` when unset: 127.0.0.1 only);
    ``text_limit`` is ``server.max_text_chars`` (characters); ``transcripts`` is where history
    reads (``None``: history answers 503).
    """

    runtime: Any
    hub: ConsoleHub
    token: str | None
    bot_ids: list[str]
    masters: ConsoleMasters
    text_limit: int
    leak_policy: LeakPolicy
    transcripts: TranscriptStore | None

    @classmethod
    def build(
        cls, runtime: Any, config: Any, bots: list[Any], hub: ConsoleHub, transcripts: TranscriptStore | None
    ) -> ConsoleContext:
        """The context of the console ``bots`` of ``config``.

        Raises:
            ValueError: the first console bot's ``secret_env`` names an unset variable.
        """
        return cls(
            runtime=runtime,
            hub=hub,
            token=read_env(getattr(bots[0], "secret_env", None), what="console token"),
            bot_ids=[str(b.self_id) for b in bots],
            masters=ConsoleMasters(bots),
            text_limit=max_text_chars(config),
            leak_policy=LeakPolicy.from_config(config),
            transcripts=transcripts,
        )

    def authorized(self, request: Request) -> bool:
        """Whether a browser request carries the console token (always, when none is set)."""
        if not self.token:
            return True
        got = request.headers.get("x-console-token") or request.query_params.get("token") or ""
        return hmac.compare_digest(got.encode(), self.token.encode())

    @staticmethod
    def denied() -> Response:
        """The 401 of a browser request without the console token."""
        return JSONResponse({"error": "missing or wrong X-Console-Token"}, status_code=401)

    @staticmethod
    def internal(request: Request) -> bool:
        """Whether a request carries ``X-Console-Api-Token`` (the internal endpoints' proof)."""
        return api_token_matches(request.headers.get(API_TOKEN_HEADER))

    @staticmethod
    def internal_denied() -> Response:
        """The 401 of an internal endpoint called without its token."""
        return JSONResponse(
            {"error": f"internal console endpoint: missing or wrong {API_TOKEN_HEADER} "
                      f"(the value of ${API_TOKEN_ENV} on the server)"},
            status_code=401,
        )  # fmt: skip

    @staticmethod
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

    def who(self, request: Request) -> tuple[str, str] | Response:
        """``(user, bot)`` from the query of a request carrying the console token (``bot`` defaults
        to the first console bot), or the response to answer: the 401 of :meth:`denied` without the
        token, a 400 for a bad ``user`` or an unknown ``bot``."""
        if not self.authorized(request):
            return self.denied()
        user = request.query_params.get("user", "")
        bot = request.query_params.get("bot") or self.bot_ids[0]
        if not NAME_RULE.fullmatch(user):
            return bad(f"`user` {NAMES}")
        if bot not in self.masters.names:
            return bad(f"`bot`: no console bot {bot!r} is configured")
        return user, bot
