"""The wheel as a user installs it: `make test-wheel` (CI runs it after `make test`).

    python3 tests/wheel/smoke.py --wheel dist/resilient_run-X-py3-none-any.whl --constraints constraints-dev.txt

Standard library only. In a temporary directory outside the checkout (so the source tree is never
importable): a fresh venv gets torch pinned by the constraints file (the Makefile's way: the CPU
wheel on this machine's disk), then the built wheel, not editable, with the [hf] extra. Then, from
that directory, with no PYTHONPATH:
  1. the installed layout: both packages, py.typed and the auto-attach bootstrap dir
     (rundir.ATTACH_DIR) come from the venv's site-packages, and no install is editable;
  2. `resilient-run --version` prints the wheel's version (read from the installed metadata);
  3. tests/wheel/toy.py (a raw trainer_shim loop) supervised, SIGKILLed once at step 12 and resumed
     from its step-10 checkpoint: exit 0, attempts ended [signal, success], final weights bitwise
     equal to an uninterrupted run's;
  4. tests/wheel/hf_zero_code.py (an HF Trainer script with no resilient-run code) supervised:
     exit 0, the installed package's ResilientCallback was auto-attached and the shim committed
     checkpoint-5 and checkpoint-10 (a MANIFEST.json in each, a checkpoint_saved event for each).
Every wait is a poll with a deadline; the closing line is `smoke: N passed, N failed`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def log(msg: str) -> None:
    print(f"[wheel smoke {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def run(cmd: list[str], *, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def poll(pred: Callable[[], object], timeout: float, what: str, proc: Optional[subprocess.Popen] = None) -> object:
    """pred() until truthy (returned); AssertionError at the deadline or when `proc` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the supervisor exited {proc.returncode} while waiting for {what}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def events(run_dir: Path, name: str) -> list[dict]:
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, filter(None, lines)) if e.get("event") == name]


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of `proc` (started with start_new_session=True): what is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait(30)


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else f"({path} absent)"


