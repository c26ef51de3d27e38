"""examples/hf_train.py with an evaluation set evaluated at every epoch end, saving every 4 steps (12 an
epoch: the epoch's last step is a save), plus the test's fault knobs (tests/integrations/faults.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse  # noqa: E402

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from examples.hf_train import RandomTokens  # noqa: E402
from tests.integrations.faults import Faults  # noqa: E402
from tests.integrations.hf_job import AfterStep, FaultCallback  # noqa: E402
from trainer_shim.integrations.hf import ResilientCallback  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--async-save", action="store_true", help="ResilientCallback(async_save=True)")
    a = p.parse_args()
    cb = ResilientCallback(async_save=a.async_save)
    faults = Faults(cb)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))  # dropout 0.1
    args = TrainingArguments(
        output_dir=a.output_dir, per_device_train_batch_size=8, per_device_eval_batch_size=8,
        num_train_epochs=a.epochs, learning_rate=1e-3, max_grad_norm=0.25, save_strategy="steps", save_steps=4,
        save_total_limit=3, eval_strategy="epoch", logging_steps=1, report_to=[], seed=0, use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    data = RandomTokens(n=120)
    train, val = torch.utils.data.random_split(data, [96, 24], generator=torch.Generator().manual_seed(5))
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val,
                      callbacks=[FaultCallback(faults), cb, AfterStep(faults)])
    trainer.model.register_forward_pre_hook(faults.in_forward)
    trainer.train(resume_from_checkpoint=cb.resume_from(a.output_dir))
    torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, a.out)


if __name__ == "__main__":
    main()
