"""2-rank restart benchmark, as a ratio against torchrun --max-restarts measured side by side.

One rank of a 2-rank DDP job (CPU, gloo, bench/ddp_restart_job.py on trainer_shim) is SIGKILLed
from outside after it has trained a few steps; measured is the time from that kill until BOTH
ranks have finished their first training step of the next attempt (time.monotonic(), which is
system-wide on Linux, so the bench's kill time and the ranks' marks compare directly).

- ours:     resilient-run run --nproc-per-node 2 --backoff 0 (the supervisor runs torchrun with
            --max-restarts 0, sees it exit, kills the tree and starts a new torchrun)
- baseline: python -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 10
            (torchrun's agent restarts the worker group itself; a restart whose ranks die before
            training, as gloo's reconnect often does here, counts as part of the time)

Same job, same shim (both resume from the newest checkpoint). Rounds alternate ours/baseline.
Printed: median and best of each, the ratio ours / torchrun (target <= 1.0), the load average,
and the median phase split of the next attempt (rank process start, import torch, rendezvous,
restore, first step) so a regression shows where it is.

Run: .venv/bin/python bench/bench_ddp_restart.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
JOB = str(REPO / "bench" / "ddp_restart_job.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
KILL_RANK = 1
KILL_AFTER_STEP = 15   # the job saves every 10 steps: the next attempt resumes from step 10
PHASES = ("start", "imported", "rendezvous", "restored")
# torchrun's in-place restarts on gloo often fail to connect the new ranks (stale peer addresses
# in the reused store) and burn a restart or two before one trains: allow enough to get there.
TORCHRUN_RESTARTS = 10


def _read_marks(path: Path) -> list[tuple[int, int, str, int, float]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) == 5:  # a line being written is skipped until complete
            out.append((int(parts[0]), int(parts[1]), parts[2], int(parts[3]), float(parts[4])))
    return out


def _command(tool: str, work: Path) -> tuple[list[str], dict[str, str]]:
    env = {**ENV, "BENCH_MARKS": str(work / "marks.txt")}
    if tool == "resilient-run":
        cmd = [PY, "-m", "supervisor", "run", "--run-dir", str(work / "run"), "--backoff", "0",
               "--nproc-per-node", "2", JOB]
    else:
        env["BENCH_RUN_DIR"] = str(work / "run")
        cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts",
               str(TORCHRUN_RESTARTS), JOB]
    return cmd, env


def restart_latency(tool: str, work: Path, timeout: float = 180.0) -> dict[str, float]:
    """{'total': kill -> both ranks' first step of attempt 2, 'start': kill -> first rank process
    of attempt 2 started, 'imported'/'rendezvous'/'restored': kill -> the last rank reached it,
    'agent_exit' (ours only): kill -> the supervisor reports attempt 1 ended}."""
    work.mkdir(parents=True)
    marks = work / "marks.txt"
    cmd, env = _command(tool, work)
    lines: list[tuple[float, str]] = []
    p = subprocess.Popen(cmd, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)

    def reader() -> None:
        assert p.stdout is not None
        for raw in p.stdout:
            lines.append((time.monotonic(), raw.decode(errors="replace").rstrip()))

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    deadline = time.monotonic() + timeout
    t_kill = None
    try:
        while time.monotonic() < deadline:
            m = _read_marks(marks)
            if t_kill is None:
                hit = [r for r in m if r[0] == KILL_RANK and r[1] == 1 and r[2].isdigit()
                       and int(r[2]) >= KILL_AFTER_STEP]
                if hit:
                    t_kill = time.monotonic()
                    os.kill(hit[0][3], signal.SIGKILL)
            else:
                firsts = {r[0]: r[4] for r in m if r[1] > 1 and r[2].isdigit()}
                if len(firsts) == 2:
                    break
            if p.poll() is not None and t_kill is None:
                raise RuntimeError(f"{tool}: job ended before the kill")
            time.sleep(0.005)
        else:
            raise RuntimeError(f"{tool}: no restart within {timeout:g}s")
        rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        th.join(5)
        if rc != 0:
            raise RuntimeError(f"{tool}: exit {rc}; last output:\n" + "\n".join(s for _, s in lines[-30:]))
    except BaseException:
        _kill_tree(p)
        raise
    m = _read_marks(marks)
    # The first later attempt that trained (torchrun may need several); earlier ones that died
    # before a step count as time, and their number is reported.
    trained = min(r[1] for r in m if r[1] > 1 and r[2].isdigit())
    nxt = [r for r in m if r[1] == trained]
    out = {"total": max(r[4] for r in nxt if r[2].isdigit()) - t_kill,
           "start": min(r[4] for r in nxt if r[2] == "start") - t_kill,
           "failed_restarts": float(len({r[1] for r in m if 1 < r[1] < trained}))}
    for ph in PHASES[1:]:
        out[ph] = max(r[4] for r in nxt if r[2] == ph) - t_kill
    ended = [t for t, s in lines if "attempt 1 ended" in s]
    if ended:
        out["agent_exit"] = ended[0] - t_kill
    return out


def _kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL the tool and every descendant: torchrun starts its ranks in their own sessions, so
    killing its process group alone leaves them running (and holding ports and cores)."""
    try:
        procs = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    except psutil.Error:
        procs = []
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    p.wait()
    psutil.wait_procs(procs, timeout=10)


