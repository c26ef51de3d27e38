"""`resilient-run drill`: a real fault in a live supervised toy run (SIGKILL, SIGSTOP, a kernel OOM kill
inside its memory limit) is recorded with the right kind, the run resumes and ends bit-exact, and the
drill reports what the supervisor recorded; a run that is not live is refused in one line, exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from supervisor.insight.drill import DrillRefused, render_text, run_drill
from supervisor.process.cgroup import MemoryCgroup, memory_limit_of
from tests.conftest import PYTHON
from tests.support import ended_kinds, events, heartbeat, kill_group, run_cli, start_cli, sup_env, wait_until
from trainer_shim.rundir import EXIT_GAVE_UP, EXIT_NOT_RECOVERED, EXIT_OK, EXIT_USAGE, checkpoint_name

from .common import FAST, TOY, assert_bit_exact, assert_no_survivors, reference, v1_memory_parent

JOB = ("--epochs", "2", "--samples", "96", "--batch-size", "8", "--save-every", "5")  # 24 steps
# Attempt 1 sleeps after each step, so the drill lands while it trains: past step 5 it has 19 s left,
# room for two CLI starts under load 12 (0.4 s a step was not); the reference drops the sleep.
SLOW = ("--step-sleep", "1.0")


def _start(tmp_path: Path, *flags: str):
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    p = start_cli("--run-dir", str(run_dir), *FAST, *flags, TOY, *JOB, *SLOW, "--out", str(out),
                  env=sup_env(TOY_STEP_SLEEP_ATTEMPT="1"))
    return p, run_dir, out


def _training_past_a_checkpoint(run_dir: Path, p, checkpoint: int = 5) -> dict:
    """Attempt 1's heartbeat once it trains past its first committed checkpoint (step 5; 0: once it trains)."""
    def ready():
        if p.poll() is not None:
            raise AssertionError(f"the supervisor exited {p.returncode}: {p.stderr.read()[-3000:]}")
        hb = heartbeat(run_dir) or {}
        past = (hb.get("checkpoint_step") or 0) >= checkpoint
        return hb if hb.get("attempt") == 1 and hb.get("phase") == "training" and past else None
    return wait_until(ready, timeout=120, what=f"attempt 1 training past checkpoint {checkpoint}")


def _refused_in_one_line(run_dir: Path, fault: str) -> str:
    r = run_cli("drill", str(run_dir), fault)
    assert r.returncode == EXIT_USAGE, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    return r.stderr


def _finish_and_check(p, run_dir: Path, out: Path, kinds: list[str]) -> None:
    try:
        rc = p.wait(180)
    finally:
        kill_group(p)
    assert rc == EXIT_OK, p.stderr.read()[-3000:]
    assert ended_kinds(run_dir) == kinds
    assert_bit_exact(out, reference(out.parent, *JOB))
    assert_no_survivors(run_dir, str(out))


def _check_result(res, run_dir: Path, kind: str) -> None:
    """The drill's result says what the run dir's records say."""
    ended, started = events(run_dir, "attempt_ended")[0], events(run_dir, "attempt_started")[1]
    assert res.recovered and res.exit_code == EXIT_OK and res.attempt == 1 and res.next_attempt == 2, res
    assert res.kind == res.expected_kind == ended["kind"] == kind and res.evidence == ended["evidence"], (res, ended)
    assert res.pid == events(run_dir, "attempt_started")[0]["pid"]
    assert res.resumed_from == started["resume_from"] and Path(res.resumed_from).name >= checkpoint_name(5)
    assert res.first_step == int(Path(res.resumed_from).name.rpartition("-")[2]) + 1
    c = res.recovery
    parts = (c.recover_detect, c.recover_stop, c.recover_start, c.recover_restore, c.recover_first_step)
    assert None not in parts and c.recover_total is not None


def test_drill_kill_through_the_cli(tmp_path):
    p, run_dir, out = _start(tmp_path)
    try:
        _training_past_a_checkpoint(run_dir, p)
        # No memory limit here: an OOM drill would fill the machine, so it is refused and nothing happens.
        assert "no memory limit" in _refused_in_one_line(run_dir, "oom")
        r = run_cli("drill", str(run_dir), "kill", timeout=120)
    except BaseException:
        kill_group(p)
        raise
    assert r.returncode == EXIT_OK, r.stdout + r.stderr
    ended = events(run_dir, "attempt_ended")[0]
    assert ended["kind"] == "signal" and ended["signal"] == signal.SIGKILL
    resumed = events(run_dir, "attempt_started")[1]["resume_from"]
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"drill kill: SIGKILL to rank 0's trainer, pid {events(run_dir, 'attempt_started')[0]['pid']}")
    assert lines[1] == f"recorded: signal: {ended['evidence']}"
    assert lines[2].startswith(f"resumed:  attempt 2 from {resumed} (first step ")
    assert lines[3].startswith("recovery: ") and "detect" in lines[3] and "first step" in lines[3]
    _finish_and_check(p, run_dir, out, ["signal", "success"])
    assert "not live" in _refused_in_one_line(run_dir, "kill")   # finished: its supervisor is gone


