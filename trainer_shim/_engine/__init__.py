"""The checkpoint engine: the state it captures, commit, save, restore, retention.

Private: users rely only on what `trainer_shim` exports.

    async_save       async disk saves and memory snapshots through shared-memory slots
    checkpoint       member I/O: hashed, fsynced writes; safe weights_only reads; the manifest
    data             mid-epoch data resume: skip consumed batches by index
    landing          memory a restore lands in, faulted in by the warm standby while it waits
    late_copy        memory snapshots copy the optimizer's tensors while the next step computes
    engine           the collaborators saving/restoring/async saves share (Engine, Reporter, Stream)
    loading          `load()`: verify and load a checkpoint outside a training run
    mapped_load      a plain member restored into the live tensors it belongs to: one copy, not two
    memory_snapshot  write a checkpoint into a /dev/shm slot with the stall of a memory copy
    raw_read         split members read back: every tensor once, straight into place, verified there
    raw_tensors      the raw tensor layout of a split checkpoint member
    restoring        ONE restore loop for 1..N ranks, with fallback on rejection
    retention        index upkeep, rotation, background deletion
    rng              capture and restore every RNG a step can touch
    rotation         the pure retention policy: which checkpoints to delete
    saving           ONE commit protocol for 1..N ranks (decide -> write -> manifest -> rename)
    sharded          DCP (FSDP2/DTensor) model and optimizer state
    slot_maps        the slots' tensor regions mapped and populated by the warm standby while it waits
    slot_restore     restoring from memory snapshot slots (FastSaver's part the restore loop calls)
    snapshot_hasher  memory snapshots taken at run.step() and completed by the hasher thread
    snapshot_store   memory snapshot slots without torch: find, persist, free
    writer           the body of a background writer thread holding one job at a time
"""
