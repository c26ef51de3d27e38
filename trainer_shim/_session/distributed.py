"""Collectives of a multi-rank (torch.distributed) run: agreement on stop/save, checkpoint choice, commit.

Used only when WORLD_SIZE > 1 and the job initialised the default process group before
`trainer_shim.init()`; a single process never imports torch.distributed through this module.

A world of one uses `engine.Solo` (the same interface, no torch.distributed call). All shim
collectives run on a gloo group of their own (CPU tensors, object collectives and
`monitored_barrier` work on it whatever the job's backend is), created with `timeout`, so no
shim collective waits forever: a barrier or collective that times out raises CollectiveTimeout,
which ends the process non-zero (after a timeout the group is unusable). The supervisor restarts
the attempt from the newest complete checkpoint.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from ..errors import CollectiveTimeout, WorldSizeMismatch

__all__ = ["Dist", "CollectiveTimeout", "WorldSizeMismatch", "active_world_size"]


def active_world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class Dist:
    def __init__(self, timeout: float) -> None:
        self.timeout = float(timeout)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        td = datetime.timedelta(seconds=self.timeout)
        self.group = dist.new_group(backend="gloo", timeout=td)
        self._flags = torch.zeros(2, dtype=torch.int32)

    def guard(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs), a collective on this group; its failure becomes CollectiveTimeout."""
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:  # gloo reports timeouts and lost peers as RuntimeError
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise CollectiveTimeout(f"{what} failed on rank {self.rank} (timeout {self.timeout:g}s): {first}") from e

    def barrier(self, what: str) -> None:
        self.guard(what, dist.monitored_barrier, group=self.group,
                    timeout=datetime.timedelta(seconds=self.timeout), wait_all_ranks=True)

    def broadcast(self, obj: Any, what: str) -> Any:
        """rank 0's obj on every rank."""
        box = [obj]
        self.guard(what, dist.broadcast_object_list, box, src=0, group=self.group)
        return box[0]

    def all_gather(self, obj: Any, what: str) -> list:
        out: list = [None] * self.world_size
        self.guard(what, dist.all_gather_object, out, obj, group=self.group)
        return out

    def agree(self, stop: bool, save: bool) -> tuple[bool, bool]:
        """One all-reduce (MAX) of two int32 flags: any rank's stop or time-based save is everyone's."""
        f = self._flags
        f[0] = int(stop)
        f[1] = int(save)
        self.guard("stop/save flag all-reduce", dist.all_reduce, f, op=dist.ReduceOp.MAX, group=self.group)
        return bool(f[0]), bool(f[1])

    def destroy(self) -> None:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
