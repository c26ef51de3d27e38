"""Goodput under failures, side by side (not a test).

    .venv/bin/python bench/bench_goodput.py [--mb 128] [--steps 200] [--batch 64] [--mtbf 10,20,40] [--seed 1]

The issue's job (384 MiB, 0.15-0.5 s steps, kills at 8/17/27 s, MTBF 30/60/120 s) scaled to this
2-core box: 128 MiB, ~0.1-0.2 s steps, a ~30 s job, MTBF 10/20/40 s (a third each).

One job (bench/goodput_job.py: model + Adam of --mb MiB, CPU steps, --steps steps, a deterministic
batch per step) and one seeded failure schedule (exponential gaps of mean MTBF of training time:
each gap runs from the current attempt's first step;
kill -9s, and one kernel OOM-kill through a memory cgroup v1 when /sys/fs/cgroup/memory is
writable, else a kill -9 said so), applied to:
- resilient-run defaults: `resilient-run run`, `init(save_every_steps=10)` (the README's first example);
  every tool gets the same restart budget (--max-restarts 100: the default 10 gives up at MTBF 10 s);
- resilient-run suggested: `--backoff 0`, `init(save_every_steps=100, async_save=True,
  memory_every_steps="auto")` (the README's fast-checkpoint settings);
- torchrun --max-restarts + a careful torch.save + fsync + rename every 20 steps, resuming from it;
- DLRover Flash Checkpoint as its docs show it (`dlrover-run --max-restarts`, a memory save every
  5 steps, a disk save every 20, resume from `load_checkpoint()`: its agent keeps the memory copy
  across a worker restart; 5 is near the Young/Daly interval for its ~45 ms memory save at MTBF
  10 s: a save every step cost it ETTR 0.58 at MTBF 10 s here), when `dlrover` is installed (the
  `bench` extra). `dlrover-run --standalone` cannot start its own master beside torch 2.13
  (dlrover 0.6.1 calls torch's SubprocessHandler with an older signature), so the bench starts that
  master itself (`python -m dlrover.python.master.main --platform local`, before the clock starts,
  as a cluster would run it) and points the run at it with DLROVER_MASTER_ADDR;
Printed per MTBF: ETTR (the bare job's wall time, no faults and no checkpoints, measured in the same
bench ÷ the wall time under failures), failures applied, steps redone, final weights == the
fault-free reference. No hang in the schedule: the default --heartbeat-timeout is 600 s and
torchrun has no hang detection, so one hang would dominate every figure of a minute-long job.

Then "overhead with nothing failing": per setting, in one child process, mean step time of the
bare loop vs the loop with run.step(), alternating blocks (bench_goodput.overhead_child).
Timings are wall clock on a shared box: run it when the box is quiet, and read the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
JOB = REPO / "bench" / "goodput_job.py"
CGROUP = Path("/sys/fs/cgroup/memory")
RUN_TIMEOUT = 400.0

DEFAULTS = {"save_every_steps": 10}
SUGGESTED = {"save_every_steps": 100, "async_save": True, "memory_every_steps": "auto"}


def setups(tmp: Path, args) -> dict[str, tuple[list[str], dict]]:
    """name -> (argv of the tool, extra env); each run gets its own dir under tmp."""
    job = [str(JOB), "--mb", str(args.mb), "--steps", str(args.steps), "--batch", str(args.batch)]
    sup = [sys.executable, "-m", "supervisor", "run", "--max-restarts", "100"]  # torchrun's budget too
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    return {
        "resilient-run defaults": (sup + ["--run-dir", "{dir}", *job, "--dir", "{dir}", "--out", "{out}"],
                                   {"GOODPUT_MODE": "shim", "GOODPUT_OPTS": json.dumps(DEFAULTS)}),
        "resilient-run suggested": (sup + ["--run-dir", "{dir}", "--backoff", "0", *job, "--dir", "{dir}",
                                           "--out", "{out}"],
                                    {"GOODPUT_MODE": "shim", "GOODPUT_OPTS": json.dumps(SUGGESTED)}),
        "torchrun + torch.save/20": ([torchrun, "--standalone", "--nproc-per-node", "1", "--max-restarts", "100",
                                      *job, "--save-every", "20", "--dir", "{dir}", "--out", "{out}"],
                                     {"GOODPUT_MODE": "torchsave"}),
        **({DLROVER: ([str(Path(sys.executable).parent / "dlrover-run"), "--standalone", "--nproc-per-node", "1",
                       "--max-restarts", "100", *job, "--save-every", "20", "--memory-every", "5", "--dir", "{dir}",
                       "--out", "{out}"], {"GOODPUT_MODE": "dlrover"})} if dlrover_here() is None else {}),
    }


DLROVER = "DLRover flash ckpt"


def dlrover_here() -> Optional[str]:
    """Why DLRover cannot run in this bench, or None when it can."""
    if importlib.util.find_spec("dlrover") is None:
        return 'not installed (pip install -e ".[bench]" -c constraints-dev.txt)'
    if not (Path(sys.executable).parent / "dlrover-run").exists():
        return "dlrover-run is not beside this Python"
    return None


@contextlib.contextmanager
def dlrover_master(name: str) -> Iterator[dict]:
    """A DLRover master for one run (see the module doc), the env pointing the run at it; its
    shared memory (named after the job) is removed afterwards: DLRover leaves it behind."""
    from bench.bench_mirror import free_port

    port = free_port()
    job = f"goodput{os.getpid()}x{port}"
    p = subprocess.Popen([sys.executable, "-m", "dlrover.python.master.main", "--port", str(port), "--node_num", "1",
                          "--job_name", job, "--platform", "local"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _listening(port):
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the DLRover master for {name} did not start (exit {p.poll()})")
            time.sleep(0.1)
        yield {"DLROVER_MASTER_ADDR": f"127.0.0.1:{port}", "ELASTIC_JOB_NAME": job}
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        for leftover in Path("/dev/shm").glob(f"{job}*"):
            leftover.unlink(missing_ok=True)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _marks(path: Path) -> tuple[list[int], int, int, int]:
    """(pids of the attempts in start order, step lines so far, steps of the newest attempt, last step)."""
    pids, steps, since, last = [], 0, 0, 0
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return [], 0, 0, 0
    for ln in lines:
        parts = ln.split()
        if parts[:1] == ["start"] and len(parts) == 3:
            pids.append(int(parts[1]))
            since = 0
        elif parts[:1] == ["step"] and len(parts) == 3:
            steps += 1
            since += 1
            last = int(parts[1])
    return pids, steps, since, last


def _oom_kill(pid: int, note: list[str]) -> None:
    """Move `pid` into a fresh memory cgroup whose limit is far below what its next steps allocate:
    the kernel OOM-kills it. Falls back to kill -9 (said so) when that cannot be done here."""
    cg = CGROUP / f"bench-goodput-{os.getpid()}-{pid}"
    try:
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(4 << 20))
        (cg / "cgroup.procs").write_text(str(pid))
    except OSError as e:
        note.append(f"OOM-kill not possible here ({e.strerror or e}): kill -9 instead")
        _kill(pid)
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        note.append("the OOM limit did not kill within 10 s: kill -9 instead")
        _kill(pid)
    else:
        note.append("1 kernel OOM-kill")
    for _ in range(50):
        try:
            cg.rmdir()
            break
        except OSError:
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] not in ("Z", "X")
    except OSError:
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def inject(proc: subprocess.Popen, marks: Path, mtbf: float, seed: int, steps: int, note: list[str]) -> int:
    """Apply the schedule until the job ends; the number of failures applied. Each gap (exponential,
    mean MTBF) runs from the current attempt's first step: failures strike training time, never a
    restart in progress (else a restart longer than the MTBF would never reach a step again)."""
    rng = random.Random(seed)
    n = 0
    while proc.poll() is None:
        gap = rng.expovariate(1.0 / mtbf)
        pids, _, since, last = _marks(marks)
        while proc.poll() is None and (since == 0 or len(pids) <= n):  # the attempt after the last failure
            time.sleep(0.02)
            pids, _, since, last = _marks(marks)
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < gap:
            time.sleep(0.02)
        pids, _, since, last = _marks(marks)
        if proc.poll() is not None or not pids or last >= steps:  # over: nothing left to fail
            break
        if n == 1:
            _oom_kill(pids[-1], note)
        else:
            _kill(pids[-1])
        n += 1
    return n


def run_one(name: str, argv: list[str], env: dict, tmp: Path, mtbf: Optional[float], seed: int,
            steps: int) -> dict:
    if env.get("GOODPUT_MODE") == "dlrover":
        with dlrover_master(name) as master:
            return _run_one(name, argv, {**env, **master}, tmp, mtbf, seed, steps)
    return _run_one(name, argv, env, tmp, mtbf, seed, steps)


def _run_one(name: str, argv: list[str], env: dict, tmp: Path, mtbf: Optional[float], seed: int,
             steps: int) -> dict:
    d = tmp / f"{name}-{mtbf}-{seed}".replace("/", "_").replace(" ", "_")
    d.mkdir()
    out, marks = d / "final.pt", d / "marks"
    argv = [a.format(dir=d / "run", out=out) for a in argv]
    (d / "run").mkdir()
    full = {**os.environ, **env, "GOODPUT_MARKS": str(marks), "PYTHONPATH": str(REPO)}
    note: list[str] = []
    t0 = time.monotonic()
    with open(d / "log", "w") as log:
        p = subprocess.Popen(argv, env=full, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        failures = 0
        if mtbf:
            holder: list[int] = []
            th = threading.Thread(target=lambda: holder.append(inject(p, marks, mtbf, seed, steps, note)), daemon=True)
            th.start()
        try:
            rc = p.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wall = time.monotonic() - t0
        if mtbf:
            th.join(15)
            failures = holder[0] if holder else 0
    for pid in _marks(marks)[0]:  # torchrun starts its workers in sessions of their own
        if _alive(pid):
            _kill(pid)
    done = _marks(marks)[1]
    return {"wall": wall, "rc": rc, "failures": failures, "redone": done - steps, "out": out,
            "note": "; ".join(note), "log": d / "log"}


def same_weights(a: Path, b: Path) -> str:
    import torch
    if not a.exists() or not b.exists():
        return "no weights"
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return "equal" if x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) else "DIFFER"


OVERHEAD_CHILD = """
import json, os, sys, time, tempfile
sys.path.insert(0, {repo!r})
import torch, trainer_shim
from bench.bench_async import build
from bench.goodput_job import train_step
model, opt = build({mb})
d = tempfile.mkdtemp(prefix="goodput-overhead-")
run = trainer_shim.init(model=model, optimizer=opt, run_dir=d, save_on_epoch_end=False, **json.loads({opts!r}))
bare, ours, step = [], [], 0
for r in range({rounds}):
    for side in ((bare, ours) if r % 2 == 0 else (ours, bare)):
        t0 = time.perf_counter()
        for _ in range({block}):
            train_step(model, opt, step, {batch}); step += 1
            if side is ours:
                run.step()
        side.append((time.perf_counter() - t0) / {block})
