"""The supervisor's metrics through a real node_exporter into a real Prometheus, and the alert
rules through promtool (checked and unit-tested on written series)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.faults.common import TOY
from tests.supervisor.helpers import run_cli, sup_env
from tests.support import ended_kinds

from .daemons import PROMETHEUS_TOOLS, Prometheus, missing, poll

RULES = REPO / "deploy" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess:
    if missing(PROMETHEUS_TOOLS):
        pytest.skip("promtool not installed: install it with `make system-deps` (apt-get)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_alert_rules():
    r = promtool("check", "rules", str(RULES / "alerts.yml"))
    assert r.returncode == 0 and "SUCCESS: 7 rules found" in r.stdout, r.stdout + r.stderr


def test_each_alert_fires_and_stays_quiet_in_the_promtool_unit_tests():
    tests = yaml.safe_load((RULES / "alerts_test.yml").read_text())
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    checks = [c for t in tests["tests"] for c in t["alert_rule_test"]]
    # Every alert has a case where it fires and one where it does not.
    assert {c["alertname"] for c in checks if c["exp_alerts"]} == alerts
    assert {c["alertname"] for c in checks if not c["exp_alerts"]} == alerts
    r = promtool("test", "rules", str(RULES / "alerts_test.yml"))
    assert r.returncode == 0, r.stdout + r.stderr


def value(prom: Prometheus, expr: str) -> float | None:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if len(result) == 1 else None


def test_a_kill_and_the_restart_reach_prometheus(prometheus: Prometheus, tmp_path: Path):
    run = "prom-kill"
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({"metrics": {"textfile_dir": str(prometheus.textfile_dir)}, "backoff": 0}))
    p = run_cli("--config", str(cfg), "--run-dir", str(tmp_path / run), TOY, "--epochs", "1",
                env=sup_env(TOY_FAULTS="1:kill@6"), timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert ended_kinds(tmp_path / run) == ["signal", "success"]
    assert (prometheus.textfile_dir / f"resilient_run_{run}.prom").exists()
    sel = f'run="{run}"'
    try:
        # The final sample of the exited supervisor: one kill, two attempts, no child running.
        poll(lambda: value(prometheus, f'resilient_run_failures_total{{{sel},kind="signal"}}') == 1
             and value(prometheus, f"resilient_run_attempts_total{{{sel}}}") == 2
             and value(prometheus, f"resilient_run_up{{{sel}}}") == 0, 30,
             "Prometheus to scrape the failure and the restart", interval=0.2)
    finally:
        (prometheus.textfile_dir / f"resilient_run_{run}.prom").unlink(missing_ok=True)
    # Only the kill counted: every other kind is exported at 0.
    others = prometheus.query(f'resilient_run_failures_total{{{sel},kind!="signal"}}')
    assert len(others) >= 7 and all(float(s["value"][1]) == 0 for s in others), others
