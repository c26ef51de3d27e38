"""Supervisor benchmarks, as ratios against a baseline measured side by side in this process.

- early crash: kill -9 right after attempt 1's start -> first training step of the next attempt,
  resilient-run ÷ torchrun --max-restarts (same script, same shim, --backoff 0). Target <= 0.5.
- warm restart (single-process job): the same figure with attempt 1 training ~6 s before
  its kill -9 (time for the warm interpreter to import torch), ours ÷ torchrun on the same script
  and warm-up, with our cold path (--no-prestart) beside it. Target <= 0.5.
- a hang ends its attempt within heartbeat-timeout + 2 s (stack dump) + grace + 1 s.
- supervisor RSS <= 50 MB and idle CPU <= 1 % of a core while watching a healthy job.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
JOB = str(REPO / "bench" / "restart_job.py")
TOY = str(REPO / "tests" / "jobs" / "toy_train.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _marks(path: Path) -> float:
    vals = dict(line.split() for line in path.read_text().splitlines())
    return float(vals["first_step"]) - float(vals["kill"])


def restart_latency(tool: str, work: Path, *extra: str, warmup: float = 0.0) -> float:
    work.mkdir(parents=True)
    marks = work / "marks.txt"
    env = {**ENV, "BENCH_MARKS": str(marks), "BENCH_RUN_DIR": str(work / "run")}
    if warmup:
        env["BENCH_WARMUP_S"] = str(warmup)
    if tool == "resilient-run":
        env.pop("BENCH_RUN_DIR")
        cmd = [PY, "-m", "supervisor", "run", "--run-dir", str(work / "run"), "--backoff", "0", *extra, JOB]
    else:
        cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
               "--monitor-interval", "0.1", JOB]
    subprocess.run(cmd, env=env, cwd=work, check=True, capture_output=True, timeout=180)
    if tool == "resilient-run" and warmup:
        starts = [json.loads(ln) for ln in (work / "run" / "events.jsonl").read_text().splitlines()
                  if '"attempt_started"' in ln]
        assert [s.get("warm") for s in starts] == [False, "--no-prestart" not in extra], starts
    return _marks(marks)


def hang_bound(work: Path) -> tuple[float, float]:
    """(seconds from the last heartbeat change to the attempt's end, the bound)."""
    hb_timeout, grace = 2.0, 2.0
    work.mkdir(parents=True)
    env = {**ENV, "TOY_FAULTS": "1:hang@6"}
    cmd = [PY, "-m", "supervisor", "run", "--run-dir", str(work / "run"), "--backoff", "0",
           "--heartbeat-timeout", str(hb_timeout), "--grace-period", str(grace), TOY, "--epochs", "1"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hb = work / "run" / "heartbeats" / "rank-0.json"
    last_change, last = None, None
    while p.poll() is None:
        try:
            rec = json.loads(hb.read_text())
        except (OSError, ValueError):
            rec = None
        # Only attempt 1's beats count: the supervisor removes them before attempt 2 starts.
        if rec is not None and rec.get("attempt") == 1 and rec.get("seq") != last:
            last, last_change = rec.get("seq"), time.monotonic()
        ev = work / "run" / "events.jsonl"
        if last_change is not None and ev.exists() and '"attempt_ended"' in ev.read_text():
            took = time.monotonic() - last_change
            p.wait(120)
            return took, hb_timeout + 2 + grace + 1
        time.sleep(0.02)
    raise RuntimeError("hang attempt never ended")


def idle_cost(work: Path, seconds: float = 20.0) -> tuple[float, float, float]:
    """(supervisor RSS MB, supervisor CPU % of a core, bare-python RSS MB baseline)."""
    work.mkdir(parents=True)
    # A healthy job in mid-epoch: steps every 50 ms, heartbeats every second, no save due.
    cmd = [PY, "-m", "supervisor", "run", "--run-dir", str(work / "run"), TOY, "--epochs", "1",
           "--samples", "400000", "--save-every", "1000000", "--step-sleep", "0.05"]
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bare = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        hb = work / "run" / "heartbeats" / "rank-0.json"
        deadline = time.monotonic() + 60
        while not hb.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)
        sp = psutil.Process(p.pid)
        c0, t0 = sum(sp.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        c1, t1 = sum(sp.cpu_times()[:2]), time.monotonic()
        rss = sp.memory_info().rss / 2**20
        bare_rss = psutil.Process(bare.pid).memory_info().rss / 2**20
        return rss, 100 * (c1 - c0) / (t1 - t0), bare_rss
    finally:
        p.terminate()
        p.wait(60)
        bare.kill()
        bare.wait()


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="rr-bench-", dir="/var/tmp"))
    try:
        ours, theirs = [], []
        for i in range(3):
            ours.append(restart_latency("resilient-run", root / f"ours-{i}"))
            theirs.append(restart_latency("torchrun", root / f"torchrun-{i}"))
        o, t = statistics.median(ours), statistics.median(theirs)
        warm, cold, tr = [], [], []
        for i in range(3):
            warm.append(restart_latency("resilient-run", root / f"warm-{i}", warmup=6.0))
            cold.append(restart_latency("resilient-run", root / f"cold-{i}", "--no-prestart", warmup=6.0))
            tr.append(restart_latency("torchrun", root / f"torchrun-warm-{i}", warmup=6.0))
        w_, c_, t_ = statistics.median(warm), statistics.median(cold), statistics.median(tr)
        took, bound = hang_bound(root / "hang")
        rss, cpu, bare_rss = idle_cost(root / "idle")
        rows = [
            # Attempt 1 dies right after its start, while the standby started beside it may still import.
            ("early crash: kill -9 -> next first step (median of 3)", f"{o:.3f}s vs torchrun {t:.3f}s", f"{o / t:.2f}",
             "<= 0.5"),
            ("warm restart, 1 process: kill -9 -> next first step (median of 3)",
             f"{w_:.3f}s vs torchrun {t_:.3f}s", f"{w_ / t_:.2f}", "<= 0.5"),
            ("  same, ours cold (--no-prestart), for reference", f"{c_:.3f}s vs torchrun {t_:.3f}s", f"{c_ / t_:.2f}", "-"),
            ("hang: last heartbeat -> attempt ended", f"{took:.2f}s vs bound {bound:.1f}s", f"{took / bound:.2f}", "<= 1.0"),
            ("supervisor RSS", f"{rss:.1f} MB vs bare python {bare_rss:.1f} MB", f"{rss / 50:.2f} of 50 MB", "<= 1.0"),
            ("supervisor idle CPU", f"{cpu:.2f} % of a core", f"{cpu:.2f} of 1 %", "<= 1.0"),
        ]
        w = [max(len(r[i]) for r in rows + [("measure", "measured", "ratio", "target")]) for i in range(4)]
        print("  ".join(h.ljust(w[i]) for i, h in enumerate(("measure", "measured", "ratio", "target"))))
        for r in rows:
            print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
