"""A small but real training job using trainer_shim; tests and the supervisor drive it.

Fault injection: TOY_FAULTS="ATTEMPT:ACTION@STEP,..." applies ACTION right after run.step()
returns at global_step == STEP when $RESILIENT_ATTEMPT (default 1) == ATTEMPT (or ATTEMPT is *).
ACTIONs: kill, raise, raise_linger (raise, then never exit), exitN, hang, deadlock, cuda_oom, alloc, sigterm,
worker_hang (the DataLoader's __getitem__ blocks forever from now on in this attempt, so the
main process waits on its workers), stall_save (the next checkpoint's first large write blocks
forever: a save that stops making progress), kill_save (SIGKILL at the next checkpoint's first
large write: a kill placed inside a save), kill_settled (SIGKILL once the memory snapshot of this
step is complete), kill_hashing (SIGKILL while this step's memory snapshot is copied but its
background hash never ends: the slot has no manifest; the previous step's snapshot is complete).

Other knobs (environment):
  TOY_WRITE_MBPS=R       large writes (>= 1 MiB, i.e. checkpoint tensors) are throttled to R MB/s:
                         a slow but progressing filesystem (NFS, a busy disk).
  TOY_ASYNC_SAVE=1       init(async_save=True);  TOY_MEMORY_EVERY=K  init(memory_every_steps=K)
  TOY_STEP_SLEEP_ATTEMPT=A --step-sleep applies in attempt A only (the others run at full speed).
  TOY_CRASH_BEFORE_STEP_ATTEMPT=A  attempt A raises right after init(), before its first step
  TOY_IMPORT=M1,M2       import these modules first, saying whether each was already imported (a
                         warm interpreter's preload, e.g. a framework the previous attempt recorded)
  TOY_CRASH_IF_RESUMED_FROM_STEP=N
                         raise right after resuming from the checkpoint of step N: a poisoned
                         checkpoint that crashes every attempt resuming from it.
  TOY_NO_EPOCH_SAVE=1    init(save_on_epoch_end=False): checkpoints at multiples of --save-every only
  TOY_WAIT_MIRRORED=1    after each step whose checkpoint was committed, wait until the supervisor's
                         --mirror reports it uploaded (every checkpoint reaches the remote)
"""

from __future__ import annotations

import importlib
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without install
import trainer_shim  # noqa: E402
from trainer_shim import rundir  # noqa: E402
from tests.jobs.jobkit import attempt, job_parser, train_step  # noqa: E402


class ToyDataset(Dataset):
    """Deterministic samples: item i depends only on i (so any worker may serve it)."""

    def __init__(self, n: int, dim: int = 16, hang_flag: "Path | None" = None) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, dim, generator=g)
        self.y = (self.x.sum(dim=1, keepdim=True) > 0).float()
        self.hang_flag = str(hang_flag) if hang_flag else None

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.hang_flag and os.path.exists(self.hang_flag):
            _worker_blocked()
        return self.x[i], self.y[i]


def _worker_blocked() -> None:
    """worker_hang: a data worker stuck for good (dead NFS read, deadlocked decoder)."""
    while True:
        time.sleep(3600)


_HANG_FLAG: "Path | None" = None   # set in main(): this attempt's worker_hang flag file
_STALL_SAVE = threading.Event()    # stall_save: the next large write never returns
_KILL_SAVE = threading.Event()     # kill_save: the next large write is where the process dies
_real_write = os.write
_BIG_WRITE = 1 << 20


def _stalled_write(fd: int, data) -> int:
    """stall_save: the checkpoint write is stuck in the kernel (hard-mounted NFS gone away)."""
    while True:
        time.sleep(3600)


def _throttled_write(fd: int, data) -> int:
    n = len(memoryview(data).cast("B"))
    if n >= _BIG_WRITE:
        if _STALL_SAVE.is_set():
            _stalled_write(fd, data)
        if _KILL_SAVE.is_set():
            os.kill(os.getpid(), signal.SIGKILL)
        rate = float(os.environ.get("TOY_WRITE_MBPS") or 0)
        if rate > 0:
            time.sleep(n / (rate * 1e6))
    return _real_write(fd, data)


