"""The docs' per-command exit-code table (docs/reference/exit-codes.md) against the code they describe, so neither can change without the other.

- The exit-code table lists every code of trainer_shim.rundir.exits under its name and value, and
  every code a command's own code returns.
- Every command's --help renders every parameter's help as written (typer reads help as rich
  markup: `[s3]` vanished from run's --help, and `[/step-N]` made export's --help crash).
"""

from __future__ import annotations

import ast
from pathlib import Path

import typer

from supervisor import cli
from tests.conftest import REPO
from tests.support import invoke_cli
from trainer_shim.rundir import exits

EXIT_PAGE = (REPO / "docs" / "reference" / "exit-codes.md").read_text()
EXIT_HEADER = "| command | exit | name | meaning |"

# Where a command's exit codes are decided besides its typer function (which calls into these).
COMMAND_SOURCES = {
    "run": ["supervisor/agent.py"],
    "stop": ["supervisor/process/stopping.py"],
    "doctor": ["supervisor/insight/doctor.py"],
    "drill": ["supervisor/insight/drill.py"],
}
CLI_MODULES = ["supervisor/cli.py", "supervisor/cli_insight.py", "supervisor/cli_slots.py"]


def table_rows(header: str) -> list[list[str]]:
    """The cells of the exit-code page's table under `header` (backticks stripped), one list per row."""
    lines = EXIT_PAGE.splitlines()
    start = lines.index(header) + 2   # past the header and its |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().strip("`") for c in line.strip().strip("|").split("|")])
    return rows


EXIT_ROWS = [(command, int(code), name) for command, code, name, _ in table_rows(EXIT_HEADER)]


def exit_names(source: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name) and n.id in exits.__all__}


def command_functions() -> dict[str, str]:
    """Command name -> the source of its typer function (the function's name, or `<name>_cmd`)."""
    out = {}
    for rel in CLI_MODULES:
        source = (REPO / rel).read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name.removesuffix("_cmd") in cli.COMMANDS:
                out[node.name.removesuffix("_cmd")] = ast.get_source_segment(source, node) or ""
    return out


def test_every_exit_code_is_in_the_table_under_its_name_and_value() -> None:
    assert {name for _, _, name in EXIT_ROWS} == set(exits.__all__)
    wrong = [(c, code, name) for c, code, name in EXIT_ROWS if getattr(exits, name) != code]
    assert wrong == [], "docs/reference/exit-codes.md's table disagrees with trainer_shim/rundir/exits.py"


def test_no_command_gives_one_code_two_meanings() -> None:
    pairs = [(c, code) for c, code, _ in EXIT_ROWS]
    assert sorted(p for p in set(pairs) if pairs.count(p) > 1) == []


def test_every_command_and_every_code_it_returns_is_in_the_table() -> None:
    functions = command_functions()
    assert set(functions) == set(cli.COMMANDS)
    for command in cli.COMMANDS:
        sources = [functions[command], *((REPO / p).read_text() for p in COMMAND_SOURCES.get(command, []))]
        documented = {code for c, code, _ in EXIT_ROWS if c == command}
        returned = {getattr(exits, n) for s in sources for n in exit_names(s)} | {exits.EXIT_OK, exits.EXIT_USAGE}
        assert returned <= documented, (command, sorted(returned - documented))


def test_the_table_check_reads_what_it_checks() -> None:
    # A parser that read nothing would pass every test above.
    assert len(EXIT_ROWS) >= len(exits.__all__) and {"run", "status", "checkpoints"} <= {c for c, _, _ in EXIT_ROWS}
    assert exit_names("raise typer.Exit(EXIT_UNHEALTHY if x else EXIT_OK)") == {"EXIT_UNHEALTHY", "EXIT_OK"}
    assert "EXIT_UNHEALTHY" in command_functions()["status"]
    assert "stop_run(" in command_functions()["stop"]


def test_every_commands_help_shows_every_help_text_as_written() -> None:
    group = typer.main.get_command(cli.app)
    for name in cli.COMMANDS:
        r = invoke_cli(name, "--help")
        assert r.returncode == 0, (name, r.stderr[-2000:])
        flat = "".join(r.stdout.replace("│", " ").split())   # rich wraps lines inside its boxes
        for p in group.commands[name].params:
            text = getattr(p, "help", None)
            if text:
                plain = text.replace("\\[", "[")   # what rich shows for an escaped bracket
                assert "".join(plain.split()) in flat, (name, p.name, plain)


def test_version_is_the_installed_distributions() -> None:
    from importlib import metadata

    from tests.support import run_cli

    r = run_cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"resilient-run {metadata.version('resilient-run')}"
