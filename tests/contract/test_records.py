"""Typed contract records read what the other side writes, and poisoning is a field of the event."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_shim.rundir import (
    HEARTBEAT_FIELDS, ContractError, ErrorRecord, Event, HeartbeatRecord, StandbyMessage, SupervisorState,
    append_event, atomic_write_json, ensure_run_dir, poisoned_checkpoints, read_events, read_heartbeat_record,
)


def test_heartbeat_round_trip_keeps_todays_shape(tmp_path: Path) -> None:
    rd = ensure_run_dir(tmp_path / "run")
    hb = HeartbeatRecord(pid=7, rank=1, attempt=2, step=5, phase="training", seq=3)
    assert set(hb.to_json()) == set(HEARTBEAT_FIELDS)  # single-node beats carry no "node" key
    atomic_write_json(rd.heartbeat(1), {**hb.to_json(), "future_field": 1})
    assert read_heartbeat_record(rd.heartbeat(1)) == hb
    assert HeartbeatRecord(pid=7, node=2).to_json()["node"] == 2
    assert read_heartbeat_record(rd.heartbeat(0)) is None
    assert HeartbeatRecord.from_json({"step": 3}) is None


def test_heartbeat_fields_the_shim_sets_later_and_wrong_types() -> None:
    # total_steps and save_interval_s are written only once known (like node on one node: never).
    hb = HeartbeatRecord(pid=7, total_steps=800, save_interval_s=12.5)
    assert HeartbeatRecord.from_json(hb.to_json()) == hb
    assert {"total_steps", "save_interval_s", "node"}.isdisjoint(HeartbeatRecord(pid=7).to_json())
    # A field of the wrong type takes its default instead of reaching a reader as something else.
    odd = HeartbeatRecord.from_json({"pid": 7, "step": "12", "rank": True, "loss": "nan", "total_steps": 3.5,
                                     "phase": None, "attempt": 2})
    assert odd == HeartbeatRecord(pid=7, attempt=2)
    assert HeartbeatRecord.from_json({"pid": 7, "loss": 0.5}).loss == 0.5


def test_supervisor_state_tolerates_wrong_optional_types() -> None:
    st = SupervisorState.from_json({"state": "running", "supervisor_pid": 10, "child_pid": "11", "config": [],
                                    "child_cmdline": ["python", 3], "attempt": 2})
    assert st == SupervisorState(state="running", supervisor_pid=10, attempt=2)


def test_supervisor_state_round_trip_and_refusal(tmp_path: Path) -> None:
    st = SupervisorState(state="running", supervisor_pid=10, child_pid=11, child_cmdline=["python", "t.py"], attempt=1)
    atomic_write_json(tmp_path / "supervisor.json", st.to_json())
    assert SupervisorState.read(tmp_path / "supervisor.json") == st
    atomic_write_json(tmp_path / "bad.json", {"state": 3})
    with pytest.raises(ContractError, match="bad.json: supervisor.json is not a supervisor state"):
        SupervisorState.read(tmp_path / "bad.json")
    with pytest.raises(ContractError, match="missing"):
        SupervisorState.read(tmp_path / "absent.json")


def test_error_record_and_standby_message() -> None:
    rec = ErrorRecord(type="builtins.RuntimeError", message="boom", traceback="tb", step=4, time="t")
    assert ErrorRecord.from_json({**rec.to_json(), "rank": 1}) == rec
    assert ErrorRecord.from_json(["not", "a", "record"]) is None
    msg = StandbyMessage({"A": "1"})
    assert StandbyMessage.from_line(msg.to_line()) == msg
    assert StandbyMessage.from_line(b"") is None
    with pytest.raises(ContractError):
        StandbyMessage.from_line(b'{"nope": 1}\n')


def test_poisoning_is_a_field_and_old_run_dirs_still_count(tmp_path: Path) -> None:
    rd = ensure_run_dir(tmp_path / "run")
    append_event(rd, Event.CHECKPOINT_REJECTED, 3, path="/a", reason="crash loop: 3 attempts", poisoned=True)
    append_event(rd, "checkpoint_rejected", 2, path="/b", reason="poisoned: 3 attempts in a row")  # older writer
    append_event(rd, Event.CHECKPOINT_REJECTED, 1, path="/c", reason="digest mismatch")
    append_event(rd, Event.ATTEMPT_ENDED, 1, path="/d", poisoned=True)
    evs = read_events(rd)
    assert evs[0]["event"] == "checkpoint_rejected" == Event.CHECKPOINT_REJECTED
    assert poisoned_checkpoints(evs) == {"/a", "/b"}
