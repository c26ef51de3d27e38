"""Framework integrations: a callback each for the HF Trainer (`.hf`) and Lightning (`.lightning`).

Importing this package imports no framework (and no torch); each submodule imports only its own.
Both reuse the shim's machinery (`_session`): heartbeats, signals, manifests, index, rotation.
"""

__all__: list[str] = []
