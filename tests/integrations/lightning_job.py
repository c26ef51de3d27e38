"""examples/lightning_train.py plus the test's fault knobs (tests/integrations/faults.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402

from examples.lightning_train import build, pl  # noqa: E402
from tests.integrations.faults import Faults  # noqa: E402
from trainer_shim.integrations.lightning import ResilientCallback  # noqa: E402


class FaultCallback(pl.Callback):
    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):  # inside trainer.save_checkpoint
        self.faults.in_save(trainer.global_step, checkpoint)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.faults.after_step(trainer.global_step)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    # none: no resilient-run code (auto-attach adds the callback, the config its save_every_steps)
    p.add_argument("--callback", choices=("explicit", "none"), default="explicit")
    p.add_argument("--async-save", action="store_true", help="ResilientCallback(async_save=True)")
    a = p.parse_args()
    cb = ResilientCallback(save_every_steps=5, async_save=a.async_save) if a.callback == "explicit" else None
    faults = Faults(cb)
    # Under torchrun (WORLD_SIZE > 1): Lightning DDP with one process per rank; torchrun started them
    # all, so Lightning does not spawn.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ddp = dict(strategy="ddp", devices=world, num_nodes=1) if world > 1 else {}
    model, loader, trainer = build(callbacks=[*([cb] if cb else []), FaultCallback(faults)], **ddp)
    model.net.register_forward_pre_hook(faults.in_forward)  # training_step calls self.net
    if cb is not None:
        trainer.fit(model, train_dataloaders=loader, ckpt_path=cb.resume_from())
        assert sum(isinstance(c, ResilientCallback) for c in trainer.callbacks) == 1  # auto-attach added none
    else:
        trainer.fit(model, train_dataloaders=loader)
    if trainer.is_global_zero:  # DDP: every rank holds the same weights
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, a.out)


if __name__ == "__main__":
    main()
