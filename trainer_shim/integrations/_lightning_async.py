"""`ResilientCallback(async_save=True)`: Lightning's checkpoint written and committed by a background thread.

A due step save costs the training thread Lightning's own checkpoint dict (`dump_checkpoint`, every
`on_save_checkpoint` hook included) and one copy of it: `trainer.save_checkpoint` runs with the
strategy's CheckpointIO swapped for `StagingIO`, whose `save_checkpoint` copies every tensor of the
dict into CPU buffers kept across saves (the engine's `memory_snapshot.Staging`: reallocated only when
a shape or dtype changes), deep-copies every other leaf, and returns. One writer thread then
torch.saves that copy as Lightning's own `.ckpt` into the checkpoint's temp dir (hashed as it is
written, fsynced) and commits it with the synchronous save's commit. A kill -9 before the commit
leaves only the temp dir, which selection never picks.

At most one save is in flight: a due save waits for the previous one (never dropped; the buffers are
then free again). A preempt or final save, an exception leaving `fit` and interpreter exit drain it
first, bounded by the engine's DRAIN_GRACE. (Lightning's own AsyncCheckpointIO clones every tensor into
new memory at each save and reports a writer failure only at the next save; here the copy goes into
the same buffers each time and a failure is a `checkpoint_failed` event at once.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from .._memory.slots import Staging
from ..rundir import LIGHTNING_CKPT
from ._background import BackgroundSaves
from ._session import say

__all__ = ["StagingIO", "copy_checkpoint"]


class StagingIO:
    """Stands in for the strategy's CheckpointIO during one `trainer.save_checkpoint`: the checkpoint
    dict Lightning hands over is copied (`state`), not written. A dict that cannot be copied (a value
    deepcopy refuses) is written by the strategy's own CheckpointIO instead, here and now (`state`
    stays None). Every other call goes to the strategy's own CheckpointIO."""

    def __init__(self, inner: Any, staging: Staging) -> None:
        self.inner = inner
        self.staging = staging
        self.state: Any = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Optional[Any] = None) -> None:
        try:
            self.state = self.staging.copy_of(LIGHTNING_CKPT, checkpoint)
        except Exception as e:
            say(f"warning: cannot copy the checkpoint for a background save ({type(e).__name__}: {e}); "
                "this one is written synchronously")
            self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.load_checkpoint(*args, **kwargs)

    def remove_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.inner.remove_checkpoint(*args, **kwargs)

    def teardown(self) -> None:
        self.inner.teardown()


def copy_checkpoint(bg: BackgroundSaves, trainer: Any, path: Path) -> Any:
    """Training thread: `trainer.save_checkpoint(path)` with Lightning's checkpoint dict copied into
    `bg`'s staging buffers instead of written. The copy, or None when `path` was written here (see
    StagingIO, or a strategy that does not save through its CheckpointIO)."""
    bg.wait()  # the buffers hold the save in flight until its write is done
    strategy = trainer.strategy
    own = strategy.checkpoint_io
    io = StagingIO(own, bg.staging)
    strategy.checkpoint_io = io  # Lightning's public extension point for where checkpoints go
    try:
        trainer.save_checkpoint(path, weights_only=False)  # full state: optimizer, loops, loader
    finally:
        strategy.checkpoint_io = own
    return io.state
