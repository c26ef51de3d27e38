"""Restoring: the one restore loop, restore from memory, the readers, and load().

Private: users rely only on what `trainer_shim` exports.

    loop         ONE restore loop for 1..N ranks: pick, verify, apply, fall back on rejection
    apply        one checkpoint applied: members read and loaded, RNGs, where training stands (Restored)
    from_memory  the memory snapshot slots the loop tries before the disk (and what becomes of them)
    read         a checkpoint's members read back verified (read_checkpoint)
    mapped_load  a plain member mapped and copied into the live tensors it belongs to: one copy, not two
    raw_read     a split member's tensors read once, straight into place, verified there
    load         `trainer_shim.load()`: the same verified read outside a training run
    landing      memory a restore lands in, faulted in by the warm standby while it waits (standby only)
    slot_maps    the slots' tensor regions mapped by the warm standby while it waits (standby only)
"""