def _fmt(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.3f}s, best {min(xs):.3f}s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds a kill may take to train again")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rr-bench-ddp-", dir="/var/tmp"))
    load0 = os.getloadavg()
    try:
        res: dict[str, list[dict[str, float]]] = {"resilient-run": [], "torchrun": []}
        stuck = {"resilient-run": 0, "torchrun": 0}
        for i in range(args.rounds):
            for tool in (("resilient-run", "torchrun") if i % 2 == 0 else ("torchrun", "resilient-run")):
                try:
                    res[tool].append(restart_latency(tool, root / f"{tool}-{i}", timeout=args.timeout))
                except RuntimeError as e:  # never trained again in time: counted, not timed
                    print(f"round {i}: {e}", file=sys.stderr)
                    stuck[tool] += 1
        load1 = os.getloadavg()
        o = [r["total"] for r in res["resilient-run"]]
        t = [r["total"] for r in res["torchrun"]]
        if not o or not t:
            raise SystemExit(f"no completed restart to compare: {stuck}")
        rows = [
            (f"2 ranks: kill -9 rank {KILL_RANK} -> both ranks' next first step, resilient-run",
             _fmt(o), f"{statistics.median(o) / statistics.median(t):.2f}", "<= 1.0"),
            (f"  torchrun --max-restarts {TORCHRUN_RESTARTS} (baseline)", _fmt(t), "", ""),
            ("  best vs best", "", f"{min(o) / min(t):.2f}", ""),
        ]
        for tool, n in stuck.items():
            if n:
                rows.append((f"  {tool}: kills after which it never trained again within {args.timeout:g}s",
                             f"{n} of {args.rounds} (not in the times above)", "", ""))
        hdr = ("measure", "measured", "ratio", "target")
        w = [max(len(r[i]) for r in rows + [hdr]) for i in range(4)]
        print("  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
        for r in rows:
            print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
        print(f"rounds {args.rounds} each, alternating; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} "
              f"at start, {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} at end; {os.cpu_count()} cores")
        for tool, rs in res.items():
            lost = [int(r["failed_restarts"]) for r in rs]
            print(f"{tool}: restarts that died before training again: {sum(lost)} over {len(rs)} kills {lost}")
        print("median time from the kill to (s):  " + "  ".join(
            f"{k}" for k in ("agent_exit", *PHASES, "first step")))
        for tool, rs in res.items():
            cols = []
            for k in ("agent_exit", *PHASES, "total"):
                xs = [r[k] for r in rs if k in r]
                cols.append(f"{statistics.median(xs):.3f}" if xs else "-")
            print(f"  {tool:<14} " + "  ".join(cols))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
