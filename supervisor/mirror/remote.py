"""The checkpoints on object storage: which ones are committed, and bringing one back verified.

Remote layout: PREFIX/<checkpoint dir name>/<member> for each member, and
PREFIX/<name>/MANIFEST.json, written last: a name without a manifest is an upload that never
finished (a killed supervisor, a lost node) and is never chosen. A manifest whose members are
missing or of another size is skipped too; a digest is checked as each member comes back, so a
corrupt object skips that checkpoint and an older one is tried.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable, Optional

from trainer_shim.rundir import CKPT_PREFIX, MANIFEST_NAME, Manifest, commit, parse_checkpoint_name, safe_member

from ._client import S3, MirrorError

__all__ = ["RemoteCheckpoint", "MirrorError", "list_remote", "download_checkpoint", "restore_newest", "fetch", "survey"]

OnSkip = Callable[[str, str], None]   # (url, reason)


@dataclasses.dataclass(frozen=True)
class RemoteCheckpoint:
    """A remote checkpoint whose manifest parsed and whose members are all there, at their sizes."""

    name: str
    manifest: Manifest
    manifest_bytes: bytes

    @property
    def step(self) -> int:
        return self.manifest.global_step


def _committed(s3: S3, name: str, members: dict[str, int]) -> RemoteCheckpoint:
    """The manifest of remote checkpoint `name`; MirrorError naming why it does not count."""
    if MANIFEST_NAME not in members:
        raise MirrorError("no MANIFEST.json (an upload that did not finish)")
    raw = s3.get_bytes((name, MANIFEST_NAME))
    try:
        manifest = Manifest.from_json(json.loads(raw))
    except (ValueError, UnicodeDecodeError) as e:
        raise MirrorError(f"MANIFEST.json is malformed: {e}") from None
    if manifest.global_step != parse_checkpoint_name(name):
        raise MirrorError(f"manifest says step {manifest.global_step}")
    for rel, ent in manifest.files.items():
        if members.get(rel) != ent.size:
            raise MirrorError(f"{rel} is " + ("missing" if rel not in members else
                                               f"{members[rel]} bytes, manifest says {ent.size}"))
    return RemoteCheckpoint(name, manifest, raw)


def list_remote(s3: S3, on_skip: Optional[OnSkip] = None) -> list[RemoteCheckpoint]:
    """The committed remote checkpoints, newest first (exact ones; an emergency save is not resumable)."""
    found = []
    for name, members in s3.listing().items():
        if parse_checkpoint_name(name) is None:
            continue
        try:
            rc = _committed(s3, name, members)
        except MirrorError as e:
            if on_skip:
                on_skip(s3.url.url(name), str(e))
            continue
        if rc.manifest.exact:
            found.append(rc)
    return sorted(found, key=lambda rc: (rc.step, rc.name.startswith(CKPT_PREFIX)), reverse=True)


def download_checkpoint(s3: S3, rc: RemoteCheckpoint, ckpt_root: Path) -> Path:
    """Download `rc` into a temp dir of `ckpt_root`, every member checked against its manifest digest,
    then commit it there (manifest last, rename) like any local checkpoint. MirrorError if one differs."""
    with commit.Draft.open(ckpt_root, rc.name) as draft:
        for rel, ent in rc.manifest.files.items():
            dst = safe_member(draft.path, rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if s3.download((rc.name, rel), dst) != ent.xxh3_128:
                raise MirrorError(f"{s3.url.url(rc.name, rel)}: digest mismatch (corrupt object)")
        return draft.commit(rc.manifest_bytes, repoint=rc.name.startswith(CKPT_PREFIX))


def restore_newest(s3: S3, ckpt_root: Path, newer_than: Optional[int], on_skip: OnSkip,
                   before_download: Callable[[Path], None] = lambda target: None,
                   ) -> Optional[tuple[RemoteCheckpoint, Path, float]]:
    """The newest remote checkpoint newer than step `newer_than` that downloads verified, committed into
    `ckpt_root`: (remote, local path, seconds); None when there is none. A failing one is skipped.
    `before_download` runs once, when a download is about to start, with the local dir the newest
    candidate will be committed to (an older one is committed instead if it fails)."""
    for rc in list_remote(s3, on_skip):
        if newer_than is not None and rc.step <= newer_than:
            return None
        before_download(Path(ckpt_root) / rc.name)
        before_download = _nothing
        t0 = time.monotonic()
        try:
            path = download_checkpoint(s3, rc, ckpt_root)
        except MirrorError as e:
            on_skip(s3.url.url(rc.name), str(e))
            continue
        return rc, path, time.monotonic() - t0
    return None


def _nothing(target: Path) -> None:
    pass


def fetch(url: str, into: Path, on_skip: Optional[OnSkip] = None) -> Path:
    """A remote checkpoint downloaded verified under `into`: `url` names one checkpoint
    (s3://BUCKET/PREFIX/step-N) or a mirror prefix (its newest committed checkpoint that verifies).
    MirrorError (one line) when there is none."""
    from .url import MirrorUrl

    parsed = MirrorUrl.parse(url)
    parent, _, last = parsed.prefix.rstrip("/").rpartition("/")
    one = last if parse_checkpoint_name(last) is not None else None
    s3 = S3(MirrorUrl(parsed.bucket, parent + "/" if parent else "") if one else parsed)
    s3.check()
    candidates = [rc for rc in list_remote(s3, on_skip) if one is None or rc.name == one]
    for rc in candidates:
        try:
            return download_checkpoint(s3, rc, into)
        except MirrorError as e:
            if on_skip:
                on_skip(s3.url.url(rc.name), str(e))
    raise MirrorError(f"{url} holds no committed checkpoint that verifies")


def survey(url: str) -> tuple[list[RemoteCheckpoint], list[tuple[str, str]]]:
    """For listings: the committed checkpoints under a mirror URL, newest first, and (url, reason) of
    the names that do not count. MirrorError (one line) when the store cannot be read."""
    from .url import MirrorUrl

    skipped: list[tuple[str, str]] = []
    found = list_remote(S3(MirrorUrl.parse(url)), lambda u, why: skipped.append((u, why)))
    return found, skipped
