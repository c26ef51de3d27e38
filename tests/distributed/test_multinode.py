"""Two "nodes" on one machine: two supervisors, `--nnodes 2`, c10d rendezvous on localhost, one shared run dir.

A rank on node 1 is SIGKILLed from outside; both nodes must recover, resume from the same
checkpoint, and finish with every rank's weights bitwise equal to the uninterrupted 2-rank run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import psutil
import pytest

from tests.conftest import free_port
from tests.distributed.common import DDP_JOB, FAST
from tests.support import assert_same_weights, invoke_cli
from tests.supervisor.helpers import alive, ended_kinds, events, kill_group, run_cli, start_cli, sup_env, wait_until
from trainer_shim import rundir


def _listening(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections(kind="tcp"))


def _start_nodes(first: int, common: tuple[str, ...], job: tuple[str, ...], port: int, env: dict,
                 while_alone: Optional[Callable[[subprocess.Popen], None]] = None) -> list:
    """Both nodes' supervisors, node `first` started alone until its torchrun hosts the c10d store.

    On one machine either torchrun may host the store (both match 127.0.0.1); on a cluster it is
    the node named in --rdzv-endpoint. Fixing it makes the order of the teardown race known.
    `while_alone(node first's supervisor)` runs before the other node starts: node `first` waits in
    the rendezvous meanwhile, however long that takes (it cannot train, let alone finish, alone).
    """
    sups: dict[int, object] = {first: start_cli(*common, "--node-rank", str(first), *job, env=env)}
    try:
        wait_until(lambda: _listening(port), timeout=90, what=f"node {first}'s torchrun to host the store")
        if while_alone is not None:
            while_alone(sups[first])
    except BaseException:
        kill_group(sups[first])
        raise
    sups[1 - first] = start_cli(*common, "--node-rank", str(1 - first), *job, env=env)
    return [sups[0], sups[1]]


def _both_succeed(sups: list, rd: Path, timeout: float) -> dict[int, list[dict]]:
    """Each node's attempt_ended events, once both supervisors exited 0 (what is left is killed)."""
    try:
        for s in sups:
            s.wait(timeout)
    finally:
        for s in sups:
            if s.poll() is None:
                kill_group(s)
    errs = [s.stderr.read() for s in sups]
    assert [s.returncode for s in sups] == [0, 0], errs
    return {n: events(rd, "attempt_ended", node=n) for n in (0, 1)}


def _rank_of_node(rd: Path, node: int, min_step: int) -> dict | None:
    """The heartbeat of a rank that node `node` launched, once it has passed `min_step`."""
    for f in (rd / "heartbeats").glob("rank-*.json"):
        hb = rundir.read_heartbeat(f)
        if hb and hb.get("node") == node and hb.get("step", 0) >= min_step and hb.get("phase") == "training":
            return hb
    return None


def test_rank_killed_on_node_1_both_nodes_recover_from_the_same_checkpoint(reference: Path, tmp_path: Path):
    rd, out = tmp_path / "run", tmp_path / "out"
    port = free_port()
    common = ("--nproc-per-node", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-dir", str(rd),
              *FAST, "--heartbeat-timeout", "30")
    job = (DDP_JOB, "--out-dir", str(out), "--step-sleep", "0.2")
    def second_supervisor_is_refused(node_1: subprocess.Popen) -> None:
        # A second supervisor for node 1 is refused: each node has its own lock in the shared run dir.
        # Checked while node 1 waits for node 0 (a slow check must not outlast the whole job).
        dup = run_cli(*common, "--node-rank", "1", *job, timeout=60)
        assert dup.returncode == 3, dup.stderr
        assert f"run dir {rd} (node 1) is in use by supervisor pid {node_1.pid}" in dup.stderr

    # Node 1 hosts the store, so its restart finds no closed rendezvous of the old attempt's.
    sups = _start_nodes(1, common, job, port, sup_env(), while_alone=second_supervisor_is_refused)
    try:
        victim = wait_until(lambda: _rank_of_node(rd, 1, 6), timeout=90, what="node 1's rank past step 6")
        # The kill happens at whatever moment the poll sees it: before, during or after a save.
        os.kill(victim["pid"], signal.SIGKILL)
    except BaseException:
        for s in sups:
            kill_group(s)
        raise
    ended = _both_succeed(sups, rd, timeout=150)
    # Node 1 saw its rank SIGKILLed; node 0's rank lost its peer (a collective error or a hang).
    assert [e["kind"] for e in ended[1]] == ["signal", "success"], ended[1]
    assert "killed by SIGKILL" in ended[1][0]["evidence"] and f"(pid {victim['pid']})" in ended[1][0]["evidence"]
    kinds0 = [e["kind"] for e in ended[0]]
    # Node 0 may restart while node 1's old torchrun still holds the closed rendezvous: it rejoins.
    assert kinds0[0] in ("crash", "signal", "hang") and kinds0[-1] == "success", ended[0]
    assert set(kinds0[1:-1]) <= {"rendezvous"}, ended[0]
    # Both nodes' second attempts loaded the same checkpoint (rank 0 chose it and broadcast it).
    resumed = {n: ended[n][-1]["resumed_from"] for n in (0, 1)}
    assert resumed[0] == resumed[1] and resumed[0] is not None, resumed
    assert rundir.parse_checkpoint_name(Path(resumed[0]).name) <= ended[1][0]["step"]  # the victim's last step
    assert_same_weights(out, reference / "out")
    # Each node's supervisor kept its own files; nothing of one went into the other's.
    for n in (0, 1):
        own = rd / "nodes" / f"node-{n}"
        state = json.loads((own / "supervisor.json").read_text())
        assert state["state"] == "succeeded" and state["node"] == n and state["restarts"] == 1
        assert (own / "logs" / "attempt-0001.log").exists() and (own / "logs" / "attempt-0002.log").exists()
    assert not (rd / "supervisor.json").exists() and not (rd / "events.jsonl").exists()
    # No process of either node's tree survives.
    for n in (0, 1):
        for e in events(rd, "attempt_started", node=n):
            assert not alive(e["pid"])
    # status covers every node of the run dir.
    st = run_cli("status", str(rd), "--json")
    assert st.returncode == 0, st.stdout + st.stderr
    nodes = json.loads(st.stdout)["nodes"]
    assert sorted(nodes) == ["0", "1"] and {v["state"] for v in nodes.values()} == {"succeeded"}
    assert nodes["1"]["attempt"] == 2 and nodes["0"]["attempt"] == len(kinds0)


