"""Warm restarts of `-- python -m MODULE` and of console scripts of our Python; any other interpreter
(another venv's python, `sh -c`) restarts cold (supervisor/process/warmable.py has the rule).

A warm case kills attempt 1 with SIGKILL once the standby for attempt 2 says its imports are done
(helpers.warm_run): attempt 2 must then run in that interpreter (`warm`, `warm_ready`), and the final
weights equal an uninterrupted run's. The HF Trainer variant is in test_warm_commands_long.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from supervisor.process.warmable import STANDBY_MODULE, WARM_MODULE, standby_route
from tests.conftest import PYTHON
from tests.faults.common import assert_bit_exact, reference
from trainer_shim.rundir import Event, RunDir

from .helpers import ended_kinds, events, no_standby_left, run_cli, sup_env, warm_run

TOY_MODULE = "tests.jobs.toy_train"
# Attempt 1 only (TOY_STEP_SLEEP_ATTEMPT): 36 steps of 0.5 s leave its standby time to import torch
# under load; the test kills it as soon as the standby is ready, so the sleep is rarely waited out.
SLOW = ("--step-sleep", "0.5")
CONSOLE_SCRIPT = f"""#!{PYTHON}
import sys
from tests.jobs.toy_train import main
if __name__ == "__main__":
    sys.exit(main())
"""
# A Python launcher as `swift sft` is one: runs the trainer as `python FILE.py ARGS` and exits with its status.
LAUNCHER_SCRIPT = f"""#!{PYTHON}
import subprocess, sys
result = subprocess.run([sys.executable, {str(Path(__file__).resolve().parents[1] / "jobs" / "toy_train.py")!r}, *sys.argv[1:]])
sys.exit(result.returncode)
"""
# Attempt 1 fails at once, attempt 2 succeeds: enough to see whether attempt 2 was prestarted.
FAIL_ONCE = "import os, sys; sys.exit(1 if os.environ['RESILIENT_ATTEMPT'] == '1' else 0)"


def _toy_warm_run(tmp_path: Path, name: str, command: list[str], env: dict, imported: tuple[str, ...] = (),
                  kill_trainer: bool = False) -> Path:
    """The toy job's `command` under the supervisor, killed once warm (helpers.warm_run); bit-exact."""
    rd, out = tmp_path / name, tmp_path / f"{name}.pt"
    warm_run(rd, [*command, "--out", str(out), *SLOW], env, cwd=tmp_path, imported=imported, kill_trainer=kill_trainer)
    assert_bit_exact(out, reference(tmp_path))
    no_standby_left(str(out))
    return rd


def test_python_m_restarts_warm_with_the_frameworks_the_attempt_imported(tmp_path):
    """`-- python -m MODULE`: attempt 1 imports `transformers` (one of the recorded frameworks) and
    records it at its first step; the standby imports it too, and attempt 2 finds it imported."""
    env = sup_env(TOY_STEP_SLEEP_ATTEMPT="1", TOY_IMPORT="transformers")
    rd = _toy_warm_run(tmp_path, "module", [PYTHON, "-m", TOY_MODULE], env, imported=("transformers",))
    assert [e["preloaded"] for e in events(rd, Event.ATTEMPT_STARTED)] == [[], ["transformers"]]
    logs = [RunDir(rd).attempt_log(n).read_text() for n in (1, 2)]
    assert "toy_train: transformers imported now" in logs[0]
    assert "toy_train: transformers was preloaded" in logs[1]


