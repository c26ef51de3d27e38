"""The real unit under a real systemd (PID 1 of a private namespace) driving the real supervisor.

systemd boots in fresh PID, mount and network namespaces with private tmpfs on /tmp and /run,
so it neither sees nor touches the host's services, and dies with a SIGKILL at teardown. Test
files live in a fresh dir under /var/lib (removed at teardown): the unit's PrivateTmp= hides
both /tmp and /var/tmp from the service.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest
import yaml

from tests.conftest import JOBS, REPO, child_env
from tests.support import wait_until
from trainer_shim.rundir import RunDir, read_events, read_heartbeat, read_json

torch = pytest.importorskip("torch")

# One worker for the module (--dist loadgroup): its tests share the booted namespace (`ns`, module
# scope), and two workers would boot two systemd side by side. The time limit includes that boot.
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("systemd")]

SYSTEMD = Path("/lib/systemd/systemd")
UNITS = REPO / "systemd"
ENTRY_POINT = REPO / ".venv" / "bin" / "resilient-run"
PYTHON = REPO / ".venv" / "bin" / "python"
TOY = JOBS / "toy_train.py"
TOY_ARGS = ["--epochs", "4", "--samples", "96", "--batch-size", "8", "--save-every", "5", "--hidden", "16"]

if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter") or not SYSTEMD.exists():
    pytest.skip("needs root, unshare, nsenter and /lib/systemd/systemd", allow_module_level=True)
if not ENTRY_POINT.exists():
    pytest.skip(f"{ENTRY_POINT} is not installed (make install)", allow_module_level=True)

# Everything systemd writes at boot must stay inside the namespace:
# - /tmp private: systemd-tmpfiles would empty it; /run private: the host's /run/systemd stays
#   untouched and our unit files vanish with the namespace;
# - /var/tmp (PrivateTmp= dirs), /var/log (journal, wtmp) and /var/lib/systemd (timer stamps)
#   on tmpfs, and tmpfiles masked (it would create /etc/mtab, /root/.ssh, ... on the host).
MASKED = ("systemd-tmpfiles-setup.service", "systemd-tmpfiles-setup-dev.service",
          "systemd-tmpfiles-setup-dev-early.service", "systemd-tmpfiles-clean.timer",
          "systemd-journal-flush.service", "systemd-update-utmp.service", "systemd-update-utmp-runlevel.service")
COVERED = ("/tmp", "/run", "/var/tmp", "/var/log", "/var/lib/systemd")


# A checkout under /tmp or /var/tmp (CI's clone may be there) would vanish behind the unit's
# PrivateTmp=; only then does the test turn it off. Production venvs live in /opt.
PRIVATE_TMP_OFF = "PrivateTmp=no\n" if any(str(REPO).startswith(d + "/") for d in ("/tmp", "/var/tmp")) else ""


def boot_script(hold: Path) -> str:
    """The namespace's init script: private mounts, then systemd as PID 1.

    The checkout (and its .venv) may itself live under a covered dir, e.g. CI's clone in /tmp:
    it is bind-mounted to `hold` first and back to its own path over the fresh tmpfs.
    """
    repo = str(REPO)
    covered = any(repo == d or repo.startswith(d + "/") for d in COVERED)
    return " && ".join([
        *([f"mount --bind {repo} {hold}"] if covered else []),
        *(f"mount -t tmpfs tmpfs {d}" for d in COVERED),
        *([f"mkdir -p {repo}", f"mount --bind {hold} {repo}"] if covered else []),
        "mkdir -p /run/systemd/system",
        *(f"ln -s /dev/null /run/systemd/system/{u}" for u in MASKED),
        f"exec {SYSTEMD} --system --unit=multi-user.target",
    ])


class Namespace:
    """A booted systemd in its own namespaces, and commands run inside them."""

    def __init__(self, unshare: subprocess.Popen, pid: int) -> None:
        self.unshare = unshare
        self.pid = pid  # host pid of the namespace's PID 1 (systemd)

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        r = subprocess.run(["nsenter", "-t", str(self.pid), "-m", "-p", *argv],
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{argv} exited {r.returncode}: {r.stdout}{r.stderr}")
        return r

    def systemctl(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return self.run("systemctl", "--no-pager", *args, check=check, timeout=timeout)

    def show(self, unit: str) -> dict[str, str]:
        out = self.systemctl("show", unit, "-p", "ActiveState,SubState,Result,MainPID,NRestarts,StatusText,"
                             "ExecMainStatus").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def host_path(self, path: str) -> Path:
        """`path` as seen inside the namespace, reachable from the host."""
        return Path(f"/proc/{self.pid}/root") / path.lstrip("/")

    def start(self, unit: str) -> None:
        r = self.systemctl("start", unit, check=False, timeout=60)
        assert r.returncode == 0, r.stderr + self.systemctl("status", unit, check=False).stdout + self.journal(unit)

    def journal(self, unit: str) -> str:
        return self.run("journalctl", "-u", unit, "--no-pager", "-o", "cat", check=False).stdout


def _child_of(pid: int) -> Optional[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _booted_pid(unshare_pid: int) -> Optional[int]:
    """unshare's child once `sh` has exec'd systemd in place, else None."""
    kid = _child_of(unshare_pid)
    try:
        return kid if kid and os.readlink(f"/proc/{kid}/exe") == str(SYSTEMD.resolve()) else None
    except OSError:
        return None


@pytest.fixture(scope="module")
def ns() -> Iterator[Namespace]:
    # A file, not a pipe: nobody reads systemd's console output while it runs, and a full pipe
    # would block PID 1.
    console = tempfile.TemporaryFile()
    hold = Path("/var/lib") / f"resilient-run-test-hold-{uuid.uuid4().hex[:8]}"
    hold.mkdir(mode=0o700)
    p = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount", "--propagation", "private", "--mount-proc", "--net",
         "sh", "-c", boot_script(hold)],
        env={**os.environ, "container": "x"}, stdin=subprocess.DEVNULL,
        stdout=console, stderr=subprocess.STDOUT, start_new_session=True,
    )
    pid: Optional[int] = None
    try:
        with contextlib.suppress(AssertionError):  # neither booted nor gone: skipped below
            wait_until(lambda: _booted_pid(p.pid) is not None or p.poll() is not None, 20)
        pid = _booted_pid(p.pid)
        if pid is None:
            console.seek(0)
            pytest.skip(f"cannot boot systemd in a namespace: {console.read().decode(errors='replace')[-500:]}")
        n = Namespace(p, pid)

        def up() -> bool:
            r = n.systemctl("is-system-running", check=False, timeout=10)
            return r.stdout.strip() in ("running", "degraded")

        # 60 s was not always enough on a busy box (tests in parallel); the boot is not what is tested.
        assert wait_until(up, 150, 0.2), n.systemctl("list-jobs", check=False).stdout
        yield n
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)  # PID 1 of the namespace: every process in it dies too
        p.kill()
        p.wait(10)
        console.close()
        hold.rmdir()  # only ever a mount point inside the namespace, so it is empty here


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    d = Path("/var/lib") / f"resilient-run-test-{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(work: Path) -> dict:
    """Final weights of the same job run straight through, without supervisor or faults."""
    out = work / "reference.pt"
    subprocess.run([str(PYTHON), str(TOY), *TOY_ARGS, "--run-dir", str(work / "ref"), "--out", str(out)],
                   env=child_env(), check=True, capture_output=True, timeout=120)
    return torch.load(out)


def install(ns: Namespace, work: Path, instance: str, step_sleep: float) -> RunDir:
    """Put the production unit in the namespace, plus a drop-in pointing it at a test job."""
    unit_dir = ns.host_path("/run/systemd/system")
    for unit in ("resilient-run@.service", "resilient-run.target"):
        shutil.copy(UNITS / unit, unit_dir / unit)
    job = work / instance
    job.mkdir()
    cfg = job / "job.yaml"
    out = job / "weights.pt"
    cfg.write_text(yaml.safe_dump({
        "script": str(TOY), "args": [*TOY_ARGS, "--step-sleep", str(step_sleep), "--out", str(out)],
        "run_dir": str(job / "run"), "backoff": 0, "grace_period": 20,
    }))
    dropin = unit_dir / f"resilient-run@{instance}.service.d"
    dropin.mkdir(exist_ok=True)
    # Only what the test machine needs differs from production: paths, root, short timers.
    (dropin / "test.conf").write_text(f"""\
