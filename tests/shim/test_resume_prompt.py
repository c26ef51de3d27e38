"""init(resume=...): `ask` prompts on a real terminal only; `never` starts fresh elsewhere, deleting nothing."""

from __future__ import annotations

import io
import os
import select
import subprocess
import time

from tests.conftest import JOBS, PYTHON
from tests.supervisor.helpers import sup_env
from trainer_shim._loop.resume_prompt import should_prompt

JOB = str(JOBS / "diverge_job.py")


def _in_pty(args: list[str], env: dict, answer: bytes, cwd) -> tuple[int, str]:
    """Run with stdin/stdout/stderr on a real pty; answer the prompt once it shows."""
    master, slave = os.openpty()
    p = subprocess.Popen([PYTHON, JOB, *args], stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                         start_new_session=True)
    os.close(slave)
    out, answered, deadline = b"", False, time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    chunk = os.read(master, 4096)
                except OSError:   # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            if not answered and b"Resume? [Y/n]" in out:
                os.write(master, answer)
                answered = True
            if p.poll() is not None and not r:
                break
        return p.wait(timeout=60), out.decode(errors="replace")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)


def test_ask_prompts_on_a_tty_and_no_starts_fresh_in_a_new_dir(tmp_path):
    env = sup_env()
    p = subprocess.run([PYTHON, JOB, "--steps", "10"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    run_dir = tmp_path / "runs" / "diverge_job"
    before = sorted(x.name for x in (run_dir / "checkpoints").iterdir())
    rc, out = _in_pty(["--steps", "12", "--resume", "ask"], env, b"\n", tmp_path)
    assert rc == 0, out
    assert "Found checkpoint step-00000010 (epoch 0, loss " in out and "s ago). Resume? [Y/n]" in out
    assert "resumed from" in out
    rc, out = _in_pty(["--steps", "5", "--resume", "ask"], env, b"n\n", tmp_path)
    assert rc == 0, out
    assert "starting fresh in" in out and (tmp_path / "runs" / "diverge_job-2" / "checkpoints" / "step-00000005").is_dir()
    assert set(before) <= {x.name for x in (run_dir / "checkpoints").iterdir()}   # nothing of the old run deleted


def test_ask_never_prompts_without_a_terminal_or_under_a_supervisor():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True
    assert should_prompt(Tty(), Tty(), supervised=False, world_size=1)
    assert not should_prompt(io.StringIO(), Tty(), supervised=False, world_size=1)
    assert not should_prompt(Tty(), Tty(), supervised=True, world_size=1)
    assert not should_prompt(Tty(), Tty(), supervised=False, world_size=2)
