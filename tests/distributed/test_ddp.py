"""Distributed jobs: real 2-rank torchrun (CPU, gloo) under the real supervisor.

Each fault test compares every rank's final weights bitwise with an uninterrupted 2-rank run.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

import psutil
import pytest

from supervisor.config import build_config
from supervisor.errors import ConfigError
from supervisor.process.launch import ProcessFailure, parse_torchrun_failure, torchrun_command
from tests.conftest import mounted_tmpfs
from tests.save_modes import modes, save_mode  # noqa: F401  (fixture)
from tests.distributed.common import DDP_JOB, FAST, recovered_run
from tests.support import assert_same_weights
from tests.supervisor.helpers import alive, ended_kinds, events, heartbeat, kill_group, run_cli, start_cli, wait_until
from trainer_shim import rundir

# --- launch command and evidence (no processes) -------------------------------------------------


def test_launch_command_single_and_multi_node():
    c = build_config({}, {"script": "train.py", "args": ["--lr", "1"], "nproc_per_node": 4, "run_dir": "runs/exp1"})
    assert c.command == (sys.executable, "-m", "torch.distributed.run", "--max-restarts", "0", "--nproc-per-node", "4",
                         "--standalone", "train.py", "--lr", "1")
    multi = torchrun_command("t.py", [], nproc_per_node=2, nnodes=2, node_rank=1, rdzv_endpoint="head:29500", rdzv_id="exp1")
    assert multi[5:] == ("--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", "head:29500", "--rdzv-id", "exp1", "t.py")
    with pytest.raises(ConfigError, match="rdzv_endpoint"):
        torchrun_command("t.py", [], nproc_per_node=2, nnodes=2, node_rank=0)
    with pytest.raises(ConfigError, match="node_rank 2 must be below"):
        torchrun_command("t.py", [], nproc_per_node=2, nnodes=2, node_rank=2, rdzv_endpoint="h:1")
    # No nproc_per_node: the single-process command is exactly what it always was.
    assert build_config({}, {"script": "train.py"}).command == (sys.executable, "train.py")


def test_torchrun_failure_summary_root_cause_first():
    tail = ["Failures:", "[1]:", "  rank      : 0 (local_rank: 0)", "  exitcode  : -15 (pid: 11)  (SIGTERM)",
            "Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
            "  exitcode  : -9 (pid: 12)  (SIGKILL)"]
    failures = parse_torchrun_failure(tail)
    assert failures == [ProcessFailure(rank=1, pid=12, signal=9), ProcessFailure(rank=0, pid=11, signal=15)]
    assert [f.describe() for f in failures] == ["rank 1 (pid 12) killed by SIGKILL", "rank 0 (pid 11) killed by SIGTERM"]


# --- real 2-rank runs ------------------------------------------------------------------------------


def test_checkpoint_lists_every_rank_and_is_invalid_without_one(reference: Path, tmp_path: Path):
    ck = rundir.newest_valid([reference / "run" / "checkpoints"])
    assert ck is not None and ck.manifest.world_size == 2
    assert set(ck.manifest.files) == {"model.pt", "optimizer.pt", "rank-0.pt", "rank-1.pt"}
    broken = tmp_path / "checkpoints"
    shutil.copytree(ck.path, broken / ck.path.name)
    (broken / ck.path.name / "rank-1.pt").unlink()
    with pytest.raises(rundir.InvalidCheckpoint, match="rank-1.pt is missing"):
        rundir.inspect_checkpoint(broken / ck.path.name)


def test_sigkill_of_either_rank_over_attempts_is_bit_exact(reference: Path, tmp_path: Path):
    # rank 1 before the first save's successor, rank 0 just after a save, rank 1 mid-epoch 2.
    rd, out = recovered_run(tmp_path, "kills", faults="1:kill@6:1,2:kill@13:0,3:kill@18:1",
                            kinds=["signal", "signal", "signal", "success"])
    ev = [e["evidence"] for e in events(rd, "attempt_ended")]
    assert ev[0].startswith("exit code 1; rank 1 (pid ") and "killed by SIGKILL" in ev[0].split(",")[0]
    assert ev[1].startswith("exit code 1; rank 0 (pid ") and "killed by SIGKILL" in ev[1].split(",")[0]
    assert [e["resume_from"] for e in events(rd, "attempt_started")][1:] == [
        str(rd.resolve() / "checkpoints" / rundir.checkpoint_name(s)) for s in (4, 12, 16)]
    assert_same_weights(out, reference / "out")
    # Every restart went to a launcher prestarted during the attempt before (its imports done),
    # and the one prestarted for a fifth attempt that never came left with the supervisor.
    assert [e["prestarted"] for e in events(rd, "attempt_started")] == [False, True, True, True]
    assert sorted(f.name for f in (rd / "logs").glob("attempt-*.log")) == [f"attempt-000{n}.log" for n in (1, 2, 3, 4)]
    assert not [q for q in psutil.process_iter(["cmdline"]) if "trainer_shim._launch.standby" in (q.info["cmdline"] or [])
                and str(out) in " ".join(q.info["cmdline"])]


# make test: memory (their slots merged); async is long (test_hf_async kills a rank of two inside
# its background write, the same commit path).
@pytest.mark.parametrize("save_mode", modes("memory"), indirect=True)
def test_fast_saves_of_every_rank_survive_sigkill_bit_exact(reference: Path, tmp_path: Path, save_mode: str):
    # rank 1 killed right after step 8 returned (async: while the writers commit step 8's save in
    # the background), rank 0 after step 13. Async: each rank copies its share and returns; the
    # writer threads commit together. Memory snapshots: every rank's slot holds its share of each
    # step; the supervisor merges the slots of the newest step all ranks hold into one
    # checkpoint, and the next attempt resumes from it.
    rd, out = recovered_run(tmp_path, "fast", faults="1:kill@8:1,2:kill@13:0", kinds=["signal", "signal", "success"])
    assert_same_weights(out, reference / "out")
    starts = [e["resume_from"] for e in events(rd, "attempt_started")][1:]
    if "memory" in save_mode:
        # Step 8 is a disk save too: synchronous (after the snapshot), or in the background when the
        # kill came (then the slots have it); step 13 exists only in the slots.
        kept = events(rd, "checkpoint_persisted_by_supervisor")
        assert [e["step"] for e in kept] == ([8, 13] if "async" in save_mode else [13]), kept
        assert starts == [str(rd.resolve() / "checkpoints" / rundir.checkpoint_name(8)), kept[-1]["path"]]
    else:
        assert all(s is not None and rundir.parse_checkpoint_name(Path(s).name) is not None for s in starts), starts
    assert not [p for p in rundir.SHM_DIR.iterdir() if p.name.startswith(rundir.snapshot_slot_paths(rd)[0].name[:-1])]
    assert not list(rundir.tmp_dirs(rd / "checkpoints"))


@pytest.mark.long   # make test: the single-process fallback dir (tests/faults/test_disk_full.py)
def test_a_full_primary_root_sends_every_ranks_save_to_the_fallback_dir(reference: Path, tmp_path: Path):
    # run/checkpoints is an 8 KiB tmpfs: a rank's write fails there (ENOSPC) and the same save,
    # on every rank, goes to the fallback dir; the resume after a kill comes from there.
    fb, rd = tmp_path / "fallback", tmp_path / "fb" / "run"
    rundir.ensure_run_dir(rd)
    with mounted_tmpfs(rd / "checkpoints", "size=8k,mode=0700"):
        rd, out = recovered_run(tmp_path, "fb", "--fallback-dir", str(fb), faults="1:kill@13:0",
                                kinds=["signal", "success"])
        assert events(rd, "checkpoint_failed"), "the primary root should have failed at least once"
        assert events(rd, "attempt_started")[1]["resume_from"] == str(fb / "checkpoints" / rundir.checkpoint_name(12))
        assert not list(rundir.tmp_dirs(rd / "checkpoints")), "a failed save left its temporary dir"
    assert_same_weights(out, reference / "out")


def test_no_prestart_starts_every_attempt_cold(reference: Path, tmp_path: Path):
    rd, out = recovered_run(tmp_path, "cold", faults="1:kill@6:1", extra=("--no-prestart",),
                            kinds=["signal", "success"])
    assert [e["prestarted"] for e in events(rd, "attempt_started")] == [False, False]
    assert_same_weights(out, reference / "out")


def test_exception_on_rank_1_is_its_error_file_and_named_in_the_evidence(reference: Path, tmp_path: Path):
    rd, out = recovered_run(tmp_path, "raise", faults="1:raise@6:1", kinds=["crash", "success"])
    err = json.loads((rd / "errors" / "attempt-1-rank-1.json").read_text())
    assert err["type"] == "RuntimeError" and err["message"] == "injected crash"
    ev = events(rd, "attempt_ended")[0]["evidence"]
    assert ev.startswith("exit code 1; rank 1 (pid ") and "rank 1 RuntimeError: injected crash" in ev, ev
    assert_same_weights(out, reference / "out")


def test_hung_rank_is_named_both_stacks_dumped_and_resume_is_exact(reference: Path, tmp_path: Path):
    # rank 1 sleeps before its run.step(10) (outside any collective); rank 0 blocks in the
    # step's flag all-reduce, so rank 1's heartbeat is the one that stops first.
    rd, out = recovered_run(tmp_path, "hang", "--heartbeat-interval", "0.01", "--step-sleep", "0.2",
                            faults="1:hang_pre@10:1", extra=("--grace-period", "5"), kinds=["hang", "success"])
    first = events(rd, "attempt_ended")[0]
    assert first["evidence"].startswith("rank 1 heartbeat unchanged"), first["evidence"]
    start = events(rd, "attempt_started")[0]
    pids = {int(f.name[len("stacks-"):-4]) for f in (rd / "logs").glob("stacks-*.txt") if f.stat().st_size > 0}
    assert len(pids) == 2, pids  # both ranks of attempt 1 (later attempts never got SIGUSR1)
    assert all(not alive(pid) for pid in pids) and not alive(start["pid"])
    texts = [(rd / "logs" / f"stacks-{pid}.txt").read_text() for pid in pids]
    assert any("ddp_train.py" in t and "in inject" in t for t in texts)  # the sleeping rank
    assert any("all_reduce" in t or "distributed" in t for t in texts)  # the blocked one
    assert_same_weights(out, reference / "out")


def _stopped_at_step(rd: Path, step: int, ranks: tuple[int, ...], *cli_args: str):
    """Start the supervisor, SIGTERM it once every rank in `ranks` is at `step`; the ended process."""
    sup = start_cli(*cli_args)
    try:
        wait_until(lambda: all((heartbeat(rd, r) or {}).get("step", 0) >= step for r in ranks), timeout=60,
                   what=f"ranks {ranks} at step {step}")
        sup.send_signal(signal.SIGTERM)
        sup.wait(60)
    finally:
        if sup.poll() is None:
            kill_group(sup)
    return sup


def test_sigterm_to_supervisor_saves_all_ranks_at_one_step_and_rerun_is_exact(reference: Path, tmp_path: Path):
    (tmp_path / "stop").mkdir()
    rd, out = tmp_path / "stop" / "run", tmp_path / "stop" / "out"
    args = ("--nproc-per-node", "2", "--run-dir", str(rd), *FAST, DDP_JOB, "--out-dir", str(out))
    sup = _stopped_at_step(rd, 6, (0, 1), *args[:-2], "--out-dir", str(out), "--step-sleep", "0.3")
    assert sup.returncode == 75, sup.stderr.read()[-3000:]
    assert ended_kinds(rd) == ["preempted"]
    hbs = [heartbeat(rd, r) for r in (0, 1)]
    assert [h["phase"] for h in hbs] == ["stopping", "stopping"]
    step = hbs[0]["checkpoint_step"]
    assert step == hbs[1]["checkpoint_step"] == hbs[0]["step"] == hbs[1]["step"]
    ck = rundir.inspect_checkpoint(rd / "checkpoints" / rundir.checkpoint_name(step), full=True)
    assert ck.manifest.world_size == 2  # kind preempt, or step when the stop fell on a save step
    p = run_cli(*args, timeout=150)
    assert p.returncode == 0, p.stderr[-3000:]
    assert events(rd, "attempt_started")[-1]["resume_from"] == str(ck.path.resolve())
    assert_same_weights(out, reference / "out")


def test_a_stop_of_a_one_rank_torchrun_is_preempted_not_crash(tmp_path: Path):
    # torchrun exits 1 (SignalException) after its only rank saved and exited 75: the ranks'
    # `stopping` beats say what happened, as they do for two ranks.
    rd = tmp_path / "run"
    sup = _stopped_at_step(rd, 3, (0,), "--nproc-per-node", "1", "--run-dir", str(rd), *FAST, DDP_JOB,
                           "--out-dir", str(tmp_path / "out"), "--step-sleep", "0.3")
    assert sup.returncode == 75, sup.stderr.read()[-3000:]
    assert ended_kinds(rd) == ["preempted"]
    assert "its rank saved a preempt checkpoint" in events(rd, "attempt_ended")[0]["evidence"]
    assert events(rd, "stopped")[0]["saved"] is True


def test_sigkill_of_the_supervisor_leaves_no_rank_behind(tmp_path: Path):
    # The supervisor's death kills torchrun (PDEATHSIG); torchrun's death must kill its ranks,
    # or they train on, orphaned, beside the next supervisor's attempt.
    rd = tmp_path / "run"
    sup = start_cli("--nproc-per-node", "2", "--run-dir", str(rd), *FAST, DDP_JOB, "--out-dir", str(tmp_path / "out"),
                    "--epochs", "1000", "--step-sleep", "0.1")   # far longer than the test
    try:
        wait_until(lambda: all((heartbeat(rd, r) or {}).get("step", 0) >= 2 for r in (0, 1)), timeout=60,
                   what="both ranks at step 2")
        ranks = [heartbeat(rd, r)["pid"] for r in (0, 1)]
        sup.kill()
        sup.wait(30)
        wait_until(lambda: not any(alive(pid) for pid in ranks), timeout=30, what="both ranks gone")
    finally:
        kill_group(sup)
        for proc in psutil.process_iter(["cmdline"]):   # orphans of a failed run must not outlive it
            if str(tmp_path) in " ".join(proc.info["cmdline"] or []):
                proc.kill()


def test_shim_collective_timeout_ends_the_attempt_instead_of_waiting_forever(reference: Path, tmp_path: Path):
    # The heartbeat timeout is long here: only the shim's own collective timeout (3 s) can end it.
    rd, out = recovered_run(tmp_path, "ctimeout", "--collective-timeout", "3", "--heartbeat-interval", "0.01",
                            faults="1:hang_pre@10:1", extra=("--heartbeat-timeout", "120"), kinds=["crash", "success"])
    err = json.loads((rd / "errors" / "attempt-1.json").read_text())
    assert err["type"] == "trainer_shim.errors.CollectiveTimeout" and "rank 0" in err["message"], err
    ended = events(rd, "attempt_ended")[0]
    assert "CollectiveTimeout" in ended["evidence"] and "rank 0" in ended["evidence"]
    # The hung rank 1 outlived rank 0's crash: the supervisor dumped its stack (where it really
    # hung) and ended it, instead of torchrun's 30 s between SIGTERM and SIGKILL.
    hung = int(ended["evidence"].split("rank 1 (pid ")[1].split(")")[0])
    assert "in inject" in (rd / "logs" / f"stacks-{hung}.txt").read_text()
    assert_same_weights(out, reference / "out")


def test_world_size_mismatch_is_refused_in_one_line(reference: Path, tmp_path: Path):
    rd = tmp_path / "run"
    shutil.copytree(reference / "run", rd, ignore=shutil.ignore_patterns("supervisor.lock"))
    p = run_cli("--nproc-per-node", "1", "--run-dir", str(rd), *FAST, DDP_JOB, "--out-dir", str(tmp_path / "out"),
                timeout=120)
    assert p.returncode == 1, p.stderr[-3000:]
    assert ("written by 2 rank(s), this run has 1; only sharded (DCP) checkpoints can be resharded: "
            "run with 2 rank(s)") in p.stderr
    # torchrun exits 1, but the rank's own exit code 2 (configuration error) is what is not retried.
    assert "exit code 2 is not retryable" in events(rd, "gave_up")[-1]["reason"]
    assert len(events(rd, "attempt_started")) == len(events(reference / "run", "attempt_started")) + 1  # no retry
