"""Retention: the pure policy on plain data, and what one real run leaves on disk."""

from __future__ import annotations

from pathlib import Path

from trainer_shim import rundir
from trainer_shim.rundir.rotation import Entry, best_names, to_delete
from trainer_shim.rundir import CheckpointKind as K

from .helpers import committed, run_toy


def _e(step: int, kind: K = K.STEP, loss: float | None = None, exact: bool = True) -> Entry:
    return Entry(rundir.checkpoint_name(step), step, kind, loss, exact)


def test_keeps_newest_per_pool_and_best() -> None:
    es = [_e(5, loss=0.9), _e(10, loss=0.1), _e(12, K.EPOCH, 0.5), _e(15, loss=0.8), _e(20, K.PREEMPT, 0.7),
          _e(24, K.EPOCH, 0.6), _e(25, K.EMERGENCY, 0.01, exact=False), _e(30, loss=0.4), _e(36, K.FINAL, 0.3)]
    gone = to_delete(es, keep_last=2, keep_epochs=2, keep_best=1)
    # step pool (step, preempt, emergency) newest 2: 30, 25; epoch pool newest 2: 36, 24;
    # best = lowest loss among exact ones: 10 (the inexact 25 never counts as best)
    assert gone == {rundir.checkpoint_name(s) for s in (5, 12, 15, 20)}


def test_protected_and_zero_limits() -> None:
    es = [_e(s, loss=float(s)) for s in (1, 2, 3, 4)]
    assert to_delete(es, keep_last=0, keep_epochs=0, keep_best=0, protected={"step-00000002"}) == {
        "step-00000001", "step-00000003", "step-00000004"}
    assert to_delete(es, keep_last=1, keep_epochs=0, keep_best=1) == {"step-00000002", "step-00000003"}
    assert to_delete([], keep_last=3, keep_epochs=10, keep_best=1) == set()


def test_upgraded_kind_moves_to_epoch_pool() -> None:
    # the index says step 12 became an epoch checkpoint; rotation must use that kind
    es = [_e(12, K.EPOCH), _e(15), _e(20), _e(25)]
    assert to_delete(es, keep_last=2, keep_epochs=1, keep_best=0) == {"step-00000015"}


def test_best_ignores_missing_and_nan_loss() -> None:
    es = [_e(1, loss=None), _e(2, loss=float("nan")), _e(3, loss=2.0), _e(4, loss=1.0)]
    assert best_names(es, 1) == {"step-00000004"}
    assert best_names(es, 5) == {"step-00000003", "step-00000004"}


def test_real_run_keeps_exactly_the_policy(run_dir: Path) -> None:
    p = run_toy(run_dir, "--keep-last", "2", "--save-every", "5")
    assert p.returncode == 0, p.stderr[-3000:]
    idx = rundir.read_index(rundir.RunDir(run_dir))
    assert sorted(idx) == committed(run_dir), "index and disk disagree"
    kinds = {n: e["kind"] for n, e in idx.items()}
    epoch_pool = sorted(n for n, k in kinds.items() if k in ("epoch", "final"))
    assert epoch_pool == ["step-00000012", "step-00000024", "step-00000036"]  # keep_epochs=10 keeps all
    assert kinds["step-00000036"] == "final"
    step_pool = sorted(n for n, k in kinds.items() if k not in ("epoch", "final"))
    best = [n for n, e in idx.items() if e["is_best"]]
    assert len(best) == 1
    # step pool: the newest 2 step saves (36 is final), plus the best one wherever it is
    assert set(step_pool) == {"step-00000030", "step-00000035"} | (set(best) - set(epoch_pool)), (step_pool, best)
    losses = {n: e["loss"] for n, e in idx.items()}
    assert losses[best[0]] == min(losses.values())
    assert (run_dir / "checkpoints" / "latest").resolve().name == "step-00000036"
