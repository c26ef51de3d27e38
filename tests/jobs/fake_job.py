"""A torch-free job that speaks the heartbeat contract, for supervisor behaviour tests.

FAKE_PLAN="ATTEMPT:ACTION,..." picks what attempt N does after FAKE_STEPS steps of
FAKE_STEP_S seconds: ok (exit 0), exitN, kill (SIGKILL self), hang (stop beating, sleep),
silent (never beat at all), alloc (allocate until OOM-killed), oomerr (write a CUDA OOM error file, exit 1), sigterm-aware
stopping is built in (SIGTERM -> heartbeat phase stopping, exit 75; with FAKE_EXIT_HANGS=1 it never
exits after that). Unlisted attempts run ok.
Like the shim, it sets its step mark on every step; FAKE_BEAT_EVERY=N (default 1) beats only on
step 1 and every N-th step, so the last heartbeat's step can lag the step really reached.
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from trainer_shim import rundir  # noqa: E402

rd = rundir.ensure_run_dir(os.environ[rundir.ENV_RUN_DIR])
attempt = int(os.environ.get(rundir.ENV_ATTEMPT, "1"))
plan = dict(p.split(":", 1) for p in os.environ.get("FAKE_PLAN", "").split(",") if p)
action = plan.get(str(attempt), plan.get("*", "ok"))
steps = int(os.environ.get("FAKE_STEPS", "5"))
step_s = float(os.environ.get("FAKE_STEP_S", "0.1"))
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
signal.signal(signal.SIGUSR1, lambda *a: None)  # the shim dumps stacks here; we only survive it
beat_every = int(os.environ.get("FAKE_BEAT_EVERY", "1"))
mark = rundir.StepMark(rd.step_mark(0))  # before the first beat, as the shim does
seq = 0


def beat(step, phase=rundir.Phase.TRAINING):
    global seq
    seq += 1
    hb = rundir.HeartbeatRecord(pid=os.getpid(), attempt=attempt, step=step, phase=rundir.Phase(phase).value,
                                time=rundir.now_iso(), seq=seq, resumed_from=os.environ.get(rundir.ENV_RESUME_FROM),
                                save_bytes=None)
    rundir.atomic_write_json(rd.heartbeat(0), hb.to_json(), durable=False)


if action == "silent":
    time.sleep(3600)
print(f"fake_job: attempt {attempt} action {action}", flush=True)
for step in range(1, steps + 1):
    mark.set(step)
    if step == 1 or step % beat_every == 0:
        beat(step)
    if stop:
        beat(step, rundir.Phase.STOPPING)
        while os.environ.get("FAKE_EXIT_HANGS"):  # saved, then stuck in its teardown
            time.sleep(3600)
        sys.exit(rundir.EXIT_PREEMPTED)
    time.sleep(step_s)
if action.startswith("exit"):
    sys.exit(int(action[4:]))
if action == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if action == "hang":
    while True:
        time.sleep(3600)
if action == "alloc":
    hog = []
    while True:  # until the kernel's OOM killer ends us
        hog.append(bytearray(32 << 20))
        for i in range(0, len(hog[-1]), 4096):
            hog[-1][i] = 1
if action == "oomerr":
    err = rundir.ErrorRecord(type="torch.OutOfMemoryError", message="CUDA out of memory. Tried to allocate 2.00 GiB",
                             step=steps, time=rundir.now_iso())
    rundir.atomic_write_json(rd.error_file(attempt), err.to_json())
    sys.exit(1)
beat(steps, rundir.Phase.FINISHED)
print("fake_job: done", flush=True)
