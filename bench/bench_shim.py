"""Benchmark trainer_shim against bare PyTorch, side by side in one process (not a test).

    .venv/bin/python bench/bench_shim.py [--mb 256] [--steps 3000]

Prints one table: measured ratio vs target for step overhead, verified save, verified restore
(read back as fresh objects, and into the model as a restore meets it) and the newest-valid lookup among 1,000 checkpoints. Bare and shim runs alternate and each
side reports its best round (other processes on a shared machine only ever add time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import trainer_shim  # noqa: E402
from trainer_shim import rundir  # noqa: E402
from trainer_shim._restore import read


def bench_step(tmp: Path, steps: int, rounds: int = 7) -> tuple[float, float, float]:
    """Median per-step time of a tiny CPU training step without and with run.step(), same objects.

    Also returns the directly measured cost of run.step() plus the optimizer post-hook the
    shim registers (the hook also runs in the bare loop, so it is added here explicitly).
    """
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=tmp / "step-run", save_on_epoch_end=False)

    def loop(n: int, shim: bool) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if shim:
                run.step(loss=loss.item())
            else:
                loss.item()  # same sync as the shim loop, so only run.step() differs
        return (time.perf_counter() - t0) / n

    loop(300, False), loop(300, True)  # warm up
    bare, with_shim = [], []
    for r in range(rounds):  # interleaved, order alternating, so drift and position hit both
        for shim in ((False, True) if r % 2 == 0 else (True, False)):
            (with_shim if shim else bare).append(loop(steps, shim))
    n = 100_000
    t0 = time.perf_counter()
    for _ in range(n):
        run.step(loss=0.5)
        run._on_optimizer_step(opt, (), {})
    direct = (time.perf_counter() - t0) / n
    run.engine.hb.stop()
    # min over rounds: other processes on a shared 2-core box only ever add time
    return min(bare), min(with_shim), direct


class Big(nn.Module):
    def __init__(self, mb: int) -> None:
        super().__init__()
        n = mb * (1 << 20) // 4 // 4
        self.w = nn.ParameterList([nn.Parameter(torch.randn(n)) for _ in range(4)])


def bench_save_restore(tmp: Path, mb: int, reps: int = 5) -> tuple[float, ...]:
    model = Big(mb)
    bare_dir = tmp / "bare"
    bare_dir.mkdir()
    rd = tmp / "save-run"
    run = trainer_shim.init(model=model, run_dir=rd, save_on_epoch_end=False, keep_last=1, keep_best=0)
    t_bare, t_shim = [], []

    def bare_save(i: int) -> float:
        p = bare_dir / f"{i}.pt"
        t0 = time.perf_counter()
        with open(p, "wb") as f:
            torch.save(model.state_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        dt = time.perf_counter() - t0
        p.unlink()
        return dt

    def shim_save() -> float:
        run.global_step += 1
        t0 = time.perf_counter()
        assert run.save() is not None
        dt = time.perf_counter() - t0
        run.engine.retention.join()  # rotation unlinks in the background; keep it out of the bare timing
        return dt

    for i in range(reps + 1):  # the first round only warms the page cache / allocator for both
        if i % 2 == 0:
            t_bare.append(bare_save(i))
            t_shim.append(shim_save())
        else:
            t_shim.append(shim_save())
            t_bare.append(bare_save(i))
    t_bare, t_shim = t_bare[1:], t_shim[1:]
    run.engine.hb.stop()
    # restore: full digest check + weights_only load of every member vs one bare torch.load
    info = rundir.newest_valid([rd / "checkpoints"])
    bare_file = bare_dir / "x.pt"
    torch.save(model.state_dict(), bare_file)
    torch.load(bare_file, map_location="cpu", weights_only=True)  # warm both files into the page cache
    read.read_checkpoint(info.path)
    r_bare, r_shim, a_bare, a_shim = [], [], [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.load(bare_file, map_location="cpu", weights_only=True)
        r_bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        read.read_checkpoint(info.path)
        r_shim.append(time.perf_counter() - t0)
        # As a restore meets it: into the model. The shim's restore hands read_checkpoint the live
        # state dict (restoring._load_members); load_state_dict runs only if that did not fill it.
        t0 = time.perf_counter()
        model.load_state_dict(torch.load(bare_file, map_location="cpu", weights_only=True))
        a_bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        live = model.state_dict()
        _, files = read.read_checkpoint(info.path, into={rundir.MODEL_FILE: live})
        if files[rundir.MODEL_FILE] is not live:
            model.load_state_dict(files[rundir.MODEL_FILE])
        a_shim.append(time.perf_counter() - t0)
    # best of N for both sides: on a shared box, other jobs' I/O only ever adds time
    return min(t_bare), min(t_shim), min(r_bare), min(r_shim), min(a_bare), min(a_shim)


def bench_lookup(tmp: Path, n: int = 1000) -> float:
    """newest_valid over n tiny committed checkpoints (plus a torn newest tmp dir)."""
    root = tmp / "many" / "checkpoints"
    root.mkdir(parents=True)
    for step in range(1, n + 1):
        d = root / rundir.checkpoint_name(step)
        d.mkdir()
        (d / "model.pt").write_bytes(b"x" * 64)
        m = rundir.Manifest(global_step=step, epoch=0, batch_in_epoch=step, kind=rundir.CheckpointKind.STEP,
                            loss=None, created_at=rundir.now_iso(),
                            files={"model.pt": rundir.FileEntry(64, rundir.digest_file(d / "model.pt"))})
        rundir.atomic_write_json(d / rundir.MANIFEST_NAME, m.to_json(), durable=False)
    (root / rundir.checkpoint_name(n + 1)).mkdir()  # committed name, no manifest: must be skipped
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        info = rundir.newest_valid([root], full=True)
        times.append(time.perf_counter() - t0)
        assert info is not None and info.step == n
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3000)
    args = ap.parse_args()
    base = Path(os.environ.get("BENCH_DIR", tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix="bench-shim-", dir=base) as d:
        tmp = Path(d)
        bare, shim, direct = bench_step(tmp, args.steps)
        sb, ss, rb, rs, ab, as_ = bench_save_restore(tmp, args.mb)
        lookup = bench_lookup(tmp)
    rows = [
        ("run.step() overhead (tiny CPU step)", f"{bare * 1e6:.1f} us -> {shim * 1e6:.1f} us",
         f"{(shim / bare - 1) * 100:+.2f} %", "<= 2 %", shim / bare - 1 <= 0.02),
        ("  run.step()+hook measured directly", f"{direct * 1e6:.2f} us of {bare * 1e6:.1f} us",
         f"{direct / bare * 100:.2f} %", "<= 2 %", direct / bare <= 0.02),
        (f"verified save {args.mb} MB / torch.save+fsync", f"{sb:.3f} s -> {ss:.3f} s", f"{ss / sb:.3f}x",
         "<= 1.05x", ss / sb <= 1.05),
        (f"verified restore {args.mb} MB / torch.load", f"{rb:.3f} s -> {rs:.3f} s", f"{rs / rb:.3f}x",
         "<= 1.0x", rs / rb <= 1.0),
        ("  the same into the model / + load_state_dict", f"{ab:.3f} s -> {as_:.3f} s", f"{as_ / ab:.3f}x",
         "<= 1.0x", as_ / ab <= 1.0),
        # The goal's literal reading, as a user meets a disk restore (into the model, verified)
        # against only the bare load, which does not even apply the state.
        ("  the same into the model / torch.load alone", f"{rb:.3f} s -> {as_:.3f} s", f"{as_ / rb:.3f}x",
         "<= 1.0x", as_ / rb <= 1.0),
        ("newest_valid among 1,000 checkpoints", f"{lookup * 1e3:.2f} ms", f"{lookup * 1e3:.2f} ms",
         "<= 100 ms", lookup <= 0.1),
    ]
    w = [max(len(str(r[i])) for r in rows) for i in range(4)]
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, dir {base}")
    print(f"{'measure':<{w[0]}}  {'bare -> shim':<{w[1]}}  {'result':>{w[2]}}  {'target':<{w[3]}}  ok")
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}  {r[3]:<{w[3]}}  {'yes' if r[4] else 'NO'}")


if __name__ == "__main__":
    main()
