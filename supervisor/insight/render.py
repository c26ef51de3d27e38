"""How the CLI shows things: plain functions from reports to text and rich tables (tests call them).

Nothing here reads the run dir or decides anything; `status.py` says what is true, this module
says it to a human.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from trainer_shim.rundir import SHM_DIR, RunDir, RunState

from .progress import format_progress
from .status import CheckpointRow, StatusReport

__all__ = ["fmt_age", "fmt_ago", "fmt_bytes", "title", "describe_state", "describe_phase", "describe_progress", "status_rows",
           "status_table", "describe_slots", "checkpoint_cells", "checkpoints_table", "watch", "stop_summary", "doctor_text"]

# The checkpoints table's columns as shown, and the order they go in at a narrow terminal (least
# important first); the name, the key a user copies into `export` or RESILIENT_RESUME_FROM, never goes.
CHECKPOINT_COLUMNS = ("name", "step", "epoch", "batch", "kind", "loss", "size", "created", "status")
_DROP_ORDER = ("batch", "loss", "size", "epoch", "kind", "created", "step", "status")
_RIGHT = ("step", "epoch", "batch", "loss", "size")
_STATUS_MIN = 24   # the status column wraps (INVALID: reason) but keeps at least this width


def fmt_age(s: Optional[float]) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def fmt_ago(iso: Optional[str], now: Optional[float] = None) -> str:
    """An ISO timestamp as a short relative age: `12s ago`, `3m ago`, `5h ago`, `2d ago`."""
    try:
        t = _dt.datetime.fromisoformat(iso).timestamp() if iso else None
    except (TypeError, ValueError):
        t = None
    if t is None:
        return "-"
    s = max(0.0, (time.time() if now is None else now) - t)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit} ago"
    return f"{int(s)}s ago"


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_loss(loss: Optional[float], logged_at: Optional[int]) -> str:
    """A loss, with the step it was logged at when that is not the row's own step (an HF Trainer logs
    every logging_steps)."""
    if not isinstance(loss, (int, float)):
        return "-"
    return f"{loss:.6g}" + (f" @{logged_at}" if logged_at is not None else "")


def title(rd: RunDir, rate: str = "") -> str:
    return f"resilient-run {rd.root}" + ("" if rd.node is None else f" node {rd.node}") + rate


def describe_state(rep: StatusReport) -> str:
    """The state, and for a requested stop what a rerun will do: `stopped (resumable, checkpoint step N)`."""
    if rep.state != RunState.STOPPED:
        return rep.state
    ck = rep.latest_checkpoint
    saved = rep.stop is None or rep.stop.get("saved") is not False
    if ck is None:
        return "stopped (no checkpoint; a rerun starts from scratch)"
    return f"stopped (resumable, checkpoint step {ck['step']}" + ("" if saved else "; the trainer did not save at the stop") + ")"


def describe_phase(rep: StatusReport) -> str:
    """The trainer's phase; once the supervisor is gone its trainer is too, whatever the last beat said."""
    if rep.supervisor_alive:
        return rep.phase or "-"
    return f"exited (last heartbeat: {rep.phase})" if rep.phase else "-"


def describe_progress(rep: StatusReport) -> str:
    """`step 1,234 / 10,000 (12.3%), ...`; no ETA once no supervisor runs the job (nothing will arrive)."""
    if rep.progress is None:
        return "-"
    return format_progress(rep.progress if rep.supervisor_alive else dataclasses.replace(rep.progress, eta_s=None))


def _or_dash(v: Any) -> str:
    return "-" if v is None else str(v)


