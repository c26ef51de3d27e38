"""A restarted run reads as one run in TensorBoard, W&B and MLflow, read back with the
trackers' own code: tensorboard's EventAccumulator, W&B's offline run dirs, an MLflow file store.

Each job is killed twice under the real supervisor (SIGKILL at steps 12 and 23; checkpoints every 5
steps, so attempts 2 and 3 resume from steps 10 and 20 and relog 11-12 and 21-23):
  * a raw loop logging one scalar per step to torch's SummaryWriter (default log dir), tensorboardX's,
    W&B (offline) and MLflow, twice side by side: its writers opened after init() (the restore says
    where the attempt stands) and before it (the supervisor's choice in the environment says it);
  * a zero-code HF Trainer job with report_to=["tensorboard", "wandb", "mlflow"] (TensorBoard: a new
    default log dir at every start; W&B and MLflow through HF's own callbacks);
  * a Lightning job with a TensorBoardLogger without a version (the next version_N at every start).
And in one process each: a user's own settings and purge_step are kept, --no-auto-attach sets
nothing, and an MLflow run that cannot be continued costs one warning line, not the training.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, child_env
from tests.support import ended_kinds, events, kill_group, start_cli, sup_env
from trainer_shim.rundir import (
    ATTACH_DIR, ENV_MLFLOW_RUN_ID, ENV_RESUME_FROM, ENV_RUN_DIR, ENV_TRACKERS, ENV_WANDB_RESUME, ENV_WANDB_RUN_ID,
    ENV_ATTEMPT, MLFLOW_ID, TB_LOGDIR, WANDB_ID, Event, RunDir, recorded, resume_tag,
)

HERE = Path(__file__).resolve().parent
TRACKERS = ("tensorboard", "tensorboardX", "wandb", "mlflow")
missing = [m for m in TRACKERS if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed "
                                                      "(pip install 'resilient-run[trackers]')")
KILLS = "1:12,2:23"
FAST = ("--backoff", "0", "--heartbeat-timeout", "60")


def _offline_env(tmp: Path, **extra: str) -> dict[str, str]:
    return sup_env(WANDB_MODE="offline", WANDB_DIR=str(tmp), WANDB_SILENT="true", MLFLOW_ALLOW_FILE_STORE="true",
                     MLFLOW_TRACKING_URI=f"file:{tmp / 'mlruns'}", TRACKER_KILLS=KILLS, **extra)


def _finish(p: subprocess.Popen, run: Path) -> None:
    try:
        _, err = p.communicate(timeout=400)
    finally:
        kill_group(p)
    assert p.returncode == 0, err[-3000:]
    assert ended_kinds(run) == ["signal", "signal", "success"], events(run, Event.ATTEMPT_ENDED)


def _steps(logdir: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def _one_logdir(parent: Path) -> Path:
    dirs = sorted(parent.iterdir())
    assert len(dirs) == 1, dirs   # every attempt wrote into the first attempt's default log dir
    return dirs[0]


def test_a_raw_loop_killed_twice_reads_as_one_run(tmp_path: Path) -> None:
    jobs = {}
    for name, extra in (("after", {}), ("first", {"TRACKER_WRITER_FIRST": "1"})):
        cwd = tmp_path / name
        cwd.mkdir()
        p = start_cli("run", "--run-dir", str(cwd / "run"), *FAST, str(HERE / "raw_tracker_job.py"),
                      env=_offline_env(cwd, **extra), cwd=cwd)
        jobs[name] = (p, cwd)
    for name, (p, cwd) in jobs.items():
        run = cwd / "run"
        _finish(p, run)
        # TensorBoard: each step once in torch's default log dir and in tensorboardX's.
        tb = _one_logdir(cwd / "runs")
        assert recorded(RunDir(run), TB_LOGDIR) == str(tb)
        assert len(list(tb.glob("events.out.tfevents.*"))) == 3
        for logdir in (tb, cwd / "tbx"):
            assert _steps(logdir, "loss") == list(range(1, 31)), (name, logdir)
        _one_wandb_and_mlflow_run(cwd, run)


def _one_wandb_and_mlflow_run(cwd: Path, run: Path) -> None:
    # W&B: the three attempts' offline runs carry the one id the run dir holds.
    offline = sorted(p.name for p in (cwd / "wandb").glob("offline-run-*"))
    wandb_id = recorded(RunDir(run), WANDB_ID)
    assert len(offline) == 3 and {n.rsplit("-", 1)[1] for n in offline} == {wandb_id}, (offline, wandb_id)
    # MLflow: one run, finished, each resume tagged with its step.
    [found] = _mlflow_runs(cwd / "mlruns")
    assert found.info.run_id == recorded(RunDir(run), MLFLOW_ID) and found.info.status == "FINISHED"
    tags = {k: v for k, v in found.data.tags.items() if k.startswith("resilient.")}
    assert tags == {resume_tag(2): "10", resume_tag(3): "20"}, tags


def _mlflow_runs(store: Path) -> list:
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=f"file:{store}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_a_zero_code_hf_job_reporting_to_the_trackers_killed_twice_reads_as_one_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    p = start_cli("run", "--run-dir", str(run), *FAST, str(HERE / "hf_tracker_job.py"), str(run),
                  env=_offline_env(tmp_path, TRACKER_REPORT_TO="tensorboard,wandb,mlflow"), cwd=tmp_path)
    _finish(p, run)
    logdir = _one_logdir(run / "runs")   # HF's output_dir/runs/<date>_<host>: the first attempt's
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 3
    assert _steps(logdir, "train/loss") == list(range(1, 37))
    _one_wandb_and_mlflow_run(tmp_path, run)   # through HF's own WandbCallback and MLflowCallback


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning not installed")
def test_a_lightning_job_with_a_tensorboard_logger_killed_twice_logs_each_step_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    p = start_cli("run", "--run-dir", str(run), *FAST, str(HERE / "lightning_tracker_job.py"), str(tmp_path / "tb"),
                  env=sup_env(TRACKER_KILLS=KILLS), cwd=tmp_path)
    _finish(p, run)
    logdir = _one_logdir(tmp_path / "tb" / "lightning_logs")   # version_0: the first attempt's version
    assert logdir.name == "version_0" and len(list(logdir.glob("events.out.tfevents.*"))) == 3
    assert _steps(logdir, "loss") == list(range(30))   # Lightning logs a step before counting it: 0-29


# --- one process each: what is kept, what is left alone, what fails open -----------------------

_PROBE = """
import glob, json, os, sys
from torch.utils.tensorboard import SummaryWriter
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

