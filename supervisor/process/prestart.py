"""The next attempt's launcher, started ahead of need so that a restart does not wait for imports.

For a torchrun job it is a prestarted torchrun (trainer_shim._launch.standby); for `python SCRIPT.py`,
`python -m MODULE` and a console script of our Python a warm interpreter with torch, the `--preload`
modules and the frameworks the running attempt recorded imported (trainer_shim._launch.warm); which
command gets which: warmable.py. Either waits on its stdin for one `StandbyMessage` (the attempt's
environment) and is then attempt N; its log is logs/standby-N.log until then, so an idle standby is
never mistaken for an attempt. Without a usable standby the attempt starts cold (`launch`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import psutil

from trainer_shim.rundir import RunDir, StandbyMessage, read_warm_ready, snapshot_slot_paths

from . import procs
from .attempts import next_log_number
from .warmable import standby_route
from ..messages import say

__all__ = ["Standby", "Prestarter", "standby_fields", "WARM_MEMORY_FACTOR", "WARM_MEMORY_FLOOR"]

# A warm interpreter for a single-process job is prestarted only while MemAvailable >=
# WARM_MEMORY_FACTOR x the running attempt's peak RSS (its process tree), and at least
# WARM_MEMORY_FLOOR: the idle standby costs torch's ~250 MB and the restarted attempt will need
# its predecessor's peak again.
WARM_MEMORY_FACTOR = 2.0
WARM_MEMORY_FLOOR = 512 << 20


@dataclasses.dataclass
class Standby:
    """A launcher started ahead of need: attempt `number`'s process and log."""

    number: int
    child: procs.Child
    warm: bool = False   # a warm interpreter (trainer_shim._launch.warm) rather than a prestarted torchrun
    ready: bool = False  # a warm one had finished its imports when it was handed its attempt
    preloaded: tuple[str, ...] = ()  # ... and these modules besides torch and the shim (--preload, frameworks)


def standby_fields(sb: Optional[Standby]) -> dict[str, Any]:
    """attempt_started's fields about the standby that became the attempt (none: a cold start)."""
    return {"prestarted": sb is not None, "warm": sb is not None and sb.warm, "warm_ready": sb is not None and sb.ready,
            "preloaded": list(sb.preloaded) if sb is not None else []}


