"""One marker, `long`, selects every long variant: `make test` = `-m "not long"`, `make test-faults` =
`-m long`. Long variants were once skipped by five different mechanisms, and some were silently never
run. The marker is applied where the test is written (a long module's `pytestmark`, a matrix's
`pytest.param(..., marks=pytest.mark.long)`, a test's decorator); these checks hold no list of node
ids. They collect the suite the way the Makefile does (a real pytest in a subprocess) and assert rules
a new test cannot slip past:

  * the two selections split the suite;
  * a long module (`*_long.py`, the soak) marks itself, and each collects long tests;
  * a param id that names a long variant (`...-kills10`) is long;
  * a save-mode matrix has long variants and runs at most two variants in `make test`;
  * a single `pytest.mark.long` outside a long module says beside it why (what covers its path in
    `make test`), so that taking a test out of `make test` is a visible decision;
  * nothing but the marker skips a long variant.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.save_modes import MODES

# One worker runs this module (--dist loadgroup): its tests share one collection of the whole suite.
pytestmark = pytest.mark.xdist_group("test_markers")

LONG_MODULES = re.compile(r"^tests/.*(_long|/test_soak)\.py$")
# Param ids that say "long variant": ten kills of a chaos seed.
LONG_PARAM_TOKENS = {"kills10"}
# A save-mode matrix keeps a representative subset in `make test`, at most this many variants.
MAX_SHORT_SAVE_MODE_VARIANTS = 2

# One collection with `-m long`, as `make test-faults` selects: what it keeps is the long selection,
# what its -m deselects is exactly `-m "not long"` (make test). Collecting the suite costs ~10 s.
_COLLECT = """
import sys, pytest
class Report:
    def pytest_deselected(self, items):
        for item in items:
            print("short " + item.nodeid)
    def pytest_collection_finish(self, session):
        for item in session.items:
            print("long " + item.nodeid)
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "long", "tests"],
                     plugins=[Report()]))
"""


@pytest.fixture(scope="module")
def selections() -> tuple[set[str], set[str]]:
    """(ids of `-m long`, ids of `-m "not long"`), selected as the Makefile does."""
    p = subprocess.run([sys.executable, "-c", _COLLECT], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    picked: dict[str, set[str]] = {"long": set(), "short": set()}
    for line in p.stdout.splitlines():
        kind, _, nodeid = line.partition(" ")
        if kind in picked and "::" in nodeid:
            picked[kind].add(nodeid.strip())
    return picked["long"], picked["short"]


def _split(nodeid: str) -> tuple[str, str]:
    base, _, params = nodeid.partition("[")
    return base, params.rstrip("]")


def _module(nodeid: str) -> str:
    return nodeid.partition("::")[0]


def _save_mode_matrices(ids: set[str]) -> dict[str, set[str]]:
    """Test (base id) -> the ids of its variants, for every test parametrized by save mode."""
    out: dict[str, set[str]] = defaultdict(set)
    for i in ids:
        base, params = _split(i)
        if params.split("-")[0] in MODES:
            out[base].add(i)
    return out


def _long_module_files() -> list[Path]:
    return [f for f in REPO.joinpath("tests").rglob("test_*.py")
            if LONG_MODULES.match(str(f.relative_to(REPO)))]


def test_long_and_short_selections_split_the_suite(selections):
    long_ids, short_ids = selections
    assert long_ids and short_ids
    assert not long_ids & short_ids


def test_a_long_module_marks_itself_and_holds_only_long_tests(selections):
    long_ids, short_ids = selections
    files = _long_module_files()
    assert files
    unmarked = [str(f.relative_to(REPO)) for f in files
                if not re.search(r"^pytestmark = .*pytest\.mark\.long\b", f.read_text(), re.M)]
    assert not unmarked, f"a long module applies the marker to itself (pytestmark = pytest.mark.long): {unmarked}"
    escaped = sorted(i for i in short_ids if LONG_MODULES.match(_module(i)))
    assert not escaped, f"tests of long modules that `make test` would run: {escaped}"
    empty = [str(f.relative_to(REPO)) for f in files if not any(_module(i) == str(f.relative_to(REPO)) for i in long_ids)]
    assert not empty, f"long modules of which `make test-faults` collects nothing: {empty}"


def test_a_param_id_naming_a_long_variant_is_long(selections):
    _, short_ids = selections
    escaped = sorted(i for i in short_ids if LONG_PARAM_TOKENS & set(_split(i)[1].split("-")))
    assert not escaped, f"long variants that `make test` would run (mark them pytest.mark.long): {escaped}"


def test_every_save_mode_matrix_runs_long_and_a_subset_in_make_test(selections):
    long_ids, short_ids = selections
    matrices = _save_mode_matrices(long_ids | short_ids)
    assert matrices, "no save-mode matrix collected"
    for base, variants in sorted(matrices.items()):
        short = sorted(variants & short_ids)
        assert variants & long_ids, f"{base}: no variant in make test-faults"
        assert len(short) <= MAX_SHORT_SAVE_MODE_VARIANTS, (
            f"{base}: {len(short)} save-mode variants in make test (at most {MAX_SHORT_SAVE_MODE_VARIANTS}; "
            f"mark the others long): {short}")


def test_a_single_long_mark_says_why_beside_it():
    """Outside a long module (whose pytestmark is the reason) and the save-mode matrices (save_modes.modes),
    each `pytest.mark.long` has a comment on its line or the line above: what covers its path in make test."""
    silent = []
    for f in sorted(REPO.joinpath("tests").rglob("*.py")):
        rel = str(f.relative_to(REPO))
        if LONG_MODULES.match(rel) or f.name in ("test_markers.py", "save_modes.py"):
            continue
        lines = f.read_text().splitlines()
        for n, line in enumerate(lines):
            if "mark.long" in line and "#" not in line and not (n and lines[n - 1].lstrip().startswith("#")):
                silent.append(f"{rel}:{n + 1}")
    assert not silent, f"say why beside each of these long marks (a comment: what covers it in make test): {silent}"


def test_no_other_mechanism_skips_long_variants():
    files = [*REPO.joinpath("tests").rglob("*.py"), REPO / "Makefile", REPO / "pyproject.toml"]
    old = [str(f.relative_to(REPO)) for f in files if f.name != "test_markers.py"
           and re.search(r"RRTEST_LONG_FAULTS|mark\.slow|long_only", f.read_text())]
    assert not old, old