_HASHING = threading.Event()       # kill_hashing: the held snapshot's hash has started


def hold_hash_at(run, step: int) -> None:
    """kill_hashing: the background hash of step `step`'s memory snapshot never finishes (the
    training thread waits in inject() at that step, so the hasher's run.global_step is the snapshot's)."""
    from trainer_shim._memory import slots as memory_snapshot

    real = memory_snapshot.Slot.hash_tensors

    def held(self):
        if run.global_step == step:
            _HASHING.set()
            while True:
                time.sleep(3600)
        return real(self)

    memory_snapshot.Slot.hash_tensors = held


def parse_faults(spec: str, attempt: int) -> dict[int, str]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        who, rest = item.split(":", 1)
        action, step = rest.rsplit("@", 1)
        if who == "*" or int(who) == attempt:
            out[int(step)] = action
    return out


def inject(action: str, run=None) -> None:
    sys.stdout.flush()
    if action == "kill_settled":
        run.engine.fast.drain()
    elif action == "kill_hashing":
        _HASHING.wait(60)
    if action in ("kill", "kill_settled", "kill_hashing"):
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "raise":
        raise RuntimeError("injected crash")
    elif action == "raise_linger":
        # An uncaught exception, then a process that never exits: a non-daemon thread blocks the
        # interpreter's shutdown, as a stuck NCCL teardown or a forgotten thread does.
        threading.Thread(target=threading.Event().wait, name="toy-linger").start()
        raise RuntimeError("injected crash")
    elif action.startswith("exit"):
        sys.exit(int(action[4:] or 1))
    elif action == "hang":
        while True:
            time.sleep(3600)
    elif action == "deadlock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    elif action == "cuda_oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    elif action == "alloc":
        hog = []
        while True:
            hog.append(bytearray(64 << 20))
            hog[-1][::4096] = b"x" * len(hog[-1][::4096])  # touch pages so RSS really grows
    elif action == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action == "worker_hang":
        assert _HANG_FLAG is not None
        _HANG_FLAG.touch()
    elif action == "stall_save":
        _STALL_SAVE.set()
    elif action == "kill_save":
        _KILL_SAVE.set()
    else:
        raise SystemExit(f"toy_train: unknown fault action {action!r}")


def wait_mirrored(run, timeout: float = 120.0) -> None:
    """TOY_WAIT_MIRRORED=1: once this step's checkpoint is committed, wait for the supervisor's
    --mirror to report it uploaded, so that every checkpoint reaches the remote whatever the timing
    (its poll would otherwise skip one committed while an upload was in flight: newest wins)."""
    name = rundir.checkpoint_name(run.global_step)
    if not (run.rd.checkpoints / name / rundir.MANIFEST_NAME).exists():
        return
    deadline = time.monotonic() + timeout
    while not any(e.get("event") == rundir.Event.CHECKPOINT_MIRRORED and Path(e.get("path", "")).name == name
                  for e in rundir.read_events(run.rd)):
        if time.monotonic() > deadline:
            raise SystemExit(f"toy_train: {name} was not mirrored within {timeout:g}s")
        time.sleep(0.05)


def validate(model: nn.Module, loader: DataLoader, loss_fn) -> float:
    model.eval()
    with torch.no_grad():
        total = sum(loss_fn(model(x), y).item() for x, y in loader)
    model.train()
    return total


def import_first() -> None:
    """TOY_IMPORT: the modules this attempt imports before anything else; is each there already?"""
    for name in filter(None, os.environ.get("TOY_IMPORT", "").split(",")):
        print(f"toy_train: {name} {'was preloaded' if name in sys.modules else 'imported now'}", flush=True)
        importlib.import_module(name)


