"""Lightning's own transformer example, shrunk: validation loader, gradient clipping, `random_split`, epochs.

The shape of lightning.pytorch.demos (`Transformer` with dropout, `random_split` of one dataset into
train/val with the global RNG, `gradient_clip_val`) on synthetic tokens, with the README's three
lines and the test's fault knobs (tests/integrations/faults.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, random_split  # noqa: E402

import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.demos.transformer import Transformer  # noqa: E402

from tests.integrations.faults import Faults  # noqa: E402
from tests.integrations.lightning_job import FaultCallback  # noqa: E402
from trainer_shim.integrations.lightning import ResilientCallback  # noqa: E402

VOCAB, BLOCK = 50, 8


class Tokens(Dataset):
    """A fixed token stream cut into (input, next-token target) blocks, like the demo's WikiText2."""

    def __init__(self, n: int = 96) -> None:
        self.data = torch.randint(VOCAB, (n * BLOCK + 1,), generator=torch.Generator().manual_seed(7))
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * BLOCK:(i + 1) * BLOCK + 1]
        return chunk[:-1], chunk[1:]


class LitTransformer(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=VOCAB, ninp=16, nhead=2, nhid=32, nlayers=1, dropout=0.2)

    def _loss(self, batch: Any) -> torch.Tensor:
        inputs, target = batch
        return torch.nn.functional.nll_loss(self.model(inputs, target), target.reshape(-1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--shuffle-val", action="store_true", help="a validation loader that draws from the global RNG")
    a = p.parse_args()
    pl.seed_everything(42, verbose=False)
    train, val = random_split(Tokens(), [0.75, 0.25])  # the global RNG, as in the example
    cb = ResilientCallback(save_every_steps=a.save_every)
    faults = Faults(cb)
    trainer = pl.Trainer(max_epochs=a.epochs, gradient_clip_val=0.25, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[cb, FaultCallback(faults)])
    model = LitTransformer()
    trainer.fit(model, train_dataloaders=DataLoader(train, batch_size=8, shuffle=True),
                val_dataloaders=DataLoader(val, batch_size=8, shuffle=a.shuffle_val), ckpt_path=cb.resume_from())
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, a.out)


if __name__ == "__main__":
    main()
