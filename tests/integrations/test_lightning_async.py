"""`ResilientCallback(async_save=True)`: Lightning's checkpoint copied on the training thread, written and
committed by a background thread; kills during it resume bit-exact, from a normal Lightning `.ckpt`.

The supervised run is the chain of tests/integrations/test_chains.py (an uninterrupted run alongside,
final weights bit-equal); the kill points are the job's own (tests/integrations/faults.py), never timed.
The in-process test drives a real Lightning Trainer and holds the writer inside its write with a value
of the checkpoint dict that the writer's torch.save pickles (no part of the callback is replaced).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integrations.faults import DiskFull
from tests.integrations.test_chains import _chain
from tests.integrations.test_integrations import _needs
from tests.support import events, heartbeat
from trainer_shim.rundir import (
    EXIT_PREEMPTED, LIGHTNING_CKPT, CheckpointKind, Event, RunDir, checkpoint_name, inspect_checkpoint, tmp_dirs,
)

HERE = Path(__file__).resolve().parent
LIGHTNING_KEYS = {"state_dict", "optimizer_states", "loops"}


@_needs("lightning")
def test_kill9_at_a_step_and_inside_the_background_write_resume_bit_exact(tmp_path: Path) -> None:
    """Attempt 1 is killed at step 15, right after that step's save went to the writer: it resumes from 15
    if the write committed first, else from 10 (never from a half-written one). Attempt 2 is killed while
    the writer is inside step 25's torch.save: step 20 (committed before 25 was copied: one save in flight)
    is chosen, the temp dir never. 16 steps an epoch, 3 epochs, a save every 5 steps."""
    job = [str(HERE / "lightning_job.py"), "--async-save"]
    _chain(tmp_path, job, "1:kill@15,2:writekill@25", [(10, 15), 20], total=48)
    ckpts = RunDir(tmp_path / "run").checkpoints
    assert not list(tmp_dirs(ckpts)), "a temp dir of a killed background write was left behind"
    newest = torch.load(ckpts / checkpoint_name(48) / LIGHTNING_CKPT, map_location="cpu", weights_only=False)
    assert LIGHTNING_KEYS <= newest.keys() and newest["global_step"] == 48, sorted(newest)


class _Hold:
    """Pickled by the writer's torch.save: waits there until `gate` opens (the write is in flight)."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def __deepcopy__(self, memo: dict) -> "_Hold":  # the training thread's copy of the dict keeps it
        return self

    def __reduce__(self) -> Any:
        assert self.gate.wait(120), "the test never released the writer"
        return dict, ()


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> Any:
    """This process as an unsupervised Lightning job: no RESILIENT_* variable; what the job changes in
    the environment is undone after the test. The Lightning example's module (build, pl)."""
    for k in [k for k in os.environ if k.startswith("RESILIENT_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # seed_everything sets it
    pytest.importorskip("lightning")
    import examples.lightning_train as example
    return example


@_needs("lightning")
def test_a_due_save_waits_for_the_one_in_flight_and_nothing_is_claimed_before_its_commit(
        tmp_path: Path, in_process: Any) -> None:
    """Step 5's write is held: at step 10 (due) nothing is committed nor claimed by the heartbeat, then
    both commit, in order. Step 15's write fails (ENOSPC): a `checkpoint_failed` event, training goes on
    and saves 20. The tensors of every save go into the same preallocated buffers."""
    from trainer_shim.integrations.lightning import ResilientCallback

    build, pl = in_process.build, in_process.pl
    run = tmp_path / "run"
    gate, seen, buffers = threading.Event(), {}, []
    cb = ResilientCallback(save_every_steps=5, run_dir=run, keep_last=10, async_save=True)

    class Probe(pl.Callback):  # before cb in the list: its step-end hook runs before cb's save
        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
            if trainer.global_step == 5:
                checkpoint["probe"] = _Hold(gate)
            elif trainer.global_step == 15:
                checkpoint["probe"] = DiskFull()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if trainer.global_step == 10 and not gate.is_set():
                seen["at 10"] = (cb.session.hb.value("checkpoint_step"), _names(run))
                gate.set()

    class Buffers(pl.Callback):  # after cb: the copy of this step's save is in the buffers
        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if trainer.global_step in (10, 20):
                buffers.append([t.data_ptr() for t in cb._background.staging.bufs[LIGHTNING_CKPT]])

    model, loader, trainer = build(epochs=2, callbacks=[Probe(), cb, Buffers()], root=str(tmp_path))
    try:
        trainer.fit(model, train_dataloaders=loader, ckpt_path=cb.resume_from())
    finally:
        gate.set()
        cb.session.finish()
    assert seen["at 10"] == (None, [".tmp-" + checkpoint_name(5)]), seen
    failed = events(run, Event.CHECKPOINT_FAILED)
    assert [(e["path"], e["background"]) for e in failed] == [(str(run / "checkpoints" / checkpoint_name(15)), True)]
    assert "No space left on device" in failed[0]["error"], failed
    assert _names(run) == [checkpoint_name(s) for s in (5, 10, 20, 25, 30, 32)]
    assert heartbeat(run)["checkpoint_step"] == 32
    assert buffers[0] == buffers[1] and buffers[0], "the staging buffers were reallocated between saves"
    held = torch.load(run / "checkpoints" / checkpoint_name(5) / LIGHTNING_CKPT, weights_only=False)
    assert LIGHTNING_KEYS <= held.keys() and held["probe"] == {}, sorted(held)


def _names(run: Path) -> list[str]:
    """The checkpoint dirs, temp dirs included (`latest` is a link)."""
    return sorted(p.name for p in (run / "checkpoints").iterdir() if not p.is_symlink())


@_needs("lightning")
def test_sigterm_drains_the_background_write_before_the_preempt_save(tmp_path: Path, in_process: Any) -> None:
    """Step 5's write is held; SIGTERM arrives at step 6, the writer is let go at that moment: the preempt
    save (synchronous) begins only once step 5 is committed, then the process exits 75."""
    from trainer_shim.integrations.lightning import ResilientCallback

    run = tmp_path / "run"
    gate, seen = threading.Event(), {}
    cb = ResilientCallback(save_every_steps=5, run_dir=run, async_save=True)

    class Probe(in_process.pl.Callback):  # before cb: its step-end hook runs before cb's stop check
        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
            if trainer.global_step == 5:
                checkpoint["probe"] = _Hold(gate)
            else:  # the preempt save's dict is built on the training thread, after the drain
                seen["preempt sees"] = _names(run)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if trainer.global_step == 6:
                os.kill(os.getpid(), signal.SIGTERM)  # the callback's handler: save at this step's end, exit 75
                gate.set()

    model, loader, trainer = in_process.build(epochs=1, callbacks=[Probe(), cb], root=str(tmp_path))
    try:
        with pytest.raises(SystemExit) as ended:
            trainer.fit(model, train_dataloaders=loader, ckpt_path=cb.resume_from())
    finally:
        gate.set()
        cb.session.finish()  # exit_preempted leaves the process hooks to the exit; this process goes on
    assert ended.value.code == EXIT_PREEMPTED
    assert checkpoint_name(5) in seen["preempt sees"], seen
    assert _names(run) == [checkpoint_name(5), checkpoint_name(6)]
    assert inspect_checkpoint(run / "checkpoints" / checkpoint_name(6)).manifest.kind == CheckpointKind.PREEMPT