def main() -> None:
    import_first()
    ap = job_parser(epochs=3, samples=96, batch_size=8, save_every=5)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--fallback-dir", default=None)
    ap.add_argument("--keep-last", type=int, default=3)
    ap.add_argument("--val", action="store_true", help="validate at every epoch end (a shuffled loader: it draws RNG)")
    args = ap.parse_args()

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    faults = parse_faults(os.environ.get("TOY_FAULTS", ""), attempt())
    step_sleep = args.step_sleep if os.environ.get("TOY_STEP_SLEEP_ATTEMPT", str(attempt())) == str(attempt()) else 0.0
    global _HANG_FLAG
    if "worker_hang" in faults.values():
        # Per attempt, next to the output (the run dir is created by init(), after the loader).
        _HANG_FLAG = Path(args.out or ".").absolute().parent / f".toy-worker-hang-{os.getpid()}"
        _HANG_FLAG.unlink(missing_ok=True)
    if os.environ.get("TOY_WRITE_MBPS") or {"stall_save", "kill_save"} & set(faults.values()):
        os.write = _throttled_write

    model = nn.Sequential(nn.Linear(16, args.hidden), nn.ReLU(), nn.Dropout(0.2),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    per_step = torch.optim.lr_scheduler.MultiplicativeLR(opt, lr_lambda=lambda _: 0.999)
    per_epoch = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    loader = DataLoader(ToyDataset(args.samples, hang_flag=_HANG_FLAG), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.num_workers)
    loss_fn = nn.BCEWithLogitsLoss()
    val = DataLoader(ToyDataset(32), batch_size=8, shuffle=True) if args.val else None

    run = trainer_shim.init(model=model, optimizer=opt, scheduler=per_step, extra={"epoch_sched": per_epoch},
                            run_dir=args.run_dir, save_every_steps=args.save_every, keep_last=args.keep_last,
                            fallback_dir=args.fallback_dir, async_save=os.environ.get("TOY_ASYNC_SAVE") == "1",
                            memory_every_steps=int(os.environ.get("TOY_MEMORY_EVERY") or 0) or None,
                            save_on_epoch_end=os.environ.get("TOY_NO_EPOCH_SAVE") != "1")
    held = [s for s, a in faults.items() if a == "kill_hashing"]
    if held:
        hold_hash_at(run, held[0])
    # kill_settled/kill_hashing at N: the snapshot of N is taken (not skipped while N-1's is hashed);
    # kill_hashing: N-1's too (the complete one a restart then finds).
    settle = {s - 1 for s, a in faults.items() if a in ("kill_settled", "kill_hashing")}
    settle |= {s - 2 for s, a in faults.items() if a == "kill_hashing"}
    run.state.setdefault("seen", 0)
    if os.environ.get("TOY_CRASH_BEFORE_STEP_ATTEMPT") == str(attempt()):
        raise RuntimeError("toy_train: crash before the first step")
    poison = os.environ.get("TOY_CRASH_IF_RESUMED_FROM_STEP")
    if poison and run.resumed_from and run.global_step == int(poison):
        raise RuntimeError(f"toy_train: checkpoint of step {poison} is poisoned (crash right after resume)")
    for _epoch in run.epochs(args.epochs):
        model.train()
        for x, y in run.batches(loader):
            loss = train_step(model, opt, loss_fn, x, y, per_step)
            run.state["seen"] += len(x)
            run.step(loss=loss)
            if run.global_step in settle:
                run.engine.fast.drain()
            if os.environ.get("TOY_WAIT_MIRRORED") == "1":
                wait_mirrored(run)
            if run.global_step in faults:
                inject(faults[run.global_step], run)
            if step_sleep:
                time.sleep(step_sleep)
        per_epoch.step()
        if val is not None:
            validate(model, val, loss_fn)
    run.finish()
    os.write = _real_write  # TOY_WRITE_MBPS & co. slow checkpoint writes; the result file is none
    out = Path(args.out) if args.out else run.rd.root / "final_weights.pt"
    torch.save(model.state_dict(), out)
    print(f"toy_train: finished step {run.global_step}", flush=True)


if __name__ == "__main__":
    main()
