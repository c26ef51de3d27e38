"""A tiny HF Trainer job (GPT-2 built from a config, random tokens, no downloads) under resilient-run.

    resilient-run --run-dir runs/hf examples/hf_train.py --output_dir runs/hf

The three lines that make it resilient are marked `# resilient-run`.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from trainer_shim.integrations.hf import ResilientCallback  # resilient-run


class RandomTokens(torch.utils.data.Dataset):
    """Fixed random token sequences (the same on every run), labels = inputs (causal LM)."""

    def __init__(self, n: int = 96, length: int = 16, vocab: int = 64) -> None:
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build(output_dir: str, *, epochs: int = 3, save_steps: int = 5, save_total_limit: Optional[int] = 2,
          callbacks: Optional[list[Any]] = None, logging_steps: int = 1, report_to: Sequence[str] = ()) -> Trainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))  # dropout 0.1
    args = TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=8, num_train_epochs=epochs, learning_rate=1e-3,
        save_strategy="steps", save_steps=save_steps, save_total_limit=save_total_limit, logging_steps=logging_steps,
        report_to=list(report_to), seed=0, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
    )
    return Trainer(model=model, args=args, train_dataset=RandomTokens(), callbacks=callbacks)


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--logging_steps", type=int, default=1)
    p.add_argument("--out", help="write the final weights here (torch.save of the state_dict)")
    a = p.parse_args(argv)
    cb = ResilientCallback()  # resilient-run
    trainer = build(a.output_dir, epochs=a.epochs, callbacks=[cb], logging_steps=a.logging_steps)
    trainer.train(resume_from_checkpoint=cb.resume_from(a.output_dir))  # resilient-run
    if a.out:
        torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, a.out)


if __name__ == "__main__":
    main()
