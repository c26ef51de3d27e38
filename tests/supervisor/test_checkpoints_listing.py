"""`resilient-run checkpoints` on a narrow terminal: whole names, relative ages, columns dropped that do not fit."""

from __future__ import annotations

import json

import pytest

from supervisor.insight.render import fmt_ago
from tests.conftest import JOBS

from .helpers import run_cli, sup_env

TOY = str(JOBS / "toy_train.py")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A real finished run with a few committed checkpoints, the oldest one then damaged on disk."""
    rd = tmp_path_factory.mktemp("listing") / "run"
    r = run_cli("--run-dir", str(rd), TOY, "--epochs", "1", "--samples", "48", "--batch-size", "8", "--save-every", "2",
                timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(run_cli("checkpoints", str(rd), "--json").stdout)
    assert len(rows) >= 3, rows
    victim = max((p for p in (rd / "checkpoints" / rows[-1]["name"]).iterdir() if p.name != "MANIFEST.json"),
                 key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[:-10])  # a torn write: the listing says INVALID, with its reason
    return rd, [r["name"] for r in rows]


@pytest.mark.parametrize("columns", [80, 60])
def test_names_are_never_cut(finished_run, columns):
    rd, names = finished_run
    r = run_cli("checkpoints", str(rd), env=sup_env(COLUMNS=str(columns)))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(ln.rstrip()) <= columns for ln in lines), r.stdout
    assert "…" not in r.stdout, r.stdout
    listed = [ln.split()[0] for ln in lines[1:] if ln.strip() and ln.startswith(("step-", "final", "epoch"))]
    assert listed == names, r.stdout
    header = lines[0].split()
    assert header[0] == "name" and "status" in header, r.stdout
    assert "INVALID" in r.stdout, r.stdout
    if columns == 80:
        assert "created" in header and " ago" in r.stdout, r.stdout
    else:
        assert "batch" not in header and "loss" not in header, r.stdout  # dropped, not squeezed


def test_json_is_unchanged_by_the_terminal(finished_run):
    rd, _ = finished_run
    wide, narrow = (run_cli("checkpoints", str(rd), "--json", env=sup_env(COLUMNS=c)).stdout for c in ("200", "40"))
    assert wide == narrow
    assert set(json.loads(wide)[0]) >= {"name", "created_at", "size_bytes", "valid", "problem"}


def test_fmt_ago():
    assert fmt_ago("2026-01-01T00:00:00+00:00", now=1767225600.0 + 42) == "42s ago"
    assert fmt_ago("2026-01-01T00:00:00+00:00", now=1767225600.0 + 3 * 60 + 5) == "3m ago"
    assert fmt_ago("2026-01-01T00:00:00+00:00", now=1767225600.0 + 5 * 3600) == "5h ago"
    assert fmt_ago("2026-01-01T00:00:00+00:00", now=1767225600.0 + 2 * 86400) == "2d ago"
    assert fmt_ago(None) == "-" and fmt_ago("garbage") == "-"


def test_brackets_in_paths_are_shown_not_parsed_as_markup(finished_run, tmp_path):
    rd, _ = finished_run
    odd = tmp_path / "exp[bold]1"
    odd.symlink_to(rd)
    r = run_cli("status", str(odd), env=sup_env(COLUMNS="200"))
    assert "exp[bold]1" in r.stdout, r.stdout
