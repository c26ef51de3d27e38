"""`run`'s options are declared once, as Config fields with a CliOption: the typer command's flags,
their help, the YAML keys and the docs' table all follow from that declaration, and a flag given on
the command line still wins over the config file."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
import yaml

from supervisor import cli
from supervisor.cli_options import options_table
from supervisor.config import build_config, cli_options, load_config_file, option_help
from tests.conftest import REPO
from tests.docs import gen_reference as load_generators

from .helpers import FAKE_JOB, run_cli, sup_env, supervisor_state

# A YAML value for each flag's key and the Config value it makes (flags and YAML share the parser).
SAMPLES = {
    "run_dir": ("/tmp/r", "/tmp/r"), "max_restarts": (4, 4), "backoff": (0.5, 0.5),
    "heartbeat_timeout": (45, 45.0), "heartbeat_timeout_floor": (12, 12.0), "startup_timeout": (33, 33.0),
    "save_timeout": (44, 44.0), "grace_period": (5, 5.0), "memory_limit": ("1G", 1 << 30),
    "no_restart_exit_codes": ("2,3", (2, 3)), "working_dir": ("/tmp/w", "/tmp/w"), "nproc_per_node": (2, 2),
    "nnodes": (2, 2), "node_rank": (1, 1), "rdzv_endpoint": ("h:29500", "h:29500"), "prestart": (False, False),
    "preload": ("json,csv", ("json", "csv")), "divergence_window": (9, 9), "strict_resume": (True, True),
    "mirror": ("s3://bucket/prefix", "s3://bucket/prefix"), "auto_attach": (False, False),
}


def run_params() -> dict:
    command = typer.main.get_command(cli.app).commands["run"]   # the click command typer builds
    return {p.name: p for p in command.params}


def test_run_takes_exactly_the_declared_options() -> None:
    params = run_params()
    assert set(params) - {"job", "config"} == set(cli_options())
    for name, opt in cli_options().items():
        p = params[name]
        assert "/".join([*p.opts, *p.secondary_opts]) == opt.flag   # (the help: as rendered, below)
        assert p.default is None   # an absent flag must leave the config file's value alone


def test_every_flag_is_a_yaml_key_of_the_same_name(tmp_path: Path) -> None:
    assert set(SAMPLES) == set(cli_options())
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"script": "train.py", **{k: v for k, (v, _) in SAMPLES.items()}}))
    cfg = build_config(load_config_file(job), {})
    assert {k: getattr(cfg, k) for k in SAMPLES} == {k: want for k, (_, want) in SAMPLES.items()}


def test_help_lists_every_flag_with_its_help() -> None:
    r = run_cli("run", "--help", env=sup_env(COLUMNS="300"))   # wide enough that no flag name wraps
    assert r.returncode == 0, r.stderr
    # rich may still wrap the help column; without the box and the spaces each help is one unbroken run
    flat = "".join(r.stdout.replace("│", " ").split())
    for name, opt in cli_options().items():
        assert "".join(opt.flag.replace("/", " ").split()) in flat, opt.flag
        assert "".join(option_help(name).split()) in flat, name


def test_a_flag_wins_over_the_file_and_an_absent_flag_does_not(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"script": FAKE_JOB, "max_restarts": 5, "grace_period": 7, "prestart": False,
                                   "divergence_window": 11}))
    run_dir = tmp_path / "run"
    r = run_cli("--config", str(job), "--run-dir", str(run_dir), "--max-restarts", "2", "--prestart",
                env=sup_env(FAKE_STEPS="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    recorded = supervisor_state(run_dir)["config"]
    assert (recorded["max_restarts"], recorded["prestart"]) == (2, True)             # the flags
    assert (recorded["grace_period"], recorded["divergence_window"]) == (7.0, 11)    # the file's
    assert recorded["command"][:2] == [sys.executable, FAKE_JOB]


def test_the_docs_show_the_declared_options() -> None:
    # The CLI reference asks for the table, which the docs hook renders from options_table() at build time
    # (tests/docs/test_docs_site.py checks that every flag reaches the built site).
    assert "<!-- gen:run-options -->" in (REPO / "docs" / "reference" / "cli.md").read_text()
    gen_reference = load_generators()
    assert gen_reference.render("<!-- gen:run-options -->") == options_table()
