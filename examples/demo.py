"""`make demo`: a small CPU job is SIGKILLed, crashes and hangs once each under resilient-run,
is restarted from its newest valid checkpoint every time, and ends with weights bitwise equal
to an uninterrupted run. Prints the events timeline."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "jobs" / "toy_train.py"
RUNS = REPO / "runs"
sys.path.insert(0, str(REPO))

from trainer_shim.rundir import Event, RunDir, read_events  # noqa: E402

console = Console()


def _name(path: "str | None") -> str:
    return Path(path).name if path else "scratch"


def _detail(ev: dict) -> str:
    """One readable line per event of the timeline."""
    name = ev["event"]
    if name == Event.ATTEMPT_STARTED:
        return f"pid {ev['pid']}, resume from {_name(ev.get('resume_from'))}"
    if name == Event.ATTEMPT_ENDED:
        return f"[bold]{ev['kind']}[/bold], last step reached {ev.get('step')}: {ev.get('evidence', '')[:60]}"
    if name == Event.RESTARTING:
        return f"in {ev['delay_s']}s from {_name(ev.get('resume_from'))}"
    if name == Event.FIRST_STEP:
        return f"the attempt's first training step: step {ev.get('step')}"
    return ", ".join(f"{k}={v}" for k, v in ev.items() if k not in ("time", "event", "attempt"))[:80]


def main() -> int:
    ref_dir, run_dir = RUNS / "demo-reference", RUNS / "demo"
    for d in (ref_dir, run_dir):
        shutil.rmtree(d, ignore_errors=True)  # the demo's own dirs: start clean each time
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("TOY_FAULTS", None)
    job_args = ["--epochs", "3", "--samples", "96", "--save-every", "5", "--step-sleep", "0.05"]

    console.rule("1. the uninterrupted reference run")
    subprocess.run([sys.executable, str(JOB), *job_args, "--run-dir", str(ref_dir), "--out", str(ref_dir / "w.pt")],
                   env=env, check=True)

    console.rule("2. the same job under resilient-run: SIGKILL at step 8, crash at 17, hang at 26")
    faults = "1:kill@8,2:raise@17,3:hang@26"
    cmd = [sys.executable, "-m", "supervisor", "run", "--run-dir", str(run_dir), "--backoff", "0",
           "--heartbeat-timeout", "3", "--grace-period", "2", str(JOB), *job_args, "--out", str(run_dir / "w.pt")]
    console.print(f"$ TOY_FAULTS={faults} resilient-run " + " ".join(cmd[3:]), style="dim")
    rc = subprocess.run(cmd, env={**env, "TOY_FAULTS": faults, "PYTHONPATH": str(REPO)}).returncode

    console.rule("3. what happened")
    events = read_events(RunDir(run_dir))
    t0 = dt.datetime.fromisoformat(events[0]["time"]) if events else None
    table = Table(box=None, header_style="bold")
    for col in ("t", "attempt", "event", "details"):
        table.add_column(col)
    for ev in events:
        t = (dt.datetime.fromisoformat(ev["time"]) - t0).total_seconds() if t0 else 0.0
        table.add_row(f"{t:6.2f}s", str(ev.get("attempt") or ""), ev["event"], _detail(ev))
    console.print(table)

    ref = torch.load(ref_dir / "w.pt")
    got = torch.load(run_dir / "w.pt") if (run_dir / "w.pt").exists() else {}
    exact = rc == 0 and ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    kinds = [e["kind"] for e in events if e["event"] == "attempt_ended"]
    console.rule("4. verdict")
    console.print(f"supervisor exit code: {rc}; attempts ended as: {', '.join(kinds)}")
    if exact:
        console.print(f"[bold green]final weights are bitwise equal to the uninterrupted run[/] ({len(ref)} tensors, torch.equal)")
        rel = run_dir.relative_to(REPO)
        console.print(f"inspect it yourself: .venv/bin/resilient-run status {rel}; "
                      f".venv/bin/resilient-run checkpoints {rel} --verify; .venv/bin/resilient-run report {rel}")
        return 0
    console.print("[bold red]final weights differ from the uninterrupted run[/]")
    return 1


if __name__ == "__main__":
    sys.exit(main())
