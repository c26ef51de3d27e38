"""`resilient-run export`: verify a checkpoint's digests here (torch-free), convert it in a child.

The conversion needs torch, which the supervisor never imports: it runs as
`python -m trainer_shim._insight.export` under this interpreter (the venv that has the shim).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from trainer_shim import rundir

from ..errors import ConfigError, SupervisorError
from ..messages import say

__all__ = ["FORMATS", "export_checkpoint"]

FORMATS = ("torch", "safetensors")


def export_checkpoint(ckpt_dir: "Path | str", out: Path, fmt: str = "torch", model_only: bool = False) -> str:
    """Verify, then convert; returns the child's one-line summary. SupervisorError (exit 2) on bad input.

    An s3:// URL (a mirrored checkpoint, or a mirror prefix: its newest) is downloaded, verified,
    into a temporary dir first."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if str(ckpt_dir).startswith("s3://"):
        from ..mirror.remote import fetch   # boto3 (the s3 extra) only for a remote checkpoint

        with tempfile.TemporaryDirectory(prefix="resilient-run-export-") as tmp:
            skipped = lambda url, why: say(f"remote checkpoint skipped: {url}: {why}")  # noqa: E731
            return export_checkpoint(fetch(str(ckpt_dir), Path(tmp), skipped), out, fmt, model_only)
    ckpt_dir = Path(ckpt_dir)
    if (Path(ckpt_dir) / rundir.CHECKPOINTS).is_dir() or not (Path(ckpt_dir) / rundir.MANIFEST_NAME).exists():
        info = rundir.newest_valid([Path(ckpt_dir) / rundir.CHECKPOINTS, Path(ckpt_dir)])
        if info is None:
            raise ConfigError(f"{ckpt_dir} holds no valid checkpoint; give a checkpoint dir (RUN_DIR/checkpoints/step-N)")
        ckpt_dir = info.path   # a run dir or checkpoints dir: its newest valid checkpoint
    try:
        rundir.inspect_checkpoint(Path(ckpt_dir), full=True)
    except rundir.InvalidCheckpoint as e:
        raise ConfigError(f"not exporting {ckpt_dir}: {e.reason}") from None
    if Path(out).is_dir():
        raise ConfigError(f"output {out} is a directory; give a file name such as {Path(out) / 'model.safetensors'}")
    argv = [sys.executable, "-m", "trainer_shim._insight.export", str(ckpt_dir), str(out), "--format", fmt, "--verified"]
    if model_only:
        argv.append("--model-only")
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != rundir.EXIT_OK:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        raise SupervisorError((lines[-1] if lines else f"export failed with exit code {p.returncode}")
                              .removeprefix("trainer_shim._insight.export: "))
    return p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
