"""Memory snapshots and async saves: checkpoints in shared-memory slots, hashed and persisted in the background.

Private: users rely only on what `trainer_shim` exports. Loaded only when `async_save` or
`memory_every_steps` is on.

    saver      FastSaver: what init(async_save=..., memory_every_steps=...) adds to a run
    slots      a snapshot slot: its preallocated buffers in /dev/shm, fill, finalize, own/disown
    fit        whether the slots fit (slot dir, host memory, memory cgroup) before they are made
    hasher     SnapshotHasher (composed into the saver, one InFlight shared): snapshots taken at
               run.step() and completed by the hasher thread
    late_copy  the optimizer's tensors copied while the next step computes
    writer     the body of a background writer thread holding one job at a time
"""
