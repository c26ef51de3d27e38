"""SIGTERM preempts with zero lost steps, SIGUSR1 dumps stacks, crashes leave an error file and an
emergency checkpoint that is never auto-resumed, and heartbeats go stale exactly when they should."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Optional

from trainer_shim import rundir
from trainer_shim._session import heartbeat as heartbeat_module
from trainer_shim._session.heartbeat import Heartbeat

from tests.support import first_steps, wait_until

from .helpers import TOY, assert_same_weights, kill_group, manifest, run_toy, start_toy


HEARTBEAT = Path(heartbeat_module.__file__)
# The toy's top level: `main()` under `if __name__ == "__main__":`, where every stack of its main thread starts.
TOY_MAIN_CALL = next(n for n, ln in enumerate(TOY.read_text().splitlines(), 1) if ln.strip() == "main()")


def _whole_dump(path: Path) -> Optional[list[list[str]]]:
    """faulthandler's dump of every thread, once the training thread's is in (its stack ends at the
    script's top level): one [header, innermost frame, ..., outermost frame] per thread, each frame
    as faulthandler writes it, 'File "PATH", line N in FUNC'."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    threads = [[ln.strip() for ln in block.splitlines() if ln.strip()] for block in text.split("\n\n")]
    threads = [t for t in threads if t]
    return threads if any(t[-1].endswith(" in <module>") for t in threads) else None


def test_sigterm_loses_no_step_and_exits_75_sigusr1_dumps(run_dir: Path, refs) -> None:
    ref = refs.get()
    rd = rundir.RunDir(run_dir)
    proc = start_toy(run_dir, "--step-sleep", "0.05")
    phases: list[str] = []

    def beat_at(step: int):
        hb = rundir.read_heartbeat(rd.heartbeat(0))
        if hb and (not phases or phases[-1] != hb["phase"]):
            phases.append(hb["phase"])
        return hb if hb and hb["step"] >= step else None

    assert wait_until(lambda: beat_at(6), 60, 0.005), "no training heartbeat" 
    proc.send_signal(signal.SIGUSR1)
    stacks = rd.stacks_file(proc.pid)
    dump = wait_until(lambda: _whole_dump(stacks), 20, what="the SIGUSR1 stack dump")
    # What the user asked for: where training is. Exactly one thread (the main thread, whichever
    # thread took the signal) is the script's: main() called from its top level, the shim on top.
    training = [t for t in dump if t[-1] == f'File "{TOY}", line {TOY_MAIN_CALL} in <module>']
    assert len(training) == 1 and re.fullmatch(rf'File "{re.escape(str(TOY))}", line \d+ in main', training[0][-2]), dump
    assert training[0][0].startswith(("Current thread 0x", "Thread 0x")) and training[0][0].endswith(
        " (most recent call first):"), training[0]
    # ... and every other thread as well: the shim's heartbeat thread, in its loop.
    assert any(re.fullmatch(rf'File "{re.escape(str(HEARTBEAT))}", line \d+ in _loop', f) for t in dump for f in t[1:]), dump
    assert wait_until(lambda: beat_at(9), 60, 0.005), "training stopped after SIGUSR1"
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == rundir.EXIT_PREEMPTED
    finally:
        kill_group(proc)
    hb = rundir.read_heartbeat(rd.heartbeat(0))
    assert hb["phase"] == "stopping"
    newest = rundir.newest_valid([rd.checkpoints], full=True)
    assert newest is not None and newest.step == hb["step"] == hb["checkpoint_step"]
    assert newest.manifest.kind.value in ("preempt", "step")
    assert "training" in phases and phases[-1] in ("training", "saving", "stopping")

    p = run_toy(run_dir, attempt=2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert first_steps(run_dir)[2] == newest.step + 1, p.stderr  # resumed from the stop's checkpoint
    assert rundir.read_heartbeat(rd.heartbeat(0))["phase"] == "finished"
    assert_same_weights(ref / "final_weights.pt", run_dir / "final_weights.pt")


def test_crash_writes_error_and_inexact_emergency_never_auto_resumed(run_dir: Path, refs) -> None:
    ref = refs.get()
    rd = rundir.RunDir(run_dir)
    p = run_toy(run_dir, faults="1:raise@13,2:cuda_oom@18")
    assert p.returncode == 1
    err = json.loads(rd.error_file(1).read_text())
    assert err["type"] == "RuntimeError" and err["message"] == "injected crash" and err["step"] == 13
    assert "injected crash" in err["traceback"] and err["time"]
    em = rd.checkpoint(13)
    m = manifest(em)
    assert m["exact"] is False and m["kind"] == "emergency" and m["global_step"] == 13
    rundir.inspect_checkpoint(em, full=True)  # consistent: complete and digests match
    assert (rd.latest).resolve().name != em.name
    assert all(manifest(rd.checkpoint(s))["exact"] for s in (5, 10, 12))

    p = run_toy(run_dir, attempt=2, faults="1:raise@13,2:cuda_oom@18")
    assert p.returncode == 1
    assert first_steps(run_dir)[2] == 13, p.stderr  # resumed from step 12: the emergency at 13 was passed over
    assert rundir.ErrorRecord.from_json(rundir.read_json(rd.error_file(2))).type == "torch.OutOfMemoryError"
    assert manifest(rd.checkpoint(18))["exact"] is False

    p = run_toy(run_dir, attempt=3, faults="1:raise@13,2:cuda_oom@18")
    assert p.returncode == 0, p.stderr[-3000:]
    assert first_steps(run_dir)[3] == 16, p.stderr  # resumed from step 15, not the inexact 18
    assert_same_weights(ref / "final_weights.pt", run_dir / "final_weights.pt")


def test_heartbeat_goes_stale_unless_asked_or_save_progresses(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.json"
    hb = Heartbeat(path, rank=0, attempt=1, interval=0.05)
    hb.write_now()
    first = rundir.read_heartbeat(path)
    assert first["phase"] == "starting" and first["seq"] == 1
    assert set(rundir.HEARTBEAT_FIELDS) <= set(first)
    hb.start()
    try:
        time.sleep(0.3)
        assert rundir.read_heartbeat(path)["seq"] == 1, "the thread beat on its own: a hung loop would look alive"
        hb.progress(0, 0)   # phase training
        hb.request()
        assert wait_until(lambda: rundir.read_heartbeat(path)["seq"] == 2, 5)
        hb.begin_save()
        seq = rundir.read_heartbeat(path)["seq"]
        assert rundir.read_heartbeat(path)["phase"] == "saving"
        time.sleep(0.3)
        assert rundir.read_heartbeat(path)["seq"] == seq, "a stuck save must go stale"
        for n in range(1, 6):
            hb.save_bytes = n << 20
            time.sleep(0.08)
        got = rundir.read_heartbeat(path)
        assert got["seq"] >= seq + 3 and got["save_bytes"] > 0, got
        hb.end_save(checkpoint_step=7)
        got = rundir.read_heartbeat(path)
        assert got["phase"] == "training" and got["checkpoint_step"] == 7
    finally:
        hb.stop()


def test_exact_save_replaces_an_emergency_checkpoint_at_the_same_step(run_dir: Path, refs) -> None:
    # A crash after the last step leaves an emergency checkpoint at 36; the rerun reaches 36 again
    # and its epoch-end/final saves must commit an exact checkpoint there, not adopt the inexact one.
    ref = refs.get()
    rd = rundir.RunDir(run_dir)
    assert run_toy(run_dir, faults="1:raise@36").returncode == 1
    assert manifest(rd.checkpoint(36))["exact"] is False
    p = run_toy(run_dir, attempt=2, faults="1:raise@36")
    assert p.returncode == 0, p.stderr[-3000:]
    m = manifest(rd.checkpoint(36))
    assert m["exact"] is True and m["kind"] == "epoch"
    assert rundir.read_index(rd)["step-00000036"]["kind"] == "final"
    assert (rd.latest).resolve().name == "step-00000036"
    assert_same_weights(ref / "final_weights.pt", run_dir / "final_weights.pt")
