"""A torch-free job with chosen step and save durations, beating like the shim, for learned-timeout tests.

RRTEST_STEPS (per attempt "A:N,..." or N), RRTEST_STEP_S, RRTEST_SAVE_EVERY (steps), RRTEST_SAVE_S;
RRTEST_HANG_ATTEMPT=A: attempt A stops beating after its last step (a hang in phase training).
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
spec = os.environ.get("RRTEST_STEPS", "40")
per = dict(p.split(":") for p in spec.split(",")) if ":" in spec else {"*": spec}
steps = int(per.get(str(attempt), per.get("*", "40")))
step_s = float(os.environ.get("RRTEST_STEP_S", "0.05"))
save_every = int(os.environ.get("RRTEST_SAVE_EVERY", "10"))
save_s = float(os.environ.get("RRTEST_SAVE_S", "1"))
signal.signal(signal.SIGUSR1, lambda *a: None)
seq = 0


def beat(step, phase):
    global seq
    seq += 1
    rundir.atomic_write_json(rd.heartbeat(0), {
        "pid": os.getpid(), "rank": 0, "attempt": attempt, "step": step, "epoch": 0, "loss": None,
        "phase": phase, "time": time.time(), "checkpoint_step": None, "seq": seq,
        "resumed_from": None, "save_bytes": 0}, durable=False)


beat(0, "starting")
for step in range(1, steps + 1):
    time.sleep(step_s)
    beat(step, "training")
    if step % save_every == 0:
        beat(step, "saving")
        time.sleep(save_s)     # one blocking write: no progress beats, like a torch.save of one big file
        beat(step, "training")
if str(attempt) == os.environ.get("RRTEST_HANG_ATTEMPT"):
    print(f"timing_job: hanging after step {steps}", flush=True)
    while True:
        time.sleep(60)
print(f"timing_job: done {steps} steps", flush=True)
