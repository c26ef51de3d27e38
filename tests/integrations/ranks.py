"""Two-rank framework jobs (torchrun, gloo on CPU) under the real `resilient-run --nproc-per-node 2`.

Each campaign runs alongside an uninterrupted 2-rank run of the same job and must end with final
weights bit-equal to it (DDP: every rank holds the same weights; rank 0 writes them).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from trainer_shim import rundir
from tests.support import assert_equal_state, ended_kinds, events, kill_group, start_cli, sup_env, weights

HERE = Path(__file__).resolve().parent
HF_JOB, PL_JOB = HERE / "hf_job.py", HERE / "lightning_job.py"
# No stop is asked of the job here: a short grace ends a rank stuck in a collective sooner.
FAST = ("--backoff", "0", "--heartbeat-timeout", "5", "--grace-period", "3", "--nproc-per-node", "2")


def _job_args(job: Path, run: Path, out: Path, job_extra: tuple = ()) -> list[str]:
    extra = ["--output_dir", str(run)] if job == HF_JOB else []
    return [str(job), *extra, *job_extra, "--out", str(out)]


def start_run(job: Path, d: Path, faults: str, *extra: str, job_extra: tuple = ()) -> tuple[subprocess.Popen, Path, Path]:
    """`resilient-run --nproc-per-node 2 job` in d/run (weights: d/weights.pt) with RRTEST_FAULTS=faults;
    `job_extra`: the job's own options."""
    d.mkdir(parents=True)
    run, out = d / "run", d / "weights.pt"
    p = start_cli("run", "--run-dir", str(run), *FAST, *extra, *_job_args(job, run, out, job_extra),
                  env=sup_env(RRTEST_FAULTS=faults), cwd=d)
    return p, run, out


def finish(p: subprocess.Popen, timeout: float = 300) -> str:
    """Wait for a run started by start_run (its whole group killed after); its stderr."""
    try:
        _, err = p.communicate(timeout=timeout)
    finally:
        kill_group(p)
    return err


def two_rank_campaign(job: Path, tmp: Path, faults: str, kinds: list[str], heartbeat_timeout: float = 5,
                      job_extra: tuple = ()) -> Path:
    """The faulted 2-rank run and the uninterrupted one side by side; asserts the attempts ended as
    `kinds`, every rank heartbeat, and the final weights equal; returns the faulted run's dir.

    After a kill -9 of one rank the survivor is silent until torchrun has ended it, which took over
    4 s with 4 ranks on 2 busy cores: a campaign without a hang gives it a longer heartbeat timeout."""
    base, _, base_out = start_run(job, tmp / "baseline", "", job_extra=job_extra)
    p, run, out = start_run(job, tmp / "faulted", faults, "--heartbeat-timeout", f"{heartbeat_timeout:g}",
                            job_extra=job_extra)
    err = finish(p)
    base_err = finish(base)
    assert base.returncode == 0, base_err[-3000:]
    assert p.returncode == 0, err[-3000:]
    assert ended_kinds(run) == kinds, [(e["kind"], e["evidence"]) for e in events(run, "attempt_ended")]
    assert (run / "heartbeats" / "rank-0.json").is_file() and (run / "heartbeats" / "rank-1.json").is_file()
    assert_equal_state(weights(out), weights(base_out), "final weights vs the uninterrupted 2-rank run")
    return run


def committed_files(checkpoint: Path) -> set[str]:
    """The files a committed checkpoint's manifest lists (the commit must cover every rank's)."""
    return set(rundir.inspect_checkpoint(checkpoint, full=True).manifest.files)
