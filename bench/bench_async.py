"""Fast checkpoints, side by side in one process (not a test).

    .venv/bin/python bench/bench_async.py [--mb 256] [--rounds 5]

One table, measured ratio vs goal:
- async stall per save (run.step() at a due save with async_save=True) / the floor: copying the
  same state into preallocated buffers (`buf.copy_(t)`); a fresh `t.clone()` and a bare
  `torch.save`+fsync shown beside it;
- steps/s while the background write runs / steps/s without saving;
- DLRover Flash Checkpoint (optional extra `[bench]`) in a child process: its memory-save stall
  and its restore beside the same floor and torch.load, measured there; skipped with a note when
  it is not installed or does not finish;
- restore from a memory snapshot left by a kill -9 (a child process; every digest verified, then
  copied into the live tensors) / bare `torch.load` of the same state from a file: into live
  optimizer state, and into an optimizer without state yet (as after a restart: materialised);
  beside them the floor any verified restore pays (preadv every byte of the slot into warm
  memory and xxh3 it while cached, on 2 threads, as the restore does).
Each figure is the median of its rounds; sides alternate so machine load hits both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import xxhash  # noqa: E402
from torch import nn  # noqa: E402

import trainer_shim  # noqa: E402
from trainer_shim._restore import apply as applying
from trainer_shim import rundir  # noqa: E402
from trainer_shim.rundir import CheckpointKind, RunDir  # noqa: E402

HIDDEN = 2048


def build(mb: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Model + Adam state of about `mb` MiB (params x3: weights, exp_avg, exp_avg_sq), state populated."""
    layers = max(1, round(mb * (1 << 20) / 3 / (HIDDEN * HIDDEN * 4)))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(HIDDEN, HIDDEN) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    train_step(model, opt)
    return model, opt


def train_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad(set_to_none=True)
    model(torch.randn(4, HIDDEN)).pow(2).mean().backward()
    opt.step()


def state_tensors(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = list(model.state_dict().values())
    for st in opt.state_dict()["state"].values():
        out += [v for v in st.values() if isinstance(v, torch.Tensor)]
    return out


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_stall(tmp: Path, mb: int, rounds: int) -> dict[str, float]:
    model, opt = build(mb)
    tensors = state_tensors(model, opt)
    bufs = [torch.empty_like(t) for t in tensors]
    for b, t in zip(bufs, tensors):
        b.copy_(t)  # touch the pages once: the floor is a copy into warm preallocated buffers
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=tmp / "stall", save_every_steps=1,
                            save_on_epoch_end=False, async_save=True, keep_last=2)
    res: dict[str, list[float]] = {"floor": [], "clone": [], "save": [], "ours": []}
    run.step()  # first save: creates the slot files (once per run)
    run.engine.fast.drain(600)
    f = tmp / "bare.pt"

    def bare_save() -> None:
        with open(f, "wb") as fh:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, fh)
            fh.flush()
            os.fsync(fh.fileno())

    for _ in range(rounds):
        res["floor"].append(timed(lambda: [b.copy_(t) for b, t in zip(bufs, tensors)]))
        res["clone"].append(timed(lambda: [t.clone() for t in tensors]))
        res["save"].append(timed(bare_save))
        run.engine.fast.drain(600)
        res["ours"].append(timed(run.step))  # due: copy into the slot, hand over to the writer
        run.engine.fast.drain(600)
    run.engine.fast.slots.free()
    out = {k: statistics.median(v) for k, v in res.items()}
    out["bytes"] = sum(t.numel() * t.element_size() for t in tensors)
    return out


def bench_throughput(tmp: Path, mb: int, rounds: int) -> tuple[float, float]:
    """Steps/s without saving vs while the background write (hash, copy to disk, fsync) runs."""
    model, opt = build(mb)
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=tmp / "tput", save_on_epoch_end=False,
                            async_save=True, keep_last=2)
    run.engine.fast.save_async(CheckpointKind.STEP)  # warm the slot files
    run.engine.fast.drain(600)
    quiet, busy = [], []
    for _ in range(rounds):
        t0, n = time.perf_counter(), 0
        while n < 10:
            train_step(model, opt)
            run.step()
            n += 1
        quiet.append(n / (time.perf_counter() - t0))
        run.engine.fast.save_async(CheckpointKind.STEP)
        t0, n = time.perf_counter(), 0
        while run.engine.fast._job is not None:
            train_step(model, opt)
            run.step()
            n += 1
        if n >= 2:
            busy.append(n / (time.perf_counter() - t0))
        run.engine.fast.drain(600)
    run.engine.fast.slots.free()
    return statistics.median(quiet), (statistics.median(busy) if busy else float("nan"))


CHILD = """
import os, sys, torch
sys.path.insert(0, {repo!r})
sys.argv = ["bench-child"]
import bench.bench_async as b, trainer_shim
model, opt = b.build({mb})
run = trainer_shim.init(model=model, optimizer=opt, run_dir={rd!r}, memory_every_steps=1, save_on_epoch_end=False)
b.train_step(model, opt); run.step()
run.engine.fast.drain(600)  # the snapshot is hashed in the background: complete before the kill
os.kill(os.getpid(), 9)
"""


