"""Warm restart of a single-process SCRIPT.py job: the next attempt runs in an interpreter that
imported torch while the attempt before it trained (trainer_shim._launch.warm), and looks exactly like a
cold start to the classifier and to the weights."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import JOBS
from tests.faults.common import reference

from trainer_shim.rundir import RunDir

from .helpers import alive, attempt_pids, ended_kinds, events, no_standby_left, run_cli, sup_env

TOY = str(JOBS / "toy_train.py")
FAULTS = "1:kill@20,2:raise@30"   # kill -9, then an uncaught exception in the (warm) second attempt
# Steps are slowed so attempt 1 trains ~6 s: time for the warm interpreter to finish importing torch
# (an unready one is not used: that restart starts cold; ~4 s was sometimes too short under load 3).
# Only attempt 1 is slowed (TOY_STEP_SLEEP_ATTEMPT): the later ones need no time to act in.


def _run(tmp_path, name: str, *extra: str) -> tuple:
    rd, out = tmp_path / name, tmp_path / f"{name}.pt"
    r = run_cli("--run-dir", str(rd), "--backoff", "0", *extra, TOY, "--out", str(out), "--step-sleep", "0.3",
                env=sup_env(TOY_FAULTS=FAULTS, TOY_STEP_SLEEP_ATTEMPT="1"), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return rd, out


@pytest.mark.long   # ~30 s, two full runs: make test-faults (the warm tests below run in make test)
def test_warm_restart_matches_cold_and_is_bit_exact(tmp_path):
    expected = reference(tmp_path)  # the uninterrupted run, shared with test_end_to_end (cached per args)
    warm_rd, warm_out = _run(tmp_path, "warm")
    cold_rd, cold_out = _run(tmp_path, "cold", "--no-prestart")

    # Every restart of the warm run went to a warm interpreter; --no-prestart started all cold.
    warm = [e["warm"] for e in events(warm_rd, "attempt_started")]
    assert warm[:2] == [False, True], warm  # the third attempt may start cold if its standby was not ready
    assert [e["warm"] for e in events(cold_rd, "attempt_started")] == [False, False, False]
    # The kill -9 and the exception in the warm attempt are classified exactly as cold ones.
    assert ended_kinds(warm_rd) == ended_kinds(cold_rd) == ["signal", "crash", "success"]
    fields = ("kind", "exit_code", "signal", "evidence", "step")
    warm_ended = [{k: e.get(k) for k in fields} for e in events(warm_rd, "attempt_ended")]
    cold_ended = [{k: e.get(k) for k in fields} for e in events(cold_rd, "attempt_ended")]
    assert warm_ended == cold_ended
    # Both finish bit-exact against the uninterrupted run.
    for out in (warm_out, cold_out):
        got = torch.load(out)
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[k], expected[k]) for k in got)
    # Nothing left behind: no attempt, no idle warm interpreter.
    for pid in attempt_pids(warm_rd) + attempt_pids(cold_rd):
        assert not alive(pid)
    no_standby_left(str(warm_out))


def test_a_crash_before_the_first_step_restarts_warm(tmp_path):
    """The standby starts with the attempt, not after its start-up: attempt 1 dies right after init(),
    before any step (seconds after the supervisor started), and attempt 2 still runs in the warm
    interpreter."""
    rd, out = tmp_path / "early", tmp_path / "early.pt"
    r = run_cli("--run-dir", str(rd), "--backoff", "0", TOY, "--epochs", "1", "--out", str(out),
                env=sup_env(TOY_CRASH_BEFORE_STEP_ATTEMPT="1"), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(rd) == ["crash", "success"]
    assert events(rd, "first_step")[0]["attempt"] == 2   # attempt 1 never reached a step
    assert [e["warm"] for e in events(rd, "attempt_started")] == [False, True]
    no_standby_left(str(out))


def test_a_warm_restart_restores_its_memory_snapshot_into_memory_the_standby_faulted_in(tmp_path):
    """While it waits, the warm interpreter keeps the optimizer state's landing memory faulted in
    (trainer_shim._restore.landing, sized from the run's complete memory snapshot slots) and the slots'
    regions mapped (slot_maps): the restart's restore copies out of that mapping into it instead of
    reading page by page into fresh pages, and ends bit-exact."""
    # ~0.5 MiB of Adam state; no disk save before the kill: the supervisor persists the slot as it is
    args = ("--hidden", "256", "--save-every", "100")
    expected = reference(tmp_path, *args)
    rd, out = tmp_path / "landing", tmp_path / "landing.pt"
    r = run_cli("--run-dir", str(rd), "--backoff", "0", TOY, *args, "--out", str(out), "--step-sleep", "0.3",
                env=sup_env(TOY_FAULTS="1:kill_settled@20", TOY_MEMORY_EVERY="1", TOY_STEP_SLEEP_ATTEMPT="1"),
                timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [e["warm"] for e in events(rd, "attempt_started")] == [False, True]
    log = RunDir(rd).attempt_log(2).read_text()
    assert "resumed from memory step 20 (" in log and "MiB into memory the warm standby had faulted in, " in log, log
    assert "MiB out of its mapping of the slot)" in log, log   # the slot's pages mapped ahead too (slot_maps)
    got = torch.load(out)
    assert all(torch.equal(got[k], expected[k]) for k in expected) and got.keys() == expected.keys()
    no_standby_left(str(out))


def test_a_warm_attempt_runs_the_thread_count_its_script_sets(tmp_path):
    """The script sets OMP_NUM_THREADS=1 before importing torch; the warm interpreter imported torch
    with the supervisor's 2 before the script ran. Its attempt still runs 1 thread, as the cold one did
    (other numerics otherwise, and an OpenMP team that stalls while the next standby imports)."""
    rd = tmp_path / "threads"
    r = run_cli("--run-dir", str(rd), "--backoff", "0", str(JOBS / "threads_job.py"),
                env=sup_env(OMP_NUM_THREADS="2"), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [e["warm"] for e in events(rd, "attempt_started")] == [False, True]
    for n in (1, 2):
        log = RunDir(rd).attempt_log(n).read_text()
        assert f"threads_job: attempt {n} runs 1 torch threads" in log, log
    no_standby_left(str(rd))
