"""`resilient-run report` on a real supervised run with known faults (injected by the shim's doctor mode)."""

from __future__ import annotations

import datetime as dt
import json
import struct

import pytest

from tests.conftest import JOBS
from tests.supervisor.helpers import run_cli, sup_env
from tests.support import events
from trainer_shim.rundir import ENV_DOCTOR, ENV_DOCTOR_FAULTS, ENV_DOCTOR_STEPS


def _t(s: str) -> float:
    return dt.datetime.fromisoformat(s).timestamp()


@pytest.fixture(scope="module")
def doctor_run(tmp_path_factory):
    """kill -9 at step 7 (newest checkpoint: 5), an exception at 11 (newest: 10), success at 12."""
    tmp = tmp_path_factory.mktemp("report")
    env = sup_env(**{ENV_DOCTOR: str(tmp / "digests.jsonl"), ENV_DOCTOR_FAULTS: "7:kill,11:raise",
                     ENV_DOCTOR_STEPS: "12"})
    rd = tmp / "run"
    r = run_cli("run", "--run-dir", str(rd), "--backoff", "0", str(JOBS / "doctor_job.py"), "exact",
                env=env, cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return rd


def test_figures_match_the_events(doctor_run):
    r = run_cli("report", "--json", str(doctor_run))
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    a1, a2, a3 = rep["attempts"]
    assert [a["kind"] for a in rep["attempts"]] == ["signal", "crash", "success"]
    assert [a["resumed_from_step"] for a in rep["attempts"]] == [0, 5, 10]
    # attempt_ended's step is the last step really reached (the step mark): killed at 7 -> 7, raised at 11 -> 11.
    assert [a["last_step"] for a in rep["attempts"]] == [7, 11, 12]
    assert [a["steps_redone"] for a in rep["attempts"]] == [2, 1, 0]  # 7 - 5, 11 - 10
    assert rep["lost_steps"] == 3
    assert rep["restarts_by_kind"] == {"signal": 1, "crash": 1}
    started = {e["attempt"]: e for e in events(doctor_run, "attempt_started")}
    ended = {e["attempt"]: e for e in events(doctor_run, "attempt_ended")}
    first = {e["attempt"]: e for e in events(doctor_run, "first_step")}
    assert rep["wall_seconds"] == pytest.approx(_t(ended[3]["time"]) - _t(started[1]["time"]), abs=2e-3)
    for n, a in ((2, a2), (3, a3)):
        prev = ended[n - 1]
        assert a["recover_detect"] == pytest.approx(_t(prev["detected_time"]) - _t(prev["failure_time"]), abs=2e-3)
        assert a["recover_stop"] == pytest.approx(_t(prev["time"]) - _t(prev["detected_time"]), abs=2e-3)
        assert a["recover_spawn"] == pytest.approx(_t(started[n]["time"]) - _t(prev["time"]), abs=2e-3)
        assert a["recover_total"] == pytest.approx(_t(first[n]["time"]) - _t(prev["failure_time"]), abs=2e-3)
        # The shim's own marks split the start: init() ends "start" (process start, imports) and begins "restore".
        fs = first[n]
        assert a["recover_start"] == pytest.approx(_t(fs["init_time"]) - _t(prev["time"]), abs=2e-3)
        assert a["recover_restore"] == pytest.approx(_t(fs["restored_time"]) - _t(fs["init_time"]), abs=2e-3)
        # A cold attempt's process starts with the attempt; a warm one (the standby) long before it.
        assert _t(fs["process_start_time"]) <= _t(fs["init_time"])
        if not started[n]["warm"]:
            assert _t(fs["process_start_time"]) >= _t(started[n]["time"]) - 1
        assert a["recover_imports"] == pytest.approx(
            _t(fs["init_time"]) - max(_t(started[n]["time"]), _t(fs["process_start_time"])), abs=2e-3)
        # A toy's restore takes milliseconds; a cold attempt's interpreter start and `import torch` are
        # "start", not "restore"; a warm one (the standby, started with the attempt before) imported them earlier.
        startup1 = _t(first[1]["time"]) - _t(started[1]["time"])
        if started[n]["warm_ready"]:  # a standby still importing (a quick crash on a busy box) pays the rest
            assert a["recover_imports"] < startup1 / 2, a
        elif not started[n]["warm"]:
            assert a["recover_imports"] > a["recover_restore"], a
        parts = ("recover_detect", "recover_stop", "recover_start", "recover_restore", "recover_first_step")
        assert sum(a[k] for k in parts) == pytest.approx(a["recover_total"], abs=8e-3)
    assert a1["recover_total"] is None
    assert 0 < rep["goodput"] < 1 and rep["useful_seconds"] < rep["wall_seconds"]
    # ETTR also credits the start-up a failure-free job pays once: above goodput, below 1 with two failures.
    assert rep["goodput"] < rep["ettr"] < 1
    startup = _t(first[1]["time"]) - _t(started[1]["time"])
    assert rep["ettr"] == pytest.approx((startup + rep["useful_seconds"]) / rep["wall_seconds"], abs=2e-3)
    # Global step over time per attempt: each line ends where its attempt failed, the next starts lower.
    lines = rep["step_lines"]
    assert [ln["points"][-1][1] for ln in lines] == [7, 11, 12]
    assert [ln["points"][0][1] for ln in lines] == [1, 6, 11]


def test_time_spent_saving(doctor_run):
    """save_every_steps=5, 8 batches an epoch: attempt 1 saves at 5 (killed at 7); attempt 2 at 8 (epoch
    end), 10, and 11 (the emergency save of the exception); attempt 3 its final save at 12."""
    rep = json.loads(run_cli("report", "--json", str(doctor_run)).stdout)
    saved = events(doctor_run, "checkpoint_saved")
    expected = [(1, 5, "step"), (2, 8, "epoch"), (2, 10, "step"), (2, 11, "emergency"), (3, 12, "final")]
    assert [(e["attempt"], e["step"], e["kind"]) for e in saved] == expected
    assert [(c["attempt"], c["step"], c["kind"]) for c in rep["checkpoints"]] == expected  # the PNG's marks
    for a in rep["attempts"]:
        mine = [e for e in saved if e["attempt"] == a["attempt"]]
        # Each event carries its own stall and the attempt's running total.
        assert mine[-1]["saving_seconds"] == pytest.approx(sum(e["seconds"] for e in mine), abs=1e-3)
        assert a["saving_seconds"] == pytest.approx(mine[-1]["saving_seconds"], abs=1e-3) and a["saving_seconds"] > 0
        assert a["saves"] == len(mine)
    assert rep["saving_seconds"] == pytest.approx(sum(a["saving_seconds"] for a in rep["attempts"]), abs=2e-3)


def test_text_and_png(doctor_run, tmp_path):
    png = tmp_path / "timeline.png"
    r = run_cli("report", str(doctor_run), "--png", str(png))
    assert r.returncode == 0, r.stderr
    assert "goodput" in r.stdout.splitlines()[-1] and "restarts: crash 1, signal 1" in r.stdout
    assert "ETTR" in r.stdout.splitlines()[-1] and "detect/stop/start/restore/first step" in r.stdout
    assert "saving" in r.stdout.splitlines()[0] and ", saving " in r.stdout.splitlines()[-1]
    raw = png.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", raw[16:24]) == (1200, 400)
    import matplotlib.image

    img = matplotlib.image.imread(str(png))
    assert img.std() > 0.01  # not blank
    red = ((img[..., 0] > 0.7) & (img[..., 1] < 0.3)).sum()
    green = ((img[..., 1] > 0.4) & (img[..., 0] < 0.3)).sum()
    assert red > 100 and green > 100  # failed attempts red, the successful one green
    navy = ((img[..., 2] > 0.4) & (img[..., 0] < 0.1) & (img[..., 1] < 0.1)).sum()
    assert navy > 20 * len(json.loads(run_cli("report", "--json", str(doctor_run)).stdout)["checkpoints"])


def test_status_progress_and_metrics(doctor_run):
    r = run_cli("status", "--json", str(doctor_run))
    st = json.loads(r.stdout)
    assert st["step"] == 12 and st["total_steps"] == 100 * 8  # run.epochs(100) x 8 batches
    assert st["steps_per_s"] > 0 and st["eta_s"] > 0
    rep = json.loads(run_cli("report", "--json", str(doctor_run)).stdout)
    assert st["goodput"] == rep["goodput"]
    prom = (doctor_run / "metrics.prom").read_text()
    # The textfile of the last write (after attempt 3 ended) carries both recoveries.
    assert f'resilient_run_lost_steps_total{{run="run"}} {rep["lost_steps"]}' in prom
    assert 'resilient_run_recovery_seconds_count{run="run"} 2' in prom
    assert 'resilient_run_recovery_seconds_bucket{run="run",le="+Inf"} 2' in prom
    assert "resilient_run_goodput_ratio{" in prom
    assert f'resilient_run_ettr_ratio{{run="run"}} {rep["ettr"]}' in prom
