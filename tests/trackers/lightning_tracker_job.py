"""A Lightning job with the explicit callback and a TensorBoardLogger without a version (the next
free version_N at every start), logging its loss at every step.

TRACKER_KILLS="1:12,2:23": SIGKILL at the end of the batch that makes that global step in that attempt.
"""

from __future__ import annotations

import os
import signal
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from trainer_shim.integrations.lightning import ResilientCallback

kills = dict(item.split(":") for item in filter(None, os.environ.get("TRACKER_KILLS", "").split(",")))
kill_at = int(kills.get(os.environ.get("RESILIENT_ATTEMPT", "1"), 0))


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.trainer.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(240, 4), torch.randn(240, 1))
loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
cb = ResilientCallback(save_every_steps=5)
trainer = pl.Trainer(max_steps=30, logger=TensorBoardLogger(sys.argv[1]), log_every_n_steps=1, callbacks=[cb],
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     accelerator="cpu", devices=1)
trainer.fit(Model(), train_dataloaders=loader, ckpt_path=cb.resume_from())
