"""`resilient-run doctor` with its default settings (--steps 60, --kill-at 17,41) against the script's
own run (not a test), side by side, each a fresh process.

    .venv/bin/python bench/bench_doctor.py

Rows: the README example (80 steps) and the word_language_model-style job (its 16-piece epochs, run
for 60 steps by the doctor; its own run: 4 epochs = 64 steps). The script's own run is a plain
`python SCRIPT` into a scratch run dir; doctor runs its two runs one after the other
(--sequential) and side by side (--parallel, the default without a GPU). Goal: doctor
<= 4x the script's own run time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = [("README example", [str(ROOT / "examples" / "train.py")], None),
        ("word_language_model", [str(ROOT / "tests" / "jobs" / "word_lm_job.py"), "declared"], 64)]


def _env(run_dir: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", RESILIENT_RUN_DIR=str(run_dir))
    return env


def own_run(job: list[str], steps: int | None, tmp: Path) -> float:
    env = _env(tmp / "own")
    if steps is not None:  # the job runs 100 epochs: stop it where the comparison says (doctor's stop knob)
        env.update(RESILIENT_DOCTOR=str(tmp / "own.jsonl"), RESILIENT_DOCTOR_STEPS=str(steps))
    t0 = time.monotonic()
    subprocess.run([sys.executable, *job], env=env, check=True, capture_output=True)
    return time.monotonic() - t0


def doctor(job: list[str], tmp: Path, mode: str) -> tuple[float, dict]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "supervisor", "doctor", mode, "--json", *job], env=env, cwd=tmp,
                       capture_output=True, text=True)
    return time.monotonic() - t0, json.loads(r.stdout)


def main() -> None:
    print(f"{'job':<22} {'doctor':<12} {'own run s':>9} {'doctor s':>9} {'ratio':>6}  {'exact':>5}  goal <= 4.0")
    for name, job, steps in JOBS:
        for mode in ("--sequential", "--parallel"):
            with tempfile.TemporaryDirectory(prefix="bench-doctor-") as d:
                own = own_run(job, steps, Path(d))
                doc, out = doctor(job, Path(d), mode)
            print(f"{name:<22} {mode:<12} {own:>9.1f} {doc:>9.1f} {doc / own:>6.2f}  {str(out['exact']):>5}  "
                  f"(baseline {out['baseline_seconds']:.1f} s, interrupted {out['interrupted_seconds']:.1f} s)")


if __name__ == "__main__":
    main()
