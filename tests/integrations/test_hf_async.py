"""`ResilientCallback(async_save=True)` for the HF Trainer: the Trainer's checkpoint files staged on the
training thread, written and committed by a background thread; kills during it resume bit-exact from a
normal `checkpoint-N/` that `Trainer.train(resume_from_checkpoint=...)` reads.

The supervised runs are the chains of tests/integrations/test_chains.py (an uninterrupted run alongside,
final weights bit-equal); the kill points are the job's own (tests/integrations/faults.py), never timed:
`writekill` puts a value into the optimizer's param group that SIGKILLs the process when the writer
thread pickles optimizer.pt (and fails the attempt if the training thread pickled it: not in the background).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.ranks import HF_JOB, committed_files, two_rank_campaign
from tests.integrations.faults import DiskFull
from tests.integrations.test_chains import _chain, _hf_args
from tests.integrations.test_integrations import _needs
from tests.support import events
from trainer_shim.rundir import InvalidCheckpoint, Event, hf_checkpoint_name, inspect_checkpoint

HERE = Path(__file__).resolve().parent
JOB = [str(HERE / "hf_chain_job.py"), "--async-save"]
# What the Trainer writes itself into checkpoint-N/ (the rest of its files are staged and written later).
TRAINER_FILES = {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"}


@_needs("transformers")
def test_kills_at_an_epoch_end_and_inside_the_background_write_resume_bit_exact(tmp_path: Path) -> None:
    """12 steps an epoch with an evaluation at its end, a save every 4. Attempt 1 is killed at step 13,
    after the epoch-end save 12 (committed when epoch 2 began, with that moment's RNG) went to the writer:
    it resumes from 12 if that write committed first, else from 8. Attempt 2 is killed while the writer
    is inside step 20's optimizer.pt: 16 (committed before 20 was staged: one save in flight) is chosen,
    the torn checkpoint-20/ never."""
    _chain(tmp_path, JOB, "1:kill@13,2:writekill@20", [(8, 12), 16], _hf_args, total=24)
    run = tmp_path / "run"
    final = inspect_checkpoint(run / hf_checkpoint_name(24), full=True)  # InvalidCheckpoint when invalid
    assert TRAINER_FILES <= set(final.manifest.files), sorted(final.manifest.files)
    saved = events(run, Event.CHECKPOINT_SAVED)
    assert saved and all(e["seconds"] >= 0 for e in saved), saved


@_needs("transformers")
def test_two_ranks_rank_0_killed_inside_its_background_write_restarts_the_group_exact(tmp_path: Path) -> None:
    """torchrun, 2 ranks, 18 steps, a save every 5: rank 0 (which commits) stages its files and writes
    them in the background; rank 1 writes its RNG state at once. Rank 0 dies inside step 15's write:
    the group restarts from 10, bit-exact, and every commit holds both ranks' RNG files."""
    run = two_rank_campaign(HF_JOB, tmp_path, "1:writekill@15/0", ["signal", "success"], heartbeat_timeout=20,
                            job_extra=("--async-save",))
    assert [e["resume_from"] and Path(e["resume_from"]).name for e in events(run, Event.ATTEMPT_STARTED)] == [
        None, hf_checkpoint_name(10)], events(run, Event.ATTEMPT_STARTED)
    ckpts = sorted(run.glob("checkpoint-*"))
    assert ckpts, list(run.iterdir())
    for c in ckpts:
        assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt"} <= committed_files(c), c


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as an unsupervised job: no RESILIENT_* variable; undone after the test."""
    for k in [k for k in os.environ if k.startswith("RESILIENT_")]:
        monkeypatch.delenv(k)


@_needs("transformers")
def test_a_failed_background_write_is_an_event_and_training_goes_on(tmp_path: Path, in_process: None) -> None:
    """The writer's optimizer.pt of step 4 fails (ENOSPC): a `checkpoint_failed` event, no manifest on
    that dir, and training goes on to commit the later saves; the Trainer's writers are its own again."""
    import torch
    from transformers import TrainerCallback

    from examples.hf_train import build
    from trainer_shim.integrations.hf import ResilientCallback

    class FailAt4(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            groups = kw["optimizer"].param_groups
            if state.global_step == 4:
                groups[0]["rrtest_full"] = DiskFull()
            else:
                groups[0].pop("rrtest_full", None)

    original = torch.save
    cb = ResilientCallback(run_dir=tmp_path / "run", async_save=True)
    trainer = build(str(tmp_path / "out"), epochs=1, save_steps=4, save_total_limit=None, callbacks=[cb, FailAt4()])
    trainer.train(resume_from_checkpoint=cb.resume_from(str(tmp_path / "out")))
    assert torch.save is original, "the save window left torch.save wrapped"
    failed = events(tmp_path / "run", Event.CHECKPOINT_FAILED)
    assert [Path(e["path"]).name for e in failed] == [hf_checkpoint_name(4)] and failed[0]["background"], failed
    assert "No space left" in failed[0]["error"], failed
    with pytest.raises(InvalidCheckpoint, match="MANIFEST"):
        inspect_checkpoint(tmp_path / "out" / hf_checkpoint_name(4))
    good = inspect_checkpoint(tmp_path / "out" / hf_checkpoint_name(8), full=True)
    assert TRAINER_FILES <= set(good.manifest.files), sorted(good.manifest.files)
