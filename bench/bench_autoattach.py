"""What auto-attach costs a process that never imports a framework, side by side (not a test).

    .venv/bin/python bench/bench_autoattach.py [--rounds 30]

Alternately starts `python -c "import json, email, http.client"` (stdlib imports, ~100 modules)
with and without the bootstrap dir first on PYTHONPATH, and compares the lower-quartile wall
times. Goal: the hook costs <= 5 % of a bare interpreter start (it is one dict lookup per import;
the rest is reading one small sitecustomize.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_shim.rundir import ATTACH_DIR  # noqa: E402

GOAL = 0.05
CODE = "import json, email.parser, http.client, logging, argparse"


def _once(env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", CODE], env=env, check=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    a = p.parse_args()
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    attached = dict(plain, PYTHONPATH=str(ATTACH_DIR))
    times: dict[str, list[float]] = {"plain": [], "auto-attach": []}
    for _ in range(a.rounds):
        times["plain"].append(_once(plain))
        times["auto-attach"].append(_once(attached))
    q = {k: statistics.quantiles(v, n=4)[0] for k, v in times.items()}
    ratio = q["auto-attach"] / q["plain"]
    print(f"{'variant':<14}{'start (lower quartile)':>24}")
    for k, v in q.items():
        print(f"{k:<14}{v * 1000:>21.1f} ms")
    print(f"ratio {ratio:.3f}  (goal <= {1 + GOAL:.2f}: {'met' if ratio <= 1 + GOAL else 'NOT met'})")


if __name__ == "__main__":
    main()
