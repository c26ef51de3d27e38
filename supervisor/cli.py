"""`resilient-run`: a thin typer CLI that parses and renders; the logic lives in plain modules."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from . import procs
from .config import DEFAULTS, Config, build_config, load_config_file
from .errors import EXIT_GAVE_UP, EXIT_OK, EXIT_USAGE, ConfigError, RunDirError, SupervisorError
from .progress import format_progress
from .status import list_checkpoints, lock_holder, open_run_dir, read_status, supervised_parts

__all__ = ["app", "main", "resolve_job"]

COMMANDS = ("run", "status", "checkpoints", "stop", "export", "doctor", "report")

app = typer.Typer(
    add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
    help="Keep a training job alive: restart it from the newest valid checkpoint when it dies or hangs.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

# The argv `main` was given: needed to tell `SCRIPT.py ARGS` from `-- COMMAND ARGS`, a
# distinction click's parser erases.
_argv: list[str] = []


def _say(msg: str) -> None:
    typer.echo(f"resilient-run: {msg}", err=True)


def _default_run_dir(command: tuple[str, ...], script: Optional[str]) -> Path:
    if script:
        stem = Path(script).stem
    else:
        stem = next((Path(a).stem for a in command[1:] if a.endswith(".py")), Path(command[0]).name)
    return Path("runs") / stem


def resolve_job(job: list[str], command_mode: bool) -> dict:
    """CLI job tokens -> config values (script+args, or command), checking the program exists."""
    if not job:
        return {}
    if command_mode:
        exe = job[0]
        found = shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) and os.path.isfile(exe) else None)
        if not found:
            raise ConfigError(f"command {exe!r} not found or not executable; check PATH or give a full path")
        return {"command": job}
    script = job[0]
    if not os.path.isfile(script):
        raise ConfigError(f"script {script!r} not found; check the path (or run a program with `-- COMMAND ...`)")
    return {"script": script, "args": job[1:]}


def _check_run_dir(path: Path, explicit: bool) -> None:
    if path.exists() and not path.is_dir():
        raise RunDirError(f"run dir {path} is a file; choose another --run-dir")
    parent = path.absolute().parent
    if explicit and not path.exists() and not parent.is_dir():
        raise RunDirError(f"parent directory {parent} of the run dir does not exist; create it or choose another --run-dir")
    probe = path if path.exists() else next((p for p in [parent, *parent.parents] if p.exists()), parent)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunDirError(f"run dir {path} is not writable ({probe}); choose another --run-dir")


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    job: Optional[List[str]] = typer.Argument(None, metavar="SCRIPT.py [ARGS]... | -- COMMAND [ARGS]...", show_default=False),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run directory (default runs/<script stem>)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML job file (same names in snake_case; flags win)."),
    max_restarts: Optional[int] = typer.Option(None, "--max-restarts", help=f"Restarts before giving up (default {DEFAULTS.max_restarts})."),
    backoff: Optional[float] = typer.Option(None, "--backoff", help=f"First restart delay in seconds, doubling up to {DEFAULTS.backoff_max:g}; 0 restarts at once (default {DEFAULTS.backoff:g})."),
    heartbeat_timeout: Optional[str] = typer.Option(None, "--heartbeat-timeout", help=f"Seconds without a heartbeat change before a hang (default {DEFAULTS.heartbeat_timeout:g}), or `auto`: per phase max(floor, 5 x p99 of the intervals seen)."),
    heartbeat_timeout_floor: Optional[float] = typer.Option(None, "--heartbeat-timeout-floor", help=f"Lower bound of a learned (auto) heartbeat timeout (default {DEFAULTS.heartbeat_timeout_floor:g})."),
    startup_timeout: Optional[float] = typer.Option(None, "--startup-timeout", help=f"Seconds from spawn to first heartbeat (default {DEFAULTS.startup_timeout:g})."),
    save_timeout: Optional[float] = typer.Option(None, "--save-timeout", help=f"Seconds a save may go without progress (default {DEFAULTS.save_timeout:g})."),
    grace_period: Optional[float] = typer.Option(None, "--grace-period", help=f"Seconds from SIGTERM to SIGKILL (default {DEFAULTS.grace_period:g})."),
    memory_limit: Optional[str] = typer.Option(None, "--memory-limit", help="Memory cgroup limit for the job, e.g. 8G."),
    no_restart_exit_codes: Optional[str] = typer.Option(None, "--no-restart-exit-codes", help=f"Exit codes that are never retried (default {','.join(map(str, DEFAULTS.no_restart_exit_codes))})."),
    working_dir: Optional[Path] = typer.Option(None, "--working-dir", help="Working directory of the job."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", help="Run SCRIPT.py under torchrun with this many ranks on this node."),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", help="Number of nodes (with --nproc-per-node; >1 needs --node-rank and --rdzv-endpoint)."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", help="This node's rank, 0..nnodes-1."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous, the same on every node."),
    prestart: Optional[bool] = typer.Option(None, "--prestart/--no-prestart", help="torchrun and SCRIPT.py jobs: import the next attempt's launcher / a warm interpreter ahead of a restart (default on; ~250 MB idle)."),
    preload: Optional[str] = typer.Option(None, "--preload", help="MODULE,...: what a warm interpreter imports besides torch (SCRIPT.py jobs)."),
    divergence_window: Optional[int] = typer.Option(None, "--divergence-window", help=f"A job that diverges (non-finite loss) within this many steps of its resume condemns that checkpoint (default {DEFAULTS.divergence_window})."),
    strict_resume: Optional[bool] = typer.Option(None, "--strict-resume/--no-strict-resume", help="Refuse (exit 2, not retried) to resume a checkpoint whose git commit, dirty state or arguments differ (default: warn)."),
) -> None:
    """Run SCRIPT.py (under this Python) or `-- COMMAND` and keep it alive until it succeeds."""
    from .agent import Supervisor  # imported here so `status` stays quick

    tokens = list(job or [])
    command_mode = bool(tokens) and len(_argv) > len(tokens) and _argv[len(_argv) - len(tokens) - 1] == "--"
    file_values = load_config_file(config) if config else {}
    cli_values = {
        **resolve_job(tokens, command_mode),
        "run_dir": str(run_dir) if run_dir else None, "max_restarts": max_restarts, "backoff": backoff,
        "heartbeat_timeout": heartbeat_timeout, "startup_timeout": startup_timeout, "save_timeout": save_timeout,
        "grace_period": grace_period, "memory_limit": memory_limit, "no_restart_exit_codes": no_restart_exit_codes,
        "working_dir": str(working_dir) if working_dir else None,
        "nproc_per_node": nproc_per_node, "nnodes": nnodes, "node_rank": node_rank, "rdzv_endpoint": rdzv_endpoint,
        "prestart": prestart, "heartbeat_timeout_floor": heartbeat_timeout_floor, "divergence_window": divergence_window, "strict_resume": strict_resume,
        "preload": preload,
    }
    cfg: Config = build_config(file_values, cli_values)
    if not tokens and cfg.script and not os.path.isfile(cfg.script):
        raise ConfigError(f"script {cfg.script!r} (from {config}) not found; fix `script:` in the config")
    explicit = cfg.run_dir is not None
    rdir = Path(cfg.run_dir) if cfg.run_dir else _default_run_dir(cfg.command, cfg.script)
    _check_run_dir(rdir, explicit)
    if cfg.working_dir and not os.path.isdir(cfg.working_dir):
        raise ConfigError(f"working_dir {cfg.working_dir} is not a directory")
    raise typer.Exit(Supervisor(cfg, rdir).run())


def _fmt_age(s: Optional[float]) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def _fmt_bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _status_table(rep, title: str):  # noqa: ANN001, ANN202 - rich objects
    from rich.table import Table

    t = Table(title=title, show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    lf = rep.last_failure
    ck = rep.latest_checkpoint
    rows = [
        ("state", rep.state), ("attempt", str(rep.attempt or "-")), ("restarts", str(rep.restarts if rep.restarts is not None else "-")),
        ("supervisor pid", str(rep.supervisor_pid or "-")), ("trainer pid", str(rep.child_pid or "-")),
        ("phase", rep.phase or "-"), ("step", str(rep.step if rep.step is not None else "-")),
        ("progress", format_progress(rep.progress) if rep.progress else "-"),
        ("epoch", str(rep.epoch if rep.epoch is not None else "-")),
        ("loss", f"{rep.loss:.6g}" if isinstance(rep.loss, (int, float)) else "-"),
        ("heartbeat age", _fmt_age(rep.heartbeat_age_s) + ("" if rep.heartbeat_fresh or rep.heartbeat_age_s is None else " (stale)")),
        ("last failure", f"{lf['kind']} (attempt {lf['attempt']}, {lf['at']})" if lf else "-"),
        ("latest checkpoint", f"{Path(ck['path']).name} (step {ck['step']}, {_fmt_age(rep.checkpoint_age_s)} ago)" if ck else "-"),
        ("disk free", _fmt_bytes(rep.disk_free_bytes)),
    ] + ([("save interval", f"{_fmt_age(rep.save_interval_s)} (auto)")] if rep.save_interval_s is not None else [])
    for k, v in rows:
        t.add_row(k, v)
    return t


@app.command()
def status(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    watch: bool = typer.Option(False, "--watch", help="Refresh in place until interrupted."),
    interval: float = typer.Option(1.0, "--interval", help="Refresh interval for --watch, seconds."),
) -> None:
    """Show the job's state; exit 0 when running with a fresh heartbeat or succeeded, else 1.

    A multi-node run dir shows every node's supervisor; it is healthy only when all are."""
    parts = supervised_parts(open_run_dir(run_dir))
    if watch:
        _watch(parts, interval)
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
            Console().print(_status_table(rep, _title(rd)))
    raise typer.Exit(EXIT_OK if all(rep.healthy for _, rep in reps) else EXIT_GAVE_UP)


