"""The docs site's tests; `gen_reference()` imports the build's generators (docs/gen_reference.py)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.conftest import REPO


def gen_reference() -> ModuleType:
    """docs/gen_reference.py, the mkdocs hook that renders the reference tables from the code."""
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "docs" / "gen_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
