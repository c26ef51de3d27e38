"""Job configuration: the one schema behind CLI flags and YAML files, with every default.

A YAML file uses the CLI names in snake_case; CLI flags override file values. Validation turns
every problem into a ConfigError whose message is one line naming the key and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Union

import yaml

from trainer_shim.rundir import EXIT_REFUSED, parse_callback_options

from .errors import ConfigError

__all__ = ["Config", "CliOption", "DEFAULTS", "cli_options", "option_help", "load_config_file", "build_config", "parse_size",
           "parse_exit_codes"]


@dataclasses.dataclass(frozen=True)
class CliOption:
    """How `resilient-run run` takes a Config field as a flag. Declared on the field itself, so the
    flag, its help, the YAML key (the field's name) and the default are written once; cli_options
    derives run's typer parameters from these, and _validate parses flag and YAML values alike."""

    flag: str           # "--max-restarts", or "--prestart/--no-prestart" for an on/off pair
    help: str           # may name {default} and any field's default, e.g. {backoff_max}
    cli_type: type      # what typer parses the flag's text into, before _validate checks it


def _flag(default: Any, flag: str, help: str, cli_type: Optional[type] = None) -> Any:
    """A Config field that is also a `run` flag; cli_type defaults to the type of the default."""
    return dataclasses.field(default=default, metadata={"cli": CliOption(flag, help, cli_type or type(default))})


@dataclasses.dataclass(frozen=True)
class Config:
    """A validated job configuration (frozen: what the supervisor runs with never changes).

    The fields declared with _flag are `run`'s flags; the others are set by the job tokens or YAML only."""

    command: tuple[str, ...] = ()     # full argv of the child
    script: Optional[str] = None      # set when the job is `SCRIPT.py`: runs under our Python
    args: tuple[str, ...] = ()
    run_dir: Optional[str] = _flag(None, "--run-dir", "Run directory (default runs/<script stem>).", Path)
    max_restarts: int = _flag(10, "--max-restarts", "Restarts before giving up (default {default}).")
    # first delay; doubles; reset after progress; 0 = at once
    backoff: float = _flag(1.0, "--backoff", "First restart delay in seconds, doubling up to {backoff_max}; "
                           "0 restarts at once (default {default}).")
    backoff_max: float = 60.0
    # The flag takes `auto` too, hence text; _seconds_field turns it into heartbeat_timeout_auto.
    heartbeat_timeout: float = _flag(600.0, "--heartbeat-timeout", "Seconds without a heartbeat change before a hang "
                                     "(default {default}), or `auto`: per phase max(floor, 5 x p99 of the intervals seen).", str)
    heartbeat_timeout_auto: bool = False  # `--heartbeat-timeout auto`: learn per-phase limits (configured ones until then)
    # a learned limit is never below this
    heartbeat_timeout_floor: float = _flag(60.0, "--heartbeat-timeout-floor",
                                           "Lower bound of a learned (auto) heartbeat timeout (default {default}).")
    # spawn to first heartbeat (and allowance of phase `starting`)
    startup_timeout: float = _flag(900.0, "--startup-timeout", "Seconds from spawn to first heartbeat (default {default}).")
    # allowance of phase `saving` without progress
    save_timeout: float = _flag(1800.0, "--save-timeout", "Seconds a save may go without progress (default {default}).")
    grace_period: float = _flag(30.0, "--grace-period", "Seconds from SIGTERM to SIGKILL (default {default}).")
    # bytes; puts the child tree in its own memory cgroup
    memory_limit: Optional[int] = _flag(None, "--memory-limit", "Memory cgroup limit for the job, e.g. 8G.", str)
    # a refusal of the trainer: retrying cannot help
    no_restart_exit_codes: tuple[int, ...] = _flag((EXIT_REFUSED,), "--no-restart-exit-codes",
                                                   "Exit codes that are never retried (default {default}).", str)
    crash_loop_attempts: int = 3      # attempts without progress before the checkpoint is poisoned
    env: tuple[tuple[str, str], ...] = ()
    working_dir: Optional[str] = _flag(None, "--working-dir", "Working directory of the job.", Path)
    metrics_textfile_dir: Optional[str] = None  # node-exporter textfile collector dir
    nproc_per_node: Optional[int] = _flag(None, "--nproc-per-node",
                                          "Run SCRIPT.py under torchrun with this many ranks on this node.", int)
    nnodes: Optional[int] = _flag(None, "--nnodes", "Number of nodes (with --nproc-per-node; >1 needs --node-rank "
                                  "and --rdzv-endpoint).", int)
    node_rank: Optional[int] = _flag(None, "--node-rank", "This node's rank, 0..nnodes-1.", int)
    rdzv_endpoint: Optional[str] = _flag(None, "--rdzv-endpoint",
                                         "HOST:PORT of the c10d rendezvous, the same on every node.", str)
    # torchrun / python SCRIPT.py jobs: start the next attempt's launcher ahead of need
    prestart: bool = _flag(True, "--prestart/--no-prestart", "torchrun and Python jobs (SCRIPT.py, -m MODULE, "
                           "console scripts of this Python): import the next attempt's launcher / a warm interpreter "
                           "ahead of a restart (default on; ~250 MB idle).")
    # modules a warm interpreter (Python jobs) imports besides torch
    preload: tuple[str, ...] = _flag((), "--preload", "MODULE,...: what a warm interpreter imports besides torch and "
                                     "the frameworks the last attempt recorded.", str)
    # a `diverged` attempt this many steps after its resume poisons that checkpoint
    divergence_window: int = _flag(200, "--divergence-window", "A job that diverges (non-finite loss) within this many "
                                   "steps of its resume condemns that checkpoint (default {default}).")
    # a provenance mismatch on resume is an exit-2 refusal, not a warning
    strict_resume: bool = _flag(False, "--strict-resume/--no-strict-resume", "Refuse (exit 2, not retried) to resume "
                                "a checkpoint whose git commit, dirty state or arguments differ (default: warn).")
    policy: tuple = ()                # failure_policy.KindRule per failure kind (the YAML `policy:` section)
    # s3://BUCKET/PREFIX: checkpoints mirrored to object storage
    mirror: Optional[str] = _flag(None, "--mirror", "s3://BUCKET/PREFIX: upload every checkpoint there in the "
                                  "background and resume from it on a new node (needs resilient-run[s3]; endpoint "
                                  "and credentials from the AWS environment).", str)
    # the job's HF / Lightning Trainers get the callback and resume point by themselves
    auto_attach: bool = _flag(True, "--auto-attach/--no-auto-attach", "Give every HF / Lightning Trainer of the job "
                              "the resilient callback and the resume point, with no code in the script (default on).")
    callback: tuple = ()              # (name, value) options of an auto-attached callback (the YAML `callback:` mapping)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def node(self) -> Optional[int]:
        """This supervisor's node in a multi-node job (its files go to nodes/node-N/), else None."""
        return self.node_rank if (self.nnodes or 1) > 1 else None


DEFAULTS = Config()


def cli_options() -> dict[str, CliOption]:
    """Config field name -> its `run` flag, in declaration order."""
    return {f.name: f.metadata["cli"] for f in dataclasses.fields(Config) if "cli" in f.metadata}


def _shown(value: Any) -> str:
    """A default as --help shows it: 60 for 60.0, 2,3 for (2, 3)."""
    if isinstance(value, float):
        return f"{value:g}"
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def option_help(name: str) -> str:
    """The help of field `name`'s flag, with the defaults it names filled in."""
    shown = {f.name: _shown(getattr(DEFAULTS, f.name)) for f in dataclasses.fields(Config)}
    return cli_options()[name].help.format(default=shown[name], **shown)

# YAML keys and the field each sets; `command` may be a string (shell-split) or a list.
_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_KEYS = sorted(set(_FIELDS) - {"env"} | {"env", "metrics"})

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(value: Union[str, int], key: str = "memory_limit") -> int:
    """'8G', '512M', '1.5GiB' or a byte count -> bytes (binary units, as cgroups and free(1) use)."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size like 8G or 512M, got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE_RE.match(str(value))
        if not m:
            raise ConfigError(f"{key}: {value!r} is not a size; use e.g. 8G, 512M or a byte count")
        n = int(float(m.group(1)) * _SIZE_MULT[m.group(2).lower()])
    if n <= 0:
        raise ConfigError(f"{key}: size must be positive, got {value!r}")
    return n


def parse_exit_codes(value: Union[str, int, list, tuple], key: str = "no_restart_exit_codes") -> tuple[int, ...]:
    items = value if isinstance(value, (list, tuple)) else [p for p in re.split(r"[,\s]+", str(value)) if p]
    out = []
    for it in items:
        try:
            code = int(it)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: {it!r} is not an exit code; use a comma-separated list like 2,3") from None
        if not 0 <= code <= 255 or isinstance(it, bool):
            raise ConfigError(f"{key}: exit code {it!r} is out of range 0-255")
        out.append(code)
    return tuple(out)


def _number(key: str, value: Any, *, integer: bool = False, minimum: float = 0.0) -> Union[int, float]:
    kind = "a whole number" if integer else "a number of seconds"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key}: expected {kind}, got {value!r}")
    try:
        n = int(value) if integer else float(value)
    except ValueError:
        raise ConfigError(f"{key}: expected {kind}, got {value!r}") from None
    if integer and isinstance(value, float) and value != int(value):
        raise ConfigError(f"{key}: expected {kind}, got {value!r}")
    if n < minimum or n != n:
        raise ConfigError(f"{key}: must be >= {minimum:g}, got {value!r}")
    return n


def _int_field(key: str, value: Any) -> dict[str, Any]:
    minimum = 1 if key in ("crash_loop_attempts", "nproc_per_node", "nnodes") else 0
    return {key: int(_number(key, value, integer=True, minimum=minimum))}


def _seconds_field(key: str, value: Any) -> dict[str, Any]:
    if key == "heartbeat_timeout" and str(value).strip().lower() == "auto":
        return {"heartbeat_timeout_auto": True}
    n = float(_number(key, value))
    if key in ("backoff", "backoff_max", "grace_period"):
        return {key: n}
    if n <= 0:
        raise ConfigError(f"{key}: must be > 0 seconds, got {value!r}")
    return {key: n}


def _bool_field(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    return {key: value}


def _callback_field(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, tuple):
        return {key: value}
    try:
        return {key: parse_callback_options(value)}
    except ValueError as e:
        raise ConfigError(f"callback: {e}") from None


def _policy_field(key: str, value: Any) -> dict[str, Any]:
    from .decisions.failure_policy import parse_policy

    return {key: value if isinstance(value, tuple) else parse_policy(value)}


def _preload_field(key: str, value: Any) -> dict[str, Any]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(m, str) for m in items):
        raise ConfigError(f"preload: expected MODULE,... or a list of module names, got {value!r}")
    bad = [m for m in items if m.strip() and not all(part.isidentifier() for part in m.strip().split("."))]
    if bad:
        raise ConfigError(f"preload: {bad[0]!r} is not a module name")
    return {key: tuple(m.strip() for m in items if m.strip())}


def _mirror_field(key: str, value: Any) -> dict[str, Any]:
    from .mirror.url import MirrorUrl   # the URL only: no S3 client is imported here

    MirrorUrl.parse(str(value))
    return {key: str(value)}


def _command_field(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        argv = tuple(shlex.split(value))
    elif isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        argv = tuple(str(v) for v in value)
    else:
        raise ConfigError(f"command: expected a string or a list of strings, got {value!r}")
    if not argv:
        raise ConfigError("command: is empty")
    return {key: argv}


def _args_field(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"args: expected a list of strings, got {value!r}")
    return {key: tuple(str(v) for v in value)}


def _path_field(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ConfigError(f"{key}: expected a path string, got {value!r}")
    return {key: str(value)}


def _env_field(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"env: expected a mapping of NAME: value, got {value!r}")
    return {key: tuple(sorted((str(k), str(v)) for k, v in value.items()))}


def _metrics_field(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) - {"textfile_dir"}:
        raise ConfigError("metrics: expected a mapping with the key textfile_dir")
    return {"metrics_textfile_dir": str(value["textfile_dir"])} if value.get("textfile_dir") is not None else {}


# key -> parser(key, raw value) -> Config field values
_PARSERS: dict[str, Callable[[str, Any], dict[str, Any]]] = {
    **dict.fromkeys(("max_restarts", "crash_loop_attempts", "nproc_per_node", "nnodes", "node_rank",
                     "divergence_window"), _int_field),
    **dict.fromkeys(("backoff", "backoff_max", "grace_period", "heartbeat_timeout", "startup_timeout",
                     "save_timeout", "heartbeat_timeout_floor"), _seconds_field),
    **dict.fromkeys(("prestart", "strict_resume", "heartbeat_timeout_auto", "auto_attach"), _bool_field),
    **dict.fromkeys(("script", "run_dir", "working_dir", "metrics_textfile_dir", "rdzv_endpoint"), _path_field),
    "policy": _policy_field, "preload": _preload_field, "command": _command_field, "args": _args_field,
    "env": _env_field, "metrics": _metrics_field, "mirror": _mirror_field, "callback": _callback_field,
    "memory_limit": lambda key, value: {key: parse_size(value, key)},
    "no_restart_exit_codes": lambda key, value: {key: parse_exit_codes(value, key)},
}


def _validate(values: dict[str, Any], source: str) -> dict[str, Any]:
    """Normalise raw values (YAML or CLI) into Config field values; `source` prefixes errors."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        try:
            parse = _PARSERS.get(key)
            if parse is None:
                hint = difflib.get_close_matches(key, _KEYS, n=1)
                raise ConfigError(f"unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint
                                                            else f"; known keys: {', '.join(_KEYS)}"))
            out.update(parse(key, value))
        except ConfigError as e:
            raise ConfigError(f"{source}{e}") from None
    return out