[Unit]
AssertPathExists=
[Service]
ExecStart=
ExecStart={ENTRY_POINT} run --config {cfg}
User=root
Group=root
StateDirectory=
WorkingDirectory={job}
ReadWritePaths={work}
WatchdogSec=3s
RestartSec=1
LimitCORE=0
Environment=OMP_NUM_THREADS=1
{PRIVATE_TMP_OFF}""")
    ns.systemctl("daemon-reload")
    return RunDir(job / "run")


def trainer_pid(rd: RunDir) -> Optional[int]:
    try:
        return read_json(rd.supervisor_state).get("child_pid")
    except Exception:  # noqa: BLE001 - absent or being replaced: poll again
        return None


def step(rd: RunDir) -> int:
    return (read_heartbeat(rd.heartbeat(0)) or {}).get("step") or 0


def ended(rd: RunDir) -> list[str]:
    return [e.get("kind") for e in read_events(rd) if e.get("event") == "attempt_ended"]


def test_notify_status_kill9_and_stop_without_losing_a_step(ns: Namespace, work: Path):
    unit = "resilient-run@stop.service"
    rd = install(ns, work, "stop", step_sleep=0.1)

    t0 = time.monotonic()
    ns.start(unit)
    # Type=notify: start returns only after READY=1, which follows the first spawn.
    first = ns.show(unit)
    assert first["ActiveState"] == "active" and first["SubState"] == "running", first
    assert any(e.get("event") == "attempt_started" for e in read_events(rd))
    main_pid = first["MainPID"]
    assert time.monotonic() - t0 < 60

    assert wait_until(lambda: step(rd) >= 3, 60), ns.journal(unit)
    assert wait_until(lambda: "step" in ns.show(unit)["StatusText"], 10), ns.show(unit)
    status = ns.systemctl("status", unit, check=False).stdout
    assert 'Status: "attempt 1, step ' in status and ', running"' in status, status
    # The trainer cannot impersonate the supervisor towards systemd.
    pid = trainer_pid(rd)
    environ = ns.run("cat", f"/proc/{pid}/environ").stdout
    assert "NOTIFY_SOCKET=" not in environ and "WATCHDOG_USEC=" not in environ

    # kill -9 of the trainer: the supervisor restarts it, systemd sees nothing happen.
    ns.run("kill", "-9", str(pid))
    assert wait_until(lambda: trainer_pid(rd) not in (None, pid) and ended(rd) == ["signal"], 30), ns.journal(unit)
    assert wait_until(lambda: 'attempt 2, step' in ns.show(unit)["StatusText"], 60), ns.show(unit)
    after = ns.show(unit)
    assert after["NRestarts"] == "0" and after["MainPID"] == main_pid and after["ActiveState"] == "active"

    # systemctl stop: SIGTERM to the supervisor only (KillMode=mixed), trainer saves, exit 75.
    ns.systemctl("stop", unit, timeout=90)
    final = ns.show(unit)
    assert final["ActiveState"] == "inactive" and final["Result"] == "success", final
    assert ns.systemctl("is-failed", unit, check=False).stdout.strip() == "inactive"
    assert ended(rd) == ["signal", "preempted"]
    hb = read_heartbeat(rd.heartbeat(0))
    newest = max(int(d.name.split("-")[1]) for d in rd.checkpoints.glob("step-*"))
    assert newest == hb["step"], (newest, hb)  # zero lost steps


def test_frozen_supervisor_is_caught_by_the_watchdog_and_the_job_finishes(ns: Namespace, work: Path, reference: dict):
    unit = "resilient-run@freeze.service"
    rd = install(ns, work, "freeze", step_sleep=0.05)
    ns.start(unit)
    assert wait_until(lambda: step(rd) >= 8, 60), ns.journal(unit)
    frozen = ns.show(unit)["MainPID"]
    ns.run("kill", "-STOP", frozen)

    def restarted() -> bool:
        s = ns.show(unit)
        return int(s["NRestarts"]) >= 1 and s["MainPID"] not in ("0", frozen)

    assert wait_until(restarted, 30, 0.2), ns.journal(unit)
    assert "Watchdog timeout" in ns.journal(unit)
    # The restarted supervisor runs the job to its end; Type=notify units end inactive on exit 0.
    assert wait_until(lambda: ns.show(unit)["ActiveState"] in ("inactive", "failed"), 90, 0.2), ns.journal(unit)
    final = ns.show(unit)
    assert final["ActiveState"] == "inactive" and final["Result"] == "success", (final, ns.journal(unit)[-3000:])
    assert ended(rd)[-1] == "success"
    # The second supervisor resumed from a checkpoint rather than starting over.
    starts = [e for e in read_events(rd) if e.get("event") == "attempt_started"]
    assert starts[0].get("resume_from") is None and starts[-1].get("resume_from")
    weights = torch.load(work / "freeze" / "weights.pt")
    assert weights.keys() == reference.keys()
    for k in weights:
        assert torch.equal(weights[k], reference[k]), k