class Smoke:
    def __init__(self, wheel: Path, constraints: Path, root: Path) -> None:
        self.wheel, self.constraints, self.root = wheel, constraints, root
        self.venv = root / "venv"
        self.bin = self.venv / "bin"
        self.py = str(self.bin / "python")
        self.work = root / "work"          # every job's cwd: outside the checkout
        # The user's environment less anything that could make the checkout or another venv importable.
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONSAFEPATH")
                    and not k.startswith(("RESILIENT_", "RRTEST_"))}
        self.env.update(PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONNOUSERSITE="1",
                        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                        HF_HOME=str(root / "hf-home"), TOKENIZERS_PARALLELISM="false",
                        OMP_NUM_THREADS="1")   # the jobs run side by side on a 2-core box

    def install(self) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(self.venv)], check=True)
        # --no-compile: no .pyc for all of torch and transformers up front (most of an install's time on
        # a busy 2-core box); the modules a job imports are compiled on first import, as usual.
        pip = [self.py, "-m", "pip", "install", "-q", "--no-compile", "-c", str(self.constraints)]
        run([*pip, "torch==2.13.0"], cwd=self.root, env=self.env, timeout=600)     # the Makefile's way
        run([*pip, f"{self.wheel}[hf]"], cwd=self.root, env=self.env, timeout=600)  # not editable
        self.work.mkdir()

    def check_layout(self) -> None:
        code = ("import json, sys, importlib.metadata as m, supervisor, trainer_shim\n"
                "from trainer_shim.rundir import ATTACH_DIR\n"
                "d = m.distribution('resilient-run')\n"
                "print(json.dumps({'site': [p for p in sys.path if p.endswith('site-packages')],"
                " 'supervisor': supervisor.__file__, 'trainer_shim': trainer_shim.__file__,"
                " 'attach': str(ATTACH_DIR), 'direct_url': d.read_text('direct_url.json'),"
                " 'files': sorted(str(f) for f in d.files)}))")
        got = json.loads(run([self.py, "-c", code], cwd=self.work, env=self.env).stdout)
        site = [Path(p).resolve() for p in got["site"] if Path(p).resolve().is_relative_to(self.venv.resolve())]
        assert len(site) == 1, got["site"]
        for name in ("supervisor", "trainer_shim"):
            assert Path(got[name]).resolve() == site[0] / name / "__init__.py", (name, got[name])
            assert (site[0] / name / "py.typed").is_file(), f"{name}/py.typed missing"
        attach = Path(got["attach"])
        assert attach == site[0] / "trainer_shim" / "_attach", attach
        assert (attach / "sitecustomize.py").is_file(), "the auto-attach bootstrap is missing from the wheel"
        assert "editable" not in (got["direct_url"] or ""), got["direct_url"]
        assert any(f.endswith("dist-info/licenses/LICENSE") for f in got["files"]), "no LICENSE in the wheel"

    def check_version(self) -> None:
        want = self.wheel.name.split("-")[1]
        r = run([str(self.bin / "resilient-run"), "--version"], cwd=self.work, env=self.env)
        assert r.stdout.strip() == f"resilient-run {want}", r.stdout

    def check_kill_and_resume(self) -> None:
        toy = self.work / "toy.py"
        shutil.copy(HERE / "toy.py", toy)
        ref_dir, sup_dir = self.work / "reference", self.work / "supervised"
        ref_dir.mkdir()
        sup_dir.mkdir()
        # the uninterrupted reference run, beside the supervised one (each is mostly interpreter start-up)
        ref = subprocess.Popen([self.py, str(toy), str(ref_dir / "final.pt")], cwd=ref_dir, env=self.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            self._supervised_toy(toy, sup_dir)
            ref_out = ref.communicate(timeout=300)[0]
        finally:
            kill(ref)
        assert ref.returncode == 0, f"the reference run exited {ref.returncode}\n{ref_out[-3000:]}"
        same = ("import sys, torch\n"
                "a, b = (torch.load(p, weights_only=True) for p in sys.argv[1:])\n"
                "assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a), 'weights differ'\n"
                "print(len(a))")
        n = run([self.py, "-c", same, str(ref_dir / "final.pt"), str(sup_dir / "final.pt")], cwd=self.work, env=self.env)
        assert int(n.stdout) == 4, n.stdout   # two Linear layers: weight + bias each

    def _supervised_toy(self, toy: Path, sup_dir: Path) -> None:
        run_dir, ready = sup_dir / "run", sup_dir / "ready"
        out, err = sup_dir / "supervisor.out", sup_dir / "supervisor.err"
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen([str(self.bin / "resilient-run"), "--run-dir", str(run_dir), "--backoff", "0",
                                     str(toy), str(sup_dir / "final.pt"), str(ready)],
                                    cwd=sup_dir, env=self.env, stdout=o, stderr=e, start_new_session=True)
        try:
            poll(ready.exists, 240, "the trainer at step 12", proc)
            pid = int(ready.read_text())
            state = json.loads((run_dir / "supervisor.json").read_text())
            assert state.get("child_pid") == pid, (state.get("child_pid"), pid)
            os.kill(pid, signal.SIGKILL)
            rc = proc.wait(180)
        finally:
            kill(proc)
        assert rc == 0, f"supervisor exited {rc}\n{tail(err)}\n{tail(run_dir / 'logs' / 'attempt-0002.log')}"
        kinds = [e["kind"] for e in events(run_dir, "attempt_ended")]
        assert kinds == ["signal", "success"], kinds
        resumed = [Path(e["resume_from"]).name if e.get("resume_from") else None
                   for e in events(run_dir, "attempt_started")]
        assert resumed == [None, "step-00000010"], resumed
        assert (run_dir / "checkpoints" / "latest" / "MANIFEST.json").is_file(), "no committed checkpoint"

    def check_hf_autoattach(self) -> None:
        job = self.work / "hf_zero_code.py"
        shutil.copy(HERE / "hf_zero_code.py", job)
        hf_dir = self.work / "hf"
        hf_dir.mkdir()
        run_dir, report = hf_dir / "run", hf_dir / "report.json"
        out_dir = run_dir / "out"
        r = subprocess.run([str(self.bin / "resilient-run"), "--run-dir", str(run_dir), "--backoff", "0", "--",
                            self.py, str(job), "--output_dir", str(out_dir), "--report", str(report)],
                           cwd=hf_dir, env=self.env, capture_output=True, text=True, timeout=300,
                           start_new_session=True)
        assert r.returncode == 0, f"supervisor exited {r.returncode}\n{r.stderr[-3000:]}\n{tail(run_dir / 'logs' / 'attempt-0001.log')}"
        assert [e["kind"] for e in events(run_dir, "attempt_ended")] == ["success"]
        got = json.loads(report.read_text())
        assert "trainer_shim.integrations.hf.ResilientCallback" in got["callbacks"], got["callbacks"]
        assert Path(got["trainer_shim"]).resolve().is_relative_to(self.venv.resolve()), got["trainer_shim"]
        saved = {e["step"] for e in events(run_dir, "checkpoint_saved")}
        assert {5, 10} <= saved, sorted(saved)
        for step in (5, 10):
            assert (out_dir / f"checkpoint-{step}" / "MANIFEST.json").is_file(), sorted(p.name for p in out_dir.iterdir())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--wheel", required=True, type=Path)
    p.add_argument("--constraints", required=True, type=Path)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    a = p.parse_args()
    wheel, constraints = a.wheel.resolve(), a.constraints.resolve()
    assert re.fullmatch(r"resilient_run-[^-]+-py3-none-any\.whl", wheel.name), wheel.name
    root = Path(tempfile.mkdtemp(prefix="resilient-run-wheel-smoke-"))
    assert not root.resolve().is_relative_to(REPO), f"{root} is inside the checkout"
    smoke = Smoke(wheel, constraints, root)
    passed, failed = 0, 0
    try:
        log(f"fresh venv in {smoke.venv}: torch from the constraints, then {wheel.name}[hf]")
        smoke.install()
        log("installed")
        checks = [("installed layout (packages, py.typed, _attach, LICENSE, not editable)", smoke.check_layout),
                  ("resilient-run --version", smoke.check_version),
                  ("raw loop SIGKILLed at step 12, resumed bit-exact", smoke.check_kill_and_resume),
                  ("zero-code HF Trainer auto-attached and checkpointed", smoke.check_hf_autoattach)]
        results: dict[str, Optional[BaseException]] = {}

        def attempt(what: str, check: Callable[[], None]) -> None:
            t = time.monotonic()
            try:
                check()
            except BaseException as e:  # noqa: BLE001 - every failure is reported, then the exit code says it
                results[what] = e
                log(f"FAILED {what}: {type(e).__name__}: {e}")
            else:
                results[what] = None
                log(f"ok {what} ({time.monotonic() - t:.1f}s)")

        for what, check in checks[:2]:
            attempt(what, check)
        # The two jobs side by side: each is mostly its interpreter's and imports' start-up, one core each.
        threads = [threading.Thread(target=attempt, args=c) for c in checks[2:]]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        failed = sum(e is not None for e in results.values())
        passed = len(checks) - failed
    finally:
        if a.keep or failed:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"smoke: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


T0 = time.monotonic()

if __name__ == "__main__":
    sys.exit(main())