def test_a_console_script_of_our_python_restarts_warm(tmp_path):
    """`-- NAME`, NAME a script on PATH whose shebang is our Python (as pip writes `litgpt`, `tune`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "toy-train").write_text(CONSOLE_SCRIPT)
    (bin_dir / "toy-train").chmod(0o755)
    env = sup_env(TOY_STEP_SLEEP_ATTEMPT="1", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    rd = _toy_warm_run(tmp_path, "console", ["toy-train"], env)
    assert [e["preloaded"] for e in events(rd, Event.ATTEMPT_STARTED)] == [[], []]


def test_a_python_launchers_child_restarts_warm_inside_the_warm_interpreter(tmp_path):
    """`-- toy-launch` runs the trainer as `python toy_train.py` (as `swift sft` does). Attempt 1's child
    imports transformers and is killed; attempt 2's warm interpreter (which imported transformers, the
    launcher's child having recorded it) runs the launcher, and its child inside the same process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "toy-launch").write_text(LAUNCHER_SCRIPT)
    (bin_dir / "toy-launch").chmod(0o755)
    env = sup_env(TOY_STEP_SLEEP_ATTEMPT="1", TOY_IMPORT="transformers",
                  PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    rd = _toy_warm_run(tmp_path, "launcher", ["toy-launch"], env, imported=("transformers",), kill_trainer=True)
    started = events(rd, Event.ATTEMPT_STARTED)
    assert [e["preloaded"] for e in started] == [[], ["transformers"]]
    trainer = {e["attempt"]: e["pid"] for e in events(rd, Event.FIRST_STEP)}
    assert trainer[1] != started[0]["pid"], "attempt 1's trainer is the launcher's child"
    assert trainer[2] == started[1]["pid"], "attempt 2's trainer ran inside the warm interpreter"
    assert "toy_train: transformers was preloaded" in RunDir(rd).attempt_log(2).read_text()


@pytest.fixture(scope="module")
def other_venv(tmp_path_factory) -> Path:
    """Another venv made from our Python: its `python` is a symlink to the very same binary, but it
    starts in other site-packages, so it is not our interpreter."""
    d = tmp_path_factory.mktemp("venvs") / "other"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(d)], check=True, timeout=120)
    return d / "bin" / "python"


@pytest.mark.parametrize("who", ["ours", "another venv", "sh -c"])
def test_only_our_python_gets_a_warm_interpreter(tmp_path, other_venv, who):
    (tmp_path / "fail_once.py").write_text(FAIL_ONCE)
    command = {"ours": [PYTHON, "-m", "fail_once"], "another venv": [str(other_venv), "-m", "fail_once"],
               "sh -c": ["sh", "-c", f"exec {PYTHON} fail_once.py"]}[who]
    rd = tmp_path / "run"
    r = run_cli("--run-dir", str(rd), "--backoff", "0", "--", *command, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(rd) == ["crash", "success"]
    started = events(rd, Event.ATTEMPT_STARTED)
    assert [(e["prestarted"], e["warm"]) for e in started] == [(False, False), (who == "ours",) * 2], started


def test_the_interpreter_rule(tmp_path, other_venv):
    """Which argv gets which standby: our Python under any of its names, its console scripts (also by
    `#!/usr/bin/env`), torchrun's standby for torchrun; interpreter options and other Pythons: none."""
    ours_bin = os.path.dirname(PYTHON)
    path = f"{tmp_path}{os.pathsep}{ours_bin}{os.pathsep}{os.environ['PATH']}"
    for name, shebang in (("by-path", PYTHON), ("by-env", "/usr/bin/env python"), ("opts", f"{PYTHON} -u"),
                          ("other", str(other_venv))):
        (tmp_path / name).write_text(f"#!{shebang}\nprint('hi')\n")
        (tmp_path / name).chmod(0o755)

    def route(*argv: str):
        r = standby_route(argv, path=path, cwd=str(tmp_path))
        return r and (r.launcher, r.argv())

    warm = lambda python, *target: (WARM_MODULE, (python, "-m", WARM_MODULE, *target))  # noqa: E731
    assert route("python", "-m", "pkg.mod", "-x") == warm("python", "-m", "pkg.mod", "-x")
    assert route(PYTHON, "train.py", "a") == warm(PYTHON, "train.py", "a")
    assert route("by-path", "a") == warm(PYTHON, str(tmp_path / "by-path"), "a")
    assert route("./by-env", "a") == warm(str(Path(ours_bin) / "python"), "./by-env", "a")
    standby = (STANDBY_MODULE, (PYTHON, "-m", STANDBY_MODULE, "--standalone", "t.py"))
    assert route("torchrun", "--standalone", "t.py") == standby   # pip's torchrun script, by its shebang
    assert route(PYTHON, "-m", "torch.distributed.run", "--standalone", "t.py") == standby
    for cold in (("opts",), ("other",), (PYTHON, "-u", "-m", "pkg"), (str(other_venv), "-m", "pkg"),
                 ("sh", "-c", "true"), ("no-such-command",)):
        assert route(*cold) is None, cold
