"""Every YAML file under deploy/ parses, and the keys the design depends on are right."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from supervisor.config import DEFAULTS, Config, build_config, load_config_file
from supervisor.errors import EXIT_STOPPED, EXIT_USAGE
from supervisor.insight.metrics import FAILURE_KINDS, MetricsSnapshot, render
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
# Job fields the example sets to a typical job instead of the default.
EXAMPLE_FIELDS = {"script", "args", "run_dir"}


def docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path: Path):
    assert docs(path)


def test_yaml_files_found():
    assert {p.name for p in YAML_FILES} >= {"example.yaml", "job.yaml", "alerts.yml"}


# --- example.yaml ------------------------------------------------------------------------------

def test_example_documents_every_field_with_its_default():
    path = DEPLOY / "example.yaml"
    keys = set(yaml.safe_load(path.read_text()))
    assert keys == {f.name for f in dataclasses.fields(Config)}
    cfg = build_config(load_config_file(path), {})  # loads, validates and is a runnable job
    for f in dataclasses.fields(Config):
        if f.name in EXAMPLE_FIELDS or f.name == "command":  # command is derived from script
            continue
        assert getattr(cfg, f.name) == getattr(DEFAULTS, f.name), f.name
    assert cfg.script and cfg.args and cfg.run_dir and Path(cfg.run_dir).is_absolute()


def test_example_comments_state_each_default():
    # Each key is preceded by a comment block that names its default.
    lines = (DEPLOY / "example.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^([a-z_]+):", line)
        if not m:
            continue
        block = []
        j = i - 1
        while j >= 0 and lines[j].startswith("#"):
            block.insert(0, lines[j])
            j -= 1
        assert "Default:" in " ".join(block), f"{m.group(1)} lacks a 'Default:' comment"


# --- kubernetes --------------------------------------------------------------------------------

def k8s() -> tuple[dict, dict]:
    by_kind = {d["kind"]: d for d in docs(DEPLOY / "kubernetes" / "job.yaml")}
    return by_kind["Job"], by_kind["PersistentVolumeClaim"]


def test_job_failure_policy_and_grace():
    job, _ = k8s()
    assert job["apiVersion"] == "batch/v1"
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and spec["backoffLimit"] >= 0
    rules = spec["podFailurePolicy"]["rules"]
    by_code = {code: r["action"] for r in rules if "onExitCodes" in r
               for code in r["onExitCodes"]["values"] if r["onExitCodes"]["operator"] == "In"}
    assert by_code == {EXIT_USAGE: "FailJob", EXIT_STOPPED: "Ignore"}
    names = {c["name"] for c in pod["containers"]}
    assert all(r["onExitCodes"]["containerName"] in names for r in rules if "onExitCodes" in r)
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
    assert pod["terminationGracePeriodSeconds"] > DEFAULTS.grace_period


def test_job_probe_and_run_dir_volume():
    job, pvc = k8s()
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "run-dir")
    vol = next(v for v in pod["volumes"] if v["name"] == "run-dir")
    assert vol["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    cmd = c["command"]
    assert cmd[:2] == ["resilient-run", "run"] and cmd[cmd.index("--run-dir") + 1] == mount["mountPath"] == "/run"
    probe = c["livenessProbe"]
    assert probe["exec"]["command"] == ["resilient-run", "status", mount["mountPath"]]
    # status exits 1 while a restarted trainer starts up; the probe must outlast that.
    window = probe["periodSeconds"] * probe["failureThreshold"]
    assert window > DEFAULTS.startup_timeout + DEFAULTS.backoff_max + DEFAULTS.grace_period
    assert pvc["apiVersion"] == "v1" and pvc["spec"]["resources"]["requests"]["storage"]


# --- prometheus --------------------------------------------------------------------------------

def emitted_metric_names() -> set[str]:
    """Sample names metrics.py really writes, from a rendered snapshot with every value set."""
    full = MetricsSnapshot(run="r", up=True, attempts_total=1, failures_by_kind=dict.fromkeys(FAILURE_KINDS, 1),
                           heartbeat_age_s=1.0, global_step=1, last_checkpoint_step=1,
                           last_checkpoint_age_s=1.0, disk_free_bytes=1)
    return {s.name for f in text_string_to_metric_families(render(full)) for s in f.samples}


# Series from node-exporter itself, used where our textfile cannot know the answer.
NODE_EXPORTER = {"node_filesystem_avail_bytes", "node_filesystem_size_bytes", "node_textfile_mtime_seconds"}


def test_alerts_reference_emitted_metrics():
    (rules_doc,) = docs(DEPLOY / "prometheus" / "alerts.yml")
    rules = [r for g in rules_doc["groups"] for r in g["rules"]]
    ours = emitted_metric_names()
    used = set()
    for r in rules:
        assert r["alert"] and r["expr"] and r.get("annotations", {}).get("summary"), r
        names = set(re.findall(r"\b((?:resilient_run|node)_[a-z_]+)\b", r["expr"]))
        assert names, f"{r['alert']} references no metric"
        unknown = names - ours - NODE_EXPORTER
        assert not unknown, f"{r['alert']} uses {unknown}, which metrics.py does not emit"
        used |= names
    alerts = {r["alert"]: r["expr"] for r in rules}
    assert "resilient_run_heartbeat_age_seconds" in alerts["ResilientRunHeartbeatStale"]
    assert "increase(resilient_run_failures_total" in alerts["ResilientRunCrashLoop"]
    assert "resilient_run_last_checkpoint_age_seconds" in alerts["ResilientRunNoRecentCheckpoint"]
    assert "node_filesystem_avail_bytes" in alerts["ResilientRunDiskAbove80Percent"]
    assert "resilient_run_up" in alerts["ResilientRunDown"]
    assert used & ours >= {"resilient_run_up", "resilient_run_failures_total", "resilient_run_disk_free_bytes"}