def load_config_file(path: Union[str, Path]) -> dict[str, Any]:
    """Read and validate a YAML job file into Config field values (unset keys are absent)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except OSError as e:
        raise ConfigError(f"config file {p}: {e.strerror or e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{p}: YAML syntax error{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of keys at the top level, got {type(data).__name__}")
    base = p.parent
    values = _validate({str(k): v for k, v in data.items()}, f"{p}: ")
    # Relative paths in a file are relative to the file, as users of unit files expect.
    for key in ("run_dir", "working_dir", "metrics_textfile_dir", "script"):
        if key in values and not os.path.isabs(values[key]):
            values[key] = str((base / values[key]).resolve())
    return values


def _adopt_torchrun(merged: dict[str, Any]) -> None:
    """A user's own torchrun command is supervised like ours: no restarts of its own, and the
    node's identity (for its files in a shared run dir) taken from its --nnodes/--node-rank."""
    from .process.launch import torchrun_options

    tr = torchrun_options(merged["command"])
    if tr is None:
        return
    if tr.max_restarts != 0:
        raise ConfigError(f"command: torchrun --max-restarts {tr.max_restarts} would restart ranks behind the "
                          "supervisor (without its checkpoint choice or hang detection); use --max-restarts 0")
    merged.setdefault("nnodes", tr.nnodes)
    if tr.node_rank is not None:
        merged.setdefault("node_rank", tr.node_rank)
    if merged["nnodes"] > 1 and merged.get("node_rank") is None:
        raise ConfigError(f"command: torchrun runs {merged['nnodes']} nodes; give this node's --node-rank (to torchrun "
                          "or resilient-run) so the nodes' supervisors keep their files apart in the shared run dir")