def test_drill_hang(tmp_path):
    p, run_dir, out = _start(tmp_path)
    try:
        _training_past_a_checkpoint(run_dir, p)
        res = run_drill(run_dir, "hang")
    except BaseException:
        kill_group(p)
        raise
    _check_result(res, run_dir, "hang")
    assert "heartbeat unchanged" in res.evidence
    # Detected by the watchdog (FAST: --heartbeat-timeout 3), not by an exit.
    assert res.recovery.recover_detect >= 2.5
    _finish_and_check(p, run_dir, out, ["hang", "success"])


def test_drill_oom_inside_the_memory_limit(tmp_path):
    p, run_dir, out = _start(tmp_path, "--memory-limit", "700M")
    try:
        try:
            _training_past_a_checkpoint(run_dir, p)
        except AssertionError:
            err = p.stderr.read() if p.poll() is not None else ""
            if "needs a writable memory cgroup" in err:
                pytest.skip(f"no writable memory cgroup: {err.strip()}")
            raise
        res = run_drill(run_dir, "oom")
    except BaseException:
        kill_group(p)
        raise
    _check_result(res, run_dir, "oom")
    ended = events(run_dir, "attempt_ended")[0]
    assert ended["signal"] == signal.SIGKILL and "oom_kill rose 0->1" in res.evidence, res.evidence
    _finish_and_check(p, run_dir, out, ["oom", "success"])


def test_drill_on_a_dead_run_dir_is_refused_in_one_line(tmp_path):
    """The supervisor was SIGKILLed with its job: supervisor.json still says `running`, but no one holds
    the lock. Refused before anything is touched, in-process too (DrillRefused, exit 2)."""
    p, run_dir, _ = _start(tmp_path)
    try:
        _training_past_a_checkpoint(run_dir, p, checkpoint=0)
    finally:
        kill_group(p)
    assert_no_survivors(run_dir)
    assert "not live" in _refused_in_one_line(run_dir, "kill")
    with pytest.raises(DrillRefused) as e:
        run_drill(run_dir, "hang")
    assert e.value.exit_code == EXIT_USAGE != EXIT_NOT_RECOVERED
    assert len(events(run_dir, "attempt_started")) == 1


def test_drill_on_a_run_without_supervisor_is_refused_in_one_line(tmp_path):
    """A standalone `python train.py` writes heartbeats, but nothing would recover its trainer."""
    run_dir = tmp_path / "run"
    p = subprocess.Popen([PYTHON, TOY, *JOB, *SLOW, "--run-dir", str(run_dir), "--out", str(tmp_path / "w.pt")],
                         env=sup_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        _training_past_a_checkpoint(run_dir, p, checkpoint=0)
        assert "not supervised" in _refused_in_one_line(run_dir, "kill")
        assert p.poll() is None   # untouched
    finally:
        kill_group(p)


def test_memory_limit_of_finds_a_limit_set_above_the_process(tmp_path):
    """The limit may sit on an ancestor (a supervisor inside a limited cgroup it did not create): the
    allocator must still join the process's own cgroup, where the kernel charges it alike."""
    parent = v1_memory_parent() / f"rr-drill-{os.getpid()}"
    child = parent / "job"
    try:
        child.mkdir(parents=True)
        (parent / "memory.limit_in_bytes").write_text(str(700 << 20))
    except OSError as e:
        pytest.skip(f"no writable v1 memory cgroup: {e}")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (child / "cgroup.procs").write_text(str(sleeper.pid))
        lim = memory_limit_of(sleeper.pid)
        assert lim is not None and lim.limit_bytes == 700 << 20
        assert (lim.cgroup.path, lim.limited_at, lim.cgroup.version) == (child, parent, 1)
    finally:
        sleeper.kill()
        sleeper.wait()
        MemoryCgroup(child, 1).remove()
        MemoryCgroup(parent, 1).remove()


def test_drill_that_ends_the_run_is_not_recovered(tmp_path):
    """--max-restarts 0: the kill is recorded, but the supervisor gives up, so no attempt steps again (exit 1)."""
    p, run_dir, _ = _start(tmp_path, "--max-restarts", "0")
    try:
        _training_past_a_checkpoint(run_dir, p)
        res = run_drill(run_dir, "kill")
        assert p.wait(60) == EXIT_GAVE_UP
    finally:
        kill_group(p)
    assert not res.recovered and res.exit_code == EXIT_NOT_RECOVERED
    assert res.kind == "signal" and "gave_up" in res.outcome and res.recovery is None
    assert "not recovered: the run ended (gave_up)" in render_text(res)
