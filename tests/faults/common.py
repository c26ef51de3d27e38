"""Shared pieces of the failure campaign: reference runs, bit-exact checks, survivor checks, a killer.

Every trial runs the real CLI (tests/supervisor/helpers.py) on the real torch job
(tests/jobs/toy_train.py) and judges only what a user would see: exit code, final weights,
attempt_ended kinds, processes left behind, the checkpoint that was chosen.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from pathlib import Path
from typing import Optional

import psutil
import torch

from tests.conftest import PYTHON, built_once
from tests.save_modes import PLAIN
from tests.support import (  # noqa: F401 - FAST, TOY and faulted_run re-exported for the campaign
    FAST, TOY, assert_equal_state, events, faulted_run, heartbeat, kill_group, run_cli, start_cli, sup_env,
    supervisor_state, wait_until, weights,
)
from trainer_shim import rundir

_REF_CACHE: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}


def reference(tmp_path: Path, *args: str) -> dict[str, torch.Tensor]:
    """Final weights of an uninterrupted standalone run of toy_train.py with `args` (cached per args).

    `--step-sleep S` is dropped: it only sleeps after a step (time for a test to act), it changes no
    weight, and in an uninterrupted run it is pure waiting."""
    key = _without_step_sleep(args)
    if key not in _REF_CACHE:
        def build(d: Path) -> None:
            p = subprocess.run([PYTHON, TOY, *key, "--run-dir", str(d / "run"), "--out", str(d / "weights.pt")],
                               env=sup_env(**PLAIN), capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, p.stderr[-2000:]
        _REF_CACHE[key] = weights(built_once("toy-reference", key, build) / "weights.pt")
    return _REF_CACHE[key]


def _without_step_sleep(args: tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    it = iter(args)
    for a in it:
        if a == "--step-sleep":
            next(it, None)
        elif not a.startswith("--step-sleep="):
            out.append(a)
    return tuple(out)


def assert_bit_exact(out: Path, ref: dict[str, torch.Tensor]) -> None:
    assert_equal_state(weights(out), ref, "final weights vs the uninterrupted run")


def job_processes(run_dir: Path, marker: Optional[str] = None) -> list[psutil.Process]:
    """Live processes of this job: RESILIENT_RUN_DIR is our run dir, or the command line holds `marker`."""
    want = str(Path(run_dir).resolve())
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if marker and marker in cmd:
                found.append(p)
                continue
            if p.environ().get(rundir.ENV_RUN_DIR) == want:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def assert_no_survivors(run_dir: Path, marker: Optional[str] = None, timeout: float = 10.0) -> None:
    """No process of the job (trainer, DataLoader workers, supervisor) outlives it."""
    try:
        wait_until(lambda: not job_processes(run_dir, marker), timeout=timeout, what="job processes to exit")
    except AssertionError:
        left = [(p.pid, " ".join(p.cmdline())[:120]) for p in job_processes(run_dir, marker)]
        for p in job_processes(run_dir, marker):
            try:
                p.kill()
            except psutil.Error:
                pass
        raise AssertionError(f"processes of the job survived: {left}") from None


def current_trainer(run_dir: Path) -> Optional[psutil.Process]:
    """The running attempt's main process, checked against its recorded start time (pid reuse)."""
    st = supervisor_state(run_dir)
    pid, ctime = st.get("child_pid"), st.get("child_create_time")
    if not pid or ctime is None:
        return None
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - ctime) > 0.05 or p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except psutil.Error:
        return None


def v1_memory_parent() -> Path:
    """This process's own v1 memory cgroup dir (where a test may make cgroups of its own), else the root."""
    root = Path("/sys/fs/cgroup/memory")
    own = next((ln.split(":", 2)[2].strip() for ln in open("/proc/self/cgroup") if ln.split(":")[1] == "memory"), "/")
    parent = root / own.lstrip("/")
    return parent if parent.is_dir() else root


def tmp_dirs(run_dir: Path) -> list[Path]:
    return list(rundir.tmp_dirs(Path(run_dir) / "checkpoints"))


