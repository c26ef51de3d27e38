"""Zero-code framework jobs, deaths below launchers, and resume points that were not applied.

Both run side by side (each is mostly interpreter and transformers start-up):
  * a script with NO resilient-run code, started through a shell that stays its parent
    (`sh -c "python job.py; exit $?"`), kill -9 at step 12: auto-attach gave its Trainer the
    callback and the resume point -> `signal` naming the trainer's pid, resumed, bit-exact;
  * an explicit callback whose script forgets the resume point, under a Python launcher that exits
    with its child's status (sys.exit(-9) = 247, as `swift sft` does), with --no-auto-attach:
    -> `signal` naming the trainer's pid; the next attempt starts at step 0 again -> a
    `resume_step_mismatch` event and one line, and doctor's check fails on the run dir.
    That second attempt trains the whole job from step 0 without a fault: it is the uninterrupted
    run the first job's final weights must equal.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


from supervisor.insight.doctor import resume_mismatches
from tests.conftest import PYTHON
from tests.integrations.test_integrations import _needs
from tests.supervisor.helpers import start_cli, sup_env
from tests.support import assert_equal_state, ended_kinds, events, first_steps, kill_group, weights
from trainer_shim.rundir import Event, RunDir, checkpoint_roots, newest_valid

HERE = Path(__file__).resolve().parent
HF_JOB = HERE / "hf_job.py"
FAST = ("--backoff", "0", "--heartbeat-timeout", "60")


def _done(p: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        _, err = p.communicate(timeout=timeout)
    finally:
        kill_group(p)
    return p.returncode, err


# ms-swift builds the callbacks named by --callbacks as cls(args, trainer), before its Trainer, and
# passes args.resume_from_checkpoint to train(): the plugin route without auto-attach.
_SWIFT_STYLE = """
import sys
from transformers import TrainingArguments
from trainer_shim.integrations.hf import ResilientCallback
args = TrainingArguments(output_dir=sys.argv[1], report_to=[], use_cpu=True)
ResilientCallback(args, object())
print(args.resume_from_checkpoint)
"""


def _trainer_pid(run: Path, attempt: int) -> int:
    return next(e["pid"] for e in events(run, Event.FIRST_STEP) if e["attempt"] == attempt)


@_needs("transformers")
def test_zero_code_hf_job_under_launchers_resumes_bit_exact_and_a_forgotten_resume_is_loud(tmp_path: Path) -> None:
    env = sup_env(RRTEST_FAULTS="1:kill@12")
    zero, zero_out = tmp_path / "zero", tmp_path / "zero.pt"
    job = f"{PYTHON} {HF_JOB} --output_dir {zero} --out {zero_out} --callback none; exit $?"
    p_zero = start_cli("run", "--run-dir", str(zero), *FAST, "--", "sh", "-c", job, env=env, cwd=tmp_path)
    forgot = tmp_path / "forgot"
    forgot_out = tmp_path / "forgot.pt"
    p_forgot = start_cli("run", "--run-dir", str(forgot), *FAST, "--no-auto-attach", "--", PYTHON,
                         str(HERE / "launcher.py"), PYTHON, str(HF_JOB), "--output_dir", str(forgot),
                         "--out", str(forgot_out), "--callback", "ignore-resume", env=env, cwd=tmp_path)
    rc_zero, err_zero = _done(p_zero)
    rc_forgot, err_forgot = _done(p_forgot)

    # No resilient-run code, below a shell: the shell's 137 and the vanished trainer name the death.
    assert rc_zero == 0, err_zero[-3000:]
    assert ended_kinds(zero) == ["signal", "success"], events(zero)
    ended = events(zero, Event.ATTEMPT_ENDED)[0]
    assert (ended["exit_code"], ended["signal"], ended["dead_pid"]) == (137, signal.SIGKILL, _trainer_pid(zero, 1))
    assert f"trainer pid {ended['dead_pid']} killed by SIGKILL" in ended["evidence"], ended
    assert first_steps(zero)[2] == 11, events(zero, Event.FIRST_STEP)   # checkpoint-10, then step 11
    assert not events(zero, Event.RESUME_STEP_MISMATCH)
    # A Python launcher's sys.exit(-9): the same death; then the resume point the script ignored.
    assert rc_forgot == 0, err_forgot[-3000:]
    assert ended_kinds(forgot) == ["signal", "success"], events(forgot)
    ended = events(forgot, Event.ATTEMPT_ENDED)[0]
    assert (ended["exit_code"], ended["signal"], ended["dead_pid"]) == (247, signal.SIGKILL, _trainer_pid(forgot, 1))
    [mismatch] = events(forgot, Event.RESUME_STEP_MISMATCH)
    assert (mismatch["attempt"], mismatch["expected_step"], mismatch["actual_step"]) == (2, 10, 0), mismatch
    log = (forgot / "logs" / "attempt-0002.log").read_text()
    assert sum("resume not applied" in ln for ln in log.splitlines()) == 1, log[-3000:]
    problems = resume_mismatches(RunDir(forgot))
    assert len(problems) == 1 and "attempt 2" in problems[0] and "step 10" in problems[0], problems
    assert resume_mismatches(RunDir(zero)) == []

    # The ms-swift plugin route: constructed as cls(args, trainer), the callback sets the resume point.
    r = subprocess.run([PYTHON, "-c", _SWIFT_STYLE, str(zero)], env=sup_env(RESILIENT_RUN_DIR=str(zero)),
                       capture_output=True, text=True, timeout=120)
    newest = newest_valid(checkpoint_roots(RunDir(zero)))
    assert r.returncode == 0 and newest is not None and r.stdout.split()[-1] == str(newest.path), r.stderr[-2000:]

    # Attempt 2 of the forgotten resume trained steps 1..36 at one go: the uninterrupted run.
    assert first_steps(forgot)[2] == 1, events(forgot, Event.FIRST_STEP)
    assert_equal_state(weights(zero_out), weights(forgot_out), "final weights vs the uninterrupted run")
