"""rundir.trackers: the values all attempts share are written once, the user's settings win."""

from __future__ import annotations

import threading
from pathlib import Path

from trainer_shim.rundir import (
    ENV_MLFLOW_RUN_ID, ENV_TRACKERS, ENV_WANDB_RESUME, ENV_WANDB_RUN_ID, MLFLOW_ID, WANDB_ID, WANDB_RESUME_ALLOW,
    RunDir, claim, is_default_logdir, recorded, tracker_environ,
)


def test_the_first_claim_wins_and_nobody_sees_a_torn_value(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    assert recorded(rd, MLFLOW_ID) is None
    got: list[str] = []
    threads = [threading.Thread(target=lambda i=i: got.append(claim(rd, MLFLOW_ID, f"run{i}"))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and got[0] == recorded(rd, MLFLOW_ID)
    assert [p.name for p in (tmp_path / "trackers").iterdir()] == [MLFLOW_ID]   # no temp file left


def test_one_wandb_id_per_run_dir_and_the_users_settings_win(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    first = tracker_environ({}, rd)
    assert first[ENV_WANDB_RESUME] == WANDB_RESUME_ALLOW and ENV_MLFLOW_RUN_ID not in first
    assert first[ENV_TRACKERS] == f"{ENV_WANDB_RUN_ID},{ENV_WANDB_RESUME}"
    claim(rd, MLFLOW_ID, "abc")   # the first attempt's MLflow run, recorded by the shim
    later = tracker_environ({}, rd)
    assert later[ENV_WANDB_RUN_ID] == first[ENV_WANDB_RUN_ID] == recorded(rd, WANDB_ID)
    assert later[ENV_MLFLOW_RUN_ID] == "abc"
    mine = tracker_environ({ENV_WANDB_RUN_ID: "mine", ENV_WANDB_RESUME: "never", ENV_MLFLOW_RUN_ID: "m",
                            ENV_TRACKERS: "stale"}, rd)
    assert (mine[ENV_WANDB_RUN_ID], mine[ENV_WANDB_RESUME], mine[ENV_MLFLOW_RUN_ID]) == ("mine", "never", "m")
    assert ENV_TRACKERS not in mine


def test_default_log_dirs_are_told_from_chosen_ones() -> None:
    assert is_default_logdir("out/runs/Dec07_21-58-01_vm", "vm")
    assert not is_default_logdir("out/runs/Dec07_21-58-01_vm_eval", "vm")   # a comment: its own writer
    assert not is_default_logdir("out/logs/Dec07_21-58-01_vm", "vm")
    assert not is_default_logdir("runs/my-experiment", "vm")
