"""One training process's session: its heartbeat, signals, hooks and collectives, and the
bookkeeping every save and restore of the raw loop shares.

Private: users rely only on what `trainer_shim` exports.

    distributed  Dist: the collectives of a torch.distributed job (loaded only when WORLD_SIZE > 1)
    engine       Engine: the collaborators saving, restoring and memory snapshots share; Reporter (events);
                 Group and Solo (a world of one)
    heartbeat    the heartbeat file, written by a background thread
    hooks        the process hooks of one Run, installed and removed together
    messages     say: the shim's one stderr line
    core         Session: the session core of every front end (heartbeat, mark, hooks, events, the end)
    save_time    SaveTimer: the training stall of every save, told to the run dir
    signals      stop flag, stack dumps, fork tie, excepthook
    watch        StepWatch: the first-step event, the "changed after run.step()" warning, total_steps
"""
