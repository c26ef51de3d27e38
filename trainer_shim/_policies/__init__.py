"""Judgements on a running job: divergence, provenance, when to save.

Private: users rely only on what `trainer_shim` exports.

    divergence     on_nonfinite: a NaN loss ends the attempt before it is saved
    memory_interval  memory_every_steps="auto" (Young/Daly, capped at 1 % of training time)
    provenance     git/args of a checkpoint and strict resume
    save_interval  save_every_seconds="auto" (Young/Daly)
"""
