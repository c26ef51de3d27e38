"""Real Slurm and real Prometheus daemons, started once per session on first use.

`make system-deps` (a prerequisite of `make test`) installs the Debian packages; where they are
truly absent (no apt, not root) the tests that need them skip with that reason. Each daemon is
stopped by pid at the end of the session whatever happens, and the end asserts nothing is left.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .daemons import APT_HINT, PROMETHEUS_TOOLS, SLURM_TOOLS, Prometheus, Slurm, missing


# Under pytest-xdist each worker is its own session: a session fixture would start one cluster per
# worker that touches it. Every test using a daemon joins that daemon's xdist group instead, so with
# `--dist loadgroup` (the Makefile's) one worker runs them all, one after the other, on one cluster.
_GROUPS = {"slurm": "slurm", "slurm_jobs": "slurm", "prometheus": "prometheus"}


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for group in sorted({g for f, g in _GROUPS.items() if f in getattr(item, "fixturenames", ())}):
            item.add_marker(pytest.mark.xdist_group(group))


def _started(request, service_type, tools: tuple[str, ...], what: str):
    absent = missing(tools)
    if absent:
        pytest.skip(f"{what} not installed ({', '.join(absent)} missing): {APT_HINT}")
    service = service_type()
    request.addfinalizer(lambda: _stopped(service))
    return service.start()


@pytest.fixture(scope="session")
def slurm(request) -> Slurm:
    return _started(request, Slurm, SLURM_TOOLS, "Slurm/munge")


@pytest.fixture
def slurm_jobs(slurm: Slurm) -> Iterator[Slurm]:
    """The cluster, with every job the test submitted cancelled (and its processes gone) afterwards."""
    before = len(slurm.submitted)
    yield slurm
    slurm.cancel(slurm.submitted[before:])


@pytest.fixture(scope="session")
def prometheus(request) -> Prometheus:
    return _started(request, Prometheus, PROMETHEUS_TOOLS, "Prometheus")


def _stopped(service) -> None:
    service.stop()
    left = service.daemons.alive()
    if isinstance(service, Slurm):
        left += [f"job process {p.pid}" for p in service.job_processes()]
    assert not left, f"still running after the session: {left}"
