"""--mirror against a real S3 protocol server (moto, server mode): checkpoints outlive the node.

A node dies (its run dir gone) -> a new one resumes from the remote, bit-exact; a corrupt remote
object -> that checkpoint is skipped and the older one used; a supervisor killed -9 mid-upload ->
the partial checkpoint is never chosen; a bad bucket or bad credentials -> one line, exit 2, before anything starts.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.faults.common import reference
from tests.support import FAST, TOY, events, invoke_cli, run_cli, start_cli, sup_env, wait_until, weights, assert_equal_state
from trainer_shim.rundir import (
    MANIFEST_NAME, CheckpointKind, Event, FileEntry, Manifest, RunDir, checkpoint_name, commit, digest_file,
    hf_checkpoint_name, record_extra_root,
)

from .conftest import S3Server

# Steps 5, 10 and 15 are committed (no epoch-end save at 12) and each is mirrored before training
# goes on; the attempt dies at 17 and the supervisor gives up. The local rotation (--keep-last 2)
# dropped 5 when 15 was committed, and so did the remote's after 15's upload: it keeps 10 and 15.
CRASH_AT_17 = {"TOY_FAULTS": "1:raise@17", "TOY_NO_EPOCH_SAVE": "1", "TOY_WAIT_MIRRORED": "1"}
QUICK_JOB = ("--no-prestart", "--", "python3", "-c", "pass")   # a job that succeeds at once: where does it resume?


@pytest.fixture(scope="module")
def first_node(tmp_path_factory, s3_server) -> tuple[str, list[str]]:
    """A node that trains to step 17, mirrors its checkpoints and dies with its disk: (bucket, keys).

    Run once per module; each test copies its objects to a bucket of its own. The job waits for each
    checkpoint to be mirrored (the mirror's one-second poll uploads only the newest it sees: paced by
    sleeps, a busy box skipped 10 or mirrored an epoch-end 12). Waiting, it does not beat: a longer
    heartbeat timeout than FAST's."""
    tmp, bucket = tmp_path_factory.mktemp("first-node"), s3_server.new_bucket()
    rd = tmp / "run"
    r = run_cli("--run-dir", str(rd), "--mirror", f"s3://{bucket}/toy", "--max-restarts", "0", "--no-prestart", *FAST,
                "--heartbeat-timeout", "120", TOY, "--keep-last", "2", "--out", str(tmp / "unused.pt"),
                env=sup_env(**s3_server.env(), **CRASH_AT_17), timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    mirrored = [Path(e["path"]).name for e in events(rd, Event.CHECKPOINT_MIRRORED)]
    assert mirrored == [checkpoint_name(5), checkpoint_name(10), checkpoint_name(15)], r.stderr[-3000:]
    remote = sorted({o["Key"].split("/")[1] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]})
    assert remote == [checkpoint_name(10), checkpoint_name(15)], remote
    shutil.rmtree(rd)   # the node and its disk are gone
    return bucket, [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]


def _copy_remote(server: S3Server, first: tuple[str, list[str]], bucket: str) -> str:
    c = server.client()
    for key in first[1]:
        c.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": first[0], "Key": key})
    return f"s3://{bucket}/toy"


