"""``make chaos``: every chaos scenario of issue #16 at full size, a table of figures, and
build/bench/results.json updated under ``"chaos"`` (the other keys of that file are kept).

The harness (tests/chaos/*.py): a real ``sessionray serve`` subprocess per scenario
(:mod:`tests.chaos.serve`) with a OneBot v11 bot sending to a platform-API stand-in that can fail
(:mod:`tests.chaos.platform`); an open-loop webhook load, by default 10 chats × 2 msg/s for 60 s,
from a redelivering client (:mod:`tests.chaos.load`); faults by process and platform outages
(:mod:`tests.chaos.faults`); the scenarios (:mod:`tests.chaos.scenarios`) and their figures
(:mod:`tests.chaos.figures`; docs/operations.md, "Chaos suite", says how to read them). The CI
subset is tests/chaos/test_chaos_ci.py.

Usage::

    python -m tests.chaos                       # every scenario, redelivering client
    python -m tests.chaos host_kill outage_500_10s
    python -m tests.chaos --client once         # OneBot's usual client: no redelivery
    python -m tests.chaos --list
    python -m tests.chaos --quick               # the CI subset's scenarios and size, a serve each

Figures of the ``once`` client are stored under ``chaos_once``. Serve logs of the last run are
kept in build/chaos/<scenario>/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "bench" / "results.json"
LOGS = ROOT / "build" / "chaos"


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("scenarios", nargs="*", help="scenario names (default: all)")
    p.add_argument("--client", choices=("redelivering", "once"), default="redelivering")
    p.add_argument("--quick", action="store_true", help="the CI size per scenario")
    p.add_argument("--list", action="store_true", help="print the scenario names and exit")
    return p.parse_args(argv)


def _interrupted(signum: int, frame: Any) -> None:
    """Ctrl-C: kill every process of the running scenario's serve and exit at once (the load's
    tasks and threads are not waited for)."""
    from tests.chaos.serve import Topology

    print("\nchaos: interrupted; killing the serve processes of the running scenario", file=sys.stderr)
    for topo in list(Topology.running):
        topo.close(grace_s=0)
        shutil.rmtree(topo.dir, ignore_errors=True)
    os._exit(130)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    signal.signal(signal.SIGINT, _interrupted)
    from tests.chaos.figures import table
    from tests.chaos.scenarios import CI, FULL, ci_scenarios, full_scenarios, run_fresh

    args = _args(argv)
    size = CI if args.quick else FULL
    every = ci_scenarios() if args.quick else full_scenarios(size)
    if args.list:
        print("\n".join(s.name for s in every))
        return 0
    unknown = set(args.scenarios) - {s.name for s in every}
    if unknown:
        print(f"unknown scenarios: {', '.join(sorted(unknown))} (see --list)", file=sys.stderr)
        return 2
    chosen = [s for s in every if not args.scenarios or s.name in args.scenarios]
    fixtures = ROOT / "tests" / "fixtures"
    key = "chaos" if args.client == "redelivering" else "chaos_once"
    results: dict[str, Any] = {}
    for scenario in chosen:
        print(f"== chaos {scenario.name}", flush=True)
        t0 = time.monotonic()
        results[scenario.name] = run_fresh(
            scenario, size, fixtures, redeliver=args.client == "redelivering", keep_dir=LOGS
        )
        results[scenario.name]["size"] = {
            "chats": size.chats, "rate_per_chat": size.rate_per_chat, "duration_s": size.duration_s,
        }  # fmt: skip
        print(
            f"   ({time.monotonic() - t0:.0f} s) {json.dumps(results[scenario.name], default=str)}",
            flush=True,
        )
        _write(key, scenario.name, results[scenario.name])
    print(table(results))
    print(f"wrote {OUT} [{key}]")
    return 0


def _write(key: str, name: str, figures: dict[str, Any]) -> None:
    """Merge one scenario's figures into build/bench/results.json (re-read each time: ``make
    bench`` may write its own keys meanwhile; a partial run keeps the scenarios it did not run)."""
    data: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {}
    section = data.get(key) if isinstance(data.get(key), dict) else {}
    section = dict(section or {})
    section[name] = figures
    data[key] = section
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=2, sort_keys=True))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
