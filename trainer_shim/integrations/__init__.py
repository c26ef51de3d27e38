"""Framework integrations: a callback each for the HF Trainer (`.hf`) and Lightning (`.lightning`).

Importing this package imports no framework (and no torch); each submodule imports only its own.
Both reuse the shim's machinery (`_session`): heartbeats, signals, manifests, index, rotation.

Modules:

    _background  the callbacks' background saves: reusable staging buffers and one writer thread
    _autoattach  auto-attach: patches a Trainer's train()/fit() so it gets the callback and the resume point
    _doctor     doctor mode for the callbacks: per-step digest records
    _hf_async   the HF Trainer's async_save: its checkpoint writers staged while it saves, written by the writer thread
    _options    CallbackOptions: the options both callbacks take, and when a step save is due
    _lightning_async  Lightning's async_save: the checkpoint dict copied into reusable buffers, written and committed by a writer thread
    _resumable  a train loader Lightning can resume mid-epoch bit-exactly
"""

__all__: list[str] = []
