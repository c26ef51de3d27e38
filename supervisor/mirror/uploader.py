"""The background upload: one checkpoint in flight, the newest waiting one next, retried with backoff.

Training never waits for it: the trainer has committed the checkpoint locally before the
supervisor sees it, and this thread only reads. An upload sends the members first (each hashed
as it is sent and compared with the manifest, so a member that rotted on disk is never
published), the manifest last with `If-None-Match: *` (the commit: a reader trusts only a name
whose manifest exists). After a success, remote checkpoints the local rotation removed are
deleted, manifest first, but never the one just mirrored.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional, Union

from trainer_shim.rundir import MANIFEST_NAME, InvalidCheckpoint, inspect_checkpoint, parse_checkpoint_name, safe_member

from ._client import S3, MirrorError

__all__ = ["Uploaded", "UploadFailed", "Uploader", "upload_checkpoint", "rotate_remote"]

RETRY_FIRST = 1.0
RETRY_MAX = 30.0


@dataclasses.dataclass(frozen=True)
class Uploaded:
    path: Path
    url: str
    bytes: int
    seconds: float
    already: bool = False   # its manifest was there already (mirrored by an earlier supervisor)


@dataclasses.dataclass(frozen=True)
class UploadFailed:
    path: Path
    error: str
    final: bool   # no retry follows (the local checkpoint is gone or invalid)


def upload_checkpoint(s3: S3, path: Path) -> Uploaded:
    """Mirror one committed local checkpoint dir; MirrorError/InvalidCheckpoint/OSError on failure."""
    t0 = time.monotonic()
    info = inspect_checkpoint(path)
    manifest_bytes = (path / MANIFEST_NAME).read_bytes()
    name = path.name
    if s3.size((name, MANIFEST_NAME)) is not None:
        # Committed remotely already: members under a manifest are immutable, never rewritten.
        return Uploaded(path, s3.url.url(name), 0, time.monotonic() - t0, already=True)
    sent = 0
    for rel, ent in info.manifest.files.items():
        sent += s3.put_file((name, *rel.split("/")), safe_member(path, rel), ent.xxh3_128)
    s3.put_commit((name, MANIFEST_NAME), manifest_bytes)
    return Uploaded(path, s3.url.url(name), sent, time.monotonic() - t0)


def rotate_remote(s3: S3, keep: str, local_names: set[str]) -> list[str]:
    """Delete remote checkpoints older than `keep` that are no longer kept locally (manifest first,
    so a half-deleted one never reads as committed); `keep` itself always stays. The deleted names."""
    keep_step = parse_checkpoint_name(keep)
    gone = []
    for name, members in s3.listing().items():
        step = parse_checkpoint_name(name)
        if step is None or name == keep or name in local_names or keep_step is None or step >= keep_step:
            continue
        order = sorted(members, key=lambda m: m != MANIFEST_NAME)
        s3.delete([(name, *m.split("/")) for m in order])
        gone.append(name)
    return gone


Result = Union[Uploaded, UploadFailed]


class Uploader:
    """A daemon thread; `submit` never blocks; results are drained by the supervisor's loop."""

    def __init__(self, s3: S3, local_names: Callable[[], set[str]]) -> None:
        self.s3 = s3
        self._local_names = local_names    # () -> names of the checkpoints kept locally now
        self._cond = threading.Condition()
        self._pending: Optional[Path] = None
        self._busy = False
        self._stop = False
        self.results: "queue.SimpleQueue[Result]" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True, name="resilient-run-mirror")

    def start(self) -> None:
        self._thread.start()

    def submit(self, path: Path) -> None:
        """Upload `path` next; a waiting older one is dropped (the newest wins)."""
        with self._cond:
            self._pending = path
            self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return self._pending is None and not self._busy

    def close(self, timeout: float) -> None:
        """Give the upload in flight (and the one waiting) up to `timeout` s, then stop the thread."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._pending is not None or self._busy) and time.monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            self._stop = True
            self._cond.notify_all()

    def _take(self) -> Optional[Path]:
        with self._cond:
            while self._pending is None and not self._stop:
                self._cond.wait()
            if self._stop:
                return None
            path, self._pending, self._busy = self._pending, None, True
            return path

    def _run(self) -> None:
        while (path := self._take()) is not None:
            try:
                self._upload_with_retries(path)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _upload_with_retries(self, path: Path) -> None:
        delay = RETRY_FIRST
        while True:
            try:
                done = upload_checkpoint(self.s3, path)
                self.results.put(done)
                rotate_remote(self.s3, path.name, self._local_names())
                return
            except (InvalidCheckpoint, FileNotFoundError) as e:   # rotated away or damaged locally: not retried
                self.results.put(UploadFailed(path, str(e), final=True))
                return
            except (MirrorError, OSError) as e:
                self.results.put(UploadFailed(path, str(e), final=False))
            with self._cond:   # back off; a newer checkpoint or a stop ends this one's retries
                self._cond.wait_for(lambda: self._pending is not None or self._stop, timeout=delay)
                if self._pending is not None or self._stop:
                    return
            delay = min(delay * 2, RETRY_MAX)