@pytest.mark.long   # ~33 s: make test-faults (a node's kill and both nodes' recovery run in make test)
def test_node_restarting_before_its_peer_rejoins_the_closed_rendezvous_without_spending_restarts(
        reference: Path, tmp_path: Path):
    """Node 0 hosts the store; its rank hangs while node 1's rank dies. Node 1's torchrun closed the
    rendezvous on its way out, and node 0's torchrun keeps it (closed) until node 0's supervisor sees
    the hang: node 1's restarts meanwhile fail to join. Those are `rendezvous` retries, free: with
    --max-restarts 1 and a crash-loop limit of 2, neither gives up nor condemns the checkpoint."""
    rd, out = tmp_path / "run", tmp_path / "out"
    port = free_port()
    cfg = tmp_path / "job.yaml"
    cfg.write_text("backoff_max: 4\ncrash_loop_attempts: 2\n")
    common = ("--nproc-per-node", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-dir", str(rd),
              "--config", str(cfg), *FAST, "--heartbeat-timeout", "10", "--grace-period", "3", "--max-restarts", "1")
    job = (DDP_JOB, "--out-dir", str(out), "--step-sleep", "0.2", "--heartbeat-interval", "0.05")
    sups = _start_nodes(0, common, job, port, sup_env(DDP_FAULTS="1:hang@10:0,1:kill@10:1"))
    ended = _both_succeed(sups, rd, timeout=180)
    assert [e["kind"] for e in ended[0]] == ["hang", "success"], ended[0]
    kinds1 = [e["kind"] for e in ended[1]]
    assert kinds1[0] == "signal" and kinds1[-1] == "success" and len(kinds1) >= 3, ended[1]
    assert set(kinds1[1:-1]) == {"rendezvous"}, ended[1]
    # The first retry meets node 0's closed rendezvous; a later one may land in the moment node 0's torchrun
    # (the store's host) is being replaced, and find no store at all: the same free retry.
    assert "RendezvousClosedError" in ended[1][1]["evidence"], ended[1]
    assert all(re.search(r"Rendezvous(Closed|Connection)Error", e["evidence"]) for e in ended[1][1:-1]), ended[1]
    states = {n: json.loads((rd / "nodes" / f"node-{n}" / "supervisor.json").read_text()) for n in (0, 1)}
    assert states[1]["restarts"] == 1 and states[0]["restarts"] == 1, states
    assert not events(rd, "checkpoint_rejected", node=1)
    resumed = {n: ended[n][-1]["resumed_from"] for n in (0, 1)}
    assert resumed[0] == resumed[1] and rundir.parse_checkpoint_name(Path(resumed[0]).name) == 8, resumed
    assert_same_weights(out, reference / "out")


TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def test_users_own_torchrun_command_is_supervised_like_ours(reference: Path, tmp_path: Path):
    """`-- torchrun ...` (the user's own launcher line): a killed rank is named, the job resumes bit-exact."""
    rd, out = tmp_path / "run", tmp_path / "out"
    p = run_cli("--run-dir", str(rd), *FAST, "--", TORCHRUN, "--standalone", "--nproc-per-node", "2", DDP_JOB,
                "--out-dir", str(out), env=sup_env(DDP_FAULTS="1:kill@6:1"), timeout=150)
    assert p.returncode == 0, p.stderr[-3000:]
    assert ended_kinds(rd) == ["signal", "success"]
    assert "rank 1 (pid " in events(rd, "attempt_ended")[0]["evidence"]
    assert_same_weights(out, reference / "out")


def test_users_torchrun_with_its_own_restarts_or_no_node_rank_is_refused(tmp_path: Path):
    rd = tmp_path / "run"
    # refused before any process starts: the CLI runs in this process
    p = invoke_cli("--run-dir", str(rd), "--", TORCHRUN, "--max-restarts", "3", "--nproc-per-node", "2", DDP_JOB)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "torchrun --max-restarts 3 would restart ranks behind the supervisor" in p.stderr
    assert not rd.exists()  # bad usage touches nothing
    p = invoke_cli("--run-dir", str(rd), "--", TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", DDP_JOB)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "give this node's --node-rank" in p.stderr, p.stderr