def _title(rd, rate: str = "") -> str:  # noqa: ANN001
    return f"resilient-run {rd.root}" + ("" if rd.node is None else f" node {rd.node}") + rate


def _watched_rate(prev: dict, rd, rep) -> str:  # noqa: ANN001
    """Steps/s between two refreshes (for jobs whose heartbeats give no pace of their own)."""
    now, rate = time.monotonic(), ""
    if rep.step is not None:
        last = prev.get(rd.node)
        if last is not None and now > last[0] and rep.step >= last[1]:
            rate = f", {(rep.step - last[1]) / (now - last[0]):.2f} steps/s"
        prev[rd.node] = (now, rep.step)
    return rate


def _watch_plain(parts, interval: float) -> None:  # noqa: ANN001
    prev: dict[Optional[int], tuple[float, int]] = {}
    try:
        while True:
            for rd in parts:
                rep = read_status(rd)
                rate = _watched_rate(prev, rd, rep)
                line = format_progress(rep.progress) if rep.progress else "-"
                typer.echo(f"{time.strftime('%H:%M:%S')} {_title(rd)}: {rep.state}, attempt {rep.attempt or '-'}, "
                           f"{line}{rate if 'steps/s' not in line else ''}")
            sys.stdout.flush()
            time.sleep(interval)
    except (KeyboardInterrupt, BrokenPipeError):
        pass