def status_rows(rep: StatusReport) -> list[tuple[str, str]]:
    """The `status` table as (label, value) rows."""
    lf, ck = rep.last_failure, rep.latest_checkpoint
    sup = _or_dash(rep.supervisor_pid) + ("" if rep.supervisor_alive or rep.supervisor_pid is None else " (exited)")
    stale = "" if rep.heartbeat_fresh or rep.heartbeat_age_s is None else " (stale)"
    rows = [
        describe_trainer_pids(rep),
        ("state", describe_state(rep)), ("attempt", str(rep.attempt or "-")), ("restarts", _or_dash(rep.restarts)),
        ("supervisor pid", sup),
        ("phase", describe_phase(rep)), ("step", _or_dash(rep.step)),
        ("progress", describe_progress(rep)),
        ("epoch", _or_dash(rep.epoch)),
        ("loss", fmt_loss(rep.loss, rep.loss_step)),
        ("heartbeat age", fmt_age(rep.heartbeat_age_s) + stale),
        ("last failure", f"{lf['kind']} (attempt {lf['attempt']}, {lf['at']})" if lf else "-"),
        ("latest checkpoint", f"{Path(ck['path']).name} (step {ck['step']}, {fmt_age(rep.checkpoint_age_s)} ago)" if ck else "-"),
        ("disk free", fmt_bytes(rep.disk_free_bytes)),
    ]
    if rep.trainer_pid and rep.child_pid and rep.trainer_pid != rep.child_pid:
        rows.insert(5, ("launcher pid", str(rep.child_pid)))
    if rep.save_interval_s is not None:
        rows.append(("save interval", f"{fmt_age(rep.save_interval_s)} (auto)"))
    if rep.mirrored is not None:
        rows.append(("mirrored", f"{rep.mirrored['url']} (step {_or_dash(rep.mirrored['step'])}, {fmt_ago(rep.mirrored['at'])})"))
    if rep.memory_slots:
        rows.append(("memory slots", describe_slots(rep.memory_slots, rep.supervisor_alive)))
    if rep.memory_snapshots_off_reason:
        rows.append(("memory snapshots", f"off: {rep.memory_snapshots_off_reason}"))
    return rows


def describe_trainer_pids(rep: StatusReport) -> tuple[str, str]:
    """The first row: the process(es) a fault is injected into by hand (`kill -9 PID`), by rank when
    there are several; the launcher's pid when no rank has beaten yet."""
    pids = rep.trainer_pids or {}
    if len(pids) > 1:
        return "trainer pids", ", ".join(f"rank {r}: {p}" for r, p in sorted(pids.items()))
    return "trainer pid", str(rep.trainer_pid or rep.child_pid or "-")


def describe_slots(m: dict, supervised: bool) -> str:
    """`770.0 MiB in 2 slots (owner pid 12 running)`, or how to take the memory back."""
    head = f"{fmt_bytes(m.get('bytes'))} in {len(m.get('slots') or [])} slot(s) in {SHM_DIR}"
    if m.get("live_owner_pid") is not None:
        return f"{head} (owner pid {m['live_owner_pid']} running)"
    if supervised:
        return f"{head} (kept by the supervisor for the next attempt)"
    return f"{head} (owner gone; free: resilient-run slots RUN_DIR --free)"


