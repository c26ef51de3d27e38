"""The API a training loop calls: init() -> Run, its options, data and RNG resume.

Private: users rely only on what `trainer_shim` exports.

    cursor         rebuild an epoch's iterator at batch k exactly
    data           mid-epoch data resume: skip consumed batches by index
    options        init()'s keywords, parsed and checked once
    resume_prompt  resume=auto|ask|never|PATH for a standalone run
    rng            capture and restore every RNG a step can touch
    run            `init()` -> Run: the facade a training loop calls
"""
