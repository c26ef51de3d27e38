"""The child process: spawn in its own group with die-with-parent, tee its output, identify and kill trees."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, Optional

import psutil

from trainer_shim.rundir import EXIT_SUPERVISOR_GONE

from ..messages import PREFIX

__all__ = ["Child", "ProcessIdentity", "spawn", "identity_of", "matches", "kill_tree", "signal_pid", "tree",
           "join_cgroup"]

_PR_SET_PDEATHSIG = 1
try:
    _libc: Optional[ctypes.CDLL] = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _libc = None


@dataclasses.dataclass(frozen=True)
class ProcessIdentity:
    """A pid plus its start time: a recorded pid is ours only if both still match (pid reuse)."""

    pid: int
    create_time: float


def identity_of(pid: int) -> Optional[ProcessIdentity]:
    try:
        return ProcessIdentity(pid, psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def matches(pid: Optional[int], create_time: Optional[float]) -> Optional[psutil.Process]:
    """The live process recorded as (pid, create_time), or None if gone or a stranger reuses the pid."""
    if not pid or create_time is None:
        return None
    try:
        p = psutil.Process(int(pid))
        if abs(p.create_time() - float(create_time)) > 0.05 or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError, TypeError):
        return None


def signal_pid(pid: int, sig: int) -> bool:
    """Send `sig`; False when the process is already gone (ESRCH), other errnos raise."""
    try:
        os.kill(pid, sig)
        return True
    except OSError as e:
        if e.errno == errno.ESRCH:
            return False
        raise


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.EPERM):
            # EPERM: the group is left only with zombies or has been reused by nobody we may signal.
            return False
        raise


def tree(pid: int) -> list[psutil.Process]:
    """The process and all its live descendants (DataLoader workers, torchrun ranks, ...)."""
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


class _Tee(threading.Thread):
    """Copies one pipe of the child to our stream and to the attempt log, byte for byte."""

    def __init__(self, pipe: BinaryIO, out: BinaryIO, log: Optional[BinaryIO], lock: threading.Lock) -> None:
        super().__init__(daemon=True, name="tee")
        self.pipe, self.out, self.log, self.lock = pipe, out, log, lock

    def run(self) -> None:
        fd = self.pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            try:
                self.out.write(chunk)
                self.out.flush()
            except (OSError, ValueError):
                pass  # our terminal went away; the log still gets everything
            if self.log is not None:
                with self.lock:
                    try:
                        self.log.write(chunk)
                        self.log.flush()
                    except OSError:
                        pass  # disk full: keep the child running and our terminal fed
        self.pipe.close()


@dataclasses.dataclass
class Child:
    """A running attempt's main process (the group leader) and its output tees."""

    popen: subprocess.Popen
    identity: ProcessIdentity
    log_path: Path
    tees: list[threading.Thread]
    log_file: Optional[BinaryIO]
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)   # the tees' lock on the log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> Optional[int]:
        return self.popen.poll()

    def note(self, text: str) -> None:
        """A line of the supervisor's own in the attempt log (not on the terminal: `say` covers that).
        Every log so starts with what the attempt was and ends with how it ended: never empty."""
        if self.log_file is None:
            return
        with self.lock:
            try:
                self.log_file.write(f"{PREFIX}{text}\n".encode())
                self.log_file.flush()
            except (OSError, ValueError):
                pass

    def drain(self, timeout: float = 5.0) -> None:
        """Wait for the tees to copy everything (the pipes close when the whole tree is gone)."""
        for t in self.tees:
            t.join(timeout)

    def close(self, timeout: float = 5.0, footer: Optional[str] = None) -> None:
        """Drain the tees, add `footer` to the log, and close it."""
        self.drain(timeout)
        if footer:
            self.note(footer)
        if self.log_file is not None:
            try:
                self.log_file.close()
            except (OSError, ValueError):
                pass


def _read_oom_score_adj() -> Optional[bytes]:
    try:
        with open("/proc/self/oom_score_adj", "rb") as f:
            return f.read().strip()
    except OSError:
        return None


# The child gets the oom_score_adj we started with, not the lowered one `protect_from_oom` set.
_CHILD_OOM_SCORE_ADJ = _read_oom_score_adj()


