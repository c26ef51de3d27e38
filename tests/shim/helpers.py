"""Helpers for the shim tests: run the real toy job in a subprocess and compare weights."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from tests.conftest import JOBS, PYTHON, child_env
from tests.support import assert_same_weights, events, kill_group, weights
from trainer_shim import rundir

TOY = JOBS / "toy_train.py"
VARIANT = Path(__file__).with_name("variant_job.py")


def run_job(script: Path, run_dir: Optional[Path], *args: str, attempt: int = 1, faults: str = "",
            env: Optional[dict[str, str]] = None, timeout: float = 120, cwd: Optional[Path] = None,
            ) -> subprocess.CompletedProcess:
    """Run a job to its end (or its injected death) and return the completed process.

    The job gets its own session and output files, not pipes: a job that SIGKILLs itself leaves
    its DataLoader workers orphaned (they may linger holding inherited fds), so we wait for the
    job's own pid and then kill whatever is left of its process group.
    """
    e = child_env(**{rundir.ENV_ATTEMPT: str(attempt)}, TOY_FAULTS=faults, **(env or {}))
    argv = [PYTHON, str(script), *args]
    if run_dir is not None:
        argv += ["--run-dir", str(run_dir)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, env=e, stdout=out, stderr=err, text=True, cwd=cwd, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            kill_group(proc)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, rc, out.read(), err.read())


def run_toy(run_dir: Optional[Path], *args: str, **kw) -> subprocess.CompletedProcess:
    return run_job(TOY, run_dir, *args, **kw)


def start_toy(run_dir: Path, *args: str, attempt: int = 1, faults: str = "") -> subprocess.Popen:
    e = child_env(**{rundir.ENV_ATTEMPT: str(attempt)}, TOY_FAULTS=faults)
    return subprocess.Popen([PYTHON, str(TOY), *args, "--run-dir", str(run_dir)], env=e,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, start_new_session=True)


def committed(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-"))


def manifest(ckpt: Path) -> dict:
    return json.loads((ckpt / "MANIFEST.json").read_text())


def rewrite_manifest(ckpt: Path) -> None:
    """Recompute sizes and digests so only the content check can reject the files."""
    m = manifest(ckpt)
    for rel in m["files"]:
        p = ckpt / rel
        m["files"][rel] = {"size": p.stat().st_size, "xxh3_128": rundir.digest_file(p)}
    (ckpt / "MANIFEST.json").write_text(json.dumps(m))


def shim_lines(proc: subprocess.CompletedProcess, needle: str) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("trainer_shim:") and needle in ln]


def chain(run_dir: Path, kills: list[int], *args: str) -> list[subprocess.CompletedProcess]:
    """Attempt i is SIGKILLed right after step kills[i-1]; the last attempt runs to the end."""
    faults = ",".join(f"{i + 1}:kill@{s}" for i, s in enumerate(kills))
    out = []
    for attempt in range(1, len(kills) + 2):
        p = run_toy(run_dir, *args, attempt=attempt, faults=faults)
        out.append(p)
        want = 0 if attempt == len(kills) + 1 else -9
        assert p.returncode == want, f"attempt {attempt}: rc {p.returncode}\n{p.stderr[-3000:]}"
    return out


__all__ = ["run_toy", "run_job", "start_toy", "weights", "assert_same_weights", "events", "committed",
           "manifest", "rewrite_manifest", "shim_lines", "chain", "kill_group", "VARIANT", "TOY"]
