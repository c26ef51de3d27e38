"""The `doctor`, `report` and `drill` commands (registered on the main typer app by supervisor.cli)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from .insight import render
from .errors import EXIT_USAGE, ConfigError
from .jobspec import command_mode, resolve_job
from .messages import say
from .insight.status import open_run_dir

__all__ = ["register"]


def _parse_steps(spec: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in spec.split(",") if x.strip())
    except ValueError:
        out = ()
    if not out or any(s <= 0 for s in out):
        raise ConfigError(f"--kill-at {spec!r} is not a list of positive steps; use e.g. --kill-at 17,41")
    return out


def doctor(
    ctx: typer.Context,
    job: List[str] = typer.Argument(..., metavar="SCRIPT.py [ARGS]... | -- COMMAND [ARGS]..."),
    steps: int = typer.Option(60, "--steps", help="Steps per run (the script ends cleanly there)."),
    kill_at: str = typer.Option("17,41", "--kill-at", help="Steps to interrupt at: kill -9, then a Python exception, alternating."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    keep: Optional[Path] = typer.Option(None, "--keep", help="Keep the scratch run dirs and logs under this directory."),
    parallel: Optional[bool] = typer.Option(None, "--parallel/--sequential",
                                            help="Both runs side by side (default unless a GPU is present)."),
) -> None:
    """Prove the script resumes exactly: an uninterrupted and an interrupted run in scratch run dirs, compared step by step."""
    from .insight.doctor import run_doctor

    if steps <= 0:
        raise ConfigError(f"--steps must be positive, got {steps}")
    points = _parse_steps(kill_at)
    tokens = list(job)
    spec = resolve_job(tokens, command_mode(ctx.obj or [], tokens))
    res = run_doctor([spec["script"], *spec["args"]] if "script" in spec else ["--", *spec["command"]],
                     steps=steps, kill_at=points, keep=keep, parallel=parallel)
    typer.echo(json.dumps(res.to_json(), indent=2) if as_json else render.doctor_text(res))
    raise typer.Exit(res.exit_code)


def report(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    # escape: typer renders help as rich markup, which would swallow `[report]` as a style tag
    png: Optional[Path] = typer.Option(None, "--png", help=escape("Also draw a timeline PNG (needs the [report] extra).")),
) -> None:
    """What the failures of a run cost: per attempt, recovery times, lost steps and goodput."""
    from .insight.report import build_report, render_png, render_text

    rep = build_report(open_run_dir(run_dir))
    if png is not None and png.is_dir():
        raise ConfigError(f"--png {png} is a directory; give a file name such as {png / 'timeline.png'}")
    typer.echo(json.dumps(rep.to_json(), indent=2) if as_json else render_text(rep))
    if png is not None:
        try:
            render_png(rep, str(png))
        except ImportError:
            say("error: --png needs matplotlib; pip install 'resilient-run[report]'")
            raise typer.Exit(EXIT_USAGE) from None
        except OSError as e:
            raise ConfigError(f"cannot write --png {png}: {e.strerror or e}; choose a writable path") from None


def drill(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR"),
    fault: str = typer.Argument(..., metavar="kill|hang|oom", help="SIGKILL, SIGSTOP (a hang), or an OOM kill inside the memory limit."),
    rank: int = typer.Option(0, "--rank", min=0, help="The rank whose trainer is hit."),
) -> None:
    """Rehearse a failure on a live supervised run: hit its trainer, wait for the next attempt's first step, show what was recorded."""
    from .insight.drill import render_text, run_drill

    res = run_drill(run_dir, fault, rank)
    typer.echo(render_text(res))
    raise typer.Exit(res.exit_code)


def register(app: typer.Typer) -> None:
    app.command(context_settings={"allow_interspersed_args": False})(doctor)
    app.command()(report)
    app.command()(drill)
