"""Resuming a data stream mid-epoch: skip consumed batches by index, never by loading them.

For a torch DataLoader we build an equivalent loader whose batch_sampler drops the first k
index lists of the original one. The drop is lazy (done on the sampler's first next()) so the
RNG draws a DataLoader makes (worker base_seed at iter(), RandomSampler seed at the first
index) happen in the same order as in the interrupted run.

Limits (documented, not hidden):
* num_workers > 0: batches are assigned to workers round-robin from the resume point, so a
  worker's own RNG may serve a different batch than before. Data from a deterministic
  __getitem__ is identical; randomness inside workers is not. A warning says so once.
* Iterable-style datasets have no sampler to skip in: the k batches are consumed (loaded).
* Plain sequences are sliced; other re-iterables are advanced with islice (consumed).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Optional

from torch.utils.data import DataLoader, IterableDataset


def is_stateful(loader: Any) -> bool:
    """A torchdata StatefulDataLoader or anything shaped like one (its position is in its state_dict)."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def loader_generator(loader: Any) -> Any:
    return getattr(loader, "generator", None) if isinstance(loader, DataLoader) else None


class _SkipIter:
    """Iterator over index lists that drops the first k lazily (on first next() or prime())."""

    def __init__(self, inner: Iterable, k: int) -> None:
        self._inner = inner
        self._it: Optional[Iterator] = None
        self._k = k

    def prime(self) -> None:
        if self._it is None:
            self._it = iter(self._inner)
            for _ in itertools.islice(self._it, self._k):
                pass

    def __iter__(self) -> "_SkipIter":
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self.prime()
        return next(self._it)  # type: ignore[arg-type]


class SkipBatches:
    """A batch_sampler (or sampler) wrapper yielding `inner` minus its first k items, indices only."""

    def __init__(self, inner: Iterable, k: int) -> None:
        self.inner = inner
        self.k = k
        self.active: Optional[_SkipIter] = None

    def __iter__(self) -> _SkipIter:
        self.active = _SkipIter(self.inner, self.k)
        return self.active

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.k)  # type: ignore[arg-type]

    def prime(self) -> None:
        """Force the skip now (single-process loaders draw the sampler seed lazily)."""
        if self.active is not None:
            self.active.prime()


def can_skip_by_index(loader: Any) -> bool:
    return isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset)


def resumed_loader(loader: DataLoader, k: int) -> tuple[DataLoader, SkipBatches]:
    """An equivalent DataLoader starting at batch k of the epoch `loader` would produce."""
    kw: dict[str, Any] = dict(
        num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
        timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
        persistent_workers=getattr(loader, "persistent_workers", False),
    )
    if loader.num_workers > 0 and getattr(loader, "prefetch_factor", None) is not None:
        kw["prefetch_factor"] = loader.prefetch_factor
    for name in ("pin_memory_device", "in_order"):
        if hasattr(loader, name):
            kw[name] = getattr(loader, name)
    if loader.batch_sampler is not None:
        skip = SkipBatches(loader.batch_sampler, k)
        new = DataLoader(loader.dataset, batch_sampler=skip, **kw)
    else:  # batch_size=None: every sampler index is one "batch"
        skip = SkipBatches(loader.sampler, k)
        new = DataLoader(loader.dataset, batch_size=None, sampler=skip, **kw)
    return new, skip


def skip_plain(iterable: Iterable, k: int) -> Iterator:
    """Sequences are sliced (no element touched); other iterables are consumed k items."""
    if k <= 0:
        return iter(iterable)
    if isinstance(iterable, (list, tuple, range)):
        return iter(iterable[k:])
    return itertools.islice(iter(iterable), k, None)
