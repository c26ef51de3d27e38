"""The HF callback's async_save, side by side in one process (not a test).

    .venv/bin/python bench/bench_hf_async.py [--layers 6] [--rounds 3] [--saves 4]

A real HF Trainer (CPU) trains a GPT-2 built from a config (6 layers of 512, vocab 8192: weights + Adam
state about 265 MiB) and saves `checkpoint-N/` at every step. Per save, the training thread's stall is
the time from the step end that decides the save to the end of `on_save` (timed by a callback before
the ResilientCallback and one after it): the Trainer's whole `_save_checkpoint` plus our part. One table:
- async stall per save (async_save=True: the Trainer's torch.save/safetensors writes staged, i.e.
  copied into the reusable buffers) / the floor: copying the same state (model + optimizer tensors)
  into warm preallocated buffers (`buf.copy_(t)`), timed just before each of those saves;
- async stall per save / the same job's synchronous save (async_save=False: the Trainer's own writes,
  then fsync, hash and commit on the training thread).
The background write of the previous save is waited for before each timed save (a due save waits for
the one in flight: that wait is the write's time, shown on its own). A run's first async save
allocates the buffers: shown apart, not in the medians. Rounds alternate the async and the
synchronous run so machine load hits both; figures are medians.
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
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from bench.bench_async import framework_stall_table, state_tensors, timed  # noqa: E402
from examples.hf_train import RandomTokens  # noqa: E402
from trainer_shim.integrations.hf import ResilientCallback  # noqa: E402

VOCAB = 8192


class Clock(TrainerCallback):
    """Two of them bracket the ResilientCallback: `start` stamps the step end, `stop` the end of on_save."""

    def __init__(self, cb: Any, res: dict[str, list[float]], start: bool) -> None:
        self.cb, self.res, self.start = cb, res, start
        self.bufs: list[torch.Tensor] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not self.start or not control.should_save or state.global_step >= state.max_steps:
            return  # the last step's save is synchronous by design (the Trainer may load its best next)
        self.res["n"].append(1.0)  # one more save of this run
        if self.cb.async_save:
            bg = self.cb._background
            if len(self.res["n"]) > 1:  # the previous save's write: waited for here, not inside the timed save
                self.res["write"].append(timed(bg.wait))
            tensors = state_tensors(kw["model"], kw["optimizer"].optimizer)
            if [t.shape for t in self.bufs] != [t.shape for t in tensors]:
                self.bufs = [torch.empty_like(t).copy_(t) for t in tensors]  # warm, as the floor's buffers are
            self.res["floor"].append(timed(lambda: [b.copy_(t) for b, t in zip(self.bufs, tensors)]))
            self.res["bytes"] = [float(sum(t.numel() * t.element_size() for t in tensors))]
        self.res["t0"] = [time.perf_counter()]

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.start or "t0" not in self.res:
            return
        first = self.cb.async_save and len(self.res["n"]) == 1
        self.res["first" if first else "stall"].append(time.perf_counter() - self.res.pop("t0")[0])


def train(tmp: Path, layers: int, saves: int, async_save: bool) -> dict[str, list[float]]:
    """One Trainer.train of saves + 2 steps, a save at every step (the last one not timed); the figures."""
    res: dict[str, list[float]] = {"stall": [], "first": [], "floor": [], "write": [], "n": []}
    cb = ResilientCallback(run_dir=tmp / ("async" if async_save else "sync"), async_save=async_save)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=512, n_head=8, vocab_size=VOCAB, n_positions=64))
    args = TrainingArguments(
        output_dir=str(tmp / ("async-out" if async_save else "sync-out")), per_device_train_batch_size=2,
        max_steps=saves + 2, learning_rate=1e-4, save_strategy="steps", save_steps=1, save_total_limit=2,
        logging_steps=1000, report_to=[], seed=0, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(n=4 * (saves + 2), vocab=VOCAB),
                      callbacks=[Clock(cb, res, True), cb, Clock(cb, res, False)])
    trainer.train(resume_from_checkpoint=cb.resume_from(args.output_dir))
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--saves", type=int, default=4, help="timed saves per run (after the first)")
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="bench-hf-async-", dir=os.environ.get("BENCH_TMP")) as d:
        framework_stall_table(lambda r, a: train(Path(d) / f"r{r}", args.layers, args.saves, a), args.rounds)

if __name__ == "__main__":
    main()