def _watch(parts, interval: float) -> None:  # noqa: ANN001
    from rich.console import Group
    from rich.live import Live

    if not sys.stdout.isatty():  # a pipe or a log file: one plain line per run dir per interval
        _watch_plain(parts, interval)
        return
    prev: dict[Optional[int], tuple[float, int]] = {}
    try:
        with Live(refresh_per_second=4, screen=False) as live:
            while True:
                tables = []
                for rd in parts:
                    rep = read_status(rd)
                    rate = _watched_rate(prev, rd, rep)
                    tables.append(_status_table(rep, _title(rd, rate)))
                live.update(Group(*tables))
                time.sleep(interval)
    except KeyboardInterrupt:
        pass


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
        from rich.table import Table

        t = Table(box=None, header_style="bold")
        for col in ("name", "step", "epoch", "batch", "kind", "loss", "size", "created", "status"):
            t.add_column(col, justify="right" if col in ("step", "epoch", "batch", "loss", "size") else "left")
        for r in rows:
            flags = [f for f, on in (("latest", r.is_latest), ("best", r.is_best), ("inexact", r.exact is False)) if on]
            st = ("ok" if not verify else "verified") if r.problem is None else f"INVALID: {r.problem}"
            t.add_row(r.name, str(r.step), str(r.epoch if r.epoch is not None else "-"),
                      str(r.batch_in_epoch if r.batch_in_epoch is not None else "-"), r.kind or "-",
                      f"{r.loss:.6g}" if isinstance(r.loss, (int, float)) else "-", _fmt_bytes(r.size_bytes),
                      (r.created_at or "-")[:19], st + (f" ({', '.join(flags)})" if flags else ""))
        Console().print(t if rows else "no checkpoints")
    raise typer.Exit(EXIT_GAVE_UP if verify and any(r.problem for r in rows) else EXIT_OK)


