"""``.ci/run`` leans on nothing the machine kept (README.md, Development): it runs ``make test`` and
then ``make smoke`` (the README's ``make run`` end to end) with ``HOME`` a new empty directory,
removed afterwards, keeping PATH and the PIP_* variables; any failure of either fails it.

``make`` is replaced by a stand-in first on PATH that records its arguments, its HOME and what that
HOME holds, and exits with the code the test asks for (the real targets are tested elsewhere)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_MAKE = """#!/usr/bin/env python3
import json, os, sys
calls = os.environ["CI_CALLS"]
home = os.environ["HOME"]
entry = {"argv": sys.argv[1:], "home": home, "home_holds": sorted(os.listdir(home)),
         "pip": os.environ.get("PIP_FIND_LINKS"), "pyenv_root": os.environ.get("PYENV_ROOT")}
with open(calls, "a") as out:
    out.write(json.dumps(entry) + "\\n")
fail = os.environ.get("CI_FAIL_TARGET")
sys.exit(int(os.environ.get("CI_FAIL_CODE", "2")) if fail and fail in sys.argv[1:] else 0)
"""


def run_ci(tmp_path: Path, **extra: str) -> tuple[int, list[dict[str, object]], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text(FAKE_MAKE)
    (bin_dir / "make").chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CI_CALLS": str(calls),
           "PIP_FIND_LINKS": "/somewhere/wheels", "TMPDIR": str(tmp_path), **extra}  # fmt: skip
    proc = subprocess.run(
        [str(ROOT / ".ci" / "run")], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    lines = calls.read_text().splitlines() if calls.exists() else []
    return proc.returncode, [json.loads(ln) for ln in lines], proc.stdout + proc.stderr


def test_the_suite_and_the_smoke_run_with_an_empty_home(tmp_path: Path) -> None:
    code, calls, out = run_ci(tmp_path)
    assert code == 0, out
    assert [c["argv"][0] for c in calls] == ["test", "smoke"], calls
    assert calls[1]["argv"][1].startswith("SMOKE_ARGS=--timeout-s ")
    homes = {str(c["home"]) for c in calls}
    assert len(homes) == 1
    [home] = homes
    assert home != os.environ.get("HOME") and home.startswith(str(tmp_path))
    assert all(c["home_holds"] == [] for c in calls)  # nothing in it: no ~/.ray, no caches
    assert all(c["pip"] == "/somewhere/wheels" for c in calls)  # the environment's PIP_* kept
    assert all(c["pyenv_root"] == os.environ.get("PYENV_ROOT") for c in calls)
    assert not Path(home).exists()  # removed afterwards
    assert "is Python 3." in out  # python3 still resolves with the empty HOME


@pytest.mark.parametrize(("target", "fail_code"), [("test", "2"), ("smoke", "2"), ("test", "5")])
def test_a_failure_of_either_fails_ci(tmp_path: Path, target: str, fail_code: str) -> None:
    code, calls, out = run_ci(tmp_path, CI_FAIL_TARGET=target, CI_FAIL_CODE=fail_code)
    assert code != 0, out
    assert [c["argv"][0] for c in calls] == (["test"] if target == "test" else ["test", "smoke"])
