"""What a save captures: model, optimizer, scheduler, scaler, extras, RNG and the data position.

Private: users rely only on what `trainer_shim` exports.

    capture  Capture (one process's state at one step, on the CPU, by member file) and capture()
    data     mid-epoch data resume: skip consumed batches by index
    rng      capture and restore every RNG a step can touch
    sharded  DCP (FSDP2/DTensor) model and optimizer state, saved and loaded sharded
"""
