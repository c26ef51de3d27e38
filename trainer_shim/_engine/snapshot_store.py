"""Memory snapshot slots, as the shim's modules call them.

Finding, persisting and freeing slots is torch-free and shared with the supervisor, so it lives
in the contract (trainer_shim.rundir.snapshots); the member copy is the commit protocol's
(trainer_shim.rundir.commit). The names below keep the shim's callers.
"""

from __future__ import annotations

from ..rundir.commit import copy_member
from ..rundir.snapshots import add_to_index, complete_slots, merged_manifest, newest_complete, persist_newest
from ..rundir.snapshots import free_slots as free, persist_slot as persist, remove_slot as remove

__all__ = ["complete_slots", "newest_complete", "merged_manifest", "persist", "add_to_index", "persist_newest",
           "remove", "free", "copy_member"]
