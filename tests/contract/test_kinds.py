"""Failure kinds: one Enum in the contract, the same values everywhere, each documented in the
docs' failure-kinds table (a kind a user meets in `status` or in RESILIENT_LAST_FAILURE must be looked up)."""

from __future__ import annotations

import re

from tests.conftest import REPO
from trainer_shim.rundir import Kind


def documented_kinds() -> list[str]:
    """The first column of the failure-kinds page's own table (the table under "Failure kinds.")."""
    text = (REPO / "docs" / "reference" / "failure-kinds.md").read_text()
    start = text.index("**Failure kinds.**")
    table = text[start:].split("\n\n")[1]
    return re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.M)


def test_every_kind_is_in_the_docs_table_and_nothing_else() -> None:
    documented = documented_kinds()
    assert sorted(documented) == sorted(k.value for k in Kind)
    assert len(documented) == len(set(documented))


def test_the_supervisor_uses_the_contract_kind() -> None:
    from supervisor.decisions.classify import Kind as ClassifyKind
    from supervisor.decisions.failure_policy import POLICY_KINDS

    assert ClassifyKind is Kind
    assert set(POLICY_KINDS) == {k.value for k in Kind} - {Kind.SUCCESS.value}


def test_kind_values_are_stable() -> None:
    # They are written to events.jsonl and read back by later supervisors: renaming one breaks old run dirs.
    assert {k.name: k.value for k in Kind} == {
        "SUCCESS": "success", "PREEMPTED": "preempted", "OOM": "oom", "CUDA_OOM": "cuda_oom", "HANG": "hang",
        "STARTUP_TIMEOUT": "startup_timeout", "CRASH": "crash", "SIGNAL": "signal", "RENDEZVOUS": "rendezvous",
        "DIVERGED": "diverged"}
