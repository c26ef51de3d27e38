"""examples/hf_train.py plus the test's fault knobs (tests/integrations/faults.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import argparse  # noqa: E402

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from examples.hf_train import build  # noqa: E402
from tests.integrations.faults import Faults  # noqa: E402
from trainer_shim.integrations.hf import ResilientCallback  # noqa: E402


class FaultCallback(TrainerCallback):
    """Runs before ResilientCallback: on_save here is after the Trainer's files, before our manifest."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def on_save(self, args, state, control, **kw):
        self.faults.in_save(state.global_step)


class AfterStep(TrainerCallback):
    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def on_step_end(self, args, state, control, **kw):
        self.faults.after_step(state.global_step)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    cb = ResilientCallback()
    faults = Faults(cb)
    trainer = build(a.output_dir, callbacks=[FaultCallback(faults), cb, AfterStep(faults)])
    trainer.model.register_forward_pre_hook(faults.in_forward)
    trainer.train(resume_from_checkpoint=cb.resume_from(a.output_dir))
    if trainer.is_world_process_zero():  # DDP: every rank holds the same weights
        torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, a.out)


if __name__ == "__main__":
    main()
