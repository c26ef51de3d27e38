"""A checkpoint still arriving (rundir.pending): the chooser waits for its download, and only for a
live downloader; a download that ends without a commit (failed, or its supervisor killed) leaves
the chooser to fall back, never to a partial dir. The downloader is a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.support import sup_env
from trainer_shim.rundir import (
    DOWNLOAD_RECORD, CheckpointKind, Manifest, checkpoint_name, choose, commit, download_pending, wait_for_download,
)

# Announces a download into argv[2] under root argv[1], writes part of it, then commits on "commit".
DOWNLOADER = """
import sys
from pathlib import Path
from trainer_shim.rundir import CheckpointKind, Manifest, announce_download, commit, settle_download
root, target = Path(sys.argv[1]), Path(sys.argv[1]) / sys.argv[2]
announce_download(target)
tmp = commit.fresh_tmp_dir(root, target.name)
(tmp / "model.bin").write_bytes(b"new" * 100)
print("announced", flush=True)
if sys.stdin.readline().strip() == "commit":
    m = Manifest.create(commit.hash_tree(tmp), step=20, epoch=0, batch_in_epoch=20, kind=CheckpointKind.STEP, loss=None)
    commit.commit_dir(tmp, target, m.to_bytes(), repoint=True)
    settle_download(root)
    print("done", flush=True)
"""


def _commit(root: Path, step: int) -> Path:
    tmp = commit.fresh_tmp_dir(root, checkpoint_name(step))
    (tmp / "model.bin").write_bytes(b"old" * 10)
    m = Manifest.create(commit.hash_tree(tmp), step=step, epoch=0, batch_in_epoch=step, kind=CheckpointKind.STEP,
                        loss=None)
    commit.commit_dir(tmp, root / checkpoint_name(step), m.to_bytes(), repoint=True)
    return root / checkpoint_name(step)


def _downloader(root: Path, target: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", DOWNLOADER, str(root), target.name], env=sup_env(),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "announced"
    return p


def _choose_in_thread(root: Path, target: Path) -> tuple[threading.Thread, threading.Event, dict[str, Any]]:
    """A trainer's choice of `target`, in a thread: `entered` is set once it waits for the download."""
    entered, out = threading.Event(), {}

    def run() -> None:
        out["waited"] = wait_for_download(str(target), on_wait=lambda p: entered.set())
        out["info"] = choose([root], str(target), on_reject=lambda p, r: out.setdefault("rejected", []).append(p))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, entered, out


def test_the_chooser_waits_for_the_download_then_takes_it(tmp_path: Path) -> None:
    _commit(tmp_path, 10)
    target = tmp_path / checkpoint_name(20)
    p = _downloader(tmp_path, target)
    try:
        assert download_pending(target) and not download_pending(tmp_path / checkpoint_name(10))
        t, entered, out = _choose_in_thread(tmp_path, target)
        assert entered.wait(30), "the chooser did not wait for the pending download"
        assert t.is_alive()
        p.stdin.write("commit\n")
        p.stdin.flush()
        t.join(30)
        assert not t.is_alive() and out["waited"] and out["info"].path == target and "rejected" not in out
        assert p.stdout.readline().strip() == "done" and not (tmp_path / DOWNLOAD_RECORD).exists()
    finally:
        p.kill()
        p.wait()


def test_a_downloader_killed_mid_download_ends_the_wait_and_the_partial_dir_is_never_chosen(tmp_path: Path) -> None:
    old = _commit(tmp_path, 10)
    target = tmp_path / checkpoint_name(20)
    p = _downloader(tmp_path, target)
    t, entered, out = _choose_in_thread(tmp_path, target)
    assert entered.wait(30)
    p.kill()   # a supervisor killed -9: its record stays, naming a dead process
    p.wait()
    t.join(30)
    assert not t.is_alive() and out["waited"] and (tmp_path / DOWNLOAD_RECORD).exists()
    assert out["info"].path == old and out["rejected"] == [target]   # the older one, not the partial .tmp- dir
    assert not download_pending(target)


def test_a_record_of_a_reused_pid_or_another_checkpoint_is_not_waited_for(tmp_path: Path) -> None:
    target = tmp_path / checkpoint_name(20)
    record = tmp_path / DOWNLOAD_RECORD
    record.write_text(json.dumps({"checkpoint": target.name, "pid": os.getpid(), "start": 1}))  # not our start
    assert not download_pending(target) and not wait_for_download(str(target))
    record.write_text(json.dumps({"checkpoint": checkpoint_name(30), "pid": os.getpid(), "start": None}))
    assert not download_pending(target) and download_pending(tmp_path / checkpoint_name(30))
    assert choose([tmp_path], str(target)) is None   # no record for it, nothing valid: a fresh start
