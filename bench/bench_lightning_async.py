"""The Lightning callback's async_save, side by side in one process (not a test).

    .venv/bin/python bench/bench_lightning_async.py [--mb 256] [--rounds 3] [--saves 4]

A real Lightning Trainer (CPU) trains a model whose weights + Adam state are about `--mb` MiB and
saves at every step. Per save, the training thread's stall is the time the ResilientCallback's
step-end hook takes at that step (timed by a callback before it and one after it). One table:
- async stall per save (async_save=True: Lightning's checkpoint dict built and copied into the
  reusable buffers) / the floor: copying the same state (model + optimizer tensors) into warm
  preallocated buffers (`buf.copy_(t)`), timed just before each of those saves;
- async stall per save / the same job's synchronous save (async_save=False: Lightning's own
  torch.save, then fsync, hash and commit on the training thread).
The background write of the previous save is waited for before each timed save (a due save waits
for the one in flight: that wait is not the copy's cost and is shown on its own, as the write's
time). A run's first async save allocates the buffers: shown apart, not in the medians. Rounds
alternate the async and the synchronous run so machine load hits both; figures are medians.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
for _k in [k for k in os.environ if k.startswith("RESILIENT_")]:  # not a supervised run: our own run dirs
    del os.environ[_k]

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import lightning.pytorch as pl  # noqa: E402

from bench.bench_async import HIDDEN, framework_stall_table, state_tensors, timed  # noqa: E402
from trainer_shim.integrations.lightning import ResilientCallback  # noqa: E402


class Big(pl.LightningModule):
    """Linear layers of HIDDEN x HIDDEN: weights + Adam's two moments are about `mb` MiB."""

    def __init__(self, mb: int) -> None:
        super().__init__()
        layers = max(1, round(mb * (1 << 20) / 3 / (HIDDEN * HIDDEN * 4)))
        self.net = nn.Sequential(*[nn.Linear(HIDDEN, HIDDEN) for _ in range(layers)])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


class Clock(pl.Callback):
    """Two of them bracket the ResilientCallback: `start` before its step-end hook, `stop` after."""

    def __init__(self, cb: Any, res: dict[str, list[float]], start: bool) -> None:
        self.cb, self.res, self.start = cb, res, start
        self.bufs: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        if not self.start:
            first = self.cb.async_save and len(self.res["n"]) == 1
            self.res["first" if first else "stall"].append(time.perf_counter() - self.res.pop("t0")[0])
            return
        self.res["n"].append(1.0)  # one more save of this run
        if self.cb.async_save:
            bg = self.cb._background
            if len(self.res["n"]) > 1:  # the previous save's write: waited for here, not inside the timed hook
                self.res["write"].append(timed(bg.wait))
            tensors = state_tensors(pl_module, trainer.optimizers[0])
            if [t.shape for t in self.bufs] != [t.shape for t in tensors]:
                self.bufs = [torch.empty_like(t).copy_(t) for t in tensors]  # warm, as the floor's buffers are
            self.res["floor"].append(timed(lambda: [b.copy_(t) for b, t in zip(self.bufs, tensors)]))
            self.res["bytes"] = [float(sum(t.numel() * t.element_size() for t in tensors))]
        self.res["t0"] = [time.perf_counter()]


def fit(tmp: Path, mb: int, saves: int, async_save: bool, model: Big) -> dict[str, list[float]]:
    """One Trainer.fit of saves + 1 steps, a save at every step; the figures of that run."""
    res: dict[str, list[float]] = {"stall": [], "first": [], "floor": [], "write": [], "n": []}
    cb = ResilientCallback(save_every_steps=1, run_dir=tmp / ("async" if async_save else "sync"), keep_last=2,
                           save_on_train_end=False, async_save=async_save)
    data = TensorDataset(torch.randn(4 * (saves + 1), HIDDEN))
    trainer = pl.Trainer(max_steps=saves + 1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp),
                         callbacks=[Clock(cb, res, True), cb, Clock(cb, res, False)])
    trainer.fit(model, train_dataloaders=DataLoader(data, batch_size=4), ckpt_path=None)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--saves", type=int, default=4, help="timed saves per run (after the first)")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Big(args.mb)
    with tempfile.TemporaryDirectory(prefix="bench-lightning-async-", dir=os.environ.get("BENCH_TMP")) as d:
        framework_stall_table(lambda r, a: fit(Path(d) / f"r{r}", args.mb, args.saves, a, model), args.rounds)

if __name__ == "__main__":
    main()
