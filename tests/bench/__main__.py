"""`make bench`: run every benchmark section, print its figures, write build/bench/results.json.

Each ``tests/bench/bench_<section>.py`` defines ``run() -> dict``; its dict is stored under
``<section>`` in the JSON. Run one section with ``python -m tests.bench <section>``.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "bench" / "results.json"


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    names = argv or sorted(p.stem.removeprefix("bench_") for p in Path(__file__).parent.glob("bench_*.py"))
    results: dict = json.loads(OUT.read_text()) if OUT.exists() else {}
    for name in names:
        print(f"== bench {name}", flush=True)
        t0 = time.perf_counter()
        mod = importlib.import_module(f"tests.bench.bench_{name}")
        results[name] = mod.run()
        print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2, sort_keys=True))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
