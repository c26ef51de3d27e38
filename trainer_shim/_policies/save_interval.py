"""`save_every_seconds="auto"`: the Young/Daly checkpoint interval, as plain functions on plain data.

    tau = sqrt(2 * C * M)

C is the stall one save costs the training loop (measured on each save; with an async save, only
the part the loop waits for), M the mean time between failures. M comes from the run dir's
history (events.jsonl: training time of the attempts / attempts that failed and lost work) and
is `mtbf_hours` (default 24) until a failure is on record. The result is clamped to
[MIN_INTERVAL_S, MAX_INTERVAL_S] = [30 s, 6 h]: below 30 s saving dominates any real job, above
6 h a single failure costs more than most schedulers' patience. Torch-free: integrations (HF,
Lightning callbacks) call `AutoInterval` or `interval_for_run_dir` directly.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from .. import rundir
from ..rundir import DEFAULT_MTBF_HOURS

__all__ = ["MIN_INTERVAL_S", "MAX_INTERVAL_S", "DEFAULT_MTBF_HOURS", "young_daly", "mtbf_from_events",
           "AutoInterval", "interval_for_run_dir", "mtbf_for", "from_option", "tune", "AUTO"]

AUTO = rundir.AUTO_INTERVAL
MIN_INTERVAL_S = 30.0
MAX_INTERVAL_S = 6 * 3600.0
_NO_LOSS = ("success", "preempted", "rendezvous")   # ends that lose no training work
_EWMA = 0.3                                          # weight of the newest save's stall


def young_daly(save_cost_s: float, mtbf_s: float, lo: float = MIN_INTERVAL_S, hi: float = MAX_INTERVAL_S) -> float:
    """sqrt(2*C*M) clamped to [lo, hi]."""
    tau = math.sqrt(2.0 * max(save_cost_s, 0.0) * max(mtbf_s, 0.0))
    return min(max(tau, lo), hi)


def _ts(ev: dict) -> Optional[float]:
    try:
        return datetime.fromisoformat(str(ev["time"])).timestamp()
    except (KeyError, ValueError):
        return None


def mtbf_from_events(events: Iterable[dict], default_hours: float = DEFAULT_MTBF_HOURS) -> float:
    """Seconds of attempt run time per work-losing failure; default_hours while none is on record.

    With failures on record the estimate is (run time) / failures; the time since the last
    failure counts too, so a long healthy stretch raises M again.
    """
    started: dict = {}
    run_s, failures, last_start = 0.0, 0, None
    for ev in events:
        t = _ts(ev)
        if t is None:
            continue
        if ev.get("event") == rundir.Event.ATTEMPT_STARTED:
            started[ev.get("attempt")] = last_start = t
        elif ev.get("event") == rundir.Event.ATTEMPT_ENDED:
            t0 = started.pop(ev.get("attempt"), None)
            if t0 is not None:
                run_s += max(0.0, t - t0)
            last_start = None
            if ev.get("kind") not in _NO_LOSS:
                failures += 1
    if last_start is not None:   # the attempt running now
        run_s += max(0.0, datetime.now().timestamp() - last_start)
    if failures == 0:
        return max(default_hours * 3600.0, run_s)
    return max(run_s / failures, 1.0)


@dataclasses.dataclass
class AutoInterval:
    """The current interval: recomputed on each measured save stall and each new MTBF estimate."""

    mtbf_s: float = DEFAULT_MTBF_HOURS * 3600.0
    save_cost_s: Optional[float] = None     # EWMA of measured stalls; None before the first save
    lo: float = MIN_INTERVAL_S
    hi: float = MAX_INTERVAL_S

    @property
    def interval_s(self) -> float:
        if self.save_cost_s is None:
            return self.lo    # first save early: it measures C
        return young_daly(self.save_cost_s, self.mtbf_s, self.lo, self.hi)

    def observe_save(self, stall_s: float) -> float:
        c = max(0.0, float(stall_s))
        self.save_cost_s = c if self.save_cost_s is None else (1 - _EWMA) * self.save_cost_s + _EWMA * c
        return self.interval_s

    def observe_mtbf(self, mtbf_s: float) -> float:
        self.mtbf_s = max(1.0, float(mtbf_s))
        return self.interval_s


def mtbf_for(rd: rundir.RunDir, mtbf_hours: float = DEFAULT_MTBF_HOURS) -> float:
    """MTBF seconds from a run dir's events (the default while they cannot be read)."""
    try:
        events = rundir.read_events(rd)
    except (rundir.ContractError, OSError):
        events = []
    return mtbf_from_events(events, mtbf_hours)


def interval_for_run_dir(run_dir: Path | str, save_cost_s: float, mtbf_hours: float = DEFAULT_MTBF_HOURS) -> float:
    """One call for integrations: the interval for a run dir's history and a measured save stall."""
    return young_daly(save_cost_s, mtbf_for(rundir.RunDir(Path(run_dir)), mtbf_hours))


def from_option(value: Union[float, str, None], rd: rundir.RunDir, mtbf_hours: float,
                hb: Any) -> tuple[Optional[float], Optional[AutoInterval]]:
    """init(save_every_seconds=...) -> (the interval now, the tuner when "auto"); ConfigError on nonsense."""
    from ..errors import ConfigError

    if value == AUTO:
        auto = AutoInterval(mtbf_for(rd, mtbf_hours))
        hb.set_save_interval(auto.interval_s)
        return auto.interval_s, auto
    if value is not None and (isinstance(value, (str, bool)) or value <= 0):
        raise ConfigError(f"save_every_seconds must be a positive number or 'auto', got {value!r}")
    return value, None


def tune(auto: Optional[AutoInterval], hb: Any, stall_s: float) -> Optional[float]:
    """After a save: with "auto", the stall it cost the loop re-tunes the interval (the heartbeat
    shows it); the new interval, or None without "auto"."""
    if auto is None:
        return None
    every = auto.observe_save(stall_s)
    hb.set_save_interval(every)
    return every