def saving(run_dir: Path, pid: int) -> bool:
    hb = heartbeat(run_dir) or {}
    return (hb.get("pid") == pid and hb.get("phase") == "saving") or any(
        p.name.startswith(".tmp-step-") for p in tmp_dirs(run_dir))


class Killer(threading.Thread):
    """SIGKILLs the running trainer `kills` times at seeded random moments, half of them mid-save.

    A "save" kill waits until the trainer is inside a checkpoint write (heartbeat phase `saving`
    or a checkpoints/.tmp-step-* dir exists) and kills it there; a "random" kill waits a random
    0.1-1.2 s after the attempt's first training heartbeat.
    """

    def __init__(self, run_dir: Path, seed: int, kills: int, proc: subprocess.Popen) -> None:
        super().__init__(daemon=True, name=f"killer-{seed}")
        self.run_dir, self.rng, self.kills, self.proc = run_dir, random.Random(seed), kills, proc
        self.log: list[dict] = []
        self.error: Optional[BaseException] = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def _wait(self, pred, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._halt.is_set() and self.proc.poll() is None:
            if pred():
                return True
            time.sleep(0.002)
        return False

    def run(self) -> None:
        try:
            last_pid = None
            modes = ["save"] * ((self.kills + 1) // 2) + ["random"] * (self.kills // 2)
            self.rng.shuffle(modes)
            for mode in modes:
                if not self._wait(lambda: (t := current_trainer(self.run_dir)) is not None and t.pid != last_pid
                                  and (heartbeat(self.run_dir) or {}).get("pid") == t.pid
                                  and (heartbeat(self.run_dir) or {}).get("phase") in ("training", "saving"), 120):
                    return
                t = current_trainer(self.run_dir)
                if t is None:
                    continue
                if mode == "save":
                    if not self._wait(lambda: saving(self.run_dir, t.pid), 30):
                        return
                    time.sleep(self.rng.uniform(0, 0.02))  # somewhere in the write, not always its start
                else:
                    time.sleep(self.rng.uniform(0.1, 1.2))
                mid_save = saving(self.run_dir, t.pid)
                hb = heartbeat(self.run_dir) or {}
                try:
                    t.kill()
                except psutil.NoSuchProcess:
                    continue
                last_pid = t.pid
                self.log.append({"pid": t.pid, "mode": mode, "mid_save": mid_save, "step": hb.get("step")})
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def killer_config(run_dir: Path, kills: int) -> tuple[str, str]:
    """`--config` that lets `kills` attempts in a row die without progress. Three kills that all
    land before the first checkpoint are a crash loop by the policy (a fresh start that never
    commits gives up; chaos sync-3 drew 10, 10, 7 with saves every 10): the campaign is about resuming."""
    cfg = run_dir.parent / f"{run_dir.name}-killer.yaml"
    cfg.write_text(f"crash_loop_attempts: {kills + 1}\n")
    return "--config", str(cfg)


def run_under_killer(run_dir: Path, seed: int, kills: int, *argv: str, env: dict,
                     timeout: float = 240) -> tuple[int, str, "Killer"]:
    """Run the CLI with `argv` while a Killer SIGKILLs its trainer `kills` times; (rc, stderr, killer)."""
    p = start_cli("--run-dir", str(run_dir), *killer_config(run_dir, kills), *argv, env=env)
    killer = Killer(run_dir, seed, kills, p)
    killer.start()
    try:
        rc = p.wait(timeout)
        killer.stop()
        killer.join(10)
    finally:
        kill_group(p)
    stderr = p.stderr.read()
    assert killer.error is None, killer.error
    return rc, stderr, killer


def verify_cli(run_dir: Path) -> subprocess.CompletedProcess:
    return run_cli("checkpoints", str(run_dir), "--verify")


def checkpoint_steps(run_dir: Path, root: Optional[Path] = None) -> list[int]:
    d = Path(root) if root else Path(run_dir) / "checkpoints"
    return sorted(s for s in (rundir.parse_checkpoint_name(p.name) for p in d.iterdir()) if s is not None)