class Prestarter:
    """Owns at most one standby: starts it, hands it an attempt, or discards it."""

    def __init__(self, rd: RunDir, preload: Sequence[str], working_dir: Optional[str],
                 tick: Callable[[], None], landing: bool = True) -> None:
        self.rd = rd
        # A warm interpreter keeps a restore's landing memory faulted in (trainer_shim._restore.landing),
        # not under --memory-limit: pages it faults outside the job's cgroup stay charged outside it.
        self.landing = landing
        self.preload = tuple(preload)
        self.working_dir = working_dir
        self._tick = tick
        self.standby: Optional[Standby] = None
        self.peak_rss = 0   # the largest peak RSS of the attempts seen (a new attempt's own is not known yet)

    def start(self, command: Sequence[str], n: int, env: dict[str, str], peak_rss: int) -> None:
        """Prestart attempt n's launcher for `command` (no-op when one exists or none applies)."""
        if self.standby is not None:
            return
        route = standby_route(command, path=env.get("PATH"), cwd=self.working_dir)
        if route is None:
            return
        options: tuple[str, ...] = ()
        if route.warm:
            self.peak_rss = max(self.peak_rss, peak_rss)
            if not self._memory_for_warm(self.peak_rss):
                return
            # The ready file says its imports are done (a restart before that still uses it: it is ahead
            # of a cold start); the frameworks record says what the running attempt imported.
            options = ((f"--preload={','.join(self.preload)}",) if self.preload else ()) + (
                f"--ready={self.rd.warm_ready(n)}", f"--frameworks={self.rd.frameworks}") + (
                (f"--slots={','.join(map(str, snapshot_slot_paths(self.rd.root, self.rd.node)))}",)
                if self.landing else ()) + self._title_options()
        log_path = self.rd.standby_log(n)
        log_path.unlink(missing_ok=True)  # an idle standby's log left by a killed supervisor: never an attempt's
        try:  # the attempt's own variables come over the pipe when it is needed
            child = procs.spawn(route.argv(*options), env=env, cwd=self.working_dir, log_path=log_path,
                                stdin_pipe=True)
        except OSError as e:
            say(f"cannot prestart the next attempt's launcher ({e.strerror or e}); restarts start it cold")
            return
        self.standby = Standby(n, child, warm=route.warm)

    def _title_options(self) -> tuple[str, ...]:
        """What the warm interpreter names in its process title (rundir.titles): this run dir."""
        return (f"--run-dir={self.rd.root.resolve()}",) + (() if self.rd.node is None else (f"--node={self.rd.node}",))

    def _memory_for_warm(self, peak_rss: int) -> bool:
        """The rule of WARM_MEMORY_FACTOR: is there room for an idle warm interpreter?"""
        need = max(WARM_MEMORY_FLOOR, int(WARM_MEMORY_FACTOR * peak_rss))
        try:
            avail = psutil.virtual_memory().available
        except (OSError, psutil.Error):
            return False
        if avail < need:
            say(f"not prestarting a warm interpreter: {avail >> 20} MiB available < {need >> 20} MiB "
                      f"({WARM_MEMORY_FACTOR:g} x the attempt's peak RSS); a restart starts cold")
            return False
        return True

    def activate(self, after: int, env_of: Callable[[int], dict[str, str]],
                 cgroup_procs: Optional[str]) -> Optional[Standby]:
        """Hand the standby its attempt's environment; None when there is none usable (then it is
        discarded). `after` is the last attempt number used: an older standby is stale."""
        sb = self.standby
        if sb is None:
            return None
        # A warm interpreter still importing is used all the same: it started importing before the
        # failure, a cold start only after it (an attempt that crashes before its first step, while
        # its standby still imports, restarts warm); it reads the message once its imports are done.
        if sb.number <= after or sb.child.poll() is not None or sb.child.popen.stdin is None:
            self.discard()
            return None
        try:
            if cgroup_procs is not None:  # joined only now: idle, it must not eat the job's memory budget
                Path(cgroup_procs).write_text(str(sb.child.pid))   # cgroup.procs_file is a str
            sb.child.popen.stdin.write(StandbyMessage(env_of(sb.number)).to_line())
            sb.child.popen.stdin.close()
        except OSError as e:
            say(f"prestarted launcher unusable ({e.strerror or e}); starting the attempt cold")
            self.discard()
            return None
        self.standby = None
        if sb.warm:
            preloaded = read_warm_ready(self.rd.warm_ready(sb.number))
            sb.ready, sb.preloaded = preloaded is not None, preloaded or ()
            self.rd.warm_ready(sb.number).unlink(missing_ok=True)
        try:  # from now on it is attempt N: its log takes the attempt's name (the open fd follows the rename)
            os.replace(sb.child.log_path, self.rd.attempt_log(sb.number))
            sb.child.log_path = self.rd.attempt_log(sb.number)
        except OSError:
            pass
        return sb

    def launch(self, command: Sequence[str], after: int, env_of: Callable[[int], dict[str, str]],
               cgroup_procs: Optional[str]) -> tuple[int, procs.Child, Optional[Standby]]:
        """The next attempt's number and process: the standby when it is usable, else `command`
        spawned cold (numbered after `after` and any log that exists: no log is overwritten)."""
        sb = self.activate(after, env_of, cgroup_procs)
        if sb is not None:
            return sb.number, sb.child, sb
        n = next_log_number(self.rd, after)
        log_path = self.rd.attempt_log(n)
        child = procs.spawn(command, env=env_of(n), cwd=self.working_dir, log_path=log_path, cgroup_procs=cgroup_procs)
        if child.log_file is None:
            say(f"cannot write {log_path}; the child's output goes to the terminal only")
        return n, child, None

    def discard(self) -> None:
        """Kill the standby (if any) and remove its files: it never ran an attempt."""
        sb, self.standby = self.standby, None
        if sb is None:
            return
        if sb.warm:
            self.rd.warm_ready(sb.number).unlink(missing_ok=True)
        procs.kill_tree(sb.child.pid, grace=0, tick=self._tick, reap=sb.child.poll)
        sb.child.close()
        try:
            sb.child.log_path.unlink()
        except OSError:
            pass
