"""Long variant of test_warm_commands: an HF Trainer job run as `-- python -m MODULE`. Its first
attempt records transformers and transformers.trainer (seconds of imports); the standby imports them
while that attempt trains, so the restart after a kill -9 finds them imported, and ends bit-exact."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import PYTHON
from tests.integrations.test_integrations import _needs
from tests.support import assert_equal_state, events, weights
from trainer_shim.rundir import Event

from .helpers import sup_env, warm_run

pytestmark = pytest.mark.long

HF_MODULE = "tests.integrations.hf_job"


@_needs("transformers")
def test_hf_trainer_under_python_m_restarts_warm_with_transformers_preloaded(tmp_path):
    base = tmp_path / "baseline"
    base.mkdir()
    ref = subprocess.run([PYTHON, "-m", HF_MODULE, "--output_dir", str(base), "--out", str(base / "weights.pt")],
                         env=sup_env(RESILIENT_RUN_DIR=str(base / "run")), cwd=base, capture_output=True, text=True,
                         timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    rd, out = tmp_path / "run", tmp_path / "weights.pt"
    # Attempt 1 holds at step 6 (after checkpoint-5) until it is killed: time for the standby's imports.
    warm_run(rd, [PYTHON, "-m", HF_MODULE, "--output_dir", str(rd), "--out", str(out)],
             sup_env(RRTEST_FAULTS="1:pause@6"), cwd=tmp_path, imported=("transformers", "transformers.trainer"))
    assert events(rd, Event.ATTEMPT_STARTED)[1]["preloaded"] == ["transformers", "transformers.trainer"]
    assert_equal_state(weights(out), weights(base / "weights.pt"), "final weights vs the uninterrupted run")
