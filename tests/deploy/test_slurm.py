"""deploy/slurm/train.sbatch under real bash, with stub resilient-run and scontrol processes."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from supervisor.errors import EXIT_STOPPED
from tests.conftest import REPO
from tests.support import wait_until

SBATCH = REPO / "deploy" / "slurm" / "train.sbatch"

# `run` records its argv, then idles until SIGTERM and exits 75, as the real supervisor does
# after the trainer saved; `stop` signals it through the pid file and waits for it to exit.
STUB_RESILIENT_RUN = textwrap.dedent("""\
    #!/bin/bash
    case "$1" in
    run)
        [ "$2" = --run-dir ] || exit 98
        rd=$3; shift 3
        echo "$*" > "$rd/run-args"
        if [ -n "${STUB_RUN_EXIT:-}" ]; then exit "$STUB_RUN_EXIT"; fi
        trap 'echo "run got TERM" >> "$rd/calls"; exit 75' TERM
        echo $$ > "$rd/run.pid.tmp" && mv "$rd/run.pid.tmp" "$rd/run.pid"
        while :; do sleep 0.05; done
        ;;
    stop)
        rd=$2
        echo "stop $rd" >> "$rd/calls"
        pid=$(cat "$rd/run.pid")
        kill -TERM "$pid"
        while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
        ;;
    *) exit 99 ;;
    esac
""")
STUB_SCONTROL = '#!/bin/bash\necho "$*" >> "$SCONTROL_LOG"\n'


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("resilient-run", STUB_RESILIENT_RUN), ("scontrol", STUB_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "RUN_DIR": str(run_dir),
        "SCONTROL_LOG": str(tmp_path / "scontrol.log"), "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "3",
    }


def start(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(SBATCH), *args], env=env, cwd=env["RUN_DIR"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_stops_saves_and_requeues(env, sig):
    rd = Path(env["RUN_DIR"])
    p = start(env, "--lr", "0.1")
    try:
        assert wait_until(lambda: (rd / "run.pid").exists(), 20), "stub run never started"
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == EXIT_STOPPED, err
    assert (rd / "calls").read_text().splitlines() == [f"stop {rd}", "run got TERM"]
    assert (rd / "run-args").read_text() == "train.py --lr 0.1\n"
    assert Path(env["SCONTROL_LOG"]).read_text() == "requeue 4242\n"
    assert "restart count 3" in err and f"got SIG{sig.name[3:]}" in err


@pytest.mark.parametrize("code", [0, 1])
def test_other_exit_codes_propagate_without_requeue(env, code):
    env["STUB_RUN_EXIT"] = str(code)
    p = start(env)
    _, err = p.communicate(timeout=30)
    assert p.returncode == code, err
    assert not Path(env["SCONTROL_LOG"]).exists()
    assert not (Path(env["RUN_DIR"]) / "calls").exists()


def test_requeue_only_inside_slurm(env):
    rd = Path(env["RUN_DIR"])
    del env["SLURM_JOB_ID"]
    p = start(env)
    try:
        assert wait_until(lambda: (rd / "run.pid").exists(), 20)
        p.send_signal(signal.SIGUSR1)
        p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == EXIT_STOPPED and not Path(env["SCONTROL_LOG"]).exists()
