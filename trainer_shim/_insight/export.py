"""`python -m trainer_shim._insight.export CKPT_DIR OUT [--format torch|safetensors] [--model-only]`.

The torch side of `resilient-run export` (the supervisor stays torch-free and runs this as a
child). A sharded (DCP) checkpoint is consolidated into full tensors in this one process; a
single-process or DDP one is re-saved from its members. Digests are verified first (unless the
caller just did: --verified). Output, written atomically (tmp + rename):

- torch, --model-only: the model's state dict (`model.load_state_dict(torch.load(OUT))`);
- torch: {"model": ..., "optimizer": ..., "trainer": ..., other members by name, "manifest": {...}};
- safetensors: the same tree flattened to "model.<key>" / "optimizer.state.0.exp_avg" ...
  tensor names (with --model-only the bare model keys); non-tensor leaves and the manifest go to
  the file's metadata as JSON (`resilient_run`). Tied tensors are stored once each (cloned).

Exit codes: 0 written, 2 bad input (not a valid checkpoint, safetensors missing, bad OUT).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from .. import rundir
from ..errors import CheckpointError
from ..rundir import EXIT_BAD_INPUT, EXIT_OK
from .._restore import read

__all__ = ["export", "flatten", "main"]



def flatten(obj: Any, prefix: str = "") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, other leaves) of a nested dict/list tree, keyed by dotted paths."""
    tensors: dict[str, torch.Tensor] = {}
    other: dict[str, Any] = {}

    def walk(o: Any, key: str) -> None:
        if isinstance(o, torch.Tensor):
            tensors[key] = o
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, f"{key}.{i}" if key else str(i))
        else:
            other[key] = o if isinstance(o, (int, float, str, bool, type(None))) else repr(o)

    walk(obj, prefix)
    return tensors, other


def _members(path: Path, manifest: rundir.Manifest, model_only: bool) -> Any:
    if manifest.sharded:
        from .._state import sharded

        if model_only:
            return sharded.full_model_state(path)
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(str(path), os.path.join(tmp, "full.pt"))
            full = torch.load(os.path.join(tmp, "full.pt"), map_location="cpu", weights_only=False)
        out = {"model": full.pop("model", {}), "optimizer": full.pop("optim", {}), **full}
        names = [n for n in manifest.files if n.endswith(".pt")]
        _, files = read.read_checkpoint(path, names=names, verify=False) if names else (None, {})
    else:
        _, files = read.read_checkpoint(path, model_only=model_only, verify=False)
        if model_only:
            return files[rundir.MODEL_FILE]
        out = {}
    for name, obj in files.items():
        out[name[:-3] if name.endswith(".pt") else name] = obj
    out["manifest"] = manifest.to_json()
    return out


def export(ckpt_dir: Path, out: Path, fmt: str = "torch", model_only: bool = False, verify: bool = True) -> dict:
    """Write the export; returns a summary (tensors, bytes). CheckpointError/ValueError on bad input."""
    if fmt not in ("torch", "safetensors"):
        raise ValueError(f"--format must be torch or safetensors, got {fmt!r}")
    if fmt == "safetensors":
        if importlib.util.find_spec("safetensors") is None:  # _write needs it: fail before any work
            raise ValueError("--format safetensors needs the safetensors package; pip install safetensors")
    try:
        info = rundir.inspect_checkpoint(Path(ckpt_dir), full=verify)
    except rundir.InvalidCheckpoint as e:
        raise CheckpointError(f"{ckpt_dir}: {e.reason}") from e
    obj = _members(info.path, info.manifest, model_only)
    out = Path(out)
    if out.is_dir():
        raise ValueError(f"{out} is a directory; give a file name")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        _write(obj, out, tmp, fmt, info.manifest.global_step)
    except OSError as e:  # the output side only: the checkpoint was read and verified above
        raise ValueError(f"cannot write {out}: {e.strerror or e}; give an OUT path in a writable directory") from e
    finally:
        tmp.unlink(missing_ok=True)
    return {"tensors": len(flatten(obj)[0]), "bytes": out.stat().st_size, "step": info.manifest.global_step,
            "sharded": info.manifest.sharded}


def _write(obj: Any, out: Path, tmp: Path, fmt: str, step: int) -> None:
    """torch.save or safetensors into `tmp`, then renamed to `out` (never a half-written `out`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "torch":
        torch.save(obj, tmp)
    else:
        from safetensors.torch import save_file
        tensors, other = flatten(obj)
        seen: set[int] = set()
        clean = {}
        for k, t in tensors.items():
            t = t.detach().cpu().contiguous()
            ptr = t.untyped_storage().data_ptr() if t.numel() else -1
            clean[k] = t.clone() if ptr in seen else t  # safetensors refuses shared storage
            seen.add(ptr)
        meta = {"resilient_run": json.dumps({"other": other, "step": step}, default=repr)}
        save_file(clean, str(tmp), metadata=meta)
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer_shim._insight.export")
    ap.add_argument("ckpt_dir")
    ap.add_argument("out")
    ap.add_argument("--format", default="torch")
    ap.add_argument("--model-only", action="store_true")
    ap.add_argument("--verified", action="store_true", help="digests were just verified by the caller")
    a = ap.parse_args(argv)
    try:
        s = export(Path(a.ckpt_dir), Path(a.out), a.format, a.model_only, verify=not a.verified)
    except (CheckpointError, ValueError, OSError) as e:
        print(f"trainer_shim._insight.export: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(s))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
