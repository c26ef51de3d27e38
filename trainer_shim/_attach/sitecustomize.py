"""Auto-attach bootstrap: runs at the start of every Python process of a supervised job.

Costs one dictionary lookup per import until a framework's trainer module loads: no torch, no
trainer_shim import here. When `transformers.trainer` or a Lightning trainer module has executed,
trainer_shim.integrations._autoattach patches its Trainer (the callback and the resume point); when a
tracker's module has (a SummaryWriter's, mlflow's runs), trainer_shim._trackers continues it across
restarts.
Then the user's own sitecustomize (the next one on sys.path) runs, as it would have without us.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys

# module whose execution defines what is patched -> the patch function (module:function in trainer_shim)
_AUTO = "trainer_shim.integrations._autoattach"
_TRACKERS = "trainer_shim._trackers."
_TB = "trainer_shim._trackers.tensorboard_writer:patch"
_PL_TB = "trainer_shim._trackers.lightning_logger:patch"
_TARGETS = {
    "transformers.trainer": f"{_AUTO}:patch_hf",
    "lightning.pytorch.trainer.trainer": f"{_AUTO}:patch_lightning",
    "pytorch_lightning.trainer.trainer": f"{_AUTO}:patch_lightning",
    # trackers: a restarted run reads as one run
    "torch.utils.tensorboard.writer": _TB,
    "tensorboardX.writer": _TB,
    "mlflow.tracking.fluent": "trainer_shim._trackers.mlflow_run:patch",
    "lightning.pytorch.loggers.tensorboard": _PL_TB,
    "lightning.fabric.loggers.tensorboard": _PL_TB,
    "pytorch_lightning.loggers.tensorboard": _PL_TB,
    "lightning_fabric.loggers.tensorboard": _PL_TB,
}
_HERE = os.path.dirname(os.path.abspath(__file__))
# The shim's root (the dir holding trainer_shim/): appended to sys.path only if a job's own
# Python cannot import trainer_shim (e.g. another venv), so the job's packages always win.
_SHIM_ROOT = os.path.dirname(os.path.dirname(_HERE))


def _patch(fullname: str, module: object) -> None:
    where, _, function = _TARGETS[fullname].partition(":")
    try:
        try:
            patches = importlib.import_module(where)
        except ImportError:
            if _SHIM_ROOT not in sys.path:
                sys.path.append(_SHIM_ROOT)
            patches = importlib.import_module(where)
        getattr(patches, function)(module)
    except Exception as e:
        if not where.startswith(_TRACKERS):
            raise
        # A tracker's continuity is never worth the job's import of it: one line, the tracker as it is.
        print(f"trainer_shim: warning: trackers: {fullname} not continued across restarts: "
              f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)


class _Finder:
    """A meta-path finder that only watches: it lets the other finders find a target module and
    wraps that spec's loader.exec_module (on its own loader instance) to patch after execution."""

    @classmethod
    def find_spec(cls, fullname: str, path: object = None, target: object = None) -> object:
        if fullname not in _TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: object) -> None:
            try:
                del loader.exec_module  # back to the class's: a loader may serve other modules (zipimport)
            except AttributeError:
                pass
            run(module)
            if getattr(module, "__name__", None) == fullname:
                _patch(fullname, module)

        try:
            loader.exec_module = exec_module  # this module's loader instance only
        except AttributeError:
            return spec
        return spec

    @classmethod
    def invalidate_caches(cls) -> None:
        pass


def _chain_user_sitecustomize() -> None:
    """Run the sitecustomize Python would have run without our directory first on sys.path."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # imported by `site` at start-up, not as trainer_shim._attach.sitecustomize
    if not any(f is _Finder for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder)
    already = {name for name in _TARGETS if name in sys.modules}  # cannot happen at start-up; be safe
    for name in already:
        _patch(name, sys.modules[name])
    _chain_user_sitecustomize()
