"""Ray's authentication token for the local Ray of ``sessionray serve``
(docs/decisions.md#ops-ray-token-first-start).

With ``RAY_AUTH_MODE=token`` every Ray process, ``ray start --head`` included, needs a token. Ray
2.60 looks for it, in this order, in ``$RAY_AUTH_TOKEN``, in the file ``$RAY_AUTH_TOKEN_PATH`` and in
``~/.ray/auth_token``. ``ray.init()`` creates the last one when it starts a new local cluster and
finds none (64 hex digits, 256 random bits); ``ray start`` never does, so on a machine where no
``ray.init()`` ever ran the head did not start. :func:`ensure_local_token` does what ``ray.init()``
does, before the head starts, with the file readable by its owner only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["TOKEN_ENV", "TOKEN_PATH_ENV", "RayTokenError", "default_token_path", "ensure_local_token"]

TOKEN_ENV = "RAY_AUTH_TOKEN"
"""Ray's variable holding the token itself."""
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
"""Ray's variable naming a file that holds the token."""
TOKEN_BYTES = 32
"""Random bytes in a new token (written as 64 hex digits, as Ray writes its own)."""


class RayTokenError(RuntimeError):
    """No token can be found or created; the message is one line naming the file or variable."""


def default_token_path(environ: MutableMapping[str, str] | None = None) -> Path:
    """Ray's default token file: ``$HOME/.ray/auth_token`` (``~`` as Python expands it)."""
    env = os.environ if environ is None else environ
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".ray" / "auth_token"


def _shown(path: Path, environ: MutableMapping[str, str]) -> str:
    home = environ.get("HOME")
    if home and path.is_relative_to(home):
        return "~/" + str(path.relative_to(home))
    return str(path)


def _has_token(path: Path) -> bool:
    """``path`` is a regular file holding a token (not only whitespace); False when nothing is
    there (a dangling link included).

    Raises:
        RayTokenError: the path is there but not a regular file (a FIFO would block the read), or
            cannot be read.
    """
    try:
        if not path.exists():
            return False
        if not path.is_file():
            raise RayTokenError(f"Ray's token file {path} is not a regular file")
        return bool(path.read_text(errors="replace").strip())
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise RayTokenError(f"Ray's token file {path} cannot be read: {exc.strerror or exc}") from None


def _create(path: Path) -> bool:
    """Write a new token to ``path`` unless something is there already: the token goes to a
    temporary file of mode 0600 beside it, which is then hard-linked as ``path`` (an atomic
    create-if-absent: a start that fails half-way leaves no empty token file, and an existing file
    is never overwritten).

    Returns:
        True when this call created the file, False when another start had created it.

    Raises:
        RayTokenError: the directory or the file cannot be created or written.
    """
    tmp: str | None = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".auth_token.", dir=path.parent)  # mode 0600
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(TOKEN_BYTES))
            out.flush()
            os.fsync(out.fileno())
        os.link(tmp, path)
        return True
    except FileExistsError:
        if tmp is None:  # mkdir: the directory's path is a file
            raise RayTokenError(f"Ray's token directory {path.parent} is not a directory") from None
        return False  # another start created it meanwhile (or a dangling link is there)
    except OSError as exc:
        raise RayTokenError(
            f"Ray's token file {path} cannot be created ({exc.strerror or exc}): set {TOKEN_ENV} or "
            f"{TOKEN_PATH_ENV}, or RAY_AUTH_MODE=disabled"
        ) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def ensure_local_token(environ: MutableMapping[str, str] | None = None) -> str:
    """Make sure the local Ray finds a token when ``RAY_AUTH_MODE`` is ``token`` in ``environ``
    (default ``os.environ``): ``$RAY_AUTH_TOKEN`` set, or the file ``$RAY_AUTH_TOKEN_PATH`` holding
    one, or ``~/.ray/auth_token`` holding one — created when missing (directory mode 0700, file
    mode 0600, never overwritten). Other modes need nothing.

    Returns:
        Where the token comes from, for the banner: ``"$RAY_AUTH_TOKEN"``, a path, or
        ``"~/.ray/auth_token, created now"``; ``""`` when token authentication is off.

    Raises:
        RayTokenError: ``$RAY_AUTH_TOKEN_PATH`` names a missing or empty file (the operator's
            choice of file is not filled in) or a path that cannot be expanded, or the default file
            cannot be read or created, or is there without a token (never overwritten).
    """
    env = os.environ if environ is None else environ
    if env.get("RAY_AUTH_MODE", "").lower() != "token":
        return ""
    if env.get(TOKEN_ENV, "").strip():
        return f"${TOKEN_ENV}"
    if env.get(TOKEN_PATH_ENV):
        try:
            path = Path(env[TOKEN_PATH_ENV]).expanduser()
        except RuntimeError as exc:  # ~user that does not exist, or no home directory
            raise RayTokenError(f"{TOKEN_PATH_ENV}={env[TOKEN_PATH_ENV]}: {exc}") from None
        if not _has_token(path):
            what = "the file is missing or empty (Ray reads its token there)"
            raise RayTokenError(f"{TOKEN_PATH_ENV}={path}: {what}")
        return str(path)
    path = default_token_path(env)
    if _has_token(path):
        return _shown(path, env)
    created = _create(path)
    if not _has_token(path):
        raise RayTokenError(
            f"Ray's token file {path} is there but holds no token: remove it (it is never overwritten) "
            f"or set {TOKEN_ENV}"
        )
    return f"{_shown(path, env)}, created now" if created else _shown(path, env)