skipped = run.engine.hb.value("memory_snapshots_skipped") or 0
mem = run.engine.hb.value("memory_every_steps")
run.finish()
import shutil; shutil.rmtree(d, ignore_errors=True)
print(json.dumps({{"bare": sum(bare) / len(bare), "ours": sum(ours) / len(ours), "skipped": skipped,
                   "memory_every": mem, "steps": step}}))
"""


def overhead(opts: dict, args) -> dict:
    code = OVERHEAD_CHILD.format(repo=str(REPO), mb=args.mb, opts=json.dumps(opts), rounds=6, block=10,
                                 batch=args.batch)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"overhead child failed: {p.stderr[-1500:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mtbf", default="10,20,40", help="mean seconds between failures, comma-separated")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-overhead", action="store_true")
    args = ap.parse_args()
    mtbfs = [float(x) for x in args.mtbf.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-goodput-", dir=os.environ.get("BENCH_TMP")) as t:
        tmp = Path(t)
        bare_env = {"GOODPUT_MODE": "bare"}
        bare_argv = [sys.executable, str(JOB), "--mb", str(args.mb), "--steps", str(args.steps), "--batch",
                     str(args.batch), "--dir", "{dir}", "--out", "{out}"]
        ref = [run_one("bare", bare_argv, bare_env, tmp, None, 0, args.steps)]
        results = {}
        for mtbf in mtbfs:
            for name, (argv, env) in setups(tmp, args).items():
                results[(name, mtbf)] = run_one(name, argv, env, tmp, mtbf, args.seed, args.steps)
        ref.append(run_one("bare2", bare_argv, bare_env, tmp, None, 0, args.steps))
        bare = sum(r["wall"] for r in ref) / len(ref)
        print(f"job: {args.mb} MiB model+Adam, {args.steps} steps, batch {args.batch}, "
              f"{os.environ['OMP_NUM_THREADS']} thread(s); bare (no faults, no checkpoints) "
              f"{ref[0]['wall']:.1f} s / {ref[1]['wall']:.1f} s (before / after)")
        print(f"{'setup':<26} {'MTBF s':>6} {'wall s':>7} {'ETTR':>6} {'fails':>5} {'redone':>6}  final weights")
        for (name, mtbf), r in results.items():
            ettr = bare / r["wall"] if r["rc"] == 0 else 0.0
            eq = same_weights(r["out"], ref[0]["out"]) if r["rc"] == 0 else f"exit {r['rc']} (see {r['log']})"
            print(f"{name:<26} {mtbf:>6.0f} {r['wall']:>7.1f} {ettr:>6.2f} {r['failures']:>5} {r['redone']:>6}  {eq}"
                  + (f"  [{r['note']}]" if r["note"] else ""))
            if r["rc"] != 0:
                print(Path(r["log"]).read_text()[-1500:])
        sup = {n: [bare / results[(n, m)]["wall"] for m in mtbfs if results[(n, m)]["rc"] == 0]
               for n in setups(tmp, args)}
        ours, theirs = sup["resilient-run suggested"], sup["torchrun + torch.save/20"]
        if ours and theirs:
            ratio = (sum(ours) / len(ours)) / (sum(theirs) / len(theirs))
            print(f"mean ETTR, suggested / torchrun+torch.save: {ratio:.2f} (goal >= 1.3)"
                  f"{'  met' if ratio >= 1.3 else '  MISSED'}; suggested at the shortest MTBF "
                  f"{ours[0]:.2f} (goal >= 0.90){'  met' if ours[0] >= 0.9 else '  MISSED'}")
        if DLROVER in sup and sup[DLROVER] and ours:
            mean = sum(sup[DLROVER]) / len(sup[DLROVER])
            print(f"mean ETTR, suggested / DLRover flash checkpoint: {sum(ours) / len(ours) / mean:.2f} (goal >= 1.0)"
                  f"{'  met' if sum(ours) / len(ours) >= mean else '  MISSED'}")
    if dlrover_here() is not None:
        print(f"DLRover flash checkpoint: skipped: {dlrover_here()}")
    if args.skip_overhead:
        return
    print("\noverhead with nothing failing (mean step time, bare loop vs with run.step(), one process each)")
    print(f"{'settings':<76} {'bare s':>7} {'ours s':>7} {'ratio':>6}  goal")
    for label, opts in (("suggested: " + json.dumps(SUGGESTED), SUGGESTED),
                        ("memory_every_steps=1 + async_save, save_every_steps=100",
                         {"save_every_steps": 100, "async_save": True, "memory_every_steps": 1}),
                        ("defaults: " + json.dumps(DEFAULTS), DEFAULTS)):
        o = overhead(opts, args)
        ratio = o["ours"] / o["bare"]
        goal = "<= 1.03" if opts is SUGGESTED else "-"
        verdict = ("  met" if ratio <= 1.03 else "  MISSED") if opts is SUGGESTED else ""
        extra = f" (skipped {o['skipped']}, memory every {o['memory_every']})" if o["skipped"] or o["memory_every"] else ""
        print(f"{(label + extra)[:76]:<76} {o['bare']:>7.3f} {o['ours']:>7.3f} {ratio:>6.3f}  {goal}{verdict}")


if __name__ == "__main__":
    main()
