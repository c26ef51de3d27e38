"""Auto-attach: what the bootstrap (trainer_shim/_attach/sitecustomize.py) calls once a framework's
Trainer module has executed; a script with no resilient-run code gets the callback and the resume point.

* HF ``Trainer.train``: the Trainer gets a ``ResilientCallback`` unless one is already among its
  callbacks (an explicit one, by isinstance, also one added after the Trainer was built, as
  ms-swift's ``callbacks_map`` does), and ``resume_from_checkpoint`` becomes the callback's choice
  when the caller passed none (or ``True``: "the newest", which the callback verifies).
* Lightning ``Trainer.fit``: the same with ``ckpt_path``.

Patching happens while the framework module is being imported, so it only wraps methods; the
callback modules (which import the framework) are imported on the first train()/fit() call.
Options of an auto-attached callback come from $RESILIENT_CALLBACK (the config's ``callback:``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from ._session import product_env, say
from ..rundir import AUTO_INTERVAL

__all__ = ["patch_hf", "patch_lightning"]

_MARK = "__resilient_attached__"


def _options(cls: type) -> dict[str, Any]:
    """The configured callback options that `cls`'s constructor takes."""
    params = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in product_env().callback_options if k in params}


def _wrap(cls: type, name: str, make: Callable[[Callable], Callable]) -> None:
    orig = getattr(cls, name)
    if getattr(orig, _MARK, False):
        return
    wrapped = functools.wraps(orig)(make(orig))
    setattr(wrapped, _MARK, True)
    setattr(cls, name, wrapped)


# --- HF Trainer --------------------------------------------------------------------------------

def _hf_callback(trainer: Any) -> Any:
    from .hf import ResilientCallback

    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, ResilientCallback):
            return cb
    cb = ResilientCallback(**_options(ResilientCallback))
    trainer.add_callback(cb)
    cb.on_init_end(trainer.args, trainer.state, trainer.control)  # missed: the Trainer was built already
    return cb


def patch_hf(module: Any) -> None:
    """Wrap ``module.Trainer.train`` (transformers.trainer); subclasses inherit it."""
    def make(orig: Callable) -> Callable:
        def train(self: Any, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
            cb = _hf_callback(self)
            if resume_from_checkpoint is None or resume_from_checkpoint is True:
                resume_from_checkpoint = cb.resume_from(self.args.output_dir)
            return orig(self, resume_from_checkpoint, *args, **kwargs)
        return train
    _wrap(module.Trainer, "train", make)


# --- Lightning ---------------------------------------------------------------------------------

def _lightning_callback(trainer: Any) -> Any:
    from .lightning import ResilientCallback

    for cb in trainer.callbacks:
        if isinstance(cb, ResilientCallback):
            return cb
    options = _options(ResilientCallback)
    if "save_every_steps" not in options and "save_every_seconds" not in options:
        # Lightning saves nothing on its own before the end: a job that dies at hour 10 must not lose 10 h.
        options["save_every_seconds"] = AUTO_INTERVAL
        say("auto-attach: this Lightning job checkpoints every save_every_seconds='auto' (Young/Daly); "
            "set `callback: {save_every_steps: N}` in the config file for a fixed interval")
    cb = ResilientCallback(**options)
    trainer.callbacks.append(cb)
    return cb


def patch_lightning(module: Any) -> None:
    """Wrap ``module.Trainer.fit`` (lightning.pytorch or pytorch_lightning)."""
    def make(orig: Callable) -> Callable:
        sig = inspect.signature(orig)

        def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(self, *args, **kwargs)
            cb = _lightning_callback(self)
            if bound.arguments.get("ckpt_path") is None:
                bound.arguments["ckpt_path"] = cb.resume_from()
            return orig(*bound.args, **bound.kwargs)
        return fit
    _wrap(module.Trainer, "fit", make)
