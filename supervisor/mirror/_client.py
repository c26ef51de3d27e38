"""The one place that speaks S3 (boto3, from the `s3` extra, imported only when --mirror is used).

boto3 was chosen by bench/bench_mirror.py (docs/explanation/benchmarks.md, "S3 mirror"): it reads the
standard AWS environment and config files (profiles, AWS_ENDPOINT_URL for MinIO, Ceph RGW, R2,
GCS's S3 API), sends `If-None-Match: *`, and s3transfer does multipart uploads of large members.
Every failure leaves here as MirrorError with one line; no botocore type escapes this module.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Optional

from trainer_shim.rundir import new_hasher

from ..errors import ConfigError, SupervisorError
from .url import MirrorUrl

__all__ = ["MirrorUrl", "MirrorError", "S3", "PART_SIZE"]

PART_SIZE = 16 << 20       # multipart above this; 10,000 parts cap a member at 160 GiB


class MirrorError(SupervisorError):
    """Object storage refused or failed an operation (one line: what, where, why)."""


def _client_error(e: Exception) -> tuple[str, int]:
    resp = getattr(e, "response", None) or {}
    code = str(resp.get("Error", {}).get("Code", "")) or type(e).__name__
    return code, int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class _HashingReader(io.RawIOBase):
    """A file read once, front to back, hashing what it hands out (s3transfer reads a non-seekable
    stream sequentially), so an upload proves the bytes it sent are the manifest's."""

    def __init__(self, f: BinaryIO) -> None:
        self._f, self.hasher, self.n = f, new_hasher(), 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        self.hasher.update(data)
        self.n += len(data)
        return data


