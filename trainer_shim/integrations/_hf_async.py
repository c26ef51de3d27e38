"""`ResilientCallback(async_save=True)` for the HF Trainer: its `checkpoint-N/` written by a background thread.

The Trainer has no checkpoint-IO extension point: `_save_checkpoint` calls `torch.save` (optimizer,
scheduler, RNG state, scaler) and safetensors' `save_file` (the model, through `save_pretrained`; peft's
adapters the same way) itself. While one due save runs (from the step end that decided it to
`on_save`), a `SaveWindow` wraps those writers: a call whose file lies in that checkpoint's dir, made
by the training thread, copies its object into the reusable staging buffers (the engine's
`memory_snapshot.Staging`) and returns; any other call, and every file the Trainer writes by other
means (config.json, trainer_state.json, a tokenizer), goes to disk at once as before. At `on_save` the
staged files (`StagedFiles`) go to the one writer thread, which writes each with the Trainer's own
function (the same bytes a synchronous save writes) and then commits the dir as a synchronous save
does: members hashed and fsynced, the manifest last. A kill -9 before that leaves a `checkpoint-N/`
without a manifest, which selection never picks. A writer the window does not know (DeepSpeed's,
FSDP's DCP) simply writes synchronously: still correct, only not in the background.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from .._memory.slots import Staging

__all__ = ["SaveWindow", "StagedFiles"]

# (module, attribute): the functions the Trainer (and peft, and what loads it) writes checkpoint files
# with; a module-level `from safetensors.torch import save_file as safe_save_file` binds its own name.
_WRITERS = (("torch", "save"), ("safetensors.torch", "save_file"),
            ("transformers.modeling_utils", "safe_save_file"), ("peft.peft_model", "safe_save_file"),
            ("peft.utils.save_and_load", "safe_save_file"))


class StagedFiles:
    """One save's files held back: name -> (the writer function, the staged copy, its other arguments)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.files: dict[str, tuple[Callable[..., Any], Any, tuple, dict]] = {}

    def add(self, name: str, write: Callable[..., Any], obj: Any, args: tuple, kwargs: dict) -> None:
        self.files[name] = (write, obj, args, kwargs)

    def get(self, name: str) -> Any:
        """The staged object written as `name`, or None."""
        got = self.files.get(name)
        return got[1] if got is not None else None

    def write(self) -> None:
        """Writer thread: every staged file, with the function the Trainer called (OSError on failure)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, (write, obj, args, kwargs) in self.files.items():
            write(obj, str(self.directory / name), *args, **kwargs)


class SaveWindow:
    """The writers wrapped for one save into `directory` (`open` ... `close`); never nested."""

    def __init__(self, staging: Staging) -> None:
        self.staging = staging
        self.staged: Optional[StagedFiles] = None
        self._thread: Optional[threading.Thread] = None
        self._patched: list[tuple[Any, str, Callable[..., Any]]] = []

    @property
    def is_open(self) -> bool:
        return self.staged is not None

    def open(self, directory: Path) -> None:
        self.staged = StagedFiles(Path(os.path.abspath(directory)))
        self._thread = threading.current_thread()
        for module_name, attr in _WRITERS:
            module = sys.modules.get(module_name)
            original = getattr(module, attr, None) if module is not None else None
            if callable(original):
                setattr(module, attr, self._wrap(original))
                self._patched.append((module, attr, original))

    def close(self) -> Optional[StagedFiles]:
        """The writers restored; the files staged since `open` (None when none was)."""
        for module, attr, original in reversed(self._patched):
            setattr(module, attr, original)
        self._patched.clear()
        staged, self.staged = self.staged, None
        return staged if staged is not None and staged.files else None

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def write(obj: Any, dest: Any = None, *args: Any, **kwargs: Any) -> Any:
            staged = self.staged
            if (staged is None or threading.current_thread() is not self._thread
                    or not isinstance(dest, (str, os.PathLike))
                    or Path(os.path.abspath(dest)).parent != staged.directory):
                return original(obj, dest, *args, **kwargs)
            name = Path(dest).name
            staged.add(name, original, self.staging.copy_of(name, obj), args, kwargs)
            return None
        write.__wrapped__ = original  # type: ignore[attr-defined]
        return write
