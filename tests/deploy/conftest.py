"""Real Slurm and real Prometheus daemons, started once per session on first use.

`make system-deps` (a prerequisite of `make test`) installs the Debian packages; where they are
truly absent (no apt, not root) the tests that need them skip with that reason. Each daemon is
stopped by pid at the end of the session whatever happens, and the end asserts nothing is left.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .daemons import APT_HINT, PROMETHEUS_TOOLS, SLURM_TOOLS, Prometheus, Slurm, missing


@pytest.fixture(scope="session")
def slurm(request) -> Iterator[Slurm]:
    absent = missing(SLURM_TOOLS)
    if absent:
        pytest.skip(f"Slurm/munge not installed ({', '.join(absent)} missing): {APT_HINT}")
    cluster = Slurm()
    request.addfinalizer(lambda: _stopped(cluster))
    yield cluster.start()


@pytest.fixture
def slurm_jobs(slurm: Slurm) -> Iterator[Slurm]:
    """The cluster, with every job of the test cancelled (and its processes gone) afterwards."""
    before = len(slurm.submitted)
    yield slurm
    slurm.cancel(slurm.submitted[before:])


@pytest.fixture(scope="session")
def prometheus(request) -> Iterator[Prometheus]:
    absent = missing(PROMETHEUS_TOOLS)
    if absent:
        pytest.skip(f"Prometheus not installed ({', '.join(absent)} missing): {APT_HINT}")
    server = Prometheus()
    request.addfinalizer(lambda: _stopped(server))
    yield server.start()


def _stopped(service) -> None:
    service.stop()
    left = service.daemons.alive()
    if isinstance(service, Slurm):
        left += [f"job process {p.pid}" for p in service.job_processes()]
    assert not left, f"still running after the session: {left}"
