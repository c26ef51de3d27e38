"""The step mark survives its writer's SIGKILL and is what the reader sees."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO
from trainer_shim.rundir import HeartbeatRecord, RunDir, StepMark, atomic_write_json, ensure_run_dir, reached_step, read_step_mark

_VICTIM = textwrap.dedent("""\
    import os, signal, sys
    from trainer_shim.rundir import StepMark
    mark = StepMark(sys.argv[1])
    for step in range(1, 9):
        mark.set(step)          # no close(), no flush: the process dies right here
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_sigkilled_writer_leaves_its_last_step(tmp_path: Path) -> None:
    rd = ensure_run_dir(tmp_path / "run")
    path = rd.step_mark(1)
    p = subprocess.run([sys.executable, "-c", _VICTIM, str(path)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert read_step_mark(path) == 8
    assert path.name == "rank-1.step" and path.stat().st_size == 8


def test_absent_unset_and_short_marks_read_as_none(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    assert read_step_mark(rd.step_mark(0)) is None
    rd.heartbeats.mkdir()
    with StepMark(rd.step_mark(0)) as mark:
        assert read_step_mark(rd.step_mark(0)) is None  # opened, not set yet
        mark.set(0)
        assert read_step_mark(rd.step_mark(0)) == 0
        mark.set(12345678901)
        assert read_step_mark(rd.step_mark(0)) == 12345678901
    mark.set(3)  # after close: ignored, never raises (a late step() during shutdown)
    assert read_step_mark(rd.step_mark(0)) == 12345678901
    rd.step_mark(2).write_bytes(b"\x01\x02")
    assert read_step_mark(rd.step_mark(2)) is None


def test_a_new_writer_clears_an_earlier_attempts_mark(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.step"
    with StepMark(path) as mark:
        mark.set(40)
    StepMark(path).close()
    assert read_step_mark(path) is None


def test_step_marks_are_not_heartbeats(tmp_path: Path) -> None:
    rd = ensure_run_dir(tmp_path / "run")
    StepMark(rd.step_mark(0)).close()
    rd.heartbeat(0).write_text("{}")
    rd.heartbeat(3).write_text("{}")
    (rd.heartbeats / ".rank-0.json.x.tmp").write_text("")
    assert rd.heartbeat_files() == [(0, rd.heartbeat(0)), (3, rd.heartbeat(3))]


def test_reached_step_trusts_only_this_attempts_files(tmp_path: Path) -> None:
    rd = ensure_run_dir(tmp_path / "run")
    with StepMark(rd.step_mark(0)) as mark:
        mark.set(8)
    assert reached_step(rd, 0, attempt=2) is None  # no heartbeat: the mark may be an earlier attempt's
    atomic_write_json(rd.heartbeat(0), HeartbeatRecord(pid=1, attempt=1, step=5).to_json())
    assert reached_step(rd, 0, attempt=2) is None
    atomic_write_json(rd.heartbeat(0), HeartbeatRecord(pid=1, attempt=2, step=5).to_json())
    assert reached_step(rd, 0, attempt=2) == 8  # the heartbeat lags: rate-limited
    StepMark(rd.step_mark(0)).close()  # opened, never set (died before its first step)
    assert reached_step(rd, 0, attempt=2) == 5
