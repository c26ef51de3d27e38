"""Real Slurm (munged + slurmctld + slurmd) and real Prometheus (+ node_exporter) for the tests.

Facts from /work/shared/recipes/real-slurm-and-prometheus.md: one node (this host), jobs as root,
free ports on 127.0.0.1, all state under one temp dir, no systemd. Every daemon is started in its
own session and stopped by its pid; nothing is found or killed by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Optional

import psutil

from tests.conftest import free_port

SLURM_TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "sinfo", "srun")
PROMETHEUS_TOOLS = ("prometheus", "prometheus-node-exporter", "promtool")
APT_HINT = "install them with `make system-deps` (apt-get)"


def missing(tools: tuple[str, ...]) -> list[str]:
    return [t for t in tools if shutil.which(t, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") is None]


def which(tool: str) -> str:
    found = shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    assert found, tool
    return found


def poll(pred: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class Daemons:
    """Processes started here, stopped here by pid (TERM, then KILL), newest first."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def spawn(self, name: str, argv: list[str], env: Optional[dict] = None) -> subprocess.Popen:
        log = open(self.root / f"{name}.out", "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env)
        log.close()
        self.procs.append((name, p))
        return p

    def log(self, name: str) -> str:
        path = self.root / f"{name}.out"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self, name: str, timeout: float = 10.0) -> None:
        for n, p in self.procs:
            if n == name and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)

    def stop_all(self) -> None:
        for name, _ in reversed(self.procs):
            self.stop(name)

    def alive(self) -> list[str]:
        return [f"{n} (pid {p.pid})" for n, p in self.procs if p.poll() is None]


def _environ(p: psutil.Process) -> dict[str, str]:
    try:
        return p.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return {}


def processes_with_env(name: str, value: str) -> list[psutil.Process]:
    """Live processes whose environment has name=value (jobs inherit SLURM_CONF from sbatch)."""
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(name) == value:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


# Final job states: nothing changes after them (a requeue goes through PENDING instead).
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")

