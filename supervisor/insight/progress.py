"""Progress of a running job (step / total, steps/s, ETA) and the failure-cost figures that
`status` and the Prometheus textfile show; torch-free, computed from heartbeats and events."""

from __future__ import annotations

import dataclasses
import datetime as _dt
from typing import Optional

from trainer_shim.rundir import Event, HeartbeatRecord, RunDir

from .report import build_report

__all__ = ["Progress", "progress_of", "format_progress", "CostCache"]


def _t(s: Optional[str]) -> Optional[float]:
    try:
        return _dt.datetime.fromisoformat(s).timestamp() if s else None
    except (TypeError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class Progress:
    step: Optional[int]
    total_steps: Optional[int]      # heartbeat `total_steps`: run.epochs(n) x len(loader), or an integration's
    steps_per_s: Optional[float]    # this attempt's pace since its first step
    eta_s: Optional[float]
    goodput: Optional[float]        # only once an attempt has failed (docs/how-to/report-metrics.md)


def progress_of(rd: RunDir, hb: Optional[HeartbeatRecord], events: list[dict], *, failed: bool,
                step: Optional[int] = None) -> Progress:
    """Progress from the newest heartbeat; goodput only once an attempt has `failed` (a requested stop is no failure).
    `step`: a fresher step than the beat's (the step mark) for the position and the ETA; the pace is the
    beat's own, its step and time taken together."""
    beat_step = hb.step if hb else None
    step = beat_step if step is None else step
    total = hb.total_steps if hb else None
    rate = eta = None
    first = next((e for e in reversed(events) if e.get("event") == Event.FIRST_STEP
                  and hb is not None and e.get("attempt") == hb.attempt), None)
    t_hb, t_first = _t(hb.time if hb else None), _t(first.get("time") if first else None)
    if first is not None and beat_step is not None and t_hb and t_first and t_hb > t_first and beat_step > first["step"]:
        rate = (beat_step - first["step"]) / (t_hb - t_first)
        if step is not None and total is not None and total >= step:
            eta = (total - step) / rate
    goodput = build_report(rd).goodput if failed else None
    return Progress(step, total, round(rate, 3) if rate else None, round(eta, 1) if eta is not None else None, goodput)


def _dur(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def format_progress(p: Progress) -> str:
    """`step 1,234 / 10,000 (12.3%), 4.56 steps/s, ETA 32m55s, goodput 97.1%` (parts only when known)."""
    if p.step is None:
        return "-"
    parts = [f"step {p.step:,}" + (f" / {p.total_steps:,} ({p.step / p.total_steps:.1%})" if p.total_steps else "")]
    if p.steps_per_s:
        parts.append(f"{p.steps_per_s:.2f} steps/s")
    if p.eta_s is not None:
        parts.append(f"ETA {_dur(p.eta_s)}")
    if p.goodput is not None:
        parts.append(f"goodput {p.goodput:.1%}")
    return ", ".join(parts)


class CostCache:
    """Goodput, ETTR, lost steps and recovery times for the metrics textfile, recomputed only when
    events.jsonl changed (the supervisor writes metrics every few seconds)."""

    def __init__(self, rd: RunDir) -> None:
        self.rd = rd
        self._key: Optional[tuple[int, int]] = None
        self._value: dict = {}

    def get(self) -> dict:
        try:
            st = self.rd.events.stat()
            key = (st.st_size, st.st_mtime_ns)
        except OSError:
            return {}
        if key != self._key:
            rep = build_report(self.rd)
            self._key = key
            self._value = {"goodput": rep.goodput, "ettr": rep.ettr, "lost_steps": rep.lost_steps,
                           "recovery_seconds": tuple(a.recover_total for a in rep.attempts
                                                     if a.recover_total is not None)}
        return self._value
