"""`resilient-run report`: what the failures of a run cost, computed from its events.jsonl.

Definitions (docs/how-to/report-metrics.md, "report"): an attempt's useful time is its training time (first step -> the
failure, else its end, minus its time spent saving) scaled to the steps that were not redone by
the next attempt; goodput = useful time / wall time (first attempt start -> last attempt end).
Lost steps = steps redone after restarts. Time spent saving = the training stall of saves, from
the shim's checkpoint_saved events.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections import Counter
from typing import Optional

from trainer_shim.rundir import (Event, RunDir, parse_checkpoint_name,
                                 read_events, read_index)

from ..decisions.classify import Kind

__all__ = ["AttemptCost", "RunReport", "build_report", "render_text", "render_png"]


def _t(s: Optional[str]) -> Optional[float]:
    return _dt.datetime.fromisoformat(s).timestamp() if s else None


def _step_of(path: Optional[str]) -> int:
    """The step a resume_from path names (0: a fresh start or a name we cannot parse)."""
    if not path:
        return 0
    return parse_checkpoint_name(path.rstrip("/").rsplit("/", 1)[-1]) or 0


@dataclasses.dataclass
class AttemptCost:
    attempt: int
    start: str
    end: Optional[str]
    kind: Optional[str]
    evidence: Optional[str]
    resumed_from_step: int
    last_step: Optional[int]
    steps_redone: int
    # Recovery from the failure that ended the previous attempt (None for the first one), seconds;
    # detect + stop + start + restore + first step = total (each boundary a mark of its own side).
    recover_detect: Optional[float] = None        # failure -> the supervisor saw it (a hang: its timeout)
    recover_stop: Optional[float] = None          # saw it -> every process of the attempt gone
    recover_start: Optional[float] = None         # previous attempt ended -> init() called: backoff, spawn,
                                                  # interpreter start and imports (a warm standby: activation)
    recover_restore: Optional[float] = None       # init() -> state restored (older shims: started -> restored)
    recover_first_step: Optional[float] = None    # restore done -> first step
    recover_total: Optional[float] = None         # failure (else the previous end) -> first step
    # Parts of recover_start: previous end -> attempt started (backoff, fork), and this attempt's
    # process start (or attempt start, if the process was a standby started earlier) -> init().
    recover_spawn: Optional[float] = None
    recover_imports: Optional[float] = None
    saving_seconds: Optional[float] = None        # training stalled by saves (None: no checkpoint_saved events)
    saves: int = 0                                # saves that returned to training (checkpoint_saved events)


@dataclasses.dataclass
class RunReport:
    attempts: list[AttemptCost]
    wall_seconds: float
    useful_seconds: float
    goodput: Optional[float]
    lost_steps: int
    restarts_by_kind: dict[str, int]
    checkpoints: list[dict] = dataclasses.field(default_factory=list)   # {step, time, kind[, attempt]}
    saving_seconds: Optional[float] = None        # the attempts' time spent saving, summed
    # Effective training time ratio: the wall time the job would have taken with no failure and no
    # checkpoint (the first attempt's start up to its first step, plus the useful time) / wall time.
    ettr: Optional[float] = None
    # Global step over wall time for the PNG: per attempt [(time, step)] from its first step to its end.
    step_lines: list[dict] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _by_attempt(events: list[dict]) -> dict[int, dict]:
    attempts: dict[int, dict] = {}
    for ev in events:
        n = ev.get("attempt")
        if not isinstance(n, int):
            continue
        a = attempts.setdefault(n, {"saves": []})
        name = ev.get("event")
        if name == Event.ATTEMPT_STARTED:
            a["started"] = ev
        elif name == Event.ATTEMPT_ENDED:
            a["ended"] = ev
        elif name == Event.FIRST_STEP and "first" not in a:
            a["first"] = ev
        elif name == Event.CHECKPOINT_SAVED:
            a["saves"].append(ev)
    return {n: a for n, a in attempts.items() if "started" in a}


def _recovery(c: AttemptCost, prev: Optional[dict], t_start: float, fs: Optional[dict]) -> None:
    """The recovery of attempt `c` from `prev`, the previous attempt's attempt_ended event."""
    if prev is None:
        return
    prev_end = _t(prev["time"])
    failed, detected = _t(prev.get("failure_time")), _t(prev.get("detected_time"))
    t_first = _t(fs["time"]) if fs else None
    t_restored = _t(fs.get("restored_time")) if fs else None
    t_init, t_born = (_t(fs.get("init_time")), _t(fs.get("process_start_time"))) if fs else (None, None)
    if failed is not None and detected is not None:
        c.recover_detect = round(detected - failed, 3)
        c.recover_stop = round(prev_end - detected, 3)
    c.recover_spawn = round(t_start - prev_end, 3)
    # From init() on, the shim's own marks; an older shim's event has no init_time: "started" stands for it.
    began = t_init if t_init is not None else t_start
    c.recover_start = round(began - prev_end, 3)
    if t_init is not None:
        c.recover_imports = round(t_init - max(t_start, t_born if t_born is not None else t_start), 3)
    if t_restored is not None:
        c.recover_restore = round(t_restored - began, 3)
        if t_first is not None:
            c.recover_first_step = round(t_first - t_restored, 3)
    if t_first is not None:
        c.recover_total = round(t_first - (failed if failed is not None else prev_end), 3)


