"""Memory snapshot slots, as the shim's modules call them.

Finding, persisting and freeing slots is torch-free and shared with the supervisor, so it lives
in the contract (trainer_shim.rundir.snapshots, .slot_memory); the member copy is the commit
protocol's (trainer_shim.rundir.commit). The names below keep the shim's callers.
"""

from __future__ import annotations

from .. import rundir
from .._process.messages import say
from ..rundir.commit import copy_member
from ..rundir.snapshots import add_to_index, complete_slots, merged_manifest, newest_complete, persist_newest
from ..rundir.snapshots import free_slots as free, persist_slot as persist, remove_slot as remove

__all__ = ["complete_slots", "newest_complete", "merged_manifest", "persist", "add_to_index", "persist_newest",
           "remove", "free", "copy_member", "own", "disown"]


def own(rd: rundir.RunDir, rank: int) -> None:
    """Record this process as its slots' owner (so a kill leaves them visible and reclaimable), and
    take back the memory of other runs' stale slots (the rule: trainer_shim.rundir.slot_memory)."""
    try:
        rundir.record_owner(rd.root, rd.node, rank)
        if rank == 0:
            for g, why in rundir.free_stale(keep=rundir.slot_prefix(rd.root, rd.node)):
                say(f"freed {g.bytes / 2**20:.0f} MiB of stale memory snapshots in {rundir.SHM_DIR} "
                    f"({g.run_dir or g.prefix + '*'}: {why})")
    except OSError as e:
        say(f"warning: cannot record the memory snapshot owner in {rundir.SHM_DIR}: {e.strerror or e}")


def disown(rd: rundir.RunDir, rank: int) -> None:
    """The slots are freed: the owner record goes with them."""
    remove(rundir.owner_path(rd.root, rd.node, rank))