def protect_from_oom(adj: int = -500) -> None:
    """Make the OOM killer prefer the trainer over us (needs CAP_SYS_RESOURCE; best effort)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(adj))
    except OSError:
        pass


def _preexec(cgroup_procs: Optional[str]) -> Callable[[], None]:
    parent = os.getpid()
    adj = _CHILD_OOM_SCORE_ADJ

    def run() -> None:
        # In the forked child, before exec: die with the supervisor (a SIGKILLed supervisor must
        # not leave an orphan trainer), and join the job's memory cgroup so every descendant
        # is accounted from its first allocation.
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(EXIT_SUPERVISOR_GONE)  # the supervisor died between fork and prctl
        if adj is not None:
            try:
                fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                os.write(fd, adj)
                os.close(fd)
            except OSError:
                pass
        if cgroup_procs:
            join_cgroup(cgroup_procs)

    return run


def join_cgroup(procs_file: str) -> None:
    """Move the calling process into the cgroup of `procs_file` (a forked child before exec: every
    page it then touches is charged there). Async-signal-safe enough for a pre-exec hook: plain syscalls."""
    fd = os.open(procs_file, os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def spawn(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    cwd: Optional[str],
    log_path: Path,
    cgroup_procs: Optional[str] = None,
    stdin_pipe: bool = False,
) -> Child:
    """Start the child in a new session/process group; must be called from the main thread.

    `stdin_pipe` gives the child a pipe from us as stdin (a standby launcher reads its go from it).

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so spawning from a helper
    thread would kill the child when that thread ends.
    """
    assert threading.current_thread() is threading.main_thread(), "spawn from the main thread"
    try:
        log_file: Optional[BinaryIO] = open(log_path, "xb")  # never overwrite an attempt's log
    except FileExistsError:
        raise
    except OSError:
        log_file = None  # run dir full or read-only: supervise anyway, say so upstream
    popen = subprocess.Popen(
        list(argv), env=env, cwd=cwd, stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_preexec(cgroup_procs),
        close_fds=True,
    )
    ident = identity_of(popen.pid) or ProcessIdentity(popen.pid, time.time())
    lock = threading.Lock()
    tees = [
        _Tee(popen.stdout, sys.stdout.buffer, log_file, lock),  # type: ignore[arg-type]
        _Tee(popen.stderr, sys.stderr.buffer, log_file, lock),  # type: ignore[arg-type]
    ]
    for t in tees:
        t.start()
    return Child(popen, ident, log_path, tees, log_file, lock)


def kill_tree(
    leader: int,
    *,
    grace: float,
    known: Sequence[psutil.Process] = (),
    term_first: bool = True,
    tick: Callable[[], None] = lambda: None,
    reap: Optional[Callable[[], Optional[int]]] = None,
) -> None:
    """SIGTERM the leader's process group, wait until `grace` ends, then SIGKILL every descendant.

    Descendants are collected before signalling (a worker re-parented to init after its
    parent died is still found via `known`, the processes seen during the attempt; psutil
    refuses to signal one whose pid was reused, so a stranger is never hit). `tick` runs
    while waiting so the caller's loop stays healthy (sd_notify watchdog); `reap` reaps the
    leader if it is our child.
    """
    procs = _collect(leader, known)
    deadline = time.monotonic() + grace
    if term_first and grace > 0:
        _signal_group(leader, signal.SIGTERM)
        for p in procs:
            _quiet(p.send_signal, signal.SIGTERM)
        while time.monotonic() < deadline:
            if reap:
                reap()
            procs = [p for p in procs if _alive(p)] + [p for p in _collect(leader, ()) if p not in procs]
            if not procs:
                return
            tick()
            time.sleep(0.05)
    _signal_group(leader, signal.SIGKILL)
    procs = [p for p in procs if _alive(p)] + _collect(leader, known)
    for p in procs:
        _quiet(p.kill)
    gone_by = time.monotonic() + 5.0
    while time.monotonic() < gone_by:
        if reap:
            reap()
        procs = [p for p in procs if _alive(p)]
        if not procs:
            return
        for p in procs:
            _quiet(p.kill)
        tick()
        time.sleep(0.05)


def _collect(leader: int, known: Sequence[psutil.Process]) -> list[psutil.Process]:
    found: dict[int, psutil.Process] = {}
    roots: list[psutil.Process] = list(known)
    try:
        roots.insert(0, psutil.Process(leader))
    except psutil.Error:
        pass
    for p in roots:
        try:
            if not p.is_running():
                continue
            found.setdefault(p.pid, p)
            for c in p.children(recursive=True):
                found.setdefault(c.pid, c)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    # Members of the leader's group that were re-parented (their parent died first).
    try:
        for p in psutil.process_iter(["pid"]):
            try:
                if p.pid not in found and os.getpgid(p.pid) == leader:
                    found[p.pid] = p
            except OSError:
                continue
    except psutil.Error:
        pass
    return [p for p in found.values() if p.pid != os.getpid()]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _quiet(fn: Callable, *args: object) -> None:
    try:
        fn(*args)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ProcessLookupError):
        pass
