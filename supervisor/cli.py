"""`resilient-run`: a thin typer CLI that parses and renders; the logic lives in plain modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.markup import escape

from .insight import render
from .cli_options import with_run_options
from .config import Config, build_config, load_config_file
from .errors import EXIT_INTERRUPTED, EXIT_INVALID_CHECKPOINT, EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, SupervisorError
from .jobspec import command_mode, resolve_job, run_dir_of
from .messages import say
from .insight.status import list_checkpoints, open_run_dir, read_status, supervised_parts
from .process.stopping import stop_run

__all__ = ["app", "main", "resolve_job"]

COMMANDS = ("run", "status", "checkpoints", "stop", "export", "doctor", "report", "slots", "drill")

app = typer.Typer(
    add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
    help="Keep a training job alive: restart it from the newest valid checkpoint when it dies or hangs.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

@app.command(context_settings={"allow_interspersed_args": False})
@with_run_options   # every other flag of `run`: one per Config field declared with a CliOption
def run(
    ctx: typer.Context,
    job: Optional[List[str]] = typer.Argument(None, metavar="SCRIPT.py [ARGS]... | -- COMMAND [ARGS]...", show_default=False),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML job file (same names in snake_case; flags win)."),
    **options: Any,
) -> None:
    """Run SCRIPT.py (under this Python) or `-- COMMAND` and keep it alive until it succeeds."""
    from .agent import Supervisor  # imported here so `status` stays quick

    tokens = list(job or [])
    file_values = load_config_file(config) if config else {}
    cli_values = {**resolve_job(tokens, command_mode(ctx.obj or [], tokens)), **options}
    cfg: Config = build_config(file_values, cli_values)
    raise typer.Exit(Supervisor(cfg, run_dir_of(cfg, config, tokens)).run())


@app.command()
def status(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    watch: bool = typer.Option(False, "--watch", help="Refresh in place until interrupted."),
    interval: float = typer.Option(1.0, "--interval", min=0.1, help="Refresh interval for --watch, seconds (at least 0.1)."),
) -> None:
    """Show the job's state; exit 0 when running with a fresh heartbeat or succeeded, else 1 (unhealthy).

    A multi-node run dir shows every node's supervisor; it is healthy only when all are."""
    parts = supervised_parts(open_run_dir(run_dir))
    if watch:
        render.watch(parts, interval, read_status)
        return
    reps = [(rd, read_status(rd)) for rd in parts]
    if as_json:
        if len(reps) == 1:
            typer.echo(json.dumps(reps[0][1].to_json(), indent=2))
        else:
            typer.echo(json.dumps({"nodes": {str(rd.node): rep.to_json() for rd, rep in reps}}, indent=2))
    else:
        from rich.console import Console

        for rd, rep in reps:
            Console().print(render.status_table(rep, render.title(rd)))
    raise typer.Exit(EXIT_OK if all(rep.healthy for _, rep in reps) else EXIT_UNHEALTHY)


@app.command()
def checkpoints(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    verify: bool = typer.Option(False, "--verify", help="Recompute every file's digest; exit 1 if any fails."),
) -> None:
    """List committed checkpoints, newest first."""
    rd = open_run_dir(run_dir)
    rows = list_checkpoints(rd, verify=verify)
    if as_json:
        typer.echo(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        from rich.console import Console

        console = Console()
        console.print(render.checkpoints_table(rows, verify, console.width) if rows else "no checkpoints")
    raise typer.Exit(EXIT_INVALID_CHECKPOINT if verify and any(r.problem for r in rows) else EXIT_OK)


@app.command()
def stop(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR"),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0, help="Seconds to wait for the supervisor to exit (default: its grace period + 30)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the supervisor has exited."),
) -> None:
    """SIGTERM the run's supervisor: the trainer saves, the supervisor exits 75.

    A multi-node run dir: every node's supervisor that runs on this host (the trainers agree on
    the step to save at, so stopping one node stops them all)."""
    raise typer.Exit(stop_run(supervised_parts(open_run_dir(run_dir)), timeout, wait))


@app.command("export")
def export_cmd(
    # escape: typer renders help as rich markup, and `[/step-N]` is a closing tag to it (--help crashed)
    ckpt_dir: str = typer.Argument(..., metavar="CKPT_DIR", help=escape("A checkpoint dir (or a run dir: its newest valid checkpoint), or s3://BUCKET/PREFIX[/step-N] (a mirror's newest, or that checkpoint).")),
    out: Path = typer.Argument(..., metavar="OUT", help="Output file."),
    fmt: str = typer.Option("torch", "--format", help="torch or safetensors."),
    model_only: bool = typer.Option(False, "--model-only", help="Only the model's state dict."),
) -> None:
    """Verify a checkpoint's digests and write it as one file (a sharded DCP checkpoint is consolidated)."""
    from .insight.export import export_checkpoint

    summary = export_checkpoint(ckpt_dir, out, fmt, model_only)
    say(f"exported {ckpt_dir} to {out}" + (f" ({summary})" if summary else ""))
    raise typer.Exit(EXIT_OK)


from .cli_insight import register as _register_insight  # noqa: E402 - needs `app`

_register_insight(app)

from .cli_slots import register as _register_slots  # noqa: E402 - needs `app`

_register_slots(app)


def version() -> str:
    """The installed distribution's version: one source, pyproject.toml, read through its metadata."""
    from importlib import metadata

    try:
        return metadata.version("resilient-run")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


@app.callback(invoke_without_command=False)
def _top(show_version: bool = typer.Option(False, "--version", is_eager=True,
                                           help="Print the version and exit.")) -> None:
    if show_version:
        print(f"resilient-run {version()}")
        raise typer.Exit(EXIT_OK)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: `resilient-run [RUN OPTIONS] SCRIPT.py ...` is shorthand for `run`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--version"]:   # click wants a command after a group option: answered here
        print(f"resilient-run {version()}")
        sys.exit(EXIT_OK)
    if args and args[0] not in COMMANDS and args[0] not in ("-h", "--help", "--version"):
        args.insert(0, "run")
    command = typer.main.get_command(app)
    try:
        # obj: the argv as given, for `command_mode` (click's parser erases `SCRIPT.py ARGS` vs `-- COMMAND ARGS`)
        rc = command.main(args=args, prog_name="resilient-run", standalone_mode=False, obj=args)
    except SupervisorError as e:
        say(f"error: {e}")
        rc = e.exit_code
    except KeyboardInterrupt:
        rc = EXIT_INTERRUPTED
    except Exception as e:  # click usage errors (typer may vendor click, so match by shape)
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            sub = args[0] if args and args[0] in COMMANDS else ""
            say(f"error: {e.format_message()} (see `resilient-run {sub} --help`)".replace("  ", " "))
            rc = EXIT_USAGE
        else:
            raise
    sys.exit(rc if isinstance(rc, int) else EXIT_OK)
