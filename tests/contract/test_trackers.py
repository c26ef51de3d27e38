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


def test_where_an_attempt_stands_from_the_shim_else_from_the_supervisors_choice(monkeypatch, tmp_path: Path) -> None:
    import importlib

    from trainer_shim._trackers import point

    point = importlib.reload(point)   # this process's own: nothing said yet
    monkeypatch.setenv("RESILIENT_ATTEMPT", "1")
    monkeypatch.delenv("RESILIENT_RESUME_FROM", raising=False)
    assert point.current().first_step is None   # a first attempt has nothing to purge
    monkeypatch.setenv("RESILIENT_ATTEMPT", "3")
    monkeypatch.setenv("RESILIENT_RESUME_FROM", str(tmp_path / "checkpoints" / "step-00000020"))
    assert point.current() == point.Point(3, 20, 21)   # before init(): the supervisor's choice
    monkeypatch.setenv("RESILIENT_RESUME_FROM", "none")
    assert point.current() == point.Point(3, None, 0)   # a later attempt starting over relogs from 0
    point.set_resumed(15, 15)   # what the shim restored wins (Lightning: its first logged step is 15)
    assert point.current() == point.Point(3, 15, 15)
    point.set_fresh()
    assert point.current() == point.Point(3, None, 0)
    importlib.reload(point)
