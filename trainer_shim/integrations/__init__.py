"""Framework integrations: a callback each for the HF Trainer (`.hf`) and Lightning (`.lightning`).

Importing this package imports no framework (and no torch); each submodule imports only its own.
Both reuse the shim's machinery (`_session`): heartbeats, signals, manifests, index, rotation.

Modules:

    _autoattach  auto-attach: patches a Trainer's train()/fit() so it gets the callback and the resume point
    _doctor     doctor mode for the callbacks: per-step digest records
    _resumable  a train loader Lightning can resume mid-epoch bit-exactly
"""

__all__: list[str] = []
