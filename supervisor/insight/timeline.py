"""`report --png`: global step over wall time. Each attempt is a line from its first step to its
failure (red, ending in an x) or its end (green); the drop to the next attempt's first step is the
rollback a failure cost. Each recovery is shaded by phase (detect, stop, start, restore, first
step) and every checkpoint is a marker at its step. matplotlib is the optional [report] extra."""

from __future__ import annotations

import datetime as _dt
from typing import Any, Optional

from ..decisions.classify import Kind

__all__ = ["draw", "PHASES"]

# (AttemptCost field, label, colour): the recovery phases in the order they happen.
PHASES = (("recover_detect", "detect", "#f4a582"), ("recover_stop", "stop", "#fddbc7"),
          ("recover_start", "start (spawn, imports)", "#d1e5f0"), ("recover_restore", "restore", "#92c5de"),
          ("recover_first_step", "first step", "#e0e0e0"))


def _t(s: Optional[str]) -> Optional[float]:
    return _dt.datetime.fromisoformat(s).timestamp() if s else None


def _shade(ax, rep: Any, t0: float) -> None:  # noqa: ANN001 - a matplotlib Axes
    """Each recovery's phases as vertical bands, back to back from the failure to the first step."""
    firsts = {ln["attempt"]: _t(ln["points"][0][0]) for ln in rep.step_lines}
    for c in rep.attempts:
        t_first = firsts.get(c.attempt)
        if c.recover_total is None or t_first is None:
            continue
        at = t_first - c.recover_total - t0
        for field, _, colour in PHASES:
            d = getattr(c, field)
            if d:
                ax.axvspan(at, at + d, color=colour, alpha=0.8, lw=0, zorder=0)
                at += d


def draw(rep: Any, path: str, width_px: int = 1200, height_px: int = 400) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    starts = [_t(c.start) for c in rep.attempts]
    t0 = min((s for s in starts if s is not None), default=0.0)
    fig = plt.figure(figsize=(width_px / 100, height_px / 100), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    _shade(ax, rep, t0)
    kinds = {c.attempt: c.kind for c in rep.attempts}
    for ln in rep.step_lines:
        xs = [_t(t) - t0 for t, _ in ln["points"]]
        ys = [s for _, s in ln["points"]]
        kind = kinds.get(ln["attempt"])
        ok = kind in (Kind.SUCCESS.value, None)
        ax.plot(xs, ys, color="tab:green" if kind == Kind.SUCCESS.value else ("tab:blue" if ok else "tab:red"),
                lw=3, zorder=2)
        if not ok:
            ax.plot([xs[-1]], [ys[-1]], marker="x", color="black", markersize=10, mew=2, zorder=3)
    for ck in rep.checkpoints:
        if isinstance(ck.get("step"), int):
            ax.plot([_t(ck["time"]) - t0], [ck["step"]], marker="v", color="navy", markersize=7, zorder=4)
    gp = "-" if rep.goodput is None else f"{rep.goodput:.1%}"
    ettr = "-" if rep.ettr is None else f"{rep.ettr:.1%}"
    restarts = sum(rep.restarts_by_kind.values())
    ax.set_title(f"ETTR {ettr}, goodput {gp}, lost steps {rep.lost_steps}, {restarts} restart(s)")
    ax.set_xlabel("seconds since the first attempt")
    ax.set_ylabel("global step")
    ax.plot([], [], "x", color="black", label="failure")
    ax.plot([], [], "v", color="navy", label="checkpoint")
    for _, label, colour in PHASES:
        ax.fill_between([], [], color=colour, label=label)
    ax.legend(loc="upper left", fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
