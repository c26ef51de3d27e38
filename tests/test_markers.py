"""One marker, `long`, selects every long variant: `make test` = `-m "not long"`, `make test-faults` =
`-m long`. Long variants were once skipped by five different mechanisms, and some were silently never
run; these checks collect the suite the way the Makefile does (a real pytest in a subprocess) so that a
variant can neither escape the marker nor drop out of both selections."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.save_modes import MODES

# Parametrized by save mode: the variants `make test` runs. Every other variant of these tests is long;
# a new save-mode-parametrized test must be declared here (see test_every_save_mode_matrix_is_declared).
SHORT_VARIANTS = {
    # Every seed of the chaos campaign is long (~27 s each): make test's chaos is the async+memory one.
    "tests/faults/test_chaos_kill.py::test_chaos_sigkill_of_the_trainer_is_bit_exact": set(),
    "tests/faults/test_memory_snapshots.py::test_chaos_kill9_with_async_saves_and_memory_snapshots_is_bit_exact":
        {"async+memory-3"},
    # The seven-kill chain (sync-0-3-kills0, ~27 s) is long: the async+memory chaos, the kill-during-
    # save variants and every front end's two-kill chain cover its moments in `make test`.
    "tests/shim/test_resume_exact.py::test_sigkill_anywhere_resumes_bit_exact": {"sync-2-2-kills1"},
    "tests/shim/test_resume_exact.py::test_sigkill_during_save_resumes_bit_exact": {"sync-0", "async-0"},
    "tests/distributed/test_ddp.py::test_fast_saves_of_every_rank_survive_sigkill_bit_exact": {"memory"},
}
# Single long tests outside a long module (each used to skip unless an environment variable was set).
LONG_TESTS = {
    "tests/distributed/test_ddp.py::test_a_full_primary_root_sends_every_ranks_save_to_the_fallback_dir",
    "tests/faults/test_memory_snapshots.py::test_a_half_written_or_untrusted_slot_is_never_used[loose_mode]",
    "tests/faults/test_slot_memory.py::test_stale_slots_of_a_deleted_run_are_freed_by_the_next_run",
    # Three-kill chains across epoch ends (each front end's two-kill chain runs by default).
    "tests/integrations/test_chains.py::test_raw_loop_chain_of_three_kills_is_bit_exact",
    "tests/integrations/test_chains.py::test_hf_trainer_chain_of_three_kills_is_bit_exact",
    "tests/integrations/test_chains.py::test_lightning_chain_of_three_kills_is_bit_exact",
    # Each ~23-33 s, kept out of `make test` (25-minute limit) where a test there covers the same path.
    "tests/distributed/test_multinode.py::test_node_restarting_before_its_peer_rejoins_the_closed_rendezvous_without_spending_restarts",
    "tests/integrations/test_ranks.py::test_hf_trainer_two_ranks_kill9_of_rank_1_restarts_the_group_exact",
    "tests/deploy/test_slurm.py::test_multinode_script_on_one_node_stops_requeues_and_resumes_exact",
    "tests/deploy/test_slurm.py::test_scontrol_requeue_stops_with_a_checkpoint_and_the_rerun_resumes_exact",
    "tests/supervisor/test_warm_restart.py::test_warm_restart_matches_cold_and_is_bit_exact",
}
LONG_MODULES = re.compile(r"^tests/.*(_long|/test_soak)\.py::")


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
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "long", "tests"], plugins=[Report()]))
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


def _should_be_long(nodeid: str) -> bool:
    base, params = _split(nodeid)
    if LONG_MODULES.match(nodeid) or nodeid in LONG_TESTS or "kills10" in params.split("-"):
        return True
    return base in SHORT_VARIANTS and params not in SHORT_VARIANTS[base]


def test_long_and_short_selections_split_the_suite(selections):
    long_ids, short_ids = selections
    assert long_ids and short_ids
    assert not long_ids & short_ids


def test_every_long_variant_carries_the_marker(selections):
    long_ids, short_ids = selections
    escaped = sorted(i for i in short_ids if _should_be_long(i))
    assert not escaped, f"long variants that `make test` would run (mark them pytest.mark.long): {escaped}"
    unexpected = sorted(i for i in long_ids if not _should_be_long(i))
    assert not unexpected, f"marked long but not declared long here (update this file): {unexpected}"


def test_the_declared_short_variants_stay_in_make_test(selections):
    _, short_ids = selections
    declared = {f"{base}[{p}]" for base, ps in SHORT_VARIANTS.items() for p in ps}
    assert declared <= short_ids, sorted(declared - short_ids)


def test_every_long_module_and_seed_matrix_is_selected(selections):
    long_ids, _ = selections
    bases = {_split(i)[0] for i in long_ids}
    assert {"tests/faults/test_soak.py::test_chaos_soak",
            "tests/faults/test_learned_timeout_long.py::test_8s_saves_with_50ms_steps"} <= bases
    assert any(i.startswith("tests/faults/test_doctor_long.py::") for i in long_ids)
    for base in SHORT_VARIANTS:
        assert any(_split(i)[0] == base for i in long_ids), f"{base}: no long variant selected"


def test_every_save_mode_matrix_is_declared(selections):
    long_ids, short_ids = selections
    mode_tests = {_split(i)[0] for i in long_ids | short_ids if _split(i)[1].split("-")[0] in MODES}
    assert mode_tests <= set(SHORT_VARIANTS), sorted(mode_tests - set(SHORT_VARIANTS))


def test_no_other_mechanism_skips_long_variants():
    files = [*REPO.joinpath("tests").rglob("*.py"), REPO / "Makefile", REPO / "pyproject.toml"]
    old = [str(f.relative_to(REPO)) for f in files if f.name != "test_markers.py"
           and re.search(r"RRTEST_LONG_FAULTS|mark\.slow|long_only", f.read_text())]
    assert not old, old
