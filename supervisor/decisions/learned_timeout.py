"""`--heartbeat-timeout auto`: per-phase hang limits learned from the heartbeat intervals observed.

For each phase (starting, training, saving, evaluating) the supervisor records how long the
heartbeat stayed unchanged before it changed (attributed to the phase it was in while silent).
Once a phase has MIN_SAMPLES of them its limit is

    max(floor, FACTOR * p99(intervals))

and until then the configured rule (--heartbeat-timeout / --save-timeout / --startup-timeout)
holds. The samples (the newest KEEP per phase) persist in RUN_DIR/heartbeat_timeouts.json, so a
restarted attempt (or supervisor) starts with what earlier attempts taught. A hang verdict says
which rule fired.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import Optional

from trainer_shim.rundir import ContractError, RunDir, atomic_write_json, read_json

__all__ = ["FACTOR", "MIN_SAMPLES", "KEEP", "Limit", "TimeoutLearner", "p99"]

FACTOR = 5.0
KEEP = 512
MIN_SAMPLES = {"starting": 2, "saving": 3, "training": 20, "evaluating": 5}
_DEFAULT_MIN = 20
SAVE_EVERY = 30.0     # seconds between writes of the samples file while an attempt runs


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


@dataclasses.dataclass(frozen=True)
class Limit:
    seconds: float
    rule: str         # e.g. "learned: max(floor 5s, 5 x p99 0.41s of 212 training intervals)"


class TimeoutLearner:
    def __init__(self, rd: RunDir, floor: float) -> None:
        self.path = rd.learned_timeouts
        self.floor = float(floor)
        self.samples: dict[str, deque] = {}
        self._dirty = False
        self._last_save = 0.0
        try:
            data = read_json(self.path)
        except (ContractError, OSError):
            data = None
        if isinstance(data, dict) and isinstance(data.get("samples"), dict):
            for phase, vals in data["samples"].items():
                if isinstance(vals, list):
                    self.samples[str(phase)] = deque((float(v) for v in vals if isinstance(v, (int, float)) and v >= 0),
                                                     maxlen=KEEP)

    def record(self, phase: Optional[str], interval: float) -> None:
        if phase is None or interval < 0:
            return
        self.samples.setdefault(phase, deque(maxlen=KEEP)).append(round(interval, 4))
        self._dirty = True

    def limit(self, phase: Optional[str]) -> Optional[Limit]:
        """The learned limit of `phase`, or None while it has too few samples."""
        vals = self.samples.get(phase or "")
        if not vals or len(vals) < MIN_SAMPLES.get(phase or "", _DEFAULT_MIN):
            return None
        q = p99(list(vals))
        secs = max(self.floor, FACTOR * q)
        which = f"floor {self.floor:g}s" if secs == self.floor else f"{FACTOR:g} x p99 {q:.3g}s"
        return Limit(secs, f"learned ({which}; max(floor {self.floor:g}s, {FACTOR:g} x p99 {q:.3g}s of "
                           f"{len(vals)} {phase} intervals))")

    def save(self, now: float, force: bool = False) -> None:
        if not self._dirty or (not force and now - self._last_save < SAVE_EVERY):
            return
        self._last_save = now
        try:
            atomic_write_json(self.path, {"floor": self.floor, "factor": FACTOR,
                                          "samples": {p: list(v) for p, v in self.samples.items()}}, durable=False)
            self._dirty = False
        except OSError:
            pass   # learning is an optimisation: the configured limits still hold
