"""The product environment is parsed once, strictly: a boolean means what it says or is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, child_env
from trainer_shim.rundir import ENV_ALLOW_RESHARD, ENV_ATTEMPT, ENV_NODE, RESUME_NONE, EnvError, RunEnv


@pytest.mark.parametrize("word", ["0", "false", "no", "off", "FALSE", "Off", " no "])
def test_allow_reshard_false_words_turn_it_off(word: str) -> None:
    # Before: any value but "" and "0" turned resharding ON, `false` included.
    assert RunEnv.from_environ({ENV_ALLOW_RESHARD: word}).allow_reshard is False


@pytest.mark.parametrize("word", ["1", "true", "yes", "on", "TRUE", "On"])
def test_allow_reshard_true_words_turn_it_on(word: str) -> None:
    assert RunEnv.from_environ({ENV_ALLOW_RESHARD: word}).allow_reshard is True


def test_unset_or_empty_leaves_the_choice_to_init() -> None:
    assert RunEnv.from_environ({}).allow_reshard is None
    assert RunEnv.from_environ({ENV_ALLOW_RESHARD: ""}).allow_reshard is None


@pytest.mark.parametrize("name, value", [(ENV_ALLOW_RESHARD, "maybe"), (ENV_ATTEMPT, "two"), (ENV_ATTEMPT, "0"),
                                         (ENV_NODE, "-1")])
def test_a_bad_value_is_a_one_line_error_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(EnvError) as e:
        RunEnv.from_environ({name: value})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{name}={value!r} is not valid; use ")


def test_the_supervisor_environment_parses_whole() -> None:
    env = RunEnv.from_environ({"RESILIENT_RUN_DIR": "/r", ENV_ATTEMPT: "3", "RESILIENT_RESUME_FROM": RESUME_NONE,
                               ENV_NODE: "1", "PATH": "/bin"})
    assert env == RunEnv(run_dir="/r", attempt=3, resume_from=RESUME_NONE, node=1, allow_reshard=None)
    assert env.fresh_start_requested
    assert RunEnv.from_environ({}) == RunEnv(attempt=1)


_SHOW_RESHARD = "import sys, trainer_shim; print(trainer_shim.init(run_dir=sys.argv[1]).allow_reshard)"


@pytest.mark.parametrize("word, want", [("false", "False"), ("off", "False"), ("yes", "True")])
def test_the_shim_honours_allow_reshard_words(tmp_path, word: str, want: str) -> None:
    p = subprocess.run([sys.executable, "-c", _SHOW_RESHARD, str(tmp_path / "run")], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=child_env(**{ENV_ALLOW_RESHARD: word}))
    assert p.returncode == 0 and p.stdout.split() == [want], p.stderr[-2000:]


def test_the_shim_refuses_a_bad_allow_reshard_in_one_line(tmp_path) -> None:
    p = subprocess.run([sys.executable, "-c", _SHOW_RESHARD, str(tmp_path / "run")], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=child_env(**{ENV_ALLOW_RESHARD: "maybe"}))
    assert p.returncode != 0 and f"{ENV_ALLOW_RESHARD}='maybe' is not valid" in p.stderr, p.stderr[-2000:]
