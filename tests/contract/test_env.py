"""The product environment is parsed once, strictly: a boolean means what it says or is refused."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, child_env
from trainer_shim._policies import provenance
from trainer_shim.rundir import (
    ENV_ALLOW_RESHARD, ENV_ATTEMPT, ENV_DOCTOR, ENV_DOCTOR_FAULTS, ENV_DOCTOR_STEPS, ENV_LAST_FAILURE, ENV_NAMES,
    ENV_NODE, ENV_RESUME_FROM, ENV_RUN_DIR, ENV_SHM_DIR, ENV_STRICT_RESUME, ENV_CALLBACK, ENV_TRACKERS, FAULT_KILL, FAULT_RAISE,
    RESUME_NONE, EnvError, RunEnv,
)
from trainer_shim.rundir import env as env_module

# A valid value for each variable and the RunEnv it parses to (the table is the test that RunEnv
# reads every name: a variable added to ENV_NAMES without a row fails below).
VALID = {
    ENV_RUN_DIR: ("/r", {"run_dir": "/r"}),
    ENV_ATTEMPT: ("3", {"attempt": 3}),
    ENV_RESUME_FROM: (RESUME_NONE, {"resume_from": RESUME_NONE}),
    ENV_LAST_FAILURE: ("oom", {"last_failure": "oom"}),
    ENV_ALLOW_RESHARD: ("yes", {"allow_reshard": True}),
    ENV_NODE: ("1", {"node": 1}),
    ENV_STRICT_RESUME: ("on", {"strict_resume": True}),
    ENV_DOCTOR: ("/tmp/d.jsonl", {"doctor_log": "/tmp/d.jsonl"}),
    ENV_DOCTOR_FAULTS: ("41:raise, 17", {"doctor_faults": ((17, FAULT_KILL), (41, FAULT_RAISE))}),
    ENV_DOCTOR_STEPS: ("60", {"doctor_steps": 60}),
    ENV_CALLBACK: ('{"save_every_steps": 5, "keep_last": 2, "async_save": true}',
                   {"callback_options": (("async_save", True), ("keep_last", 2), ("save_every_steps", 5))}),
    ENV_TRACKERS: ("WANDB_RUN_ID, MLFLOW_RUN_ID", {"trackers": ("WANDB_RUN_ID", "MLFLOW_RUN_ID")}),
}


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
                                         (ENV_NODE, "-1"), (ENV_STRICT_RESUME, "strict"), (ENV_DOCTOR_STEPS, "ten"),
                                         (ENV_DOCTOR_STEPS, "0"), (ENV_DOCTOR_FAULTS, "17:explode"),
                                         (ENV_DOCTOR_FAULTS, "x:kill"), (ENV_CALLBACK, "{"),
                                         (ENV_CALLBACK, '{"save_every": 5}'), (ENV_CALLBACK, '{"keep_last": 0}')])
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


def test_the_shim_alone_refuses_a_resilient_shm_dir_that_is_no_directory(tmp_path) -> None:
    p = subprocess.run([sys.executable, "-c", _SHOW_RESHARD, str(tmp_path / "run")], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=child_env(**{ENV_SHM_DIR: str(tmp_path / "nowhere")}))
    assert p.returncode != 0 and f"{ENV_SHM_DIR}='{tmp_path / 'nowhere'}' is not valid" in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_env_declares_every_resilient_name_the_product_mentions() -> None:
    # Code, docstrings, the README and the docs pages: a RESILIENT_* name anywhere is one of env.py's.
    sources = [*(REPO / "supervisor").rglob("*.py"), *(REPO / "trainer_shim").rglob("*.py"), REPO / "README.md",
               *(REPO / "docs").rglob("*.md")]
    seen = {m for p in sources for m in re.findall(r"RESILIENT_[A-Z0-9_]*[A-Z0-9]", p.read_text())}
    assert seen <= set(ENV_NAMES), sorted(seen - set(ENV_NAMES))
    declared = {v for k, v in vars(env_module).items() if k.startswith("ENV_") and isinstance(v, str)}
    assert declared == set(ENV_NAMES) and len(ENV_NAMES) == len(set(ENV_NAMES))


# Set by the user for the supervisor and its trainers alike, not by the supervisor: read once by
# rundir.snapshots (the slot directory), not a RunEnv field.
USER_SET = {ENV_SHM_DIR}


def test_runenv_parses_every_name() -> None:
    assert set(VALID) | USER_SET == set(ENV_NAMES)
    for name, (value, fields) in VALID.items():
        assert RunEnv.from_environ({name: value}) == RunEnv(**fields), name


@pytest.mark.parametrize("word, want", [("false", False), ("0", False), ("off", False), ("NO", False),
                                        ("true", True), ("1", True), ("yes", True), ("", None)])
def test_strict_resume_words(word: str, want) -> None:
    # Before: provenance read the variable itself, and any value but "" and "0" turned strict ON.
    env = RunEnv.from_environ({ENV_STRICT_RESUME: word})
    assert env.strict_resume is want
    assert provenance.strict_from_env(env) is bool(want)


_SHOW_STRICT = "import sys, trainer_shim; print(trainer_shim.init(run_dir=sys.argv[1]).strict_resume)"


@pytest.mark.parametrize("word, want", [("false", "False"), ("1", "True")])
def test_the_shim_honours_strict_resume_words(tmp_path, word: str, want: str) -> None:
    p = subprocess.run([sys.executable, "-c", _SHOW_STRICT, str(tmp_path / "run")], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=child_env(**{ENV_STRICT_RESUME: word}))
    assert p.returncode == 0 and p.stdout.split() == [want], p.stderr[-2000:]


def test_launcher_env_reads_torchrun_and_falls_back_to_one_process() -> None:
    got = env_module.LauncherEnv.from_environ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    assert (got.rank, got.world_size, got.local_world_size) == (1, 2, 2)
    assert env_module.LauncherEnv.from_environ({"WORLD_SIZE": "", "RANK": "x"}) == env_module.LauncherEnv()


def test_shm_dir_defaults_to_dev_shm_and_a_bad_one_is_a_one_line_refusal(tmp_path) -> None:
    from trainer_shim.rundir import check_shm_dir
    from trainer_shim.rundir.env import shm_dir

    assert str(shm_dir({})) == str(shm_dir({ENV_SHM_DIR: " "})) == "/dev/shm"
    assert str(shm_dir({ENV_SHM_DIR: "/mnt/slots "})) == "/mnt/slots"
    check_shm_dir({})                          # the default is not judged
    check_shm_dir({ENV_SHM_DIR: "/dev/shm"})   # a tmpfs
    for bad in ("relative/dir", str(tmp_path / "missing")):
        with pytest.raises(EnvError, match=f"^{ENV_SHM_DIR}=.* is not valid; use a writable directory on a tmpfs"):
            check_shm_dir({ENV_SHM_DIR: bad})
    with pytest.raises(EnvError, match=r"it is on \w+, so every memory snapshot would go to the disk"):
        check_shm_dir({ENV_SHM_DIR: str(REPO)})   # the checkout's own filesystem: a disk
