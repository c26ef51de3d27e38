"""The README's example script, run the way the README says, killed once, finishes bit-exact."""

from __future__ import annotations

import os
import signal
import subprocess

import torch

from tests.conftest import PYTHON, REPO
from tests.supervisor.helpers import ended_kinds, heartbeat, kill_group, start_cli, sup_env, supervisor_state, wait_until

EXAMPLE = str(REPO / "examples" / "train.py")


def test_readme_example_survives_a_sigkill(tmp_path):
    subprocess.run([PYTHON, EXAMPLE], cwd=tmp_path, env=sup_env(), check=True, capture_output=True, timeout=120)
    ref = torch.load(tmp_path / "runs" / "train" / "final_weights.pt")

    work = tmp_path / "supervised"
    work.mkdir()
    p = start_cli("--backoff", "0", EXAMPLE, cwd=work)  # default run dir: runs/train
    run_dir = work / "runs" / "train"
    try:
        wait_until(lambda: (heartbeat(run_dir) or {}).get("step", 0) >= 12, timeout=60, what="step 12")
        os.kill(supervisor_state(run_dir)["child_pid"], signal.SIGKILL)
        assert p.wait(120) == 0
    finally:
        kill_group(p)
    assert ended_kinds(run_dir) == ["signal", "success"]
    got = torch.load(run_dir / "final_weights.pt")
    assert all(torch.equal(ref[k], got[k]) for k in ref)
