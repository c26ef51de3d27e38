"""Prometheus text-format metrics of one run, written as a textfile for node-exporter."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Optional, Union

from trainer_shim.rundir import RunDir, atomic_write_bytes, checkpoint_roots, commit_age, newest_valid

from ..decisions.classify import Kind
from ..process.heartbeat import HeartbeatMonitor

__all__ = ["MetricsSnapshot", "FAILURE_KINDS", "METRICS", "render", "write_textfile",
           "textfile_name", "disk_free_bytes", "collect"]

# Always exported, at 0 until they happen: a counter series that appears only at its first
# increment makes increase()/rate() miss that increment, so crash-loop alerts would fire late.
FAILURE_KINDS = tuple(k.value for k in Kind if k is not Kind.SUCCESS)

# name -> (type, help); the single list that render() emits and that the alert tests check.
METRICS: dict[str, tuple[str, str]] = {
    "resilient_run_up": ("gauge", "1 while the supervisor is alive and its child is running."),
    "resilient_run_attempts_total": ("counter", "Child processes started for this run."),
    "resilient_run_failures_total": ("counter", "Failed attempts, by failure kind."),
    "resilient_run_heartbeat_age_seconds": ("gauge", "Seconds since the child's heartbeat last changed."),
    "resilient_run_global_step": ("gauge", "Training step of the newest heartbeat."),
    "resilient_run_last_checkpoint_step": ("gauge", "Step of the newest committed checkpoint."),
    "resilient_run_last_checkpoint_age_seconds": ("gauge", "Seconds since the newest checkpoint was committed."),
    "resilient_run_disk_free_bytes": ("gauge", "Free bytes on the run dir's filesystem (for unprivileged users)."),
    "resilient_run_save_interval_seconds": ("gauge", "The trainer's current automatic (Young/Daly) save interval."),
    "resilient_run_goodput_ratio": ("gauge", "Useful training time / wall time (README: What failures cost)."),
    "resilient_run_ettr_ratio": ("gauge", "Effective training time ratio: failure- and checkpoint-free wall time / wall time (README: report)."),
    "resilient_run_lost_steps_total": ("counter", "Steps redone after restarts."),
    "resilient_run_mirror_lag_seconds": ("gauge", "--mirror: seconds the newest local checkpoint has waited for its upload (0 when mirrored)."),
    "resilient_run_mirror_failures_total": ("counter", "--mirror: failed upload tries (each is retried)."),
    "resilient_run_recovery_seconds": ("histogram", "Failure -> first step of the next attempt (detect, stop, spawn, restore, first step)."),
}

# Recovery takes seconds (a quick restart) to many minutes (a large restore after a node loss).
RECOVERY_BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)

Number = Union[int, float]


@dataclasses.dataclass(frozen=True)
class MetricsSnapshot:
    """The values of one run at one moment; None means unknown and its sample is omitted."""

    run: str
    up: bool
    attempts_total: int
    failures_by_kind: Mapping[str, int]
    heartbeat_age_s: Optional[float]
    global_step: Optional[int]
    last_checkpoint_step: Optional[int]
    last_checkpoint_age_s: Optional[float]
    disk_free_bytes: Optional[int]
    save_interval_s: Optional[float] = None
    goodput: Optional[float] = None
    ettr: Optional[float] = None
    lost_steps: Optional[int] = None
    recovery_seconds: tuple[float, ...] = ()
    mirror_lag_s: Optional[float] = None      # only with --mirror
    mirror_failures: Optional[int] = None


def _escape_label(value: str) -> str:
    # The exposition format escapes exactly these three in label values.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format_value(v: Number) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _histogram(name: str, run: str, values: tuple[float, ...]) -> dict[str, list[tuple[str, Number]]]:
    """Cumulative buckets, sum and count; nothing at all before the first recovery."""
    if not values:
        return {name: []}
    buckets = [(f'{run},le="{b:g}"', sum(1 for v in values if v <= b)) for b in RECOVERY_BUCKETS]
    buckets.append((f'{run},le="+Inf"', len(values)))
    return {name: [], f"{name}_bucket": buckets, f"{name}_sum": [(run, float(sum(values)))],
            f"{name}_count": [(run, len(values))]}


def render(s: MetricsSnapshot) -> str:
    """The snapshot in the Prometheus text exposition format, with # HELP and # TYPE lines."""
    run = f'run="{_escape_label(s.run)}"'
    kinds = dict.fromkeys(FAILURE_KINDS, 0)
    kinds.update(s.failures_by_kind)
    samples: dict[str, list[tuple[str, Number]]] = {
        "resilient_run_up": [(run, bool(s.up))],
        "resilient_run_attempts_total": [(run, s.attempts_total)],
        "resilient_run_failures_total": [
            (f'{run},kind="{_escape_label(k)}"', n) for k, n in sorted(kinds.items())
        ],
        "resilient_run_heartbeat_age_seconds": [(run, s.heartbeat_age_s)],
        "resilient_run_global_step": [(run, s.global_step)],
        "resilient_run_last_checkpoint_step": [(run, s.last_checkpoint_step)],
        "resilient_run_last_checkpoint_age_seconds": [(run, s.last_checkpoint_age_s)],
        "resilient_run_disk_free_bytes": [(run, s.disk_free_bytes)],
        "resilient_run_save_interval_seconds": [(run, s.save_interval_s)],
        "resilient_run_goodput_ratio": [(run, s.goodput)],
        "resilient_run_ettr_ratio": [(run, s.ettr)],
        "resilient_run_lost_steps_total": [(run, s.lost_steps)],
        "resilient_run_mirror_lag_seconds": [(run, s.mirror_lag_s)],
        "resilient_run_mirror_failures_total": [(run, s.mirror_failures)],
        **_histogram("resilient_run_recovery_seconds", run, s.recovery_seconds),
    }
    out = []
    for name, (kind, help_text) in METRICS.items():
        present = [(labels, v) for labels, v in samples[name] if v is not None]
        if kind == "histogram":
            present = [(f"_{sfx}", lab, v) for sfx in ("bucket", "sum", "count")
                       for lab, v in samples.get(f"{name}_{sfx}", [])]  # type: ignore[misc]
            if present:
                out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
                out.extend(f"{name}{sfx}{{{lab}}} {_format_value(v)}" for sfx, lab, v in present)
            continue
        if not present:
            continue  # no HELP/TYPE for a family without samples: it would read as "exists, empty"
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{{{labels}}} {_format_value(v)}" for labels, v in present)
    return "\n".join(out) + "\n"