def _resumed_step(a: dict) -> int:
    """The step an attempt resumed at: what it loaded (its end record says, e.g. a memory snapshot
    newer than the supervisor's choice), else the checkpoint it was told to resume from."""
    en = a.get("ended")
    return _step_of(en["resumed_from"] if en and "resumed_from" in en else a["started"].get("resume_from"))


def build_report(rd: RunDir) -> RunReport:
    attempts = _by_attempt(read_events(rd))
    out: list[AttemptCost] = []
    useful, lost = 0.0, 0
    prev: Optional[dict] = None
    for n in sorted(attempts):
        a = attempts[n]
        st, en, fs = a["started"], a.get("ended"), a.get("first")
        resumed = _resumed_step(a)
        last = en.get("step") if en else None
        nxt = attempts.get(n + 1)
        redone = max(0, last - _resumed_step(nxt)) if (nxt and last is not None) else 0
        lost += redone
        c = AttemptCost(attempt=n, start=st["time"], end=en["time"] if en else None,
                        kind=en.get("kind") if en else None, evidence=en.get("evidence") if en else None,
                        resumed_from_step=resumed, last_step=last, steps_redone=redone)
        _recovery(c, prev, _t(st["time"]), fs)
        totals = [ev["saving_seconds"] for ev in a["saves"] if isinstance(ev.get("saving_seconds"), (int, float))]
        c.saving_seconds, c.saves = (round(max(totals), 3) if totals else None), len(a["saves"])
        useful += _useful(c, en, fs)
        prev = en
        out.append(c)
    starts = [_t(a["started"]["time"]) for a in attempts.values()]
    ends = [_t(a["ended"]["time"]) for a in attempts.values() if "ended" in a]
    wall = (max(ends) - min(starts)) if starts and ends else 0.0
    kinds = Counter(c.kind for c in out[:-1] if c.kind and c.kind != Kind.SUCCESS.value)
    saving = [c.saving_seconds for c in out if c.saving_seconds is not None]
    return RunReport(attempts=out, wall_seconds=round(wall, 3), useful_seconds=round(useful, 3),
                     goodput=round(useful / wall, 4) if wall > 0 else None, lost_steps=lost,
                     restarts_by_kind=dict(kinds), checkpoints=_checkpoints(rd, attempts),
                     saving_seconds=round(sum(saving), 3) if saving else None,
                     ettr=_ettr(attempts, useful, wall), step_lines=_step_lines(out, attempts))


def _ettr(attempts: dict[int, dict], useful: float, wall: float) -> Optional[float]:
    """(first attempt's start -> its first step, which a failure-free job pays too, + useful time) / wall.
    1.0 for a run that never failed nor saved; None until an attempt has ended after its first step."""
    if not attempts or wall <= 0:
        return None
    first = attempts[min(attempts)]
    if "first" not in first:
        return None
    startup = max(0.0, _t(first["first"]["time"]) - _t(first["started"]["time"]))
    return round(min(1.0, (startup + useful) / wall), 4)


