"""Framework integrations: a callback each for the HF Trainer (`.hf`) and Lightning (`.lightning`).

Importing this package imports no framework (and no torch); each submodule imports only its own.
Both reuse the shim's machinery (`_session`): heartbeats, signals, manifests, index, rotation.

Modules:

    _autoattach  auto-attach: patches a Trainer's train()/fit() so it gets the callback and the resume point
    _doctor     doctor mode for the callbacks: per-step digest records
    _lightning_async  Lightning's async_save: the checkpoint dict copied into reusable buffers, written and committed by a writer thread
    _resumable  a train loader Lightning can resume mid-epoch bit-exactly
"""

__all__: list[str] = []
