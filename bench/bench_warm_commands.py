"""Warm restarts of `-- COMMAND` jobs: attempt 2's start -> its first training step, warm ÷ cold.

Each job runs under the supervisor twice per repetition, side by side in this process: cold
(`--no-prestart`) and warm (the default). Attempt 1 trains at least WARMUP_S; then this script
SIGKILLs the trainer (the warm run also waits for its standby's ready file), and the figure is attempt
2's `attempt_started` -> its `first_step` event. For launchers that run the trainer as a child
(`accelerate launch`, `swift sft`) it is split at the trainer process's start (first_step's
`process_start_time`): the launcher's part. A warm `swift sft` runs its child inside the warm
interpreter (trainer_shim/_launch/inline.py): no child process, shown as "in-process".

  -m toy     `python -m tests.jobs.toy_train` (torch only)
  -m hf      `python -m tests.integrations.hf_job` (a tiny HF Trainer job, held at step 6 in attempt 1:
             the warm interpreter imports transformers.trainer because attempt 1 recorded it)
  accelerate `accelerate launch --num_processes 1 toy_train.py` (single process: a child)
  swift      `swift sft` on a tiny Qwen2 built here, with --swift-python PY: a venv with ms-swift where
             the supervisor runs too (its `swift` script is then ours); skipped without it

    python bench/bench_warm_commands.py [--reps 3] [--only NAME,...] [--swift-python /venv/bin/python]
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from trainer_shim.rundir import Event, RunDir, process_start_time, read_events, read_heartbeat  # noqa: E402

TOY = str(REPO / "tests" / "jobs" / "toy_train.py")
WARMUP_S = 6.0     # attempt 1 trains at least this long: a real job dies after a while, not at once
KILL_STEP = 6      # ... and past its first checkpoint (every 5 steps)
SLOW_TOY = ("--step-sleep", "0.3")   # attempt 1 only (TOY_STEP_SLEEP_ATTEMPT): room for the kill
_TINY_QWEN2 = REPO / "bench" / "tiny_qwen2.py"


def _events(rd: Path, name: Event, attempt: int) -> list[dict]:
    return [e for e in read_events(RunDir(rd)) if e.get("event") == name and e.get("attempt") == attempt]


def _kill_attempt_1(rd: Path, p: subprocess.Popen, warm: bool) -> None:
    """SIGKILL attempt 1's trainer once it trained WARMUP_S and passed KILL_STEP (and, warm, once the
    standby is ready: what this measures is a restart into a ready warm interpreter)."""
    t0 = time.monotonic()
    while p.poll() is None:
        first = _events(rd, Event.FIRST_STEP, 1)
        step = (read_heartbeat(RunDir(rd).heartbeat(0)) or {}).get("step") or 0
        ready = not warm or RunDir(rd).warm_ready(2).exists()
        if first and step >= KILL_STEP and ready and time.monotonic() - t0 >= WARMUP_S:
            os.kill(first[0]["pid"], signal.SIGKILL)
            return
        time.sleep(0.05)
    raise RuntimeError(f"{rd}: attempt 1 ended before the kill")


def _t(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def clock_offset() -> float:
    """How far first_step's process_start_time is off the wall clock here: /proc/stat's boot time is
    whole seconds, so a process's start read from /proc is off by a constant up to 1 s. Measured on
    processes spawned now (the spawn itself takes ~1 ms)."""
    offs = []
    for _ in range(5):
        t = time.time()
        p = subprocess.Popen(["sleep", "0.1"])
        offs.append((process_start_time(p.pid) or t) - t)
        p.wait()
    return statistics.median(offs)


def run_once(work: Path, python: str, command: list[str], env: dict, warm: bool,
             preload: Optional[str] = None, offset: float = 0.0) -> tuple[float, float]:
    """(attempt 2's start -> first step, start -> the trainer process's start) in seconds."""
    rd = work / "run"
    extra = ([] if warm else ["--no-prestart"]) + ([f"--preload={preload}"] if preload else [])
    p = subprocess.Popen([python, "-m", "supervisor", "run", "--run-dir", str(rd), "--backoff", "0", *extra, "--",
                          *command], env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        _kill_attempt_1(rd, p, warm)
        if p.wait(600) != 0:
            raise RuntimeError(f"{rd}: supervisor exit code {p.returncode}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    [start], [first] = _events(rd, Event.ATTEMPT_STARTED, 2), _events(rd, Event.FIRST_STEP, 2)
    assert start["warm"] == warm, start
    begin = _t(start["time"])
    if first.get("pid") == start.get("pid"):  # the trainer ran in the attempt's own process
        return _t(first["time"]) - begin, float("nan")
    return _t(first["time"]) - begin, _t(first["process_start_time"]) - offset - begin


def _jobs(args: argparse.Namespace, root: Path) -> dict[str, tuple[str, list[str], dict, list[Optional[str]]]]:
    """name -> (the supervisor's python, command, environment, the warm variants' --preload values)."""
    py = sys.executable
    # The venv's bin dir first on PATH, as in an activated venv: `accelerate` is found there.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TOY_STEP_SLEEP_ATTEMPT": "1",
           "PATH": f"{Path(py).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}
    jobs = {
        "-m toy": (py, [py, "-m", "tests.jobs.toy_train", *SLOW_TOY], env, [None]),
        "-m hf": (py, [py, "-m", "tests.integrations.hf_job", "--output_dir", "hf", "--out", "hf.pt"],
                  {**env, "RRTEST_FAULTS": f"1:pause@{KILL_STEP}"}, [None]),
        "accelerate": (py, ["accelerate", "launch", "--num_processes", "1", "--num_machines", "1",
                            "--mixed_precision", "no", "--dynamo_backend", "no", TOY, *SLOW_TOY], env,
                       [None, "accelerate.commands.accelerate_cli"]),
    }
    if args.swift_python:
        data = root / "swift-data"
        subprocess.run([args.swift_python, str(_TINY_QWEN2), str(data)], check=True, env=env, capture_output=True)
        bin_dir = str(Path(args.swift_python).parent)
        jobs["swift"] = (args.swift_python, [
            "swift", "sft", "--model", str(data / "qwen2-tiny"), "--model_type", "qwen2", "--template", "qwen",
            "--dataset", str(data / "data.jsonl"), "--tuner_type", "full", "--output_dir", "out",
            "--add_version", "false", "--num_train_epochs", "1", "--per_device_train_batch_size", "1",
            "--gradient_accumulation_steps", "1", "--save_steps", "5", "--logging_steps", "5", "--report_to", "none",
            "--dataloader_num_workers", "0", "--torch_dtype", "float32", "--split_dataset_ratio", "0",
            # ms-swift's switch for an offline box: else each start spends ~20 s on ModelScope hub retries.
            "--check_model", "false"],
            {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}, [None, "swift.cli.main"])
    return {k: v for k, v in jobs.items() if not args.only or k in args.only.split(",")}


def _row(name: str, variant: str, runs: list[tuple[float, float]], cold: float, launched: bool) -> tuple[str, ...]:
    total = statistics.median(r[0] for r in runs)
    inline = any(r[1] != r[1] for r in runs)  # NaN: no child process
    split = (" (in-process)" if inline else f" (launcher {statistics.median(r[1] for r in runs):.2f} s)") if launched else ""
    return (name, variant, f"{total:.2f} s{split}", f"{total / cold:.2f}", ", ".join(f"{r[0]:.2f}" for r in runs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--swift-python", default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rr-bench-warm-", dir="/var/tmp"))
    rows = [("job", "restart", "attempt start -> first step (median)", "÷ cold", "runs")]
    offset = clock_offset()
    try:
        for name, (python, command, env, preloads) in _jobs(args, root).items():
            variants = [("cold", False, None)] + [("warm" + (f" --preload {p}" if p else ""), True, p) for p in preloads]
            runs: dict[str, list[tuple[float, float]]] = {v[0]: [] for v in variants}
            for i in range(args.reps):   # alternated, so load drifts hit every variant alike
                for label, warm, preload in variants:
                    work = root / f"{name}-{label}-{i}".replace(" ", "_")
                    work.mkdir(parents=True)
                    runs[label].append(run_once(work, python, command, env, warm, preload, offset))
            cold = statistics.median(r[0] for r in runs["cold"])
            launched = not name.startswith("-m")
            rows += [_row(name, label, runs[label], cold, launched) for label, _, _ in variants]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))


if __name__ == "__main__":
    main()
