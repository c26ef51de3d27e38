"""The learned heartbeat timeout's goal as stated, in the long campaign: saves of 8 s and steps of 0.05 s never trip the learned
heartbeat timeout, and a training hang is caught within 5 x p99 + the floor."""

from __future__ import annotations

import pytest

from tests.supervisor.test_learned_timeout import check_learned, run_timing_job

pytestmark = pytest.mark.long


def test_8s_saves_with_50ms_steps(tmp_path):
    run_dir, r = run_timing_job(tmp_path, save_s=8.0, saves=4, timeout=400)
    check_learned(run_dir, r, 4)
