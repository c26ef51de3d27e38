"""Every package's __init__ maps its modules, and every module of a subpackage imports."""
import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent for top in ("supervisor", "trainer_shim") for p in (ROOT / top).rglob("__init__.py")
                  if "__pycache__" not in p.parts)


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _members(pkg: Path) -> list[str]:
    mods = [p.stem for p in pkg.glob("*.py") if p.stem not in ("__init__", "__main__")]
    return sorted(mods + [p.name for p in pkg.iterdir() if (p / "__init__.py").exists()])


@pytest.mark.parametrize("pkg", PACKAGES, ids=_dotted)
def test_package_docstring_names_each_module(pkg):
    doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or ""
    missing = [m for m in _members(pkg) if m not in {w.strip(".,;:()`/") for w in doc.split()}]
    assert not missing, f"{_dotted(pkg)}/__init__.py does not map {missing}"


SUBMODULES = sorted(_dotted(p) for pkg in PACKAGES if pkg.parent.name in ("supervisor", "trainer_shim")
                    for p in pkg.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", SUBMODULES)
def test_subpackage_module_imports(name):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:  # an optional framework (transformers, lightning) not installed
        if (e.name or "").split(".")[0] in ("supervisor", "trainer_shim"):
            raise
        pytest.skip(f"optional dependency {e.name} is not installed")


def test_the_docs_layout_names_every_room() -> None:
    """The docs' "Where the code lives" lists every subpackage of supervisor/ and trainer_shim/."""
    block = (ROOT / "docs" / "explanation" / "code-map.md").read_text()
    listed = {line.split()[0] for line in block.splitlines() if line.startswith("  ") and line.split()[0].endswith("/")}
    rooms = {f"{p.name}/" for p in PACKAGES if p.parent.name in ("supervisor", "trainer_shim")}
    assert rooms - listed == set()
