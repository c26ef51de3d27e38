"""The contract's names are spelled once: outside trainer_shim/rundir no code restates an event
name, a RESILIENT_* variable or an exit code as a literal (a second spelling is how they drift).

The scan reads the product packages (supervisor/, trainer_shim/) with `ast`, so comments and
docstrings, which name these things for the reader, do not count. Nothing is allow-listed.
Tests, examples and benchmarks are not scanned: their jobs stand in for users' scripts, which read
and set the variables by their documented names.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from trainer_shim.rundir import Event

CONTRACT = REPO / "trainer_shim" / "rundir"
PACKAGES = ("supervisor", "trainer_shim")
EVENT_NAMES = frozenset(e.value for e in Event)
ENV_NAME = re.compile(r"^RESILIENT_[A-Z0-9_]+$")
# Calls whose first argument is a process exit status, and the keyword that carries one.
EXIT_CALLS = frozenset({"sys.exit", "os._exit", "typer.Exit", "SystemExit", "exit", "Exit"})
EXIT_KEYWORD = "exit_code"


def product_sources() -> list[Path]:
    out = []
    for pkg in PACKAGES:
        out += [p for p in sorted((REPO / pkg).rglob("*.py")) if CONTRACT not in p.parents]
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings (of the module, classes and functions)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return func.id if isinstance(func, ast.Name) else ""


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _exit_literals(tree: ast.AST) -> Iterator[ast.AST]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if _call_name(node.func) in EXIT_CALLS and node.args and _is_int(node.args[0]):
                yield node
            yield from (kw.value for kw in node.keywords if kw.arg == EXIT_KEYWORD and _is_int(kw.value))
        elif isinstance(node, ast.Assign) and _is_int(node.value):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if any(n == EXIT_KEYWORD or n.startswith("EXIT_") for n in names):
                yield node   # a second definition of an exit code


def findings(path: Path) -> list[str]:
    """One line per literal, `file:line: what`, in line order."""
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    where = path.relative_to(REPO) if REPO in path.parents else path
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value in EVENT_NAMES:
                out.append((node.lineno, f"event name {node.value!r}; use Event"))
            elif ENV_NAME.match(node.value):
                out.append((node.lineno, f"env name {node.value!r}; use rundir.env / RunEnv"))
    out += [(node.lineno, "exit code literal; use rundir.exits") for node in _exit_literals(tree)]
    return [f"{where}:{line}: {what}" for line, what in sorted(out)]


def test_the_scan_covers_the_product() -> None:
    files = product_sources()
    assert len(files) > 40 and not any(CONTRACT in p.parents for p in files)


@pytest.mark.parametrize("path", product_sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_contract_literal_outside_the_contract(path: Path) -> None:
    assert findings(path) == []


# "issue" or "ticket" and a number (any case, space, dash or #): one of the project's own tickets,
# which says nothing to a reader without the tracker. Upstream references such as
# pytorch#144657 name where a workaround comes from and stay.
TICKET = re.compile(r"\b(issue|ticket)s?[ _-]?#?\d+", re.I)


def test_no_ticket_numbers_in_code_docstrings_or_test_names() -> None:
    files = [*product_sources(), *(REPO / "trainer_shim" / "rundir").glob("*.py"), *(REPO / "tests").rglob("*.py")]
    hits = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in files
            for n, line in enumerate(p.read_text().splitlines(), 1) if TICKET.search(line)]
    assert hits == []


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    # The rule itself, on a file that breaks each part of it once (a scan that finds nothing proves nothing).
    bad = tmp_path / "bad.py"
    bad.write_text('"""gave_up: a docstring may name it."""\nimport os, sys, typer\n'
                   'EXIT_FOO = 3\nos.environ.get("RESILIENT_RUN_DIR")\nemit("gave_up")\nsys.exit(2)\n'
                   'os._exit(65)\nraise typer.Exit(1)\nraise SystemExit(1)\nf(exit_code=75)\nsys.exit(EXIT_FOO)\n')
    got = findings(bad)
    assert [int(line.split(":")[1]) for line in got] == [3, 4, 5, 6, 7, 8, 9, 10], got
