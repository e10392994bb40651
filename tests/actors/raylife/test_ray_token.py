"""Ray's authentication token for the local Ray (actors/raylife/auth_token.py,
docs/decisions.md#ops-ray-token-first-start): created on the first start in an empty HOME as
``ray.init()`` would (64 hex digits, owner-only), never overwritten, and a clear one-line error
when it can neither be found nor created. The real ``ray start`` accepting it is
tests/actors/serve/test_serve_first_run.py."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from actors.raylife.auth_token import RayTokenError, ensure_local_token
from actors.serve.banner import quiet_ray_auth


def test_an_empty_home_gets_a_token_file_once(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "RAY_AUTH_MODE": "token"}
    assert ensure_local_token(env) == "~/.ray/auth_token, created now"
    token_file = tmp_path / ".ray" / "auth_token"
    token = token_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    assert ensure_local_token(env) == "~/.ray/auth_token"  # found, not made again
    assert token_file.read_text() == token


def test_an_existing_token_is_kept_and_other_sources_create_nothing(tmp_path: Path) -> None:
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("mine\n")
    assert ensure_local_token({"HOME": str(tmp_path), "RAY_AUTH_MODE": "token"}) == "~/.ray/auth_token"
    assert (tmp_path / ".ray" / "auth_token").read_text() == "mine\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"HOME": str(empty), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "abc"}
    assert ensure_local_token(env) == "$RAY_AUTH_TOKEN"
    mine = tmp_path / "tok"
    mine.write_text("x")
    env = {"HOME": str(empty), "RAY_AUTH_MODE": "TOKEN", "RAY_AUTH_TOKEN_PATH": str(mine)}
    assert ensure_local_token(env) == str(mine)
    assert ensure_local_token({"HOME": str(empty), "RAY_AUTH_MODE": "disabled"}) == ""
    assert list(empty.iterdir()) == []


def test_a_token_that_cannot_be_found_or_made_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    env = {"HOME": str(tmp_path), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(missing)}
    with pytest.raises(RayTokenError, match=r"^RAY_AUTH_TOKEN_PATH=.*/nope: the file is missing or empty"):
        ensure_local_token(env)
    assert not missing.exists() and not (tmp_path / ".ray").exists()
    home_is_a_file = tmp_path / "file"
    home_is_a_file.write_text("")
    with pytest.raises(RayTokenError) as err:
        ensure_local_token({"HOME": str(home_is_a_file), "RAY_AUTH_MODE": "token"})
    assert "\n" not in str(err.value) and "cannot be created" in str(err.value)
    assert "RAY_AUTH_MODE=disabled" in str(err.value)


def test_the_banner_line_says_where_the_token_is_and_whether_it_was_made(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert quiet_ray_auth(env) == (
        "sessionray: Ray            local; token authentication on (token: ~/.ray/auth_token, created now; "
        "`RAY_AUTH_MODE=token ray status` uses it too)"
    )
    assert env["RAY_AUTH_MODE"] == "token"
    assert "(token: ~/.ray/auth_token;" in quiet_ray_auth(env)


def test_a_default_token_file_without_a_token_is_an_error_never_overwritten(tmp_path: Path) -> None:
    """An empty ``~/.ray/auth_token``, a dangling link there, or ``~/.ray`` as a plain file was
    reported as found (Ray then failed on its own); each is one line, and nothing is replaced."""
    env = {"HOME": str(tmp_path), "RAY_AUTH_MODE": "token"}
    token_file = tmp_path / ".ray" / "auth_token"
    token_file.parent.mkdir()
    token_file.write_text("  \n")
    with pytest.raises(RayTokenError, match=r"auth_token is there but holds no token: remove it"):
        ensure_local_token(env)
    assert token_file.read_text() == "  \n"
    token_file.unlink()
    token_file.symlink_to(tmp_path / "gone")
    with pytest.raises(RayTokenError, match=r"holds no token"):
        ensure_local_token(env)
    assert token_file.is_symlink() and not (tmp_path / "gone").exists()
    assert [p.name for p in token_file.parent.iterdir()] == ["auth_token"]  # no temporary file left
    other = tmp_path / "other"
    other.mkdir()
    (other / ".ray").write_text("")
    with pytest.raises(RayTokenError, match=r"\.ray is not a directory$"):
        ensure_local_token({"HOME": str(other), "RAY_AUTH_MODE": "token"})


def test_a_token_write_that_fails_leaves_no_token_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails half-way (a full disk, a file-size limit) left an empty ``auth_token``
    that the next start took for a token, and a traceback; now one line and no file."""

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("actors.raylife.auth_token.os.fsync", full)
    with pytest.raises(RayTokenError, match=r"cannot be created \(No space left on device\)"):
        ensure_local_token({"HOME": str(tmp_path), "RAY_AUTH_MODE": "token"})
    assert list((tmp_path / ".ray").iterdir()) == []


def test_a_token_path_that_is_a_fifo_or_cannot_be_expanded_is_one_line(tmp_path: Path) -> None:
    """A FIFO named by ``RAY_AUTH_TOKEN_PATH`` blocked the start for ever; ``~nosuchuser/…`` ended
    it with a traceback."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env = {"HOME": str(tmp_path), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(fifo)}
    with pytest.raises(RayTokenError, match=r"fifo is not a regular file$"):
        ensure_local_token(env)
    env["RAY_AUTH_TOKEN_PATH"] = "~nosuchuser-sessionray/tok"
    with pytest.raises(RayTokenError, match=r"^RAY_AUTH_TOKEN_PATH=~nosuchuser-sessionray/tok: "):
        ensure_local_token(env)
