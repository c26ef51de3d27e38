"""--mirror against a real S3 protocol server (moto, server mode): checkpoints outlive the node.

A node dies (its run dir gone) -> a new one resumes from the remote, bit-exact; a corrupt remote
object -> that checkpoint is skipped and the older one used; a supervisor killed -9 mid-upload ->
the partial checkpoint is never chosen; the server down -> training goes on, one mirror_failed,
retried; a bad bucket or bad credentials -> one line, exit 2, before anything starts.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.faults.common import reference
from tests.support import FAST, TOY, events, invoke_cli, run_cli, start_cli, sup_env, wait_until, weights, assert_equal_state
from trainer_shim.rundir import (
    MANIFEST_NAME, CheckpointKind, Event, FileEntry, Manifest, RunDir, checkpoint_name, commit, digest_file,
)

from .conftest import S3Server

# Steps 5, 10 and 15 are committed (and mirrored); the attempt dies at 17 and the supervisor gives up.
CRASH_AT_17 = {"TOY_FAULTS": "1:raise@17"}


@pytest.fixture(scope="module")
def first_node(tmp_path_factory, s3_server) -> tuple[str, list[str]]:
    """A node that trains to step 17, mirrors its checkpoints and dies with its disk: (bucket, keys).

    Run once per module; each test copies its objects to a bucket of its own. --step-sleep gives the
    one-second poll time to see each checkpoint (it changes no weight)."""
    tmp, bucket = tmp_path_factory.mktemp("first-node"), s3_server.new_bucket()
    rd = tmp / "run"
    r = run_cli("--run-dir", str(rd), "--mirror", f"s3://{bucket}/toy", "--max-restarts", "0", *FAST, TOY,
                "--step-sleep", "0.25", "--out", str(tmp / "unused.pt"), env=sup_env(**s3_server.env(), **CRASH_AT_17),
                timeout=180)
    assert r.returncode == 1, r.stderr[-3000:]
    mirrored = [Path(e["path"]).name for e in events(rd, Event.CHECKPOINT_MIRRORED)]
    assert [checkpoint_name(10), checkpoint_name(15)] == mirrored[-2:], r.stderr[-3000:]
    shutil.rmtree(rd)   # the node and its disk are gone
    return bucket, [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]


def _copy_remote(server: S3Server, first: tuple[str, list[str]], bucket: str) -> str:
    c = server.client()
    for key in first[1]:
        c.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": first[0], "Key": key})
    return f"s3://{bucket}/toy"


def _new_node(tmp_path: Path, server: S3Server, mirror: str) -> tuple[Path, Path]:
    rd, out = tmp_path / "node-2", tmp_path / "weights.pt"
    r = run_cli("--run-dir", str(rd), "--mirror", mirror, *FAST, TOY, "--out", str(out),
                env=sup_env(**server.env()), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return rd, out


def test_new_node_resumes_from_the_remote_bit_exact(tmp_path, s3_server, bucket, first_node):
    mirror = _copy_remote(s3_server, first_node, bucket)
    rd, out = _new_node(tmp_path, s3_server, mirror)
    restored = events(rd, Event.CHECKPOINT_RESTORED_FROM_MIRROR)
    assert [e["step"] for e in restored] == [15]
    starts = events(rd, Event.ATTEMPT_STARTED)
    assert starts[0]["resume_from"] == str(RunDir(rd).checkpoint(15))
    assert_equal_state(weights(out), reference(tmp_path), "new node's final weights vs the uninterrupted run")


def test_corrupt_remote_object_is_skipped_and_the_older_one_used(tmp_path, s3_server, bucket, first_node):
    mirror = _copy_remote(s3_server, first_node, bucket)
    c = s3_server.client()
    newest = f"toy/{checkpoint_name(15)}/"
    member = next(o["Key"] for o in c.list_objects_v2(Bucket=bucket, Prefix=newest)["Contents"]
                  if not o["Key"].endswith(MANIFEST_NAME) and o["Size"] > 0)
    body = bytearray(c.get_object(Bucket=bucket, Key=member)["Body"].read())
    body[len(body) // 2] ^= 0xFF   # bit rot: same size, other bytes
    c.put_object(Bucket=bucket, Key=member, Body=bytes(body))
    rd, out = _new_node(tmp_path, s3_server, mirror)
    assert [e["step"] for e in events(rd, Event.CHECKPOINT_RESTORED_FROM_MIRROR)] == [10]
    assert any(newest.rstrip("/") in e["path"] and "digest mismatch" in e["reason"]
               for e in events(rd, Event.CHECKPOINT_REJECTED))
    assert events(rd, Event.ATTEMPT_STARTED)[0]["resume_from"] == str(RunDir(rd).checkpoint(10))
    assert_equal_state(weights(out), reference(tmp_path), "final weights after resuming the older checkpoint")