def status_table(rep: StatusReport, heading: str):  # noqa: ANN201 - a rich Table
    from rich.table import Table

    from rich.text import Text

    t = Table(title=Text(heading), show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in status_rows(rep):
        t.add_row(k, Text(v))   # Text: a path or reason with [brackets] is not rich markup
    return t


def checkpoint_cells(r: CheckpointRow, verify: bool, now: Optional[float] = None) -> dict[str, str]:
    """One checkpoint's cells by column name."""
    flags = [f for f, on in (("remote", r.remote), ("latest", r.is_latest), ("best", r.is_best),
                             ("inexact", r.exact is False)) if on]
    st = ("writing" if r.writing else "ok" if not verify else "verified") if r.problem is None \
        else f"INVALID: {r.problem}"
    return {
        "name": r.name, "step": str(r.step), "epoch": _or_dash(r.epoch), "batch": _or_dash(r.batch_in_epoch),
        "kind": r.kind or "-", "loss": fmt_loss(r.loss, r.loss_step),
        "size": fmt_bytes(r.size_bytes), "created": fmt_ago(r.created_at, now),
        "status": st + (f" ({', '.join(flags)})" if flags else ""),
    }


def _fitting_columns(cells: Sequence[dict[str, str]], width: int) -> tuple[list[str], int]:
    """(columns, gap) that fit `width`: every column two spaces apart if that fits, else one space
    apart, dropping the least important columns until the rest fits."""
    def need(col: str, squeeze: bool) -> int:
        w = max([len(col)] + [len(c[col]) for c in cells])
        return min(w, _STATUS_MIN) if squeeze and col == "status" else w

    def total(cols: list[str], gap: int) -> int:  # one space apart, the status column may wrap
        return sum(need(col, gap == 1) for col in cols) + gap * (len(cols) - 1)

    cols = list(CHECKPOINT_COLUMNS)
    if total(cols, 2) <= width:
        return cols, 2
    for victim in _DROP_ORDER:
        if total(cols, 1) <= width:
            break
        cols.remove(victim)
    return cols, 1


def checkpoints_table(rows: Sequence[CheckpointRow], verify: bool, width: int, now: Optional[float] = None):  # noqa: ANN201
    """The `checkpoints` listing for a terminal `width` columns wide; the name is never cut."""
    from rich.table import Table
    from rich.text import Text

    cells = [checkpoint_cells(r, verify, now) for r in rows]
    cols, gap = _fitting_columns(cells, width)
    t = Table(box=None, header_style="bold", pad_edge=False, padding=(0, gap, 0, 0))
    for col in cols:
        fixed = col != "status"
        w = max([len(col)] + [len(c[col]) for c in cells])
        t.add_column(col, justify="right" if col in _RIGHT else "left", no_wrap=fixed,
                     min_width=w if fixed else _STATUS_MIN, overflow="fold")
    for c in cells:
        t.add_row(*(Text(c[col]) for col in cols))   # Text: a reason with [brackets] is not rich markup
    return t


def stop_summary(where: str, rep: StatusReport) -> str:
    """`stop`'s closing line: what state the run was left in."""
    return f"stopped {where}: state {describe_state(rep)}" + (
        f", latest checkpoint {rep.latest_checkpoint['path']}" if rep.latest_checkpoint else "")


def watched_rate(prev: dict, rd: RunDir, rep: StatusReport, now: Optional[float] = None) -> str:
    """Steps/s between two refreshes (for jobs whose heartbeats give no pace of their own)."""
    now, rate = time.monotonic() if now is None else now, ""
    if rep.step is not None:
        last = prev.get(rd.node)
        if last is not None and now > last[0] and rep.step >= last[1]:
            rate = f", {(rep.step - last[1]) / (now - last[0]):.2f} steps/s"
        prev[rd.node] = (now, rep.step)
    return rate


def watch_line(rd: RunDir, rep: StatusReport, rate: str) -> str:
    """One plain `--watch` line (output to a pipe or a log file)."""
    line = describe_progress(rep)
    return (f"{time.strftime('%H:%M:%S')} {title(rd)}: {describe_state(rep)}, attempt {rep.attempt or '-'}, "
            f"{line}{rate if 'steps/s' not in line else ''}")


def _watch_plain(parts: Sequence[RunDir], interval: float, read: Callable[[RunDir], StatusReport]) -> None:
    prev: dict[Optional[int], tuple[float, int]] = {}
    try:
        while True:
            for rd in parts:
                rep = read(rd)
                print(watch_line(rd, rep, watched_rate(prev, rd, rep)), flush=True)
            time.sleep(interval)
    except (KeyboardInterrupt, BrokenPipeError):
        pass


def watch(parts: Sequence[RunDir], interval: float, read: Callable[[RunDir], StatusReport]) -> None:
    """`status --watch`: refresh every `interval` s until interrupted (a live table on a terminal)."""
    from rich.console import Group
    from rich.live import Live

    if not sys.stdout.isatty():  # a pipe or a log file: one plain line per run dir per interval
        _watch_plain(parts, interval, read)
        return
    prev: dict[Optional[int], tuple[float, int]] = {}
    try:
        with Live(refresh_per_second=4, screen=False) as live:
            while True:
                tables = []
                for rd in parts:
                    rep = read(rd)
                    tables.append(status_table(rep, title(rd, watched_rate(prev, rd, rep))))
                live.update(Group(*tables))
                time.sleep(interval)
    except KeyboardInterrupt:
        pass


def doctor_text(res) -> str:  # noqa: ANN001 - a doctor.DoctorResult
    """`doctor`'s verdict: exact, or where the resumed run diverged and how to fix it."""
    if res.error:
        return f"doctor failed: {res.error}"
    if res.exact:
        return f"exact: final weights and every step's loss equal across {res.interruptions} interruptions"
    d = res.divergence
    return f"not exact: {d.message}\nfix: {d.fix}" if d is not None else "not exact"
