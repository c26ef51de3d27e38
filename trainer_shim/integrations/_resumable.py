"""A train loader Lightning can resume mid-epoch bit-exactly: the shim's lazy batch skipping and RNG capture.

Lightning saves a loader's ``state_dict()`` in its checkpoint and calls ``load_state_dict()``
before it iterates again (it calls such a loader "resumable"). Our state is the number of
batches handed out this epoch, the RNG state at the epoch's start (before the DataLoader drew
its seeds) and the RNG state now. On resume, ``__iter__`` restores the epoch-start state,
builds the same DataLoader iterator, drops the consumed batches as *index lists* (no sample
is loaded), then restores the state of the checkpoint: the next batch and every dropout mask
are the ones the uninterrupted run saw.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from .._state import rng
from .._state.data import can_skip_by_index, loader_generator, resumed_loader, skip_plain


class ResumableLoader:
    """Wraps the user's train loader; everything else (len, sampler, dataset, ...) is the loader's."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.batches = 0                      # handed out in the current epoch
        self._epoch_rng: Optional[dict] = None
        self._resume: Optional[dict] = None

    def __getattr__(self, name: str) -> Any:
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        gen = loader_generator(self.loader)
        res, self._resume = self._resume, None
        k = int(res["batches"]) if res else 0
        try:
            n = len(self.loader)
        except TypeError:
            n = None
        if res and 0 < k and (n is None or k < n):
            rng.restore(res["epoch_rng"], gen)
            self._epoch_rng = res["epoch_rng"]
            if can_skip_by_index(self.loader):
                dl, skip = resumed_loader(self.loader, k)
                it = iter(dl)
                if not _ordered_by_epoch(self.loader):
                    skip.prime()
            else:
                it = skip_plain(self.loader, k)
            rng.restore(res["rng"], gen)
            self.batches = k
            return self._count(it)
        if res:  # saved at an epoch's end: the RNGs continue from the saved state into the next epoch
            rng.restore(res["rng"], gen)
        self.batches = 0
        return self._count(self._epoch(gen))

    def _epoch(self, gen: Any) -> Iterator:
        # A new epoch begins at its first batch, not at iter(): Lightning asks for the iterator early
        # (at setup, when it loads the state, before validation), and whatever draws from the RNGs in
        # between (a validation loader's seed, a sanity check) happened before this epoch's start in an
        # uninterrupted run. The state captured here is what a mid-epoch resume replays the epoch from.
        self._epoch_rng = rng.capture(gen)
        yield from self.loader

    def _count(self, it: Iterator) -> Iterator:
        for batch in it:
            self.batches += 1
            yield batch

    def state_dict(self) -> dict:
        return {"batches": self.batches, "epoch_rng": self._epoch_rng,
                "rng": rng.capture(loader_generator(self.loader))}

    def load_state_dict(self, state: dict) -> None:
        self._resume = state if state and state.get("epoch_rng") is not None else None


def _ordered_by_epoch(loader: Any) -> bool:
    """Whether the loader's order comes from its sampler's set_epoch (DistributedSampler), not from the
    RNG: Lightning sets the epoch after a resume has created the iterator, so the skip waits for the
    first batch (such a sampler draws nothing from the RNG the skip would otherwise have to see)."""
    samplers = (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    return any(callable(getattr(s, "set_epoch", None)) for s in samplers)
