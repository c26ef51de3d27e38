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
        self.faults.before_save(state.global_step, kw.get("optimizer"))
        self.faults.after_step(state.global_step)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    p.add_argument("--out", required=True)
    # none: no resilient-run code at all (auto-attach adds the callback and the resume point);
    # ignore-resume: the callback, but the resume point is never passed to the Trainer;
    # fresh: the same, saying so (resume_from_checkpoint=False: auto-attach leaves it alone)
    p.add_argument("--callback", choices=("explicit", "none", "ignore-resume", "fresh"), default="explicit")
    p.add_argument("--async-save", action="store_true", help="ResilientCallback(async_save=True)")
    a = p.parse_args()
    cb = ResilientCallback(async_save=a.async_save) if a.callback != "none" else None
    faults = Faults(cb)
    trainer = build(a.output_dir, callbacks=[FaultCallback(faults), *([cb] if cb else []), AfterStep(faults)])
    trainer.model.register_forward_pre_hook(faults.in_forward)
    if a.callback == "explicit":
        trainer.train(resume_from_checkpoint=cb.resume_from(a.output_dir))
    elif a.callback == "fresh":
        trainer.train(resume_from_checkpoint=False)
    else:
        trainer.train()
    if a.callback == "explicit":  # auto-attach must not add a second one
        assert sum(isinstance(c, ResilientCallback) for c in trainer.callback_handler.callbacks) == 1
    if trainer.is_world_process_zero():  # DDP: every rank holds the same weights
        torch.save({k: v.clone() for k, v in trainer.model.state_dict().items()}, a.out)


if __name__ == "__main__":
    main()