def textfile_name(run: str) -> str:
    """The collector file name for `run`, reduced to characters safe in a file name."""
    return f"resilient_run_{re.sub(r'[^A-Za-z0-9_.-]', '_', run)}.prom"


def write_textfile(run_dir: RunDir, s: MetricsSnapshot, textfile_dir: Optional[str] = None) -> None:
    """Atomically write RUN_DIR/metrics.prom and, if `textfile_dir` is set, its collector copy.

    Raises OSError when a write fails; the caller decides whether a lost sample matters.
    """
    data = render(s).encode()
    # Not durable: rewritten every few seconds, and a stale copy after a power cut is harmless.
    # Atomic matters: node-exporter must never read half a file (the temp name is not *.prom).
    atomic_write_bytes(run_dir.metrics, data, durable=False)
    if textfile_dir:
        atomic_write_bytes(Path(textfile_dir) / textfile_name(s.run), data, durable=False)


def disk_free_bytes(path: Union[str, os.PathLike]) -> Optional[int]:
    """Bytes available to unprivileged users on the filesystem of `path`, or None if unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def collect(rd: RunDir, monitor: Optional[HeartbeatMonitor], *, attempts_total: int,
            failures: Mapping[str, int], poisoned: set[str], costs: Mapping[str, object]) -> MetricsSnapshot:
    """The run's metrics now; `monitor` is the running attempt's (None between attempts)."""
    hb = monitor.first if monitor else None
    hb_age = None
    if monitor is not None and monitor.tracks:
        hb_age = round(time.monotonic() - min(t.changed_at for t in monitor.tracks.values()), 3)
    latest = newest_valid(checkpoint_roots(rd), exclude=poisoned)
    ckpt_age = commit_age(latest.path) if latest is not None else None
    return MetricsSnapshot(
        run=rd.root.resolve().name, up=monitor is not None, attempts_total=attempts_total,
        failures_by_kind=dict(failures), heartbeat_age_s=hb_age,
        global_step=hb.step if hb else None, last_checkpoint_step=latest.step if latest else None,
        last_checkpoint_age_s=ckpt_age, disk_free_bytes=disk_free_bytes(rd.root), **costs,  # type: ignore[arg-type]
        save_interval_s=hb.save_interval_s if hb else None,
    )
