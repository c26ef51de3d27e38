"""Capture and restore every RNG a training step can touch, as weights_only-loadable values."""

from __future__ import annotations

import random
from typing import Any, Optional

import torch

try:  # NumPy is optional: a script that never imports it has no NumPy state worth saving.
    import numpy as np
except ImportError:  # pragma: no cover
    np = None  # type: ignore[assignment]


def _python_state() -> list:
    # random.getstate() is (version, tuple of 625 ints, gauss_next); lists/ints/None load safely.
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _set_python_state(s: list) -> None:
    random.setstate((int(s[0]), tuple(int(x) for x in s[1]), s[2]))


def _numpy_state() -> Optional[dict]:
    if np is None:
        return None
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    # A tensor instead of an ndarray: weights_only refuses pickled NumPy objects.
    return {"name": str(name), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _set_numpy_state(s: Optional[dict]) -> None:
    if np is None or s is None:
        return
    keys = s["keys"].numpy().astype(np.uint32)
    np.random.set_state((s["name"], keys, s["pos"], s["has_gauss"], s["cached_gaussian"]))


def capture(generator: Optional[torch.Generator] = None) -> dict[str, Any]:
    """Python, NumPy, torch CPU, every CUDA device and (optionally) a DataLoader generator."""
    state: dict[str, Any] = {
        "python": _python_state(),
        "numpy": _numpy_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "generator": generator.get_state() if generator is not None else None,
    }
    return state


def restore(state: dict[str, Any], generator: Optional[torch.Generator] = None) -> None:
    """Inverse of capture(); CUDA states are applied only when the same devices exist."""
    _set_python_state(state["python"])
    _set_numpy_state(state.get("numpy"))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        n = min(len(cuda), torch.cuda.device_count())
        for i in range(n):
            torch.cuda.set_rng_state(cuda[i], i)
    if generator is not None and state.get("generator") is not None:
        generator.set_state(state["generator"])


def derive(state: dict[str, Any], salt: int) -> dict[str, Any]:
    """A distinct, reproducible state seeded from `state` and `salt` (the current RNGs are left as they were).

    For a rank that the checkpoint's world did not have: it starts from another rank's state,
    and without this it would draw the same dropout masks as that rank.
    """
    seed = random.Random(f"{_python_state_digest(state)}:{salt}").getrandbits(63)
    saved = capture()
    try:
        random.seed(seed)
        if np is not None:
            np.random.seed(seed % (1 << 32))
        torch.manual_seed(seed)
        out = capture()
    finally:
        restore(saved)
    out["generator"] = state.get("generator")  # the shared data order stays the shared one
    return out


def _python_state_digest(state: dict[str, Any]) -> int:
    return hash(tuple(state["python"][1])) ^ int(state["torch"].sum().item())