class _HashingWriter(io.RawIOBase):
    """The download's target: writes in arrival order, hashing them (not seekable, so s3transfer
    delivers the parts of a multipart download in order)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f, self.hasher = f, new_hasher()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.hasher.update(data)
        return self._f.write(data)


class S3:
    """A bucket and prefix, with the few operations the mirror needs."""

    def __init__(self, url: MirrorUrl, timeout: float = 20.0) -> None:
        try:
            import boto3
            from boto3.s3.transfer import TransferConfig
            from botocore.config import Config as BotoConfig
        except ImportError:
            raise ConfigError("--mirror needs the s3 extra: pip install 'resilient-run[s3]'") from None
        self.url = url
        cfg = BotoConfig(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 2, "mode": "standard"})
        self._c = boto3.session.Session().client("s3", config=cfg)
        self._transfer = TransferConfig(multipart_threshold=PART_SIZE, multipart_chunksize=PART_SIZE,
                                        max_concurrency=4, use_threads=True)
        self._conditional = True   # `If-None-Match: *` until the server says it does not support it

    def _call(self, what: str, fn: Callable[..., Any], **kw: Any) -> Any:
        try:
            return fn(**kw)
        except Exception as e:  # botocore's ClientError, connection and credential errors
            raise MirrorError(f"{what}: {_one_line(e)}") from None

    def check(self) -> None:
        """A cheap start-up check that the bucket exists and these credentials may use it."""
        try:
            self._c.head_bucket(Bucket=self.url.bucket)
        except Exception as e:
            code, status = _client_error(e)
            why = {404: "no such bucket", 403: "access denied (check the AWS credentials)",
                   400: "bad request (check the region and credentials)"}.get(status, _one_line(e))
            raise MirrorError(f"mirror s3://{self.url.bucket}: {why}; fix the bucket or the AWS_* "
                              "credentials/endpoint") from None

    # --- writing -------------------------------------------------------------------------------

    def put_file(self, rel: tuple[str, ...], path: Path, want: str) -> int:
        """Upload one member (multipart when large); MirrorError unless what was sent hashes to `want`."""
        key = self.url.key(*rel)
        with open(path, "rb") as f:
            reader = _HashingReader(f)
            self._call(f"upload {self.url.url(*rel)}", self._c.upload_fileobj, Fileobj=reader,
                       Bucket=self.url.bucket, Key=key, Config=self._transfer)
        if reader.hasher.hexdigest() != want:
            raise MirrorError(f"{path} changed while it was uploaded (digest differs from its manifest)")
        return reader.n

    def put_commit(self, rel: tuple[str, ...], data: bytes) -> bool:
        """Write the commit object only if absent (`If-None-Match: *`); False when it already exists."""
        key = self.url.key(*rel)
        if self._conditional:
            try:
                self._c.put_object(Bucket=self.url.bucket, Key=key, Body=data, IfNoneMatch="*")
                return True
            except Exception as e:
                code, status = _client_error(e)
                if status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                    return False
                if status != 501 and code not in ("NotImplemented", "InvalidArgument"):
                    raise MirrorError(f"commit {self.url.url(*rel)}: {_one_line(e)}") from None
                self._conditional = False   # an older server: a head check before the put instead
        if self.size(rel) is not None:
            return False
        self._call(f"commit {self.url.url(*rel)}", self._c.put_object, Bucket=self.url.bucket, Key=key, Body=data)
        return True

    def abort_unfinished_uploads(self) -> int:
        """Abort the multipart uploads a killed uploader left under the prefix (their parts are
        invisible to listings but stored, and billed, until aborted); the number aborted."""
        resp = self._call(f"list uploads {self.url.url()}", self._c.list_multipart_uploads, Bucket=self.url.bucket,
                          Prefix=self.url.prefix)
        uploads = resp.get("Uploads", [])
        for up in uploads:
            self._call(f"abort upload {up['Key']}", self._c.abort_multipart_upload, Bucket=self.url.bucket,
                       Key=up["Key"], UploadId=up["UploadId"])
        return len(uploads)

    def delete(self, rels: list[tuple[str, ...]]) -> None:
        for rel in rels:
            self._call(f"delete {self.url.url(*rel)}", self._c.delete_object, Bucket=self.url.bucket,
                       Key=self.url.key(*rel))

    # --- reading -------------------------------------------------------------------------------

    def size(self, rel: tuple[str, ...]) -> Optional[int]:
        try:
            return int(self._c.head_object(Bucket=self.url.bucket, Key=self.url.key(*rel))["ContentLength"])
        except Exception as e:
            if _client_error(e)[1] == 404:
                return None
            raise MirrorError(f"head {self.url.url(*rel)}: {_one_line(e)}") from None

    def get_bytes(self, rel: tuple[str, ...]) -> bytes:
        resp = self._call(f"get {self.url.url(*rel)}", self._c.get_object, Bucket=self.url.bucket,
                          Key=self.url.key(*rel))
        return self._call(f"get {self.url.url(*rel)}", resp["Body"].read)

    def download(self, rel: tuple[str, ...], dst: Path) -> str:
        """Download one object to a new file, fsynced; returns the xxh3-128 of what was written, hashed
        on the way in (s3transfer hands a non-seekable target its parts in order): no second read."""
        with open(dst, "xb") as f:
            writer = _HashingWriter(f)
            self._call(f"download {self.url.url(*rel)}", self._c.download_fileobj, Bucket=self.url.bucket,
                       Key=self.url.key(*rel), Fileobj=writer, Config=self._transfer)
            f.flush()
            os.fsync(f.fileno())
        return writer.hasher.hexdigest()

    def listing(self) -> dict[str, dict[str, int]]:
        """{checkpoint name: {member path: size}} of everything under the prefix."""
        out: dict[str, dict[str, int]] = {}
        for obj in self._objects():
            rest = obj["Key"][len(self.url.prefix):]
            name, _, member = rest.partition("/")
            if member:
                out.setdefault(name, {})[member] = int(obj["Size"])
        return out

    def _objects(self) -> Iterator[dict]:
        pages = self._c.get_paginator("list_objects_v2").paginate(Bucket=self.url.bucket, Prefix=self.url.prefix)
        try:
            for page in pages:
                yield from page.get("Contents", ())
        except Exception as e:
            raise MirrorError(f"list {self.url.url()}: {_one_line(e)}") from None