def _step_lines(out: list[AttemptCost], attempts: dict[int, dict]) -> list[dict]:
    """Each attempt's global step over time (its first step -> its failure or end; even pacing
    assumed between), so a plot shows the rollback at each failure."""
    lines = []
    for c in out:
        a = attempts[c.attempt]
        fs, en = a.get("first"), a.get("ended")
        if fs is None or en is None or not isinstance(fs.get("step"), int) or c.last_step is None:
            continue
        pts = [(fs["time"], fs["step"])] + [(ev["time"], ev["step"]) for ev in a["saves"]
                                            if isinstance(ev.get("step"), int) and ev["step"] >= fs["step"]]
        pts.append((en.get("failure_time") or en["time"], c.last_step))
        lines.append({"attempt": c.attempt, "points": pts})
    return lines


def _useful(c: AttemptCost, en: Optional[dict], fs: Optional[dict]) -> float:
    """Training time of this attempt's steps that were not redone (steps assumed evenly paced): its
    first step -> its failure (else its end), minus its time spent saving."""
    last, resumed = c.last_step, c.resumed_from_step
    if not (en and fs) or last is None or last <= resumed:
        return 0.0
    t_stop = _t(en.get("failure_time")) or _t(en["time"])
    train = max(0.0, t_stop - _t(fs["time"]) - (c.saving_seconds or 0.0))
    return train * max(0, last - c.steps_redone - resumed) / (last - resumed)


def _checkpoints(rd: RunDir, attempts: dict[int, dict]) -> list[dict]:
    """Every save the shim reported (checkpoint_saved events), else the checkpoints the index lists
    (older shims, framework integrations; rotation removed the old ones), oldest first."""
    saved = [{"step": ev.get("step"), "time": ev["time"], "kind": ev.get("kind"), "attempt": n}
             for n, a in sorted(attempts.items()) for ev in a["saves"] if isinstance(ev.get("step"), int)]
    if saved:
        return saved
    out = []
    for entry in read_index(rd).values():
        if isinstance(entry, dict) and isinstance(entry.get("global_step"), int) and entry.get("timestamp"):
            out.append({"step": entry["global_step"], "time": entry["timestamp"], "kind": entry.get("kind")})
    return sorted(out, key=lambda c: c["step"])


def render_text(rep: RunReport) -> str:
    def f(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.2f}s"

    head = "recover = detect/stop/start/restore/first step"
    lines = [f"{'#':>3} {'kind':<12} {'resumed':>7} {'last':>6} {'redone':>6} {'saving':>7}  {head:<52} evidence"]
    for c in rep.attempts:
        parts = (c.recover_detect, c.recover_stop, c.recover_start, c.recover_restore, c.recover_first_step)
        rec = "-" if c.recover_total is None else f"{f(c.recover_total)} = " + "/".join(f(x) for x in parts)
        lines.append(f"{c.attempt:>3} {c.kind or 'running':<12} {c.resumed_from_step:>7} "
                     f"{'-' if c.last_step is None else c.last_step:>6} {c.steps_redone:>6} "
                     f"{f(c.saving_seconds):>7}  {rec:<52} "
                     f"{(c.evidence or '')[:60]}")
    gp = "-" if rep.goodput is None else f"{rep.goodput:.1%}"
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(rep.restarts_by_kind.items())) or "none"
    saving = "-" if rep.saving_seconds is None else f"{rep.saving_seconds:.1f}s"
    ettr = "-" if rep.ettr is None else f"{rep.ettr:.1%}"
    lines.append(f"wall {rep.wall_seconds:.1f}s, useful {rep.useful_seconds:.1f}s, goodput {gp}, ETTR {ettr}, "
                 f"saving {saving}, lost steps {rep.lost_steps}, restarts: {kinds}")
    return "\n".join(lines)


def render_png(rep: RunReport, path: str, width_px: int = 1200, height_px: int = 400) -> None:
    """The timeline PNG (supervisor.insight.timeline); ImportError without matplotlib."""
    from .timeline import draw

    draw(rep, path, width_px, height_px)
