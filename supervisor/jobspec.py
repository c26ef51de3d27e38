"""What `run`'s job tokens and run dir mean: a script or a command that exists, a usable run dir."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from trainer_shim.rundir import EnvError, check_shm_dir

from .config import Config
from .errors import ConfigError, RunDirError

__all__ = ["command_mode", "resolve_job", "run_dir_of"]


def command_mode(argv: list[str], tokens: list[str]) -> bool:
    """Whether the job tokens came after `--` (a COMMAND, not SCRIPT.py): click's parser erases the
    distinction, so it is read from the argv `main` was given."""
    return bool(tokens) and len(argv) > len(tokens) and argv[len(argv) - len(tokens) - 1] == "--"


def default_run_dir(command: tuple[str, ...], script: Optional[str]) -> Path:
    if script:
        stem = Path(script).stem
    else:
        stem = next((Path(a).stem for a in command[1:] if a.endswith(".py")), Path(command[0]).name)
    return Path("runs") / stem


def resolve_job(job: list[str], command_mode: bool) -> dict:
    """CLI job tokens -> config values (script+args, or command), checking the program exists."""
    if not job:
        return {}
    if command_mode:
        exe = job[0]
        found = shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) and os.path.isfile(exe) else None)
        if not found:
            raise ConfigError(f"command {exe!r} not found or not executable; check PATH or give a full path")
        return {"command": job}
    script = job[0]
    if not os.path.isfile(script):
        raise ConfigError(f"script {script!r} not found; check the path (or run a program with `-- COMMAND ...`)")
    return {"script": script, "args": job[1:]}


def check_run_dir(path: Path, explicit: bool) -> None:
    if path.exists() and not path.is_dir():
        raise RunDirError(f"run dir {path} is a file; choose another --run-dir")
    parent = path.absolute().parent
    if explicit and not path.exists() and not parent.is_dir():
        raise RunDirError(f"parent directory {parent} of the run dir does not exist; create it or choose another --run-dir")
    probe = path if path.exists() else next((p for p in [parent, *parent.parents] if p.exists()), parent)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunDirError(f"run dir {path} is not writable ({probe}); choose another --run-dir")


def run_dir_of(cfg: Config, config_file: Optional[Path], tokens: list[str]) -> Path:
    """The run dir for `cfg` after the checks a bad invocation must fail before anything starts."""
    if not tokens and cfg.script and not os.path.isfile(cfg.script):
        raise ConfigError(f"script {cfg.script!r} (from {config_file}) not found; fix `script:` in the config")
    rdir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg.command, cfg.script)
    check_run_dir(rdir, explicit=cfg.run_dir is not None)
    if cfg.working_dir and not os.path.isdir(cfg.working_dir):
        raise ConfigError(f"working_dir {cfg.working_dir} is not a directory")
    try:
        check_shm_dir(os.environ)   # its trainers inherit it: refuse it before anything starts
    except EnvError as e:
        raise ConfigError(str(e)) from e
    return rdir
