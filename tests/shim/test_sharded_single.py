"""The sharded (DCP) path in one process, and RNG streams for ranks a resharded checkpoint lacks."""

from __future__ import annotations

import random
import subprocess
import textwrap
from pathlib import Path

import torch

from tests.conftest import PYTHON, REPO, child_env
from trainer_shim._state import rng
from trainer_shim import rundir

JOB = textwrap.dedent("""
    import os, sys, torch
    sys.path.insert(0, os.environ["REPO"])
    import trainer_shim
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=sys.argv[1], sharded=True, save_on_epoch_end=False)
    if os.environ.get("EARLY") and run.global_step == 0:
        run.save()  # before the optimizer's first step: it has no state yet
    for _ in run.epochs(1):
        for _b in run.batches(range(6)):
            opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
            run.step()
    run.finish()
    torch.save(model.state_dict(), os.path.join(sys.argv[1], "final.pt"))
""")


def _run(script: Path, run_dir: Path, **env: str) -> None:
    p = subprocess.run([PYTHON, str(script), str(run_dir)], env=child_env(REPO=str(REPO), **env),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]


def test_a_sharded_save_before_the_first_step_changes_nothing_and_resumes(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    _run(script, tmp_path / "plain")
    _run(script, tmp_path / "early", EARLY="1")
    a = torch.load(tmp_path / "plain" / "final.pt", weights_only=True)
    b = torch.load(tmp_path / "early" / "final.pt", weights_only=True)
    # DCP's get_state_dict would have given the fresh Adam a zero-lr step (step count 1), and
    # every later update would differ; the shim leaves a stateless optimizer out of the save.
    assert all(torch.equal(a[k], b[k]) for k in a)
    early = rundir.inspect_checkpoint(tmp_path / "early" / "checkpoints" / rundir.checkpoint_name(0), full=True)
    assert early.manifest.sharded and ".metadata" in early.manifest.files
    # Resuming from that step-0 checkpoint (no optimizer state in it) reproduces the same run.
    (tmp_path / "early" / "final.pt").unlink()
    last = tmp_path / "early" / "checkpoints" / rundir.checkpoint_name(6)
    last.rename(last.parent / f".tmp-gone-{last.name}")  # else step 6 would be kept, not rewritten
    _run(script, tmp_path / "early", RESILIENT_RESUME_FROM=str(early.path))
    c = torch.load(tmp_path / "early" / "final.pt", weights_only=True)
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_derived_rng_streams_are_distinct_reproducible_and_leave_the_current_state_alone() -> None:
    torch.manual_seed(1)
    random.seed(1)
    src = rng.capture()
    before = torch.get_rng_state().clone(), random.getstate()
    one, two = rng.derive(src, 1), rng.derive(src, 2)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert torch.equal(rng.derive(src, 1)["torch"], one["torch"])  # the same rank gets the same stream
    draws = []
    for st in (src, one, two):
        rng.restore(st)
        draws.append((torch.rand(4), random.random()))
    assert not torch.equal(draws[0][0], draws[1][0]) and not torch.equal(draws[1][0], draws[2][0])
    assert len({d[1] for d in draws}) == 3