def bench_restore(tmp: Path, mb: int, rounds: int) -> tuple[dict[str, float], str]:
    """Restore the slot a kill -9 left, as a restart does (verify digests, copy into the live
    state), beside a bare torch.load of the same state: into a process that has its model but no
    optimizer state yet (a real restart: that state is materialised) and into existing state."""
    rd = tmp / "restore"
    repo = str(Path(__file__).resolve().parents[1])
    p = subprocess.run([sys.executable, "-c", CHILD.format(repo=repo, mb=mb, rd=str(rd))], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    slot = rundir.complete_slots(rd)[0].path
    model, opt = build(mb)
    f = tmp / "bare-restore.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=rd, memory_every_steps=1, save_on_epoch_end=False)
    line = f"restored step {run.global_step} from {run.resumed_from}"
    run.engine.fast.drain(600)  # the restored snapshot is persisted in the background: not during the timing
    res: dict[str, list[float]] = {"bare": [], "fresh": [], "live": []}

    def fresh() -> None:
        opt.state.clear()  # as after a restart: the optimizer has no state before its first step
        applying.apply(run, slot, verify=True)

    regions = sorted(slot.glob("*" + rundir.TENSORS_SUFFIX))
    sinks = [torch.empty(r.stat().st_size, dtype=torch.uint8).fill_(0) for r in regions]

    def floor() -> None:
        """What any verified restore must do: read every byte of the slot into warm memory and
        hash it while cached, split over 2 threads (preadv and xxh3 release the GIL)."""
        jobs = []
        for r, sink in zip(regions, sinks):
            n = r.stat().st_size
            jobs += [(r, memoryview(sink.numpy()), 0, n // 2), (r, memoryview(sink.numpy()), n // 2, n)]
        th = threading.Thread(target=_read_hash, args=(jobs[1::2],))
        th.start()
        _read_hash(jobs[0::2])
        th.join()

    res["floor"] = []
    for _ in range(rounds):
        res["floor"].append(timed(floor))
        res["bare"].append(timed(lambda: torch.load(f, map_location="cpu", weights_only=True)))
        res["fresh"].append(timed(fresh))
        res["live"].append(timed(lambda: applying.apply(run, slot, verify=True)))
    run.engine.fast.slots.free()
    rundir.free_slots(RunDir(rd).root)
    return {k: statistics.median(v) for k, v in res.items()}, line


def _read_hash(jobs: list) -> None:
    """preadv [a, b) of each file into dst[a:b] in 4 MiB chunks, hashing each chunk while cached."""
    for path, dst, a, b in jobs:
        fd = os.open(path, os.O_RDONLY)
        try:
            for s in range(a, b, 4 << 20):
                piece = dst[s:min(b, s + (4 << 20))]
                os.preadv(fd, [piece], s)
                xxhash.xxh3_64_intdigest(piece)
        finally:
            os.close(fd)


DLROVER_TIMEOUT = 180.0
DLROVER_SHM_PREFIX = "ckpt_shm_"  # its shared-memory segments (it leaves them behind after exit)


def bench_dlrover(tmp: Path, mb: int, rounds: int) -> tuple[Optional[dict[str, float]], str]:
    """DLRover's figures from bench/dlrover_child.py (its own process group); (None, why) when it
    is not installed or does not finish. Whatever it leaves in /dev/shm and its socket dir is removed."""
    if importlib.util.find_spec("dlrover") is None:
        return None, 'not installed (pip install -e ".[bench]" -c constraints-dev.txt)'
    sock = Path("/tmp/ckpt_sock")  # DLRover's fixed socket dir
    before = set(os.listdir("/dev/shm")), set(os.listdir(sock)) if sock.is_dir() else set()
    child = Path(__file__).with_name("dlrover_child.py")
    late = ""
    # Files, not pipes: its forked saver inherits them and would keep a pipe open forever.
    with open(tmp / "dlrover.out", "w") as fo, open(tmp / "dlrover.err", "w") as fe:
        p = subprocess.Popen([sys.executable, str(child), "--mb", str(mb), "--rounds", str(rounds), "--dir",
                              str(tmp)], stdout=fo, stderr=fe, start_new_session=True)
        try:
            p.wait(timeout=DLROVER_TIMEOUT)
        except subprocess.TimeoutExpired:
            late = f"no result within {DLROVER_TIMEOUT:.0f} s"
        finally:  # its forked saver (same session) outlives it otherwise
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            for name in set(os.listdir("/dev/shm")) - before[0]:
                if name.startswith(DLROVER_SHM_PREFIX):  # only what DLRover made while it ran
                    Path("/dev/shm", name).unlink(missing_ok=True)
            for name in (set(os.listdir(sock)) if sock.is_dir() else set()) - before[1]:
                (sock / name).unlink(missing_ok=True)
    out, err = (tmp / "dlrover.out").read_text(), (tmp / "dlrover.err").read_text() + late
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        last = (err.strip().splitlines() or ["no output"])[-1]
        return None, f"did not run here: {last[:160]}"
    return json.loads(lines[-1]), "DdpCheckpointer, standalone (its forked saver alive)"


def _verdict(ratio: float, goal: str) -> str:
    """' met' / ' MISSED' for a '<= x' or '>= x' goal; nothing for the reference rows."""
    op, _, x = goal.partition(" ")
    if op not in ("<=", ">="):
        return ""
    ok = ratio <= float(x) if op == "<=" else ratio >= float(x)
    return "  met" if ok else "  MISSED"


def print_table(rows: list[tuple[str, float, str]], width: int) -> None:
    """(figure, measured ratio, goal) rows under a header, each goal marked met or MISSED."""
    print(f"{'figure':<{width}} {'ratio':>7}  goal")
    for name, ratio, goal in rows:
        print(f"{name:<{width}} {ratio:>7.3f}  {goal}{_verdict(ratio, goal)}")


def framework_stall_table(run, rounds: int) -> None:
    """The framework callbacks' async_save benches: `run(r, async_save)` is one job of round `r`, returning
    its per-save figures (stall, first, floor, write, bytes); rounds alternate async and synchronous runs.
    Prints the medians and the table of the issue's goals."""
    got: dict[str, list[float]] = {"stall": [], "first": [], "floor": [], "write": [], "sync": [], "bytes": []}
    for r in range(rounds):
        a = run(r, True)
        s = run(r, False)
        for k in ("stall", "first", "floor", "write", "bytes"):
            got[k] += a[k]
        got["sync"] += s["stall"]
    m = {k: statistics.median(v) for k, v in got.items()}
    print(f"state: {m['bytes'] / (1 << 20):.0f} MiB (model + Adam), {torch.get_num_threads()} torch thread(s), "
          f"{len(got['stall'])} async and {len(got['sync'])} synchronous saves over {rounds} round(s)")
    print(f"floor (buf.copy_) {m['floor']:.3f} s | async stall {m['stall']:.3f} s | synchronous save {m['sync']:.3f} s"
          f" | background write+commit {m['write']:.3f} s | first async save (allocates the buffers) {m['first']:.3f} s")
    print_table([
        ("async stall per save / floor copy", m["stall"] / m["floor"], "<= 1.5"),
        ("async stall per save / synchronous save", m["stall"] / m["sync"], "<= 0.2"),
        ("  (first async save of a run / synchronous save)", m["first"] / m["sync"], "-"),
    ], 60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-async-", dir=os.environ.get("BENCH_TMP")) as d:
        tmp = Path(d)
        try:
            s = bench_stall(tmp, args.mb, args.rounds)
            quiet, busy = bench_throughput(tmp, args.mb, args.rounds)
            r, line = bench_restore(tmp, args.mb, args.rounds)
            dl, dl_note = bench_dlrover(tmp, args.mb, args.rounds)
        finally:  # no /dev/shm slot outlives the bench, whatever happened
            for sub in ("stall", "tput", "restore"):
                rundir.free_slots(tmp / sub)
    print(f"state: {s['bytes'] / (1 << 20):.0f} MiB (model + Adam), {torch.get_num_threads()} torch thread(s); {line}")
    print(f"floor (buf.copy_) {s['floor']:.3f} s | t.clone() {s['clone']:.3f} s | torch.save+fsync {s['save']:.3f} s"
          f" | async stall {s['ours']:.3f} s")
    rows = [
        ("async stall per save / floor copy", s["ours"] / s["floor"], "<= 1.5"),
        ("  (fresh t.clone() / floor)", s["clone"] / s["floor"], "-"),
        ("  (torch.save+fsync / floor)", s["save"] / s["floor"], "-"),
        (f"steps/s during background write / without ({busy:.2f} vs {quiet:.2f})", busy / quiet, ">= 0.9"),
        (f"memory restore, real restart (no optimizer state) / torch.load ({r['fresh']:.3f} s vs {r['bare']:.3f} s)",
         r["fresh"] / r["bare"], "<= 0.2"),
        (f"memory restore, into live optimizer state / torch.load ({r['live']:.3f} s)",
         r["live"] / r["bare"], "<= 0.2"),
        (f"  (floor, live: preadv + xxh3 of the slot's bytes, 2 threads / torch.load, {r['floor']:.3f} s)",
         r["floor"] / r["bare"], "-"),
    ]
    if dl is not None:
        rows += [
            (f"DLRover memory save stall / its floor ({dl['save']:.3f} s vs {dl['floor']:.3f} s)",
             dl["save"] / dl["floor"], "(ours: first row)"),
            (f"DLRover load_checkpoint (views of its shm) / torch.load ({dl['load']:.3f} s vs {dl['bare']:.3f} s)",
             dl["load"] / dl["bare"], "(unverified)"),
            (f"DLRover load + load_state_dict / torch.load ({dl['apply']:.3f} s)", dl["apply"] / dl["bare"],
             "(unverified)"),
        ]
    print_table(rows, 90)
    print(f"DLRover: {dl_note}" + ("" if dl is not None else "; its rows are skipped"))


if __name__ == "__main__":
    main()
