"""Who is a console master, for the console's HTTP routes (:mod:`actors.http.console`): a name in the
bot's ``masters`` **and** the request's ``X-Console-Master-Token`` equal to the value of the bot's
``master_token_env`` (docs/decisions.md#security-console-master-proof). The webhook's own check of
the same rule is :meth:`runtime.platforms.console.ConsoleCodec.verify` / ``parse``; both use
:func:`~runtime.platforms.console.master_token_matches`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runtime.platforms.console import MASTER_TOKEN_HEADER, master_name_unproven, master_token_matches

__all__ = ["ConsoleMasters"]


class ConsoleMasters:
    """The masters of every console bot and the variables holding their proof.

    Args:
        bots: The console bots' config entries (``self_id``, ``masters``, ``master_token_env``).
    """

    def __init__(self, bots: Iterable[Any]) -> None:
        bots = list(bots)
        self.names: dict[str, set[str]] = {
            str(b.self_id): {str(m) for m in getattr(b, "masters", None) or ()} for b in bots
        }
        self._envs: dict[str, str | None] = {
            str(b.self_id): getattr(b, "master_token_env", None) for b in bots
        }

    def is_master(self, request: Request, user: str, bot: str) -> bool:
        """``user`` is a master of ``bot`` by name **and** the request proves it."""
        proof = request.headers.get(MASTER_TOKEN_HEADER)
        return user in self.names.get(bot, ()) and master_token_matches(proof, self._envs.get(bot))

    def any_token_set(self) -> bool:
        """Some console bot has a master token (``/console/api/info``: the page shows the field);
        without one a bot has no master, and a master's name is a plain name."""
        return any(env and os.environ.get(env) for env in self._envs.values())

    def unproven(self, request: Request, user: str, bot: str) -> bool:
        """``user`` is a master's name of ``bot``, a master token is set, and the request lacks the
        proof: what reads or writes under that name is refused (the name is reserved)."""
        proof = request.headers.get(MASTER_TOKEN_HEADER)
        return master_name_unproven(user, self.names.get(bot, ()), proof, self._envs.get(bot))

    def refusal(self, user: str, bot: str, what: str) -> Response:
        """The 403 of a master action (``what``) asked without a name in ``masters`` or without the
        proof, saying which is missing."""
        if user not in self.names.get(bot, ()):
            message = f"{user!r} is not a master of console bot {bot!r}; only masters may {what}"
        else:
            env = self._envs.get(bot)
            where = f"the value of ${env} on the server" if env else "none is set: see master_token_env"
            message = (
                f"{user!r} is a master name of console bot {bot!r}, but to {what} the request needs the "
                f"master token in {MASTER_TOKEN_HEADER} ({where}; `make run` prints it as the admin token)"
            )
        return JSONResponse({"error": message}, status_code=403)
