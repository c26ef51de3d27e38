"""Where the training code came from, and whether a resume comes from the same place.

The script's path and git commit/dirty state, and a hash of the script's arguments and config,
are recorded in every manifest. The args hash covers sys.argv[1:] and the bytes of every argument
that names an existing config file (.yaml/.yml/.json/.toml/.cfg/.ini), so an edited config file
counts as a change although the argv is the same. On resume a difference is one warning line and
a `resume_mismatch` event; with RESILIENT_STRICT_RESUME=1 (`resilient-run --strict-resume`) or
init(strict_resume=True) it is a refusal: the process exits EXIT_REFUSED (2, not retried by the
supervisor) before training.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .. import rundir
from .._session.messages import say
from .._session.hooks import write_error_record
from ..rundir import EXIT_REFUSED, RESUME_REFUSED_ERROR_TYPE, Event, RunEnv

__all__ = ["Provenance", "script_path", "git_info", "args_hash", "differences", "check_resume", "strict_from_env"]


def script_path() -> Optional[Path]:
    main = sys.modules.get("__main__")
    f = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else None)
    return Path(f).resolve() if f else None


def git_info(directory: Optional[Path], timeout: float = 2.0) -> tuple[Optional[str], Optional[bool]]:
    """(commit, dirty) of the repository containing `directory`; (None, None) when not a repo."""
    if directory is None:
        return None, None
    try:
        head = subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=timeout)
        if head.returncode != 0:
            return None, None
        commit = head.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None, None
    try:
        st = subprocess.run(["git", "-C", str(directory), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=timeout)
        dirty: Optional[bool] = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        dirty = None
    return commit, dirty


CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml", ".cfg", ".ini")


def args_hash(argv: Optional[Sequence[str]] = None, config: Optional[dict] = None) -> str:
    """The hash of the script's arguments, the config files they name and a framework's own
    arguments (`config`: e.g. a Trainer's TrainingArguments, minus the paths that differ per attempt)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    h = rundir.new_hasher()
    h.update(json.dumps(argv).encode())
    if config is not None:
        h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for a in argv:
        for cand in (a, a.split("=", 1)[-1]):
            if cand.endswith(CONFIG_SUFFIXES) and os.path.isfile(cand):
                try:
                    h.update(Path(cand).read_bytes())
                except OSError:
                    pass
                break
    return h.hexdigest()


def differences(manifest: Any, *, git_commit: Optional[str], git_dirty: Optional[bool], args: Optional[str]) -> dict:
    """{field: [checkpoint's, now]} for each known-on-both-sides field that differs."""
    out = {}
    for name, now in (("git_commit", git_commit), ("git_dirty", git_dirty), ("args_hash", args)):
        then = getattr(manifest, name, None)
        if then is not None and now is not None and then != now:
            out[name] = [then, now]
    return out


def strict_from_env(env: Optional[RunEnv] = None) -> bool:
    """Whether the supervisor asked for strict resume; `env` defaults to this process's environment.
    `false`/`0`/`no`/`off` mean off (a bare `not in ("", "0")` test once turned `false` on)."""
    env = env if env is not None else RunEnv.from_environ(os.environ)
    return bool(env.strict_resume)


def _describe(diff: dict) -> str:
    parts = []
    for name, (then, now) in diff.items():
        if name == "git_commit":
            parts.append(f"git commit {then[:12]} -> {now[:12]}")
        elif name == "git_dirty":
            parts.append(f"working tree {'dirty' if then else 'clean'} -> {'dirty' if now else 'clean'}")
        else:
            parts.append("arguments/config changed")
    return ", ".join(parts)


class _GitProbe:
    """git_info of a directory, asked in a background thread: two `git` runs (`status` of a big
    repository can take seconds) need not delay the restore that runs meanwhile."""

    def __init__(self, directory: Optional[Path]) -> None:
        self._answer: tuple[Optional[str], Optional[bool]] = (None, None)
        self._thread = threading.Thread(target=self._ask, args=(directory,), daemon=True, name="trainer_shim-git")
        self._thread.start()

    def _ask(self, directory: Optional[Path]) -> None:
        self._answer = git_info(directory)

    def answer(self) -> tuple[Optional[str], Optional[bool]]:
        self._thread.join()
        return self._answer


class Provenance:
    """Where this process's checkpoints come from (git commit and dirty state of the script's
    repository, the arguments hash) and its resume rule (`strict`: refuse a checkpoint of other
    code or arguments; else warn). The git fields arrive in the background: `settle()` waits (before
    the resume check and before training), every manifest written after it records them."""

    def __init__(self, script: Optional[Path], strict: bool) -> None:
        self.git_commit: Optional[str] = None
        self.git_dirty: Optional[bool] = None
        self.args_hash = args_hash()
        self.strict = strict
        self._probe: Optional[_GitProbe] = _GitProbe(script.parent) if script else None

    @classmethod
    def for_run(cls, script: Optional[Path], strict_resume: bool, env: RunEnv) -> "Provenance":
        return cls(script, bool(strict_resume) or strict_from_env(env))

    @property
    def meta(self) -> dict[str, Any]:
        """What a manifest records of it."""
        return {"git_commit": self.git_commit, "git_dirty": self.git_dirty, "args_hash": self.args_hash}

    def settle(self) -> None:
        """Wait for the git answer and record it (once; later calls return at once)."""
        probe, self._probe = self._probe, None
        if probe is not None:
            self.git_commit, self.git_dirty = probe.answer()

    def include(self, config: dict) -> None:
        """Count a framework's own arguments in the args hash (a Trainer built in code has no argv)."""
        self.args_hash = args_hash(config=config)


def check_resume(prov: Provenance, path: Path, manifest: Any, session: Any, exit_now: Callable[[int], Any]) -> None:
    """Warn (or refuse, exit 2 by `exit_now`) when the resumed checkpoint's provenance differs from
    this process's. `session`: the process's session core (its rd, attempt, rank, world size, events)."""
    prov.settle()
    strict = prov.strict
    diff = differences(manifest, git_commit=prov.git_commit, git_dirty=prov.git_dirty, args=prov.args_hash)
    if not diff:
        return
    if session.rank == 0:
        session.event(Event.RESUME_MISMATCH, path=str(path), differences=diff, strict=strict)
    what = _describe(diff)
    if not strict:
        say(f"warning: resuming {path.name} written with different provenance: {what}")
        return
    msg = (f"refusing to resume {path}: {what} (--strict-resume); restore the original code/arguments, "
           "or resume without --strict-resume")
    write_error_record(session.rd, session.attempt, session.rank if session.world_size > 1 else 0, rundir.ErrorRecord(
        type=RESUME_REFUSED_ERROR_TYPE, message=msg, step=manifest.global_step, time=rundir.now_iso()))
    say(msg)
    exit_now(EXIT_REFUSED)