def _new_node(tmp_path: Path, server: S3Server, mirror: str, *opts: str) -> tuple[Path, Path]:
    rd, out = tmp_path / "node-2", tmp_path / "weights.pt"
    r = run_cli("--run-dir", str(rd), "--mirror", mirror, *(opts or ("--no-prestart",)), *FAST, TOY, "--out", str(out),
                env=sup_env(**server.env()), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return rd, out


def test_new_node_resumes_from_the_remote_bit_exact(tmp_path, s3_server, bucket, first_node, monkeypatch):
    mirror = _copy_remote(s3_server, first_node, bucket)
    rd, out = _new_node(tmp_path, s3_server, mirror, "--prestart")
    restored = events(rd, Event.CHECKPOINT_RESTORED_FROM_MIRROR)
    assert [e["step"] for e in restored] == [15]
    starts = events(rd, Event.ATTEMPT_STARTED)
    assert starts[0]["resume_from"] == str(RunDir(rd).checkpoint(15))
    # The first attempt started (told to resume from the checkpoint still arriving) before the
    # download ended, so its imports and the script's start overlapped it; that process trained.
    names = [e["event"] for e in events(rd)]
    assert names.index(Event.ATTEMPT_STARTED) < names.index(Event.CHECKPOINT_RESTORED_FROM_MIRROR), names
    [first] = events(rd, Event.FIRST_STEP)
    assert first["pid"] == starts[0]["pid"], (first, starts[0])
    assert events(rd, Event.ATTEMPT_ENDED)[0]["resumed_from"] == str(RunDir(rd).checkpoint(15))
    began, downloaded = (datetime.datetime.fromisoformat(t) for t in (first["process_start_time"], restored[0]["time"]))
    assert starts[0]["warm"] and began < downloaded, (starts[0], first, restored)
    assert_equal_state(weights(out), reference(tmp_path), "new node's final weights vs the uninterrupted run")
    metrics = (rd / "metrics.prom").read_text()   # written last, after the final upload
    assert 'resilient_run_mirror_lag_seconds{run="node-2"} 0.0' in metrics
    assert 'resilient_run_mirror_failures_total{run="node-2"} 0' in metrics
    # `checkpoints` lists the remote ones beside the local ones; `status` names the newest mirrored one.
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    rows = json.loads(invoke_cli("checkpoints", str(rd), "--json").stdout)
    remote = [r for r in rows if r["remote"]]
    assert remote and all(r["path"].startswith(mirror + "/") and r["valid"] for r in remote)
    local = {r["step"] for r in rows if not r["remote"]}
    # The newest local checkpoint is on the remote, and the local rotation was mirrored there.
    assert remote[0]["step"] == max(local) and {r["step"] for r in remote} <= local
    status = json.loads(invoke_cli("status", str(rd), "--json").stdout)
    assert status["mirrored"]["url"].startswith(mirror + "/") and status["mirrored"]["step"] == remote[0]["step"]


def test_corrupt_remote_object_is_skipped_and_the_older_one_used(tmp_path, s3_server, bucket, first_node):
    mirror = _copy_remote(s3_server, first_node, bucket)
    c = s3_server.client()
    newest = f"toy/{checkpoint_name(15)}/"
    member = next(o["Key"] for o in c.list_objects_v2(Bucket=bucket, Prefix=newest)["Contents"]
                  if not o["Key"].endswith(MANIFEST_NAME) and o["Size"] > 0)
    body = bytearray(c.get_object(Bucket=bucket, Key=member)["Body"].read())
    body[len(body) // 2] ^= 0xFF   # bit rot: same size, other bytes
    c.put_object(Bucket=bucket, Key=member, Body=bytes(body))
    rd = tmp_path / "node-2"   # the choice is what matters here (bit-exact resume: the test above)
    r = run_cli("--run-dir", str(rd), "--mirror", mirror, *QUICK_JOB, env=sup_env(**s3_server.env()))
    assert r.returncode == 0, r.stderr[-3000:]
    assert [e["step"] for e in events(rd, Event.CHECKPOINT_RESTORED_FROM_MIRROR)] == [10]
    assert any(newest.rstrip("/") in e["path"] and "digest mismatch" in e["reason"]
               for e in events(rd, Event.CHECKPOINT_REJECTED))
    # It started while step 15 was arriving; the download failed and it was told nothing else.
    assert events(rd, Event.ATTEMPT_STARTED)[0]["resume_from"] == str(RunDir(rd).checkpoint(15))
    assert events(rd, Event.ATTEMPT_ENDED)[0]["resumed_from"] == str(RunDir(rd).checkpoint(10))
    # `export` of the mirror: downloaded, verified, the corrupt newest skipped.
    r = run_cli("export", mirror, str(tmp_path / "model.pt"), "--model-only", env=sup_env(**s3_server.env()))
    assert r.returncode == 0 and (tmp_path / "model.pt").stat().st_size > 0, r.stderr[-3000:]
    assert "digest mismatch" in r.stderr and '"step": 10' in r.stderr


def _corrupt(server: S3Server, bucket: str, step: int) -> None:
    """Bit rot in one member of remote checkpoint `step`: same size, other bytes."""
    c = server.client()
    member = next(o["Key"] for o in c.list_objects_v2(Bucket=bucket, Prefix=f"toy/{checkpoint_name(step)}/")["Contents"]
                  if not o["Key"].endswith(MANIFEST_NAME) and o["Size"] > 0)
    body = bytearray(c.get_object(Bucket=bucket, Key=member)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    c.put_object(Bucket=bucket, Key=member, Body=bytes(body))


@pytest.mark.parametrize("corrupt,resumes", [((15,), 10), ((10, 15), None)], ids=["older-one", "fresh-start"])
def test_a_trainer_waiting_for_a_download_that_fails_falls_back_bit_exact(tmp_path, s3_server, bucket, first_node,
                                                                         corrupt, resumes):
    """The first attempt starts while step 15 downloads; the download fails its digest check. The
    waiting trainer resumes from what the supervisor could restore (step 10), or starts fresh when
    nothing verifies, never from the partial download, and ends bit-exact with an uninterrupted run."""
    mirror = _copy_remote(s3_server, first_node, bucket)
    for step in corrupt:
        _corrupt(s3_server, bucket, step)
    rd, out = _new_node(tmp_path, s3_server, mirror, "--prestart")
    assert [e["step"] for e in events(rd, Event.CHECKPOINT_RESTORED_FROM_MIRROR)] == ([resumes] if resumes else [])
    [start] = events(rd, Event.ATTEMPT_STARTED)
    assert start["resume_from"] == str(RunDir(rd).checkpoint(15))
    [ended] = events(rd, Event.ATTEMPT_ENDED)
    assert ended["resumed_from"] == (str(RunDir(rd).checkpoint(resumes)) if resumes else None), ended
    [first] = events(rd, Event.FIRST_STEP)
    assert first["pid"] == start["pid"], (first, start)
    assert_equal_state(weights(out), reference(tmp_path), "final weights after the fallback vs the uninterrupted run")


def _commit(rd: RunDir, step: int, members: dict[str, bytes]) -> Path:
    """A checkpoint committed into the run dir the way a trainer commits one (manifest last, rename)."""
    tmp = commit.fresh_tmp_dir(rd.checkpoints, checkpoint_name(step))
    for rel, data in members.items():
        (tmp / rel).write_bytes(data)
    files = {rel: FileEntry(len(data), digest_file(tmp / rel)) for rel, data in members.items()}
    manifest = Manifest.create(files, step=step, epoch=0, batch_in_epoch=step, kind=CheckpointKind.STEP, loss=None)
    commit.commit_dir(tmp, rd.checkpoint(step), manifest.to_bytes(), repoint=True)
    return rd.checkpoint(step)


def test_supervisor_killed_mid_upload_leaves_nothing_that_is_chosen(tmp_path, s3_server, bucket):
    rd, mirror, c = RunDir(tmp_path / "node-1"), f"s3://{bucket}/run", s3_server.client()
    rd.checkpoints.mkdir(parents=True)
    _commit(rd, 1, {"a.bin": b"a" * 1024, "b.bin": b"b" * 1024})
    sleeper = ("--no-prestart", "--", "python3", "-c", "import time; time.sleep(120)")
    sup = start_cli("--run-dir", str(rd.root), "--mirror", mirror, *sleeper, env=sup_env(**s3_server.env()))
    try:
        wait_until(lambda: events(rd.root, Event.CHECKPOINT_MIRRORED), timeout=60, what="step 1 mirrored")
        # step 2: a small member, then one large enough that its multipart upload is under way when we kill.
        _commit(rd, 2, {"a.bin": b"A" * 1024, "b.bin": os.urandom(96 << 20)})
        keys = lambda: {o["Key"] for o in c.list_objects_v2(Bucket=bucket).get("Contents", [])}  # noqa: E731
        wait_until(lambda: f"run/{checkpoint_name(2)}/a.bin" in keys(), timeout=60, interval=0.02,
                   what="step 2's first member uploaded")
        os.killpg(sup.pid, signal.SIGKILL)
        sup.wait()
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, signal.SIGKILL)
    assert f"run/{checkpoint_name(2)}/{MANIFEST_NAME}" not in keys(), "the upload finished before the kill"
    rd2 = tmp_path / "node-2"
    r = run_cli("--run-dir", str(rd2), "--mirror", mirror, *QUICK_JOB, env=sup_env(**s3_server.env()))
    assert r.returncode == 0, r.stderr[-3000:]
    assert events(rd2, Event.ATTEMPT_STARTED)[0]["resume_from"] == str(RunDir(rd2).checkpoint(1))
    assert not c.list_multipart_uploads(Bucket=bucket).get("Uploads"), "the dead uploader's parts are still stored"
    assert any(checkpoint_name(2) in e["path"] and "no MANIFEST.json" in e["reason"]
               for e in events(rd2, Event.CHECKPOINT_REJECTED))


@pytest.mark.parametrize("problem", ["bucket", "credentials"])
def test_bad_bucket_or_credentials_is_one_line_and_exit_2(tmp_path, s3_server, bucket, monkeypatch, problem):
    server = s3_server
    if problem == "credentials":   # a server that checks signatures: no access key is known to it
        server = S3Server(INITIAL_NO_AUTH_ACTION_COUNT="0").start()
    try:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        target = "no-such-bucket-here" if problem == "bucket" else bucket
        r = invoke_cli("--run-dir", str(tmp_path / "run"), "--mirror", f"s3://{target}/x", "--", "python3", "-c", "pass")
    finally:
        if server is not s3_server:
            server.stop()
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert ("no such bucket" if problem == "bucket" else "access denied") in lines[0]
    assert not (tmp_path / "run").exists()   # refused before anything started


# The S3 server down mid-training (uploads retried, one mirror_failed): test_mirror_long.py.


def test_the_supervisor_without_a_mirror_never_imports_the_s3_client():
    import subprocess
    import sys

    code = ("import sys, supervisor, supervisor.agent, supervisor.cli, supervisor.insight.status; "
            "sys.exit(3 if {'boto3', 'botocore'} & set(sys.modules) else 0)")
    r = subprocess.run([sys.executable, "-c", code], env=sup_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_frameworks_checkpoint_dirs_are_mirrored_too(tmp_path, s3_server, bucket):
    """A HF Trainer's checkpoint-N/ in its output_dir (an extra root the integration records)."""
    rd, out_dir = RunDir(tmp_path / "run"), tmp_path / "trainer-output"
    rd.checkpoints.mkdir(parents=True)
    ckpt = out_dir / hf_checkpoint_name(7)
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"w" * 4096)
    files = {"model.safetensors": FileEntry(4096, digest_file(ckpt / "model.safetensors"))}
    commit.commit_in_place(ckpt, Manifest.create(files, step=7, epoch=0, batch_in_epoch=7, kind=CheckpointKind.STEP,
                                                 loss=None).to_bytes())
    record_extra_root(rd, out_dir)
    r = run_cli("--run-dir", str(rd.root), "--mirror", f"s3://{bucket}/hf", *QUICK_JOB, env=sup_env(**s3_server.env()))
    assert r.returncode == 0, r.stderr[-3000:]
    assert [e["url"] for e in events(rd.root, Event.CHECKPOINT_MIRRORED)] == [f"s3://{bucket}/hf/{ckpt.name}"]
    keys = {o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {f"hf/{ckpt.name}/model.safetensors", f"hf/{ckpt.name}/{MANIFEST_NAME}"}


def test_a_mirror_that_is_not_an_s3_url_is_one_line_and_exit_2(tmp_path):
    r = invoke_cli("--run-dir", str(tmp_path / "run"), "--mirror", "/mnt/backup", "--", "python3", "-c", "pass")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "use s3://BUCKET/PREFIX" in r.stderr, r.stderr
