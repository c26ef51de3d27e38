"""Process-level pieces the shim installs (through hooks.py): SIGTERM/SIGINT stop flag, SIGUSR1 stack dumps, fork tie, excepthook."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Optional


class StopFlag:
    """Set by SIGTERM/SIGINT; the training loop acts on it at the next run.step()."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def uninstall(self) -> None:
        """Restore the handlers that were there before `install` (main thread only, like install)."""
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            # A second Ctrl-C means "now": do not wait for the next step.
            raise KeyboardInterrupt
        self.requested = True
        self.signum = signum


_stack_pipe: Optional[tuple[int, int]] = None  # (read, write) fds; faulthandler writes into the pipe
_stack_path: Optional[Path] = None
_F_SETPIPE_SZ = 1031


def _relay_stacks() -> None:
    """Copy dumps from the pipe into the stack file, creating it only when a dump arrives."""
    out = None
    while _stack_pipe is not None:
        try:
            chunk = os.read(_stack_pipe[0], 65536)
        except OSError:
            return
        if not chunk:
            return
        path = _stack_path
        try:
            if out is None or out.name != str(path):
                if out is not None:
                    out.close()
                out = open(path, "ab", buffering=0)  # type: ignore[arg-type]
            out.write(chunk)
        except OSError:
            continue


def install_stack_dumps(path: Path) -> bool:
    """SIGUSR1 dumps every thread's Python stack into `path` (appending) without stopping.

    faulthandler needs a file descriptor when it is registered, but an empty stack file for every
    attempt is noise: it writes into a pipe (from its async-safe C handler, so a main thread stuck
    in C still gets dumped), and a relay thread creates `path` only when bytes arrive. The write end
    is non-blocking: a dump larger than the pipe is cut short instead of hanging the process.
    """
    global _stack_pipe, _stack_path
    if not hasattr(signal, "SIGUSR1"):
        return False
    _stack_path = path
    if _stack_pipe is not None:  # one relay per process; a new Run only moves the target file
        return True
    try:
        r, w = os.pipe()
        try:
            import fcntl

            fcntl.fcntl(w, _F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        os.set_blocking(w, False)
        _stack_pipe = (r, w)
        threading.Thread(target=_relay_stacks, daemon=True, name="trainer_shim-stacks").start()
        faulthandler.register(signal.SIGUSR1, file=w, all_threads=True, chain=False)
        return True
    except (OSError, RuntimeError, ValueError):
        return False


_PR_SET_PDEATHSIG = 1
_workers_hooked = False
_forking_pid = 0  # the process that is forking, recorded just before the fork


def _before_fork() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG fires when the forking *thread* exits: only children forked by the main
    # thread (DataLoader workers, usually) are tied to us, so a helper thread's exit never kills
    # a worker that is still needed.
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != _forking_pid:  # the parent died between fork and prctl: no signal will come
        os.kill(os.getpid(), signal.SIGKILL)


def tie_forked_children() -> None:
    """Forked children (DataLoader workers) die with this process instead of lingering seconds
    until torch's parent watchdog notices, holding memory, GPU handles and the output pipes."""
    global _workers_hooked
    if not _workers_hooked and hasattr(os, "register_at_fork") and sys.platform.startswith("linux"):
        os.register_at_fork(before=_before_fork, after_in_child=_die_with_parent)
        _workers_hooked = True


# torchrun sets this for the processes it launches (torch.distributed.elastic's worker env).
_LAUNCHED_BY_TORCHRUN = "TORCHELASTIC_RUN_ID"


def die_with_launcher() -> None:
    """A rank launched by torchrun dies with torchrun.

    The supervisor's SIGKILL-on-death reaches torchrun, but torchrun's own children would be
    orphaned: they kept training (and writing heartbeats and checkpoints into the run dir) for
    up to a collective timeout after their supervisor was killed, beside the next supervisor's
    attempt. torchrun spawns its workers from its main thread, which lives as long as it does,
    so PR_SET_PDEATHSIG is safe here.
    """
    if _LAUNCHED_BY_TORCHRUN not in os.environ or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # torchrun died before we could ask: no signal will come
        os.kill(os.getpid(), signal.SIGKILL)


def qualified_name(tp: type) -> str:
    mod = tp.__module__
    return tp.__qualname__ if mod in ("builtins", "__main__", None) else f"{mod}.{tp.__qualname__}"


def install_excepthook(on_exception: Callable[[type, BaseException, Optional[TracebackType]], None]) -> Callable[[], None]:
    """Chain sys.excepthook so `on_exception` runs first; its own failures never hide the original error.

    Returns the uninstaller: it restores the previous hook, or (when someone chained after us)
    makes ours a pass-through so their chain stays intact.
    """
    previous = sys.excepthook
    active = [True]

    def hook(tp: type, value: BaseException, tb: Optional[TracebackType]) -> None:
        if active[0]:
            try:
                on_exception(tp, value, tb)
            except BaseException:  # noqa: BLE001 - reporting must not replace the real traceback
                print("trainer_shim: error while recording the crash:", file=sys.stderr)
                traceback.print_exc()
        previous(tp, value, tb)

    def uninstall() -> None:
        active[0] = False
        if sys.excepthook is hook:
            sys.excepthook = previous

    sys.excepthook = hook
    return uninstall