def purge_step(logdir):  # the step of the writer's SessionLog.START (purge_step): None when it wrote none
    [path] = glob.glob(logdir + "/events.out.tfevents.*")
    return next((e.step for e in EventFileLoader(path).Load() if e.HasField("session_log")), None)

for name, kw in (("a", {}), ("b", {"purge_step": 3})):
    SummaryWriter(sys.argv[1] + "/" + name, **kw).close()
purges = [purge_step(sys.argv[1] + "/a"), purge_step(sys.argv[1] + "/b")]
import mlflow
run = mlflow.start_run()
mlflow.end_run()
print(json.dumps({"purges": purges, "run": run.info.run_id, "tags": run.data.tags}))
"""


def _probe(tmp: Path, env: dict[str, str]) -> tuple[dict, str]:
    import json

    env = child_env(PYTHONPATH=os.pathsep.join([str(ATTACH_DIR), str(REPO)]), MLFLOW_ALLOW_FILE_STORE="true",
                    MLFLOW_TRACKING_URI=f"file:{tmp / 'mlruns'}", **env)
    p = subprocess.run([PYTHON, "-c", _PROBE, str(tmp)], env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_a_resumed_attempt_purges_unless_told_and_a_lost_mlflow_run_costs_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out, err = _probe(tmp_path, {ENV_RUN_DIR: str(run), ENV_ATTEMPT: "2", ENV_RESUME_FROM: str(run / "checkpoint-10"),
                                 ENV_MLFLOW_RUN_ID: "0123456789abcdef0123456789abcdef", ENV_TRACKERS: ENV_MLFLOW_RUN_ID})
    assert out["purges"] == [11, 3]   # checkpoint-10: this attempt logs from step 11; the user's own 3 stays
    lines = [ln for ln in err.splitlines() if "trackers:" in ln]
    assert len(lines) == 1 and "cannot be continued" in lines[0], err[-3000:]
    assert recorded(RunDir(run), MLFLOW_ID) == out["run"]   # the run it started instead is the one now


def test_the_users_settings_are_kept_and_no_auto_attach_sets_nothing(tmp_path: Path) -> None:
    show = (f"import os; print('ENV', *(os.environ.get(n, '-') for n in "
            f"({ENV_WANDB_RUN_ID!r}, {ENV_WANDB_RESUME!r}, {ENV_MLFLOW_RUN_ID!r}, {ENV_TRACKERS!r})))")
    outs = {}
    for name, flags, extra in (("mine", (), {ENV_WANDB_RUN_ID: "myrun"}), ("off", ("--no-auto-attach",), {}),
                               ("on", (), {})):
        run = tmp_path / name
        p = start_cli("run", "--run-dir", str(run), *FAST, *flags, "--", PYTHON, "-c", show,
                      env=sup_env(**extra), cwd=tmp_path)
        _finish_ok(p)
        outs[name] = (run / "logs" / "attempt-0001.log").read_text().split("\n")
    line = {name: next(ln for ln in lines if ln.startswith("ENV ")).split()[1:] for name, lines in outs.items()}
    assert line["mine"] == ["myrun", "allow", "-", ENV_WANDB_RESUME]
    assert line["off"] == ["-", "-", "-", "-"] and not (tmp_path / "off" / "run" / "trackers").exists()
    assert line["on"][1:] == ["allow", "-", f"{ENV_WANDB_RUN_ID},{ENV_WANDB_RESUME}"]
    assert line["on"][0] == recorded(RunDir(tmp_path / "on"), WANDB_ID) and len(line["on"][0]) == 8


def _finish_ok(p: subprocess.Popen) -> None:
    try:
        _, err = p.communicate(timeout=120)
    finally:
        kill_group(p)
    assert p.returncode == 0, err[-3000:]
