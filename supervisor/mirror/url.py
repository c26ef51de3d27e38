"""A mirror's address, `s3://BUCKET/PREFIX`, parsed (no S3 client here: the config imports it)."""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError

__all__ = ["MirrorUrl"]


@dataclasses.dataclass(frozen=True)
class MirrorUrl:
    bucket: str
    prefix: str   # '' or ending in '/'

    @classmethod
    def parse(cls, url: str) -> "MirrorUrl":
        if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
            raise ConfigError(f"mirror: {url!r} is not an object storage URL; use s3://BUCKET/PREFIX")
        bucket, _, prefix = url[5:].partition("/")
        prefix = prefix.strip("/")
        return cls(bucket, prefix + "/" if prefix else "")

    def key(self, *parts: str) -> str:
        return self.prefix + "/".join(parts)

    def url(self, *parts: str) -> str:
        return f"s3://{self.bucket}/{self.key(*parts)}"
