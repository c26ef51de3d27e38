"""The wheel smoke's HF Trainer job with no resilient-run code at all (GPT-2 from a config, random
tokens, no downloads): run under `resilient-run`, auto-attach must add the callback.

    python hf_zero_code.py --output_dir DIR --report REPORT.json

REPORT.json says which callbacks the Trainer ended with and where trainer_shim was imported from,
so the smoke can tell that the *installed* package attached itself.
"""
import argparse
import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 96, length: int = 16, vocab: int = 64) -> None:
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


p = argparse.ArgumentParser()
p.add_argument("--output_dir", required=True)
p.add_argument("--report", required=True)
a = p.parse_args()

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
args = TrainingArguments(
    output_dir=a.output_dir, per_device_train_batch_size=8, num_train_epochs=1, learning_rate=1e-3,
    save_strategy="steps", save_steps=5, save_total_limit=None, logging_steps=1, report_to=[], seed=0,
    use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
)
trainer = Trainer(model=model, args=args, train_dataset=RandomTokens())   # 12 steps
trainer.train()
shim = sys.modules.get("trainer_shim")
with open(a.report, "w") as f:
    json.dump({"callbacks": [f"{type(c).__module__}.{type(c).__name__}" for c in trainer.callback_handler.callbacks],
               "trainer_shim": getattr(shim, "__file__", None)}, f)
