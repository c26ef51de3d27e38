"""The data cursor's resume: rebuild an epoch's iterator at batch k exactly as the interrupted run had it."""

from __future__ import annotations

import sys
from typing import Any, Iterator, Optional

from .._state import data, rng

__all__ = ["resumed_iter"]


def resumed_iter(loader: Any, resume: dict) -> tuple[Iterator, Optional[dict]]:
    """(iterator, epoch-start RNG) of a mid-epoch resume; leaves the RNG exactly as after the checkpointed step."""
    k = resume["batch_in_epoch"]
    gen = data.loader_generator(loader)
    epoch_rng = resume.get("epoch_rng")
    start_rng = epoch_rng if k > 0 else rng.capture(gen)
    if epoch_rng is not None and k > 0:
        rng.restore(epoch_rng, gen)  # the iterator's own draws must see the epoch-start state
    if data.is_stateful(loader) and resume.get("loader_state") is not None:
        # A stateful loader knows its own position (and its own shuffling state) at any k.
        loader.load_state_dict(resume["loader_state"])
        it = iter(loader)
    elif data.can_skip_by_index(loader):
        if loader.num_workers > 0:  # a process resumes once: this warns once
            print(f"trainer_shim: warning: mid-epoch resume with num_workers={loader.num_workers}: batches are "
                  "identical for a deterministic __getitem__, but worker-side randomness may differ "
                  "(workers are assigned round-robin from the resume point)", file=sys.stderr, flush=True)
        new, skip = data.resumed_loader(loader, k)
        it = iter(new)
        skip.prime()  # single-process loaders draw the sampler seed lazily: do it now
    else:
        it = data.skip_plain(loader, k)
    if k > 0:  # at k == 0 the iterator's draws are exactly what the interrupted run did next
        rng.restore(resume["step_rng"])
    return it, start_rng
