"""What the supervisor's loop calls for `--mirror s3://BUCKET/PREFIX`; without it, every call is a no-op.

check()    at start: the bucket answers to these credentials (else one line, exit 2)
restore()  under the run dir's lock, before the first choice: a remote checkpoint newer than every
           valid local one is downloaded (verified) into checkpoints/, so a new node resumes from it;
           the first attempt starts as the download does, and waits for it (trainer_shim.rundir.pending)
poll()     from the loop's tick: the newest committed local checkpoint goes to the uploader, and
           the uploader's results become events (`checkpoint_mirrored`, one `mirror_failed` per outage)
close()    at exit: the upload in flight gets up to the grace period to finish
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

from trainer_shim.rundir import (
    CheckpointInfo, Event, RunDir, announce_download, checkpoint_roots, commit_age, iter_checkpoint_dirs, newest_valid,
    parse_checkpoint_name, settle_download,
)

from ..messages import say
from ._client import S3, MirrorError
from .url import MirrorUrl
from .remote import restore_newest
from .uploader import UploadFailed, Uploaded, Uploader

__all__ = ["Mirror"]

POLL_EVERY = 1.0   # seconds between looks for a newly committed checkpoint


class Mirror:
    def __init__(self, url: Optional[str], rd: RunDir, emit: Callable[..., Any], poisoned: set[str]) -> None:
        # One uploader per run dir: in a multi-node job node 0's supervisor mirrors the shared checkpoints.
        self.url = MirrorUrl.parse(url) if url and (rd.node or 0) == 0 else None
        self.rd, self._emit, self.poisoned = rd, emit, poisoned
        self._s3: Optional[S3] = None
        self._uploader: Optional[Uploader] = None
        self._last_poll = 0.0
        self._submitted: Optional[tuple[str, str]] = None   # (path, created_at) of the newest handed over
        self._mirrored: set[tuple[str, str]] = set()
        self._keys: dict[str, tuple[str, str]] = {}      # path -> key of what was handed over for it
        self._newest: Optional[CheckpointInfo] = None
        self._failing = False
        self._closed = False
        self.failures = 0

    def check(self) -> None:
        if self.url is not None:
            self._s3 = S3(self.url)
            self._s3.check()

    def restore(self, before_download: Callable[[Optional[Path]], None]) -> Optional[Path]:
        """A new node: download the remote's newest checkpoint if it is newer than ours; the local
        dir it went to, or None. The caller's `before_download(target)` runs first, once the local
        dir the download is to be committed to is announced (pending.py): the first attempt starts
        then, resuming from `target`, and its start overlaps the download (None: not announced)."""
        if self._s3 is None:
            return None
        settle_download(self.rd.checkpoints)   # under the lock: a record a killed supervisor left
        local = self._local_newest()
        try:
            # Under the run dir's lock, before our own uploads: one run per prefix, so what is
            # unfinished there was left by a dead uploader.
            if self._s3.abort_unfinished_uploads():
                say(f"mirror: aborted the unfinished uploads a previous supervisor left in {self._s3.url.url()}")
            got = restore_newest(self._s3, self.rd.checkpoints, local.step if local else None, self._skip,
                                 lambda target: before_download(self._announce(target)))
        except MirrorError as e:   # the store went away since check(): train from what is here
            say(f"mirror: cannot look for a newer remote checkpoint: {e}")
            got = None
        finally:   # committed or not, the download is over: a trainer waiting for it chooses now
            settle_download(self.rd.checkpoints)
        if got is not None:
            rc, path, seconds = got
            self._mirrored.add((str(path), rc.manifest.created_at))
            say(f"restored {path.name} from {self._s3.url.url(rc.name)} ({seconds:.1f}s, verified)")
            self._emit(Event.CHECKPOINT_RESTORED_FROM_MIRROR, url=self._s3.url.url(rc.name), path=str(path),
                       step=rc.step, seconds=round(seconds, 3))
        self._uploader = Uploader(self._s3, self._local_names)
        self._uploader.start()
        return got[1] if got is not None else None

    def _announce(self, target: Path) -> Optional[Path]:
        try:
            announce_download(target)
        except OSError as e:   # without the record a trainer could not tell "arriving" from "failed"
            say(f"mirror: cannot record the download of {target.name} ({e.strerror or e}); "
                "the first attempt starts after it")
            return None
        return target

    def poll(self, force: bool = False) -> None:
        if self._uploader is None or self._closed:
            return
        now = time.monotonic()
        if force or now - self._last_poll >= POLL_EVERY:
            self._last_poll = now
            self._newest = self._local_newest()
            key = self._key(self._newest)
            if key is not None and key != self._submitted and key not in self._mirrored:
                self._submitted = self._keys[key[0]] = key
                self._uploader.submit(self._newest.path)
        self._drain()

    def metrics(self) -> dict[str, Any]:
        if self._uploader is None:
            return {}
        key = self._key(self._newest)
        lag = 0.0 if key is None or key in self._mirrored else commit_age(self._newest.path)
        return {"mirror_lag_s": lag, "mirror_failures": self.failures}

    def close(self, timeout: float) -> None:
        if self._uploader is None or self._closed:
            return
        self.poll(force=True)
        self._uploader.close(timeout)
        self._drain()
        self._closed = True   # metrics() still reports, for the supervisor's last metrics file

    # --- internals ---------------------------------------------------------------------------

    @staticmethod
    def _key(info: Optional[CheckpointInfo]) -> Optional[tuple[str, str]]:
        return (str(info.path), info.manifest.created_at) if info is not None else None

    def _local_newest(self) -> Optional[CheckpointInfo]:
        return newest_valid(checkpoint_roots(self.rd), exclude=self.poisoned)

    def _local_names(self) -> set[str]:
        return {p.name for _, p, _ in iter_checkpoint_dirs(checkpoint_roots(self.rd))}

    def _skip(self, url: str, reason: str) -> None:
        say(f"remote checkpoint skipped: {url}: {reason}")
        self._emit(Event.CHECKPOINT_REJECTED, path=url, reason=reason)

    def _drain(self) -> None:
        assert self._uploader is not None
        while not self._uploader.results.empty():
            r = self._uploader.results.get()
            if isinstance(r, Uploaded):
                self._done(r)
            else:
                self._failed(r)

    def _done(self, r: Uploaded) -> None:
        self._mirrored.add(self._keys.get(str(r.path), (str(r.path), "")))
        if self._failing:
            say(f"mirror: uploads work again ({r.url})")
        self._failing = False
        if r.already:
            return
        age = commit_age(r.path)
        self._emit(Event.CHECKPOINT_MIRRORED, path=str(r.path), url=r.url, step=parse_checkpoint_name(r.path.name), bytes=r.bytes,
                   seconds=round(r.seconds, 3), lag_s=round(age, 3) if age is not None else None)

    def _failed(self, r: UploadFailed) -> None:
        if r.final:   # rotated away (or damaged) locally before it could be sent: nothing to retry
            say(f"mirror: {r.path.name} not uploaded: {r.error}")
            return
        self.failures += 1
        if not self._failing:   # one event per outage; the retries only count in the metrics
            self._failing = True
            say(f"mirror: upload of {r.path.name} failed: {r.error}; retrying")
            self._emit(Event.MIRROR_FAILED, path=str(r.path), error=r.error)
