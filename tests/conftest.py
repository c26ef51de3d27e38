"""Shared test helpers: every test runs the real thing (subprocesses, signals, files, torch)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from filelock import FileLock

REPO = Path(__file__).resolve().parent.parent
JOBS = REPO / "tests" / "jobs"
PYTHON = sys.executable

# This pytest process's own memory-snapshot slot directory (each xdist worker is one process). Every
# run that takes memory snapshots frees the *stale* slots it finds (owner dead, run dir gone), and
# `slots --json` / `--free-stale` list and free every group in the directory: in a shared /dev/shm
# they would see, and take back, the slots of a test running on another worker (or in another
# checkout's pytest on the same box). Set before trainer_shim is imported (it reads it once) and
# passed on to every job (child_env); the user's own RESILIENT_SHM_DIR, if any, is the parent.
SHM_ENV = "RESILIENT_SHM_DIR"
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
SHM_DIR = Path(os.environ.get(SHM_ENV) or "/dev/shm") / f"rrtest-{WORKER}-{os.getpid()}"
SHM_DIR.mkdir(mode=0o700, exist_ok=True)
os.environ[SHM_ENV] = str(SHM_DIR)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(SHM_DIR, ignore_errors=True)


def _port_block() -> range:
    """This process's ports: below the kernel's ephemeral range (where bind(0) and every connect()
    take theirs, e.g. the many of gloo's meshes), one block of 200 per xdist worker."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    n = int(WORKER[2:]) if WORKER.startswith("gw") and WORKER[2:].isdigit() else 0
    base = 20000 + 200 * n
    return range(base, min(base + 200, max(low, base + 1)))


_PORTS = iter(_port_block())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and that no other worker of this session hands out,
    nor the kernel to anyone (a port from bind(0) is released before its user binds it: meanwhile
    a test on another worker could be given the same one)."""
    import socket

    for port in _PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"xdist worker {WORKER}: its block of ports {_port_block()} is used up")


# Longest first: xdist hands tests out in collection order, so a long test collected last runs
# alone at the end while the other workers idle. The master records each test's time (all phases)
# in pytest's cache; a later parallel run collects the slowest first (new tests, unknown, first of
# all). No cache (a fresh clone), no change: the order is then the files'.
_DURATIONS = "rrtest/durations"
_TIMES: dict[str, float] = {}


def _plain_id(nodeid: str) -> str:
    return nodeid.split("@", 1)[0] if "@" in nodeid.rsplit("]", 1)[-1] else nodeid   # xdist's "@group"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "PYTEST_XDIST_WORKER" not in os.environ:   # only a worker's collection is what xdist hands out
        return
    _suffix_xdist_groups(config, items)
    cache = getattr(config, "cache", None)
    known = cache.get(_DURATIONS, {}) if cache is not None else {}
    if known:
        items.sort(key=lambda it: (_plain_id(it.nodeid) in known, -known.get(_plain_id(it.nodeid), 0.0)))


def _suffix_xdist_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """What pytest-xdist's --dist loadgroup does to a worker's items, done so that it works: the group
    goes into the node id as "@group", which the scheduler groups by. xdist 3.8 sets the old private
    `_nodeid`, which pytest 9 no longer reads (its node id is `_id`): every group was ignored."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if not groups or item.nodeid.endswith("@" + "_".join(groups)):
            continue
        grouped = f"{item.nodeid}@{'_'.join(groups)}"
        if hasattr(item, "_id"):
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(grouped)
        else:
            item._nodeid = grouped


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TIMES[_plain_id(report.nodeid)] = _TIMES.get(_plain_id(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    cache = getattr(session.config, "cache", None)
    if cache is not None and "PYTEST_XDIST_WORKER" not in os.environ and _TIMES:
        cache.set(_DURATIONS, {**cache.get(_DURATIONS, {}), **{k: round(v, 2) for k, v in _TIMES.items()}})


_SESSION_DIR: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _session_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The directory every process of this test session shares: an xdist worker's basetemp is
    <session dir>/popen-gwN, a run without xdist has the session dir itself."""
    base = tmp_path_factory.getbasetemp()
    _SESSION_DIR[:] = [base.parent if "PYTEST_XDIST_WORKER" in os.environ else base]


def built_once(what: str, key: tuple[str, ...], build: Callable[[Path], None]) -> Path:
    """A directory `build(dir)` fills once per test session, whichever worker asks first; the others
    wait for it (a file lock) and then read it. For the uninterrupted reference runs the bit-exact
    tests compare against: deterministic, so one run serves every worker. Read-only for its users."""
    assert _SESSION_DIR, "built_once needs the session (call it from a test or fixture)"
    name = f"{what}-{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"
    d = _SESSION_DIR[0] / "built-once" / name
    d.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(d) + ".lock"):
        done = d / ".built"
        if not done.exists():
            shutil.rmtree(d, ignore_errors=True)   # a build that failed half-way
            d.mkdir()
            build(d)
            done.touch()
    return d


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A fresh, not yet created run dir path."""
    return tmp_path / "run"


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a job subprocess: ours, minus anything a supervisor would have set (the
    slot directory is the user's setting: this process's own, see SHM_DIR)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESILIENT_") or k == SHM_ENV}
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Two cores: keep torch from oversubscribing when tests and helpers run side by side.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A real tmpfs at `path` (e.g. options "size=600k,mode=0700") for real ENOSPC/EROFS; skips if mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {r.stderr.strip() or r.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
