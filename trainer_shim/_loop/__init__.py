"""The API a training loop calls: init() -> Run, its options, the resumed epoch iterator.

Private: users rely only on what `trainer_shim` exports.

    cursor         rebuild an epoch's iterator at batch k exactly
    options        init()'s keywords, parsed and checked once
    resume_prompt  resume=auto|ask|never|PATH for a standalone run
    run            `init()` -> Run: the facade a training loop calls
"""
