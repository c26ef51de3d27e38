"""Import boundaries of the design, checked by reading every module's imports with `ast`.

- The supervisor talks to the trainer only through the run-dir contract: from trainer_shim it
  imports trainer_shim.rundir and nothing else.
- The contract imports nothing above itself (no other trainer_shim module, no supervisor).
- No supervisor module imports torch, and none pulls it in indirectly: each is also imported in
  a fresh interpreter that must end without `torch` in sys.modules.
- No supervisor module reads another object's underscore name that the project itself defines
  (`obj._x`, where `_x` is bound somewhere in supervisor/ or trainer_shim/): a private name is its
  owner's to change. A library's documented internal (os._exit) is not the project's, so it passes.
  (tests/shim/test_module_boundaries.py holds trainer_shim to the same rule.)
- No import circles among the imports of the supervisor and of the contract, wherever they stand:
  a function-level import (done late to keep a command quick) is still a dependency, and imports
  under `if TYPE_CHECKING` count too: a module that names another's type depends on it as much as
  one that calls it. (tests/shim/test_module_boundaries.py checks the whole shim.)

Modules are found by walking the source tree, not listed by hand, so a new module is checked
without anyone remembering to add it here.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, child_env

SHIM, SUPERVISOR = "trainer_shim", "supervisor"
CONTRACT = f"{SHIM}.rundir"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((REPO / package).rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module name an ImportFrom reads from."""
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imported(module: str, path: Path, *, top_level_only: bool = False, known: frozenset[str] = frozenset()) -> Iterator[str]:
    """Every module name `module` imports (a `from pkg import name` yields pkg.name too: it may
    be a submodule). With top_level_only, only the module-level ones (under `if`, `try` and
    `with` too, `if TYPE_CHECKING` included), not those inside functions. A `from pkg import sub`
    of a `known` submodule yields only the submodule: the package is the parent, already loading."""
    tree = ast.parse(path.read_text(), str(path))
    todo: list[ast.AST] = list(tree.body) if top_level_only else [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            subs = [f"{base}.{a.name}" for a in node.names if a.name != "*"]
            if not subs or not all(n in known for n in subs):
                yield base
            yield from subs
        if top_level_only:
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                todo += [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
                todo += [s for h in getattr(node, "handlers", []) for s in h.body]
        else:
            todo += list(ast.iter_child_nodes(node))


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


SUPERVISOR_MODULES = modules_of(SUPERVISOR)
CONTRACT_MODULES = {m: p for m, p in modules_of(SHIM).items() if _within(m, CONTRACT)}


def test_the_walk_finds_the_packages() -> None:
    assert {"supervisor.agent", "supervisor.cli", "supervisor"} <= set(SUPERVISOR_MODULES)
    assert {"trainer_shim.rundir", "trainer_shim.rundir.records"} <= set(CONTRACT_MODULES)


def shim_imports_outside_the_contract(path: Path) -> list[str]:
    """What a supervisor module imports from trainer_shim beyond trainer_shim.rundir (anywhere in it)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if _within(a.name, SHIM) and not _within(a.name, CONTRACT)]
        elif isinstance(node, ast.ImportFrom) and not node.level and _within(node.module or "", SHIM):
            if node.module == SHIM:   # `from trainer_shim import rundir` is the contract; any other name is not
                bad += [f"{SHIM}.{a.name}" for a in node.names if a.name != "rundir"]
            elif not _within(node.module or "", CONTRACT):
                bad.append(node.module or "")
    return bad


@pytest.mark.parametrize("module", sorted(SUPERVISOR_MODULES))
def test_supervisor_imports_only_the_contract_of_the_shim(module: str) -> None:
    bad = shim_imports_outside_the_contract(SUPERVISOR_MODULES[module])
    assert not bad, f"{module} imports {bad} (only {CONTRACT} is allowed)"


@pytest.mark.parametrize("module", sorted(SUPERVISOR_MODULES) + sorted(CONTRACT_MODULES))
def test_no_torch_import(module: str) -> None:
    path = SUPERVISOR_MODULES.get(module) or CONTRACT_MODULES[module]
    assert not [n for n in imported(module, path) if _within(n, "torch")], f"{module} imports torch"


@pytest.mark.parametrize("module", sorted(CONTRACT_MODULES))
def test_the_contract_imports_nothing_above_itself(module: str) -> None:
    names = set(imported(module, CONTRACT_MODULES[module]))
    above = sorted(n for n in names if (_within(n, SHIM) and not _within(n, CONTRACT)) or _within(n, SUPERVISOR))
    assert not above, f"{module} imports {above}"


@pytest.mark.parametrize("module", sorted(m for m in SUPERVISOR_MODULES if not m.endswith(".__main__")))
def test_importing_a_supervisor_module_does_not_load_torch(module: str) -> None:
    # (`__main__` is left out: importing it runs the CLI; it imports only supervisor.cli, checked here.)
    # A fresh interpreter per module: an indirect import (through a dependency) shows here only.
    code = f"import sys, {module}; sys.exit(3 if 'torch' in sys.modules else 0)"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(PYTHONPATH=str(REPO)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 3, f"importing {module} loads torch"
    assert r.returncode == 0, r.stderr[-2000:]


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at module level or in a function)."""
    mods = modules_of(package)
    known = frozenset(mods)
    return {m: {n for n in imported(m, p, top_level_only=False, known=known) if n in mods and n != m}
            for m, p in mods.items()}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.add(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def test_circle_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_supervisor() -> None:
    assert circles(import_graph(SUPERVISOR)) == []


def test_no_import_circle_in_the_contract() -> None:
    graph = {m: deps for m, deps in import_graph(SHIM).items() if _within(m, CONTRACT)}
    assert circles(graph) == []


def private_names(paths: list[Path]) -> frozenset[str]:
    """Every underscore name the code at `paths` binds: functions, classes, globals, fields, attributes."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


def foreign_private_reads(path: Path, private: frozenset[str]) -> list[str]:
    """`file:line: expr` for each read of a project-defined underscore attribute off anything but self/cls."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in private:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                out.append(f"{path.relative_to(REPO) if REPO in path.parents else path}:{node.lineno}: {ast.unparse(node)}")
    return out


PROJECT_PRIVATE = private_names([*SUPERVISOR_MODULES.values(), *modules_of(SHIM).values()])


def test_no_supervisor_module_reads_another_objects_private_names() -> None:
    found = [hit for path in SUPERVISOR_MODULES.values() for hit in foreign_private_reads(path, PROJECT_PRIVATE)]
    assert found == []


def test_the_private_read_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nclass A:\n    def _x(self):\n        return self._x, os._exit\n"
                   "def f(a):\n    return a._x\n")
    assert [line.split(": ")[1] for line in foreign_private_reads(bad, private_names([bad]))] == ["a._x"]
    assert "_exit" not in PROJECT_PRIVATE and {"_validate", "_PARSERS"} <= PROJECT_PRIVATE