# KillWait=30 (Slurm's default; the recipe's 5 s): a requeued job's supervisor has that long
# for the preempt checkpoint before SIGKILL, which a loaded 2-core box can need.
SLURM_CONF = """\
ClusterName=rrtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.sock
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class Slurm:
    """A one-node Slurm cluster; `env` is what every client command (and so every job) needs."""

    def __init__(self) -> None:
        # Not under pytest's 0700 tmp: munged wants its socket's directory reachable by everyone.
        self.root = Path(tempfile.mkdtemp(prefix="rrtest-slurm-"))
        self.root.chmod(0o755)
        self.daemons = Daemons(self.root)
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.host = socket.gethostname().split(".")[0]
        self.submitted: list[str] = []

    def start(self) -> "Slurm":
        munge = self.root / "munge"
        munge.mkdir(mode=0o755)
        munge.chmod(0o755)
        key = munge / "munge.key"
        subprocess.run([which("mungekey"), "-c", "-k", str(key)], check=True, capture_output=True)
        key.chmod(0o600)
        self.daemons.spawn("munged", [which("munged"), "-F", "--force", f"--socket={munge}/munge.sock",
                                      f"--key-file={key}", f"--pid-file={munge}/munged.pid",
                                      f"--seed-file={munge}/munged.seed", f"--log-file={munge}/munged.log"])
        poll(lambda: (munge / "munge.sock").exists(), 15, "munged's socket\n" + self.daemons.log("munged"))
        for d in ("state", "spool"):
            (self.root / d).mkdir()
        memory = re.search(r"RealMemory=(\d+)", subprocess.run([which("slurmd"), "-C"], capture_output=True,
                                                               text=True).stdout)
        self.conf.write_text(SLURM_CONF.format(
            host=self.host, root=self.root, ctld_port=free_port(), d_port=free_port(),
            cpus=os.cpu_count(), memory=int(memory.group(1)) if memory else 1000))
        self.daemons.spawn("slurmctld", [which("slurmctld"), "-D", "-c", "-f", str(self.conf)], env=self.env)
        self.daemons.spawn("slurmd", [which("slurmd"), "-D", "-f", str(self.conf)], env=self.env)
        poll(lambda: self.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip() == "idle", 30,
             "the node to be idle\n" + self.logs())
        return self

    def logs(self) -> str:
        out = [self.daemons.log(n) for n in ("munged", "slurmctld", "slurmd")]
        for f in ("slurmctld.log", "slurmd.log"):
            p = self.root / f
            if p.exists():
                out.append(p.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def run(self, *argv: str, check: bool = True, env: Optional[dict] = None) -> subprocess.CompletedProcess:
        r = subprocess.run([which(argv[0]), *argv[1:]], env=env or self.env, capture_output=True, text=True,
                           timeout=60)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def sbatch(self, *args: str, env: Optional[dict] = None) -> str:
        """Submit; the job gets `env` (default: ours) plus SLURM_CONF. Returns the job id."""
        env = {**(env if env is not None else self.env), "SLURM_CONF": str(self.conf)}
        job = self.run("sbatch", "--parsable", *args, env=env).stdout.strip().split(";")[0]
        self.submitted.append(job)
        return job

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (no slurmdbd here, so no sacct)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait_job(self, job_id: str, pred: Callable[[dict], bool], timeout: float, what: str) -> dict:
        def check() -> Optional[dict]:
            j = self.job(job_id)
            if pred(j):
                return j
            if j["JobState"] in ENDED:  # it will not change any more
                raise AssertionError(f"job {job_id} ended {j['JobState']} {j['ExitCode']} before {what}")
            return None
        try:
            return poll(check, timeout, f"job {job_id}: {what}", interval=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}; last: {self.job(job_id)}") from None

    def job_processes(self, job: Optional[str] = None) -> list[psutil.Process]:
        """Processes of `job` (default: of every job): job steps and all they started, which
        inherit SLURM_CONF and SLURM_JOB_ID; never the daemons."""
        daemons = {p.pid for _, p in self.daemons.procs}
        found = [p for p in processes_with_env("SLURM_CONF", str(self.conf)) if p.pid not in daemons]
        if job is None:
            return found
        return [p for p in found if _environ(p).get("SLURM_JOB_ID") == job]

    def cancel(self, jobs: Optional[list[str]] = None, timeout: float = 30) -> None:
        """scancel `jobs` (default: all) and wait until none of their processes is left."""
        if jobs is not None and not jobs:
            return
        self.run("scancel", "--full", *(jobs or ["--user", "root"]), check=False)
        left = lambda: [p for j in (jobs or [None]) for p in self.job_processes(j)]  # noqa: E731
        try:
            poll(lambda: not left(), timeout, "job processes to exit")
        finally:
            for p in left():  # jobs that ignored the cancel: by pid, not by name
                p.kill()

    def stop(self) -> None:
        try:
            if self.daemons.alive():
                self.cancel()
                self.run("scontrol", "shutdown", check=False)
                for name in ("slurmd", "slurmctld"):
                    for n, p in self.daemons.procs:
                        if n == name:
                            try:
                                p.wait(15)
                            except subprocess.TimeoutExpired:
                                pass
        finally:
            self.daemons.stop_all()  # munged last (started first)
            shutil.rmtree(self.root, ignore_errors=True)


PROMETHEUS_CONF = """\
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: node
    static_configs:
      - targets: ["127.0.0.1:{exporter_port}"]
"""


class Prometheus:
    """node_exporter (textfile collector only) scraped every second by a Prometheus server."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rrtest-prometheus-"))
        self.daemons = Daemons(self.root)
        self.textfile_dir = self.root / "textfile"
        self.textfile_dir.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> "Prometheus":
        exporter_port = free_port()
        self.daemons.spawn("node_exporter", [
            which("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{exporter_port}",
            "--collector.disable-defaults", "--collector.textfile",
            f"--collector.textfile.directory={self.textfile_dir}"])
        conf = self.root / "prometheus.yml"
        conf.write_text(PROMETHEUS_CONF.format(exporter_port=exporter_port))
        self.daemons.spawn("prometheus", [
            which("prometheus"), f"--config.file={conf}", f"--storage.tsdb.path={self.root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"])
        poll(self._ready, 30, "Prometheus /-/ready\n" + self.daemons.log("prometheus"))
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        """The instant vector of `expr`: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        try:
            self.daemons.stop_all()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