def build_config(file_values: dict[str, Any], cli_values: dict[str, Any]) -> Config:
    """Merge file values with CLI values (CLI wins) into a Config; derive command from script."""
    cli = _validate({k: v for k, v in cli_values.items() if v is not None}, "")
    if "script" in cli or "command" in cli:  # a job on the command line replaces the file's job
        file_values = {k: v for k, v in file_values.items() if k not in ("script", "command", "args")}
    merged = {**file_values, **cli}
    script, command = merged.get("script"), merged.get("command")
    if script and command:
        raise ConfigError("give either script or command, not both")
    if script:
        # SCRIPT.py runs under the supervisor's own Python, so the venv that has the shim is used.
        if merged.get("nproc_per_node"):
            from .process.launch import torchrun_command

            rdzv_id = Path(merged["run_dir"]).name if merged.get("run_dir") else Path(script).stem
            merged["command"] = torchrun_command(
                script, merged.get("args", ()), nproc_per_node=merged["nproc_per_node"], nnodes=merged.get("nnodes"),
                node_rank=merged.get("node_rank"), rdzv_endpoint=merged.get("rdzv_endpoint"), rdzv_id=rdzv_id)
        else:
            if merged.get("nnodes") or merged.get("rdzv_endpoint"):
                raise ConfigError("nnodes/rdzv_endpoint need nproc_per_node (ranks per node)")
            merged["command"] = (sys.executable, script, *merged.get("args", ()))
    elif command and merged.get("nproc_per_node"):
        raise ConfigError("nproc_per_node launches SCRIPT.py under torchrun; with `-- COMMAND` put torchrun in the command yourself")
    elif command:
        _adopt_torchrun(merged)
    elif not command:
        raise ConfigError("no job given: pass SCRIPT.py, or `-- COMMAND ...`, or set script/command in the config")
    if merged.get("policy"):
        from .decisions.failure_policy import check_templates

        check_templates(merged["policy"], merged["command"])
        if merged.get("strict_resume") and any(r.args for r in merged["policy"]):
            raise ConfigError("strict_resume refuses a resume whose arguments changed, so policy `args` actions would "
                              "stop the job; drop one of them")
    return Config(**merged)
