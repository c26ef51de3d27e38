"""The unit files pass `systemd-analyze verify` cleanly and keep the settings the design relies on."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from supervisor.config import DEFAULTS
from supervisor.errors import EXIT_LOCKED, EXIT_STOPPED, EXIT_USAGE
from tests.conftest import REPO

UNITS = REPO / "systemd"
SERVICE = UNITS / "resilient-run@.service"
TARGET = UNITS / "resilient-run.target"
SYSTEM_UNITS = Path("/lib/systemd/system")
ENTRY_POINT = REPO / ".venv" / "bin" / "resilient-run"

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or not (SYSTEM_UNITS / "sysinit.target").exists(),
    reason="systemd-analyze or the distribution's unit files are not installed",
)


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> key -> values (systemd allows repeated keys)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert section is not None, f"{path}: {line!r} outside a section"
        section.setdefault(key.strip(), []).append(value.strip())
    return out


def seconds(value: str) -> float:
    """A systemd time span such as 120, 90s, 2min or 30min, in seconds."""
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(num) * {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}[unit]
    return total


def make_root(root: Path) -> Path:
    """A root where the units sit in /etc/systemd/system and ExecStart's binary exists.

    verify checks that ExecStart is executable; the real console script is copied to the
    production path inside the root rather than editing the unit under test.
    """
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    etc = root / "etc/systemd/system"
    etc.mkdir(parents=True)
    for unit in (SERVICE, TARGET):
        shutil.copy(unit, etc / unit.name)
    exe = root / "opt/resilient-run/.venv/bin/resilient-run"
    exe.parent.mkdir(parents=True)
    shutil.copy(ENTRY_POINT if ENTRY_POINT.exists() else shutil.which("true"), exe)
    exe.chmod(0o755)
    return etc


def verify(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", "resilient-run@demo.service", "resilient-run.target"],
        capture_output=True, text=True, timeout=60,
    )


@needs_analyze
def test_systemd_analyze_verify_is_clean(tmp_path: Path):
    make_root(tmp_path)
    r = verify(tmp_path)
    # verify exits 0 even with warnings, so silence is the assertion.
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == "", r.stdout + r.stderr


@needs_analyze
def test_verify_harness_does_see_mistakes(tmp_path: Path):
    # Guards the test above against a setup that silently checks nothing.
    etc = make_root(tmp_path)
    with open(etc / SERVICE.name, "a") as f:
        f.write("KilMode=mixed\n")
    r = verify(tmp_path)
    assert "Unknown key 'KilMode'" in r.stdout + r.stderr


def test_service_settings_the_design_relies_on():
    u = parse_unit(SERVICE)
    unit, svc, inst = u["Unit"], u["Service"], u["Install"]
    one = {k: v[-1] for k, v in svc.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert one["ExecStart"] == "/opt/resilient-run/.venv/bin/resilient-run run --config /etc/resilient-run/%i.yaml"
    assert one["KillMode"] == "mixed" and one["Restart"] == "on-failure"
    assert seconds(one["TimeoutStopSec"]) > DEFAULTS.grace_period
    assert seconds(one["WatchdogSec"]) > 0
    assert one["SuccessExitStatus"].split() == [str(EXIT_STOPPED)]
    assert set(one["RestartPreventExitStatus"].split()) == {str(EXIT_USAGE), str(EXIT_LOCKED)}
    assert one["OOMPolicy"] == "continue"
    assert "PrivateDevices" not in svc  # would hide /dev/nvidia*
    assert one["NoNewPrivileges"] == "yes" and one["PrivateTmp"] == "yes" and one["ProtectSystem"] == "full"
    assert one["WorkingDirectory"] == "/var/lib/resilient-run/%i" and one["StateDirectory"] == "resilient-run/%i"
    assert "StartLimitIntervalSec" in unit and "StartLimitBurst" in unit
    assert "StartLimitIntervalSec" not in svc  # its home since systemd 230; in [Service] it is ignored
    assert unit["PartOf"] == ["resilient-run.target"] and inst["WantedBy"] == ["resilient-run.target"]
    assert parse_unit(TARGET)["Install"]["WantedBy"] == ["multi-user.target"]