@app.command()
def stop(
    run_dir: Path = typer.Argument(..., metavar="RUN_DIR"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds to wait for the supervisor to exit (default: its grace period + 30)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the supervisor has exited."),
) -> None:
    """SIGTERM the run's supervisor: the trainer saves, the supervisor exits 75.

    A multi-node run dir: every node's supervisor that runs on this host (the trainers agree on
    the step to save at, so stopping one node stops them all)."""
    rc = EXIT_OK
    for rd in supervised_parts(open_run_dir(run_dir)):
        rc = max(rc, _stop_one(rd, timeout, wait))
    raise typer.Exit(rc)


def _stop_one(rd, timeout: Optional[float], wait: bool) -> int:  # noqa: ANN001
    import socket

    from trainer_shim.rundir import ContractError, read_json

    from .status import recorded_config

    where = f"{rd.root}" + ("" if rd.node is None else f" (node {rd.node})")
    holder = lock_holder(rd)
    try:
        state = read_json(rd.supervisor_state)
    except ContractError:
        state = {}
    if not isinstance(state, dict):
        state = {}
    if holder is None:
        _say(f"no supervisor is running on {where}")
        return EXIT_GAVE_UP
    host = state.get("host")
    if host and host != socket.gethostname():
        _say(f"the supervisor of {where} runs on host {host}; run `resilient-run stop` there")
        return EXIT_GAVE_UP
    pid = state.get("supervisor_pid")
    proc = procs.matches(pid, state.get("supervisor_create_time"))
    if proc is None or pid != holder:
        # Never signal a pid we cannot prove is this run's supervisor (stale or forged record).
        _say(f"supervisor.json names pid {pid}, which is not the live supervisor of {where} (lock held by pid {holder}); not signalling")
        return EXIT_GAVE_UP
    procs.signal_pid(int(pid), signal.SIGTERM)
    if not wait:
        _say(f"sent SIGTERM to supervisor pid {pid}")
        return EXIT_OK
    limit = timeout if timeout is not None else recorded_config(state).grace_period + 30
    deadline = time.monotonic() + limit
    while lock_holder(rd) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    if lock_holder(rd) is not None:
        _say(f"supervisor pid {pid} is still running after {limit:g}s")
        return EXIT_GAVE_UP
    final = read_status(rd)
    _say(f"stopped {where}: state {final.state}" + (f", latest checkpoint {final.latest_checkpoint['path']}" if final.latest_checkpoint else ""))
    return EXIT_OK


@app.command("export")
def export_cmd(
    ckpt_dir: Path = typer.Argument(..., metavar="CKPT_DIR", help="A checkpoint dir (or a run dir: its newest valid checkpoint)."),
    out: Path = typer.Argument(..., metavar="OUT", help="Output file."),
    fmt: str = typer.Option("torch", "--format", help="torch or safetensors."),
    model_only: bool = typer.Option(False, "--model-only", help="Only the model's state dict."),
) -> None:
    """Verify a checkpoint's digests and write it as one file (a sharded DCP checkpoint is consolidated)."""
    from .export import export_checkpoint

    summary = export_checkpoint(ckpt_dir, out, fmt, model_only)
    _say(f"exported {ckpt_dir} to {out}" + (f" ({summary})" if summary else ""))
    raise typer.Exit(EXIT_OK)


from .cli_insight import register as _register_insight  # noqa: E402 - needs `app`

_register_insight(app)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: `resilient-run [RUN OPTIONS] SCRIPT.py ...` is shorthand for `run`."""
    global _argv
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in COMMANDS and args[0] not in ("-h", "--help"):
        args.insert(0, "run")
    _argv = args
    command = typer.main.get_command(app)
    try:
        rc = command.main(args=args, prog_name="resilient-run", standalone_mode=False)
    except SupervisorError as e:
        _say(f"error: {e}")
        rc = e.exit_code
    except KeyboardInterrupt:
        rc = 130
    except Exception as e:  # click usage errors (typer may vendor click, so match by shape)
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            sub = args[0] if args and args[0] in COMMANDS else ""
            _say(f"error: {e.format_message()} (see `resilient-run {sub} --help`)".replace("  ", " "))
            rc = EXIT_USAGE
        else:
            raise
    sys.exit(rc if isinstance(rc, int) else 0)
