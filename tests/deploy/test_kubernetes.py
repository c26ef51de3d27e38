"""deploy/kubernetes/*.yaml against the official Kubernetes schemas (offline: kubernetes-validate
ships them; no cluster can run here), and the multi-node example's wiring."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from supervisor.config import build_config
from supervisor.errors import EXIT_STOPPED, EXIT_USAGE
from tests.conftest import REPO

K8S = REPO / "deploy" / "kubernetes"
MANIFESTS = sorted(K8S.glob("*.yaml"))
VERSION = kubernetes_validate.latest_version()


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def test_manifests_found():
    assert {p.name for p in MANIFESTS} >= {"job.yaml", "multinode.yaml"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_the_official_schema(path: Path):
    for doc in docs(path):
        # strict: an unknown or misspelt field is an error, not silently dropped by the API server.
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_the_validator_rejects_a_misspelt_field():
    job = next(d for d in docs(K8S / "job.yaml") if d["kind"] == "Job")
    bad = copy.deepcopy(job)
    bad["spec"]["template"]["spec"]["restartPolicey"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSION, strict=True)


def multinode() -> tuple[dict, dict, dict]:
    by_kind = {d["kind"]: d for d in docs(K8S / "multinode.yaml")}
    return by_kind["Service"], by_kind["Job"], by_kind["PersistentVolumeClaim"]


def option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_multinode_one_supervisor_per_pod_ranked_by_completion_index():
    svc, job, pvc = multinode()
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    cmd = c["command"]
    nnodes = int(option(cmd, "--nnodes"))
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == nnodes > 1
    # --node-rank is the pod's completion index, through the env var Kubernetes expands in command.
    assert option(cmd, "--node-rank") == "$(NODE_RANK)"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    # The rendezvous is on pod 0, by the stable name the headless Service gives it.
    host, port = option(cmd, "--rdzv-endpoint").rsplit(":", 1)
    assert host == f"{job['metadata']['name']}-0.{svc['metadata']['name']}" and pod["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert int(port) in [p["port"] for p in svc["spec"]["ports"]]
    # One shared run dir for every pod.
    mount = next(m for m in c["volumeMounts"] if m["name"] == "run-dir")
    vol = next(v for v in pod["volumes"] if v["name"] == "run-dir")
    assert option(cmd, "--run-dir") == mount["mountPath"]
    assert vol["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"] and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    # What each pod's supervisor gets after the expansion is a valid multi-node configuration.
    for rank in range(nnodes):
        cfg = build_config({}, {"script": cmd[cmd.index("/workspace/train.py")], "args": [], "run_dir": "/run",
                                "nproc_per_node": int(option(cmd, "--nproc-per-node")), "nnodes": nnodes,
                                "node_rank": rank, "rdzv_endpoint": option(cmd, "--rdzv-endpoint")})
        assert cfg.node_rank == rank and cfg.nnodes == nnodes


def test_multinode_failure_policy_matches_the_single_pod_job():
    _, job, _ = multinode()
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= 60
    rules = spec["podFailurePolicy"]["rules"]
    by_code = {code: r["action"] for r in rules if "onExitCodes" in r for code in r["onExitCodes"]["values"]}
    assert by_code == {EXIT_USAGE: "FailJob", EXIT_STOPPED: "Ignore"}
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
