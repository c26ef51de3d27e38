"""What the test jobs (tests/jobs/*.py, tests/shim/variant_job.py) share: common flags, the attempt, one training step."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from trainer_shim.rundir import ENV_ATTEMPT


def job_parser(*, epochs: int, samples: int, batch_size: int, save_every: int) -> argparse.ArgumentParser:
    """A parser with the flags all jobs share; each job adds its own and picks its defaults."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=epochs)
    ap.add_argument("--samples", type=int, default=samples)
    ap.add_argument("--batch-size", type=int, default=batch_size)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--save-every", type=int, default=save_every)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (time to act on it)")
    ap.add_argument("--run-dir", default=None)
    return ap


def attempt() -> int:
    """This process's attempt number as the supervisor set it (1 when run standalone)."""
    return int(os.environ.get(ENV_ATTEMPT, "1"))


def train_step(model: Any, opt: Any, loss_fn: Callable, x: Any, y: Any, sched: Any) -> float:
    """One optimizer and scheduler step on (x, y); the loss as a float."""
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()
