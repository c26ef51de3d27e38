"""Module boundaries of trainer_shim: no module reads another object's underscore attributes,
and the engine's modules never import the loop API (`run`) back."""

from __future__ import annotations

import ast
from pathlib import Path

import trainer_shim

SHIM = Path(trainer_shim.__file__).parent

# Documented or long-stable internals of the libraries the shim works with, not of the shim.
LIBRARY_INTERNALS = {
    "_exit",            # os._exit
    "_getframe",        # sys._getframe
    "_value_",          # enum members
    "_metadata",        # torch state_dict's version metadata, kept through copies
    "_version",         # torch.Tensor._version: the in-place change counter
    "_inst",            # random._inst: the module-level Random
    "_rand",            # numpy.random.mtrand._rand: the legacy global RandomState
    "_BatchNorm",       # torch.nn.modules.batchnorm._BatchNorm: every BatchNorm's base
    "_data_source",     # Lightning's fit_loop._data_source: the train dataloader source
    "_data_connector",  # Lightning's trainer._data_connector ...
    "_prepare_dataloader",  # ... ._prepare_dataloader: how Lightning itself injects a DistributedSampler
    "_call_callback_hooks",         # lightning.pytorch.trainer.call: the trainer's own hook dispatch,
    "_call_lightning_module_hook",  # used to replay the epoch-start hooks Lightning skips on a resume
}


def _private_reads(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if node.attr in LIBRARY_INTERNALS:
            continue
        out.append(f"{path.relative_to(SHIM)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_module_reads_another_objects_private_attributes() -> None:
    found = [hit for p in sorted(SHIM.rglob("*.py")) for hit in _private_reads(p)]
    assert found == []


def test_only_the_launchers_import_the_loop_api() -> None:
    """The engine's rooms never import the loop API back: dependencies flow one way, loop -> engine.
    (The warm interpreter of _launch preloads it; the package __init__ exports it lazily.)"""
    importers = {mod for mod, deps in _graph().items() for d in deps if d.startswith("trainer_shim._loop")
                 and mod != "trainer_shim" and not mod.startswith(("trainer_shim._loop", "trainer_shim._launch"))}
    assert importers == set()


def _graph() -> dict[str, set[str]]:
    """trainer_shim module -> the trainer_shim modules it imports (module level, in functions, or for typing)."""
    mods = {".".join(p.relative_to(SHIM.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in SHIM.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join(pkg.split(".")[:len(pkg.split(".")) - node.level + 1] + [node.module or ""]).rstrip(".")
                deps.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods)
                if node.module and base in mods:
                    deps.add(base)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
        graph[mod] = deps - {mod}
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return False


def test_no_import_circle_inside_trainer_shim() -> None:
    graph = _graph()
    circles = {frozenset({a, b}) for a in graph for b in graph[a] if _reaches(graph, b, a)}
    assert circles == set()


def test_the_rooms_are_layered() -> None:
    """Room level (rundir, _state, _disk, _loop, ...): no two rooms import each other, even through other
    rooms, so the tree reads top-down: the loop and the integrations over the engine over the contract."""
    def room(mod: str) -> str:
        parts = mod.split(".")
        return parts[1] if len(parts) > 1 else parts[0]
    rooms: dict[str, set[str]] = {}
    for mod, deps in _graph().items():
        rooms.setdefault(room(mod), set()).update(room(d) for d in deps if room(d) != room(mod))
    rooms.pop("trainer_shim", None)   # the package __init__ re-exports the public API from the rooms
    circles = {frozenset({a, b}) for a in rooms for b in rooms[a] if _reaches(rooms, b, a)}
    assert circles == set()


def _run_attribute_writes(path: Path) -> list[str]:
    """Assignments (plain, augmented, annotated, del) to `run.X` or `self.run.X`: a Run's own attributes."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                if isinstance(t, ast.Attribute) and ast.unparse(t.value) in ("run", "self.run"):
                    out.append(f"{path.relative_to(SHIM)}:{node.lineno}: {ast.unparse(t)}")
    return out


def test_nothing_outside_the_loop_api_writes_into_a_run() -> None:
    """The engine returns what it found (a restore's position, a tuned interval, a background commit)
    and the Run applies it: a Run's attributes have one writer, `_loop`."""
    found = [hit for p in sorted(SHIM.rglob("*.py")) if p.relative_to(SHIM).parts[0] != "_loop"
             for hit in _run_attribute_writes(p)]
    assert found == []
