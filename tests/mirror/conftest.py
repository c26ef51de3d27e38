"""A real S3 protocol server for the mirror tests: moto in server mode on 127.0.0.1, one per session.

Each test gets its own bucket; `S3Server.env()` is the standard AWS environment a supervisor
(or boto3 in the test) reads, so nothing in the code under test knows it talks to moto.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Optional

import pytest

from tests.conftest import free_port

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

_BUCKETS = itertools.count(1)


class S3Server:
    """One moto server process; `start()` again on the same port after `stop()` (a server outage)."""

    def __init__(self, port: Optional[int] = None, **server_env: str) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server_env = server_env
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "S3Server":
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     env={**os.environ, **self._server_env},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"moto server did not start on port {self.port}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def env(self, **extra: str) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", **extra}

    def client(self):
        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def new_bucket(self) -> str:
        name = f"mirror-test-{next(_BUCKETS)}-{os.getpid()}"
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    return s3_server.new_bucket()
