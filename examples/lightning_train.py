"""A tiny Lightning job (MLP with dropout, plain shuffled DataLoader, random data) under resilient-run.

    resilient-run --run-dir runs/pl examples/lightning_train.py

The three lines that make it resilient are marked `# resilient-run`.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package works the same
    import pytorch_lightning as pl

from trainer_shim.integrations.lightning import ResilientCallback  # resilient-run


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=1e-3)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)}


def build(epochs: int = 3, callbacks: Optional[list[Any]] = None, root: Optional[str] = None, **trainer_args: Any) -> tuple:
    """`trainer_args` override the Trainer's defaults (e.g. strategy="ddp", devices=2 under torchrun)."""
    pl.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1234)
    data = TensorDataset(torch.randn(256, 16, generator=g), torch.randn(256, 1, generator=g))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    trainer = pl.Trainer(**{**dict(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                   enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                                   default_root_dir=root), **trainer_args})
    return Regressor(), loader, trainer


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", help="write the final weights here (torch.save of the state_dict)")
    a = p.parse_args(argv)
    cb = ResilientCallback(save_every_steps=5)  # resilient-run
    model, loader, trainer = build(a.epochs, [cb])
    trainer.fit(model, train_dataloaders=loader, ckpt_path=cb.resume_from())  # resilient-run
    if a.out:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, a.out)


if __name__ == "__main__":
    main()
