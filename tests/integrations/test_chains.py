"""Fault *sequences* across epoch boundaries end bit-exact, for every front end, under the real `resilient-run`.

A single kill resumes from a checkpoint the uninterrupted run also wrote. A chain resumes from a
checkpoint written by an attempt that itself resumed: anything of the data position, the loop state
or the RNGs that a resumed attempt records wrongly at or after an epoch boundary shows up only here.
Each chain: attempt 1 is killed right after the checkpoint at an epoch's last batch (the next attempt
resumes at the epoch end), attempt 2 is killed a little way into the next epoch (attempt 3 resumes
mid-epoch from a checkpoint attempt 2 wrote), attempt 3 finishes. Every job has a validation loader.
Kill points are the jobs' own (RRTEST_FAULTS, tests/integrations/faults.py), never timed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON
from tests.integrations.test_integrations import _needs
from tests.supervisor.helpers import run_cli, sup_env
from tests.support import TOY, invoke_cli, assert_equal_state, ended_kinds, events, weights
from trainer_shim.rundir import Event

HERE = Path(__file__).resolve().parent
# The raw loop (tests/jobs/toy_train.py): 12 steps an epoch, a save every 4, a shuffled validation loader
# (it draws from the global RNG) run at every epoch end, after the epoch's last save.
RAW = [TOY, "--val", "--save-every", "4"]
FAST = ("--backoff", "0", "--heartbeat-timeout", "30")


def _chain(tmp_path: Path, job: list[str], faults: str, resumes: list, run_args=lambda run: [],
           knob: str = "RRTEST_FAULTS", total: int = 0) -> None:
    """Run `job` uninterrupted and, alongside, under `resilient-run` with `faults`; the attempts after
    the first must resume from the steps `resumes` (a tuple: any of those steps), and the final weights
    must be bit-equal. `status` knows the run's length (`total` steps), so it can show progress and an
    ETA, for every front end."""
    base_dir = tmp_path / "baseline"
    base_dir.mkdir()
    base_out = base_dir / "weights.pt"
    base = subprocess.Popen([PYTHON, *job, *run_args(base_dir / "run"), "--out", str(base_out)],
                            env=sup_env(RESILIENT_RUN_DIR=str(base_dir / "run")), cwd=base_dir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run, out = tmp_path / "run", tmp_path / "weights.pt"
    try:
        r = run_cli("run", "--run-dir", str(run), *FAST, *job, *run_args(run), "--out", str(out),
                    env=sup_env(**{knob: faults}), cwd=tmp_path, timeout=300)
    finally:
        _, err = base.communicate(timeout=300)
    assert base.returncode == 0, err[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run) == ["signal"] * len(resumes) + ["success"], events(run, Event.ATTEMPT_ENDED)
    starts = events(run, Event.ATTEMPT_STARTED)[1:]
    got = [_step(e["resume_from"]) for e in starts]
    assert len(got) == len(resumes) and all(g in (r if isinstance(r, tuple) else (r,)) for g, r in zip(got, resumes)), starts
    assert_equal_state(weights(out), weights(base_out), "final weights vs the uninterrupted run")
    st = invoke_cli("status", str(run), "--json")
    assert json.loads(st.stdout)["total_steps"] == total, st.stdout + st.stderr


def _step(path: str) -> int:
    name = Path(path).name
    return int(name.rsplit("-", 1)[-1])


@_needs("lightning")
def test_lightning_transformer_chain_across_an_epoch_end_is_bit_exact(tmp_path: Path) -> None:
    """Lightning's transformer example shape (validation loader, gradient clipping, random_split), 9
    batches an epoch, a save every 3 steps: resume at the epoch end (9), then mid-epoch from 12 (written by
    the attempt that resumed at 9). Lightning alone replays epoch 2 from its first batch here (its resumed
    loop never marks that epoch started), and the loader's epoch RNG was taken before validation drew."""
    _chain(tmp_path, [str(HERE / "lightning_chain_job.py")], "1:kill@10,2:kill@13", [9, 12], total=27)


@pytest.mark.long   # make test runs Lightning's two-kill chain across an epoch end (above)
@_needs("lightning")
def test_lightning_chain_of_three_kills_is_bit_exact(tmp_path: Path) -> None:
    """Mid-epoch resume written by a resumed attempt, then across the next epoch end, then mid-epoch again."""
    _chain(tmp_path, [str(HERE / "lightning_chain_job.py")], "1:kill@13,2:kill@19,3:kill@23", [12, 18, 21], total=27)


def _hf_args(run: Path) -> list[str]:
    return ["--output_dir", str(run)]


@_needs("transformers")
def test_hf_trainer_chain_across_an_epoch_end_with_evaluation_is_bit_exact(tmp_path: Path) -> None:
    """HF Trainer, 12 steps an epoch, evaluated at every epoch end, a save every 4 steps: resume at the
    epoch end (12), then mid-epoch from 16 (written by the attempt that resumed at 12). The Trainer's
    checkpoint-12 holds the RNG from before the epoch-end evaluation, which drew from it."""
    _chain(tmp_path, [str(HERE / "hf_chain_job.py")], "1:kill@13,2:kill@17", [12, 16], _hf_args, total=24)


def test_raw_loop_chain_across_an_epoch_end_with_validation_is_bit_exact(tmp_path: Path) -> None:
    """The Run API: resume at the epoch end (12), then mid-epoch from 16 (written by the resumed attempt)."""
    _chain(tmp_path, RAW, "1:kill@13,2:kill@17", [12, 16], knob="TOY_FAULTS", total=36)


@pytest.mark.long   # make test runs the raw loop's two-kill chain across an epoch end (above)
def test_raw_loop_chain_of_three_kills_is_bit_exact(tmp_path: Path) -> None:
    """Mid-epoch, then at the next epoch end, then mid-epoch again: each resume from a resumed attempt's save."""
    _chain(tmp_path, RAW, "1:kill@17,2:kill@25,3:kill@29", [16, 24, 28], knob="TOY_FAULTS", total=36)


@pytest.mark.long   # make test runs the HF Trainer's two-kill chain across an epoch end (above)
@_needs("transformers")
def test_hf_trainer_chain_of_three_kills_is_bit_exact(tmp_path: Path) -> None:
    """Mid-epoch, then across the epoch end (24 is the last step of epoch 2), then mid-epoch in epoch 3."""
    _chain(tmp_path, [str(HERE / "hf_chain_job.py"), "--epochs", "3"], "1:kill@17,2:kill@25,3:kill@29",
           [16, 24, 28], _hf_args, total=36)
