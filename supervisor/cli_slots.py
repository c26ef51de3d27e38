"""The `slots` command: the memory snapshot slots in /dev/shm (or RESILIENT_SHM_DIR), what they hold, and freeing them
(registered on the main typer app by supervisor.cli; the rule is trainer_shim.rundir.slot_memory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from trainer_shim.rundir import SHM_DIR, SlotGroup, free_stale, run_slots, slot_groups, stale_reason

from .errors import EXIT_OK, ConfigError
from .insight.render import fmt_bytes
from .insight.status import open_run_dir, supervised_parts
from .messages import say
from .process.snapshots import free_run_slots

__all__ = ["register", "describe_group"]


def describe_group(g: SlotGroup) -> str:
    """`770.0 MiB in 2 slots (steps 40, 39), owner pid 123 alive`: one line for a human."""
    steps = ", ".join(str(s.step) for s in g.slots if s.step is not None) or "none complete"
    pid = g.live_owner
    if pid is not None:
        who = f"owner pid {pid} running"
    else:
        why = stale_reason(g)
        who = "owner gone" + (f"; stale: {why}" if why else "; kept for a rerun to restore from")
    return f"{fmt_bytes(g.bytes)} in {len(g.slots)} slot(s) (steps {steps}), {who}"


def slots(
    run_dir: Optional[Path] = typer.Argument(None, metavar="[RUN_DIR]", help="A run dir (default: every run of this user)."),
    free: bool = typer.Option(False, "--free", help="Free RUN_DIR's slots; the newest is persisted to checkpoints/ first if newer than the disk."),
    discard: bool = typer.Option(False, "--discard", help="With --free: do not persist the newest slot first."),
    free_stale_: bool = typer.Option(False, "--free-stale", help="Free every stale slot of this user (dead owner, no supervisor, run dir gone or 24 h idle)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show the memory snapshot slots in /dev/shm or RESILIENT_SHM_DIR (bytes, steps, owner) and free them."""
    if free and run_dir is None:
        raise ConfigError("--free needs a RUN_DIR; to free every stale slot use --free-stale")
    if discard and not free:
        raise ConfigError("--discard only goes with --free RUN_DIR")
    if free_stale_:
        gone = free_stale()
        out = [{"run_dir": g.run_dir, "bytes": g.bytes, "reason": why} for g, why in gone]
        typer.echo(json.dumps({"freed": out}, indent=2) if as_json else "\n".join(
            [f"freed {fmt_bytes(d['bytes'])}: {d['run_dir'] or '(unknown run)'} ({d['reason']})" for d in out]
            or ["no stale memory snapshots"]))
        raise typer.Exit(EXIT_OK)
    if run_dir is None:
        groups = slot_groups()
        if as_json:
            typer.echo(json.dumps([{**g.to_json(), "stale": stale_reason(g)} for g in groups], indent=2))
        else:
            typer.echo("\n".join(f"{g.run_dir or g.prefix + '*'}: {describe_group(g)}" for g in groups)
                       or f"no memory snapshots in {SHM_DIR}")
        raise typer.Exit(EXIT_OK)
    parts = supervised_parts(open_run_dir(run_dir))
    if free:
        done = [(rd, *free_run_slots(rd, persist=not discard)) for rd in parts]
        if as_json:
            typer.echo(json.dumps([{"node": rd.node, "freed_bytes": n, "persisted": saved} for rd, n, saved in done], indent=2))
        for rd, n, saved in done:
            if not as_json:
                say((f"persisted the memory snapshot of {saved}; " if saved else "") + f"freed {fmt_bytes(n)} of "
                    f"memory snapshots of {rd.root}" + ("" if rd.node is None else f" node {rd.node}"))
        raise typer.Exit(EXIT_OK)
    groups = [(rd, run_slots(rd.root, rd.node)) for rd in parts]
    if as_json:
        typer.echo(json.dumps([{"node": rd.node, **g.to_json(), "stale": stale_reason(g)} for rd, g in groups], indent=2))
    else:
        for rd, g in groups:
            typer.echo(f"{rd.root}" + ("" if rd.node is None else f" node {rd.node}") + ": "
                       + (describe_group(g) if g.slots else "no memory snapshots"))
            for s in g.slots:
                typer.echo(f"  {s.path}  {fmt_bytes(s.bytes)}  " + (f"step {s.step}" if s.step is not None else "incomplete"))
    raise typer.Exit(EXIT_OK)


def register(app: typer.Typer) -> None:
    app.command()(slots)
