"""`resilient-run doctor`: run a job twice in scratch run dirs under the real supervisor, once
uninterrupted and once with injected faults, and compare the shim's per-step digests.

Torch-free: the shim writes the digests (doctor mode, `$RESILIENT_DOCTOR`); this module only
spawns supervisors and reads JSON lines.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Union

from trainer_shim.rundir import (ENV_DOCTOR, ENV_DOCTOR_FAULTS, ENV_DOCTOR_STEPS, ENV_RUN_DIR, EXIT_DOCTOR_FAILED,
                                 EXIT_EXACT, EXIT_OK, EXIT_NOT_EXACT, FAULT_KILL, FAULT_RAISE, MARK_BATCH, MARK_STEP,
                                 ContractError, Event, RunDir, read_events)

__all__ = ["DoctorResult", "Divergence", "run_doctor", "compare", "read_log", "resume_mismatches", "DEFAULT_STEPS", "DEFAULT_KILL_AT",
           "EXIT_EXACT", "EXIT_NOT_EXACT", "EXIT_DOCTOR_FAILED"]

DEFAULT_STEPS = 60
_GPU_NODES = ("/dev/nvidiactl", "/dev/kfd")
DEFAULT_KILL_AT = (17, 41)

# Blame order at the first divergent step: causes before their consequences.
_BLAME = ("uncaptured.", "rng.", "batch", "data", "run.state", "extra.", "scheduler", "scaler", "optimizer",
          "model.buffers", "model.params")
# What one step's update changes when its loss differs (digests are taken after the update).
_CONSEQUENCES = ("model.params", "model.buffers", "optimizer")
_LABELS = {"rng.python": "Python global RNG", "rng.numpy": "NumPy global RNG", "rng.torch": "torch CPU RNG",
           "rng.cuda": "CUDA RNG", "rng.generator": "the DataLoader's generator", "batch": "batch order",
           "data": "sampler/data position", "run.state": "run.state", "scheduler": "scheduler",
           "scaler": "AMP scaler", "optimizer": "optimizer", "model.buffers": "buffers of `model`",
           "model.params": "parameters of `model`"}
_FIXES = {"uncaptured.": "pass the generator in `extra` (an object with state_dict()/load_state_dict()) or "
                         "draw from the global RNGs the shim captures",
          "rng.": "draw random numbers only inside the loop body before run.step(), or keep the state in run.state",
          "batch": "iterate the training data with run.batches(loader) and do not consume it elsewhere",
          "data": "iterate the training data with run.batches(loader) inside run.epochs(n)",
          "outside": "keep every value the loop carries across steps (e.g. an RNN's hidden state) in run.state or "
                     "`extra`, so that checkpoints hold it"}


@dataclasses.dataclass
class Divergence:
    step: int
    component: str        # digest key ("model.buffers", "rng.numpy", "uncaptured.…", "loss", "steps")
    message: str
    fix: str


@dataclasses.dataclass
class DoctorResult:
    exact: bool
    steps: int
    interruptions: int
    kill_at: list[int]
    divergence: Optional[Divergence] = None
    baseline_seconds: float = 0.0
    interrupted_seconds: float = 0.0
    seconds: float = 0.0          # wall time of both runs (side by side unless --sequential)
    error: Optional[str] = None

    @property
    def exit_code(self) -> int:
        if self.error:
            return EXIT_DOCTOR_FAILED
        return EXIT_EXACT if self.exact else EXIT_NOT_EXACT

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"exit_code": self.exit_code}


def read_log(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # torn by a kill -9
    return out


def _label(key: str) -> str:
    if key.startswith("uncaptured."):
        return "an uncaptured " + key[len("uncaptured."):]
    if key.startswith("extra."):
        return f"extra[{key[len('extra.'):]!r}]"
    return _LABELS.get(key, key)


def _fix_for(key: str) -> str:
    return next((v for k, v in _FIXES.items() if key.startswith(k)),
                "make sure run.step() follows the last change to this state in the loop body")


def _after_step_change(rec: dict) -> Divergence:
    comp = rec["changed"][0]
    what = "BatchNorm buffers of `model`" if comp == "model.buffers" and rec.get("bn") else _label(comp)
    fix = ("call run.step() after the last change to training state in the loop body (e.g. run sampling/"
           "evaluation in eval mode, or before run.step())")
    return Divergence(rec["step"], comp, f"{what} changed after run.step() at step {rec['step']}: "
                      "state changed outside the checkpointed step", fix)


def _unseeded(base: dict[int, dict], got: list[dict]) -> Union[set, Divergence]:
    """Components that differ already at the first step, before any interruption (an unseeded
    global RNG): ignored when the training itself matches, else the run is not reproducible at all."""
    if not got or got[0]["step"] not in base:
        return set()
    b, r = base[got[0]["step"]], got[0]
    noisy = {k for k in set(b["digests"]) | set(r["digests"]) if b["digests"].get(k) != r["digests"].get(k)}
    same = b.get("loss") == r.get("loss") and b.get("batch") == r.get("batch") and not any(
        k.startswith("model.") or k == "optimizer" for k in noisy)
    if same:
        return noisy
    what = ", ".join(_label(k) for k in sorted(noisy)) or "the loss"
    return Divergence(r["step"], sorted(noisy)[0] if noisy else "loss",
                      f"the script is not reproducible even without interruptions: {what} differs at step "
                      f"{r['step']} of two uninterrupted starts", "seed every RNG at the start of the script "
                      "(torch.manual_seed, random.seed, numpy.random.seed) and avoid nondeterministic ops")


def _first_mismatch(base: dict[int, dict], got: list[dict]) -> Optional[tuple[int, dict]]:
    first: Optional[tuple[int, dict]] = None
    for r in got:
        b = base.get(r["step"])
        if b is None:
            continue
        if b.get("loss") != r.get("loss") or b["digests"] != r["digests"] or b.get("batch") != r.get("batch"):
            if first is None or r["step"] < first[0]:
                first = (r["step"], r)
    return first


def compare(baseline: list[dict], interrupted: list[dict]) -> Optional[Divergence]:
    """The first divergence between the two digest logs (None: exact), over every rank: the
    earliest step, then the likeliest cause (a rank's own RNG before the model every rank shares
    through its gradients); named `rank R: ...` when the job has several ranks."""
    ranks = sorted({r.get("rank", 0) for r in baseline if r.get("at") == MARK_STEP}) or [0]
    found = [(d, rank) for rank in ranks if (d := _compare_rank(baseline, interrupted, rank)) is not None]
    if not found:
        return None
    d, rank = min(found, key=lambda f: (f[0].step, _blame_rank(f[0].component), f[1]))
    return dataclasses.replace(d, message=f"rank {rank}: {d.message}") if len(ranks) > 1 else d


def _blame_rank(component: str) -> int:
    return next((i for i, prefix in enumerate(_BLAME) if component.startswith(prefix)), len(_BLAME))


def _compare_rank(baseline: list[dict], interrupted: list[dict], rank: int) -> Optional[Divergence]:
    base = {r["step"]: r for r in baseline if r.get("at") == MARK_STEP and r.get("rank", 0) == rank}
    after = [r for r in baseline + interrupted if r.get("at") == MARK_BATCH and r.get("rank", 0) == rank]
    got = [r for r in interrupted if r.get("at") == MARK_STEP and r.get("rank", 0) == rank]
    noisy = _unseeded(base, got)
    if isinstance(noisy, Divergence):
        return noisy
    for r in list(base.values()) + got:
        r["digests"] = {k: v for k, v in r["digests"].items() if k not in noisy}
    first = _first_mismatch(base, got)
    reached, target = max((r["step"] for r in got), default=0), max(base, default=0)
    if first is None and reached < target:
        return Divergence(reached, "steps", f"the interrupted run stopped at step {reached} of {target}",
                          "see the supervisor log (doctor --keep DIR keeps it)")
    # A change after run.step() (seen in either run) explains a divergence after it best.
    early = [a for a in after if first is None or a["step"] < first[0]]
    if early:
        return _after_step_change(min(early, key=lambda a: a["step"]))
    if first is None:
        return None
    step, r = first
    b = base[step]
    diff = [k for k in set(b["digests"]) | set(r["digests"]) if b["digests"].get(k) != r["digests"].get(k)]
    if b.get("batch") != r.get("batch"):
        diff.append("batch")
    # Digests are taken after the step's update: with the same batch, RNGs and declared state, a
    # different loss made the model and optimizer differ, not the other way round.
    if b.get("loss") != r.get("loss") and all(k.startswith(_CONSEQUENCES) for k in diff):
        diff = []
    for prefix in _BLAME:
        hit = sorted(k for k in diff if k.startswith(prefix))
        if hit:
            return Divergence(step, hit[0], f"{_label(hit[0])} differs first, at step {step}", _fix_for(hit[0]))
    return Divergence(step, "loss", f"a value outside the shim's view: the loss differs at step {step} while "
                      "every captured component matched", _FIXES["outside"])


def resume_mismatches(rd: RunDir) -> list[str]:
    """One line per attempt whose framework began at another step than its resume point (the
    shim's `resume_step_mismatch` events). Re-training from step 0 repeats the same digests, so
    comparing them alone would call such a run exact."""
    try:
        found = read_events(rd)
    except ContractError:
        return []
    return [f"attempt {e.get('attempt')} trained from step {e.get('actual_step')} instead of resuming from "
            f"{e.get('path')} (step {e.get('expected_step')})"
            for e in found if e.get("event") == Event.RESUME_STEP_MISMATCH.value]


def _resume_not_applied(rd: RunDir) -> Optional[Divergence]:
    lines = resume_mismatches(rd)
    if not lines:
        return None
    return Divergence(0, "resume", f"the resume point was not applied: {lines[0]}",
                      "pass the checkpoint the callback chose to the Trainer (resume_from_checkpoint=cb.resume_from(...)"
                      " / ckpt_path=cb.resume_from()), or drop --no-auto-attach")


def _supervise(job: list[str], run_dir: Path, env: dict, log: Path, restarts: int) -> tuple[int, float]:
    argv = [sys.executable, "-m", "supervisor", "run", "--run-dir", str(run_dir), "--backoff", "0",
            "--max-restarts", str(restarts), *job]
    t0 = time.monotonic()
    with open(log, "ab") as out:
        rc = subprocess.call(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    return rc, time.monotonic() - t0


# The flags by which HF-style command lines (the Trainer's own scripts, ms-swift, accelerate jobs) name
# the dir they write into: some write files there (e.g. ms-swift's args.json) before a Trainer, and so
# before our callback, exists.
_OUTPUT_FLAGS = ("--output_dir", "--output-dir")


def private_output_dirs(job: list[str], where: Path) -> list[str]:
    """`job` with every output-dir flag's value replaced by `where`: doctor's runs write nothing into
    the user's dirs (and the baseline and interrupted runs never share one)."""
    out, it = [], iter(job)
    for a in it:
        flag, eq, _ = a.partition("=")
        if flag in _OUTPUT_FLAGS and eq:
            out.append(f"{flag}={where}")
        elif a in _OUTPUT_FLAGS:
            out.append(a)
            if next(it, None) is not None:
                out.append(str(where))
        else:
            out.append(a)
    return out


def gpu_present() -> bool:
    """A GPU device node (NVIDIA, AMD ROCm): two copies of a job might not fit on it side by side."""
    return any(os.path.exists(p) for p in _GPU_NODES)


def run_doctor(job: list[str], steps: int = DEFAULT_STEPS, kill_at: tuple[int, ...] = DEFAULT_KILL_AT,
               keep: Optional[Path] = None, parallel: Optional[bool] = None) -> DoctorResult:
    """The baseline run and the run with faults (kill -9 and a Python exception alternating), compared.

    `job` is `[SCRIPT.py, ARGS...]` or `["--", COMMAND, ARGS...]`; `keep` keeps the scratch dirs there.
    The two runs are independent and go side by side (most of a short run is interpreter start-up)
    unless `parallel` is False, or None on a machine with a GPU."""
    if parallel is None:
        parallel = not gpu_present()
    kinds = (FAULT_KILL, FAULT_RAISE)
    faults = ",".join(f"{s}:{kinds[i % 2]}" for i, s in enumerate(kill_at))
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="resilient-doctor-", dir=keep))
    res = DoctorResult(exact=False, steps=steps, interruptions=len(kill_at), kill_at=list(kill_at))
    try:
        env = {k: v for k, v in os.environ.items() if k != ENV_RUN_DIR}
        env[ENV_DOCTOR_STEPS] = str(steps)
        logs = {name: scratch / f"{name}.digests.jsonl" for name in ("baseline", "interrupted")}

        def one(name: str, fault_spec: str) -> tuple[int, float]:
            e = dict(env, **{ENV_DOCTOR: str(logs[name]), ENV_DOCTOR_FAULTS: fault_spec})
            argv = private_output_dirs(job, scratch / f"{name}-output")
            return _supervise(argv, scratch / name, e, scratch / f"{name}.log", len(kill_at) + 2)

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(2 if parallel else 1) as pool:
            done = {"baseline": pool.submit(one, "baseline", ""), "interrupted": pool.submit(one, "interrupted", faults)}
            results = {name: f.result() for name, f in done.items()}
        res.seconds = round(time.monotonic() - t0, 3)
        for name, (rc, secs) in results.items():
            setattr(res, f"{name}_seconds", round(secs, 3))
            if rc != EXIT_OK:
                tail = (scratch / f"{name}.log").read_text(errors="replace").strip().splitlines()[-1:]
                res.error = f"the {name} run failed (exit {rc}): {tail[0] if tail else 'no output'}"
                return res
        baseline = read_log(logs["baseline"])
        if not any(r.get("at") == MARK_STEP for r in baseline):
            res.error = "the script recorded no steps; does it call trainer_shim.init() and run.step()?"
            return res
        res.divergence = _resume_not_applied(RunDir(scratch / "interrupted")) or compare(
            baseline, read_log(logs["interrupted"]))
        res.exact = res.divergence is None
        return res
    finally:
        if keep is None:
            shutil.rmtree(scratch, ignore_errors=True)
