"""Bad input: exit 2, one clear line on stderr, no traceback, and no checkpoint touched.

Refused before any process starts, so the CLI runs in this process (typer's CliRunner); the
tmpfs case keeps a real process (a mount and a real EROFS)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.conftest import mounted_tmpfs

from tests.support import invoke_cli

from .helpers import FAKE_JOB, run_cli


def _digest_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def guarded_run(tmp_path):
    """A run dir holding a 'good checkpoint' that no bad invocation may touch."""
    rd = tmp_path / "guarded"
    ck = rd / "checkpoints" / "step-00000010"
    ck.mkdir(parents=True)
    (ck / "model.pt").write_bytes(os.urandom(1000))
    (ck / "MANIFEST.json").write_text("{}")
    (rd / "events.jsonl").write_text("")
    return rd


def _yaml(tmp_path: Path, text: str) -> str:
    p = tmp_path / "job.yaml"
    p.write_text(text)
    return str(p)


CASES = {
    "unknown flag": lambda t, g: ["--max-restart", "3", FAKE_JOB],
    "bad number": lambda t, g: ["--max-restarts", "lots", FAKE_JOB],
    "negative timeout": lambda t, g: ["--heartbeat-timeout", "-5", FAKE_JOB],
    "zero startup timeout": lambda t, g: ["--startup-timeout", "0", FAKE_JOB],
    "bad size": lambda t, g: ["--memory-limit", "eight gigs", FAKE_JOB],
    "bad exit code list": lambda t, g: ["--no-restart-exit-codes", "2,x", FAKE_JOB],
    "missing script": lambda t, g: [str(t / "nope.py")],
    "command not executable": lambda t, g: ["--", str(t / "not-a-program")],
    "no job": lambda t, g: ["--run-dir", str(g)],
    "config missing": lambda t, g: ["--config", str(t / "missing.yaml"), FAKE_JOB],
    "yaml syntax error": lambda t, g: ["--config", _yaml(t, "max_restarts: [1,\n"), FAKE_JOB],
    "yaml unknown key": lambda t, g: ["--config", _yaml(t, "max_restart: 3\n"), FAKE_JOB],
    "yaml wrong type": lambda t, g: ["--config", _yaml(t, "heartbeat_timeout: soon\n"), FAKE_JOB],
    "yaml not a mapping": lambda t, g: ["--config", _yaml(t, "- a\n- b\n"), FAKE_JOB],
    "yaml unknown callback option": lambda t, g: ["--config", _yaml(t, "callback: {save_every: 5}\n"), FAKE_JOB],
    "yaml bad callback value": lambda t, g: ["--config", _yaml(t, "callback: {save_every_steps: 0}\n"), FAKE_JOB],
    "run dir is a file": lambda t, g: ["--run-dir", str(g / "events.jsonl"), FAKE_JOB],
    "run dir parent missing": lambda t, g: ["--run-dir", str(t / "no" / "such" / "run"), FAKE_JOB],
    "status on non-run-dir": lambda t, g: ["status", str(t)],
    "status on missing path": lambda t, g: ["status", str(t / "missing")],
    "checkpoints on non-run-dir": lambda t, g: ["checkpoints", str(t)],
    "stop on non-run-dir": lambda t, g: ["stop", str(t)],
    "status missing argument": lambda t, g: ["status"],
    "watch interval zero": lambda t, g: ["status", str(g), "--watch", "--interval", "0"],
    "stop negative timeout": lambda t, g: ["stop", str(g), "--timeout", "-3"],
    "report png is a dir": lambda t, g: ["report", str(g), "--png", str(t)],
    "report png unwritable": lambda t, g: ["report", str(g), "--png", "/proc/rrtest-timeline.png"],
    "export a broken checkpoint": lambda t, g: ["export", str(g / "checkpoints" / "step-00000010"), str(t / "out.pt")],
}

HINTS = {
    "unknown flag": "--max-restart", "bad number": "--max-restarts", "negative timeout": "heartbeat_timeout",
    "bad size": "memory_limit", "missing script": "not found", "command not executable": "not executable",
    "yaml syntax error": "line 2", "yaml unknown key": "did you mean 'max_restarts'", "yaml wrong type": "heartbeat_timeout",
    "run dir is a file": "is a file", "run dir parent missing": "does not exist", "status on non-run-dir": "not a run dir",
    "watch interval zero": "--interval", "stop negative timeout": "--timeout", "report png is a dir": "is a directory",
    "report png unwritable": "cannot write",
    "yaml unknown callback option": "unknown callback option 'save_every'",
    "yaml bad callback value": "save_every_steps: expected a positive int",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2(case, tmp_path, guarded_run):
    before = _digest_tree(guarded_run)
    r = invoke_cli(*CASES[case](tmp_path, guarded_run), cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, (case, r.returncode, r.stderr)
    assert len(lines) == 1, (case, r.stderr)
    assert lines[0].startswith("resilient-run: error: "), lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    if case in HINTS:
        assert HINTS[case] in lines[0], lines[0]
    assert _digest_tree(guarded_run) == before
    assert not (tmp_path / "runs").exists() or case in ("no job",)


def test_unwritable_run_dir(tmp_path):
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        r = run_cli("--run-dir", str(ro / "run"), FAKE_JOB, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "not writable" in r.stderr, r.stderr
