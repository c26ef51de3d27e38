"""A trainer's death below a launcher: the launcher's exit code names the signal only when the
trainer's pid is really gone; then it is classified as a direct child's death would be."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from supervisor.decisions.classify import AttemptFacts, Kind, classify
from supervisor.process.below import DeathBelow, death_below, signal_of_exit

_DIE = "import os, signal, sys; print(os.getpid(), flush=True); os.kill(os.getpid(), signal.SIGKILL)"


@pytest.mark.parametrize("code, sig", [(137, 9), (247, 9), (143, 15), (241, 15), (134, 6), (139, 11),
                                       (0, None), (1, None), (75, None), (128, None), (200, None)])
def test_launcher_exit_codes_that_report_a_signal(code: int, sig) -> None:
    assert signal_of_exit(code) == sig


@pytest.mark.parametrize("launcher", ["shell", "python"])
def test_a_trainer_killed_below_a_launcher_is_named(launcher: str) -> None:
    if launcher == "shell":
        argv = ["sh", "-c", f"{sys.executable} -c '{_DIE}'; exit $?"]
    else:
        argv = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)",
                sys.executable, "-c", _DIE]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    trainer = int(p.stdout.split()[0])
    assert p.returncode == (137 if launcher == "shell" else 247)
    below = death_below(p.returncode, 12345, [trainer], {})
    assert below == DeathBelow(trainer, signal.SIGKILL, 12345)
    kind, evidence = classify(AttemptFacts(returncode=p.returncode, below=below))
    assert kind is Kind.SIGNAL and f"trainer pid {trainer} killed by SIGKILL below launcher pid 12345" in evidence
    kind, evidence = classify(AttemptFacts(returncode=p.returncode, below=below,
                                           oom_evidence=(f"Killed process {trainer} (python)",)))
    assert kind is Kind.OOM and f"trainer pid {trainer} killed by SIGKILL" in evidence


def test_an_exit_code_alone_is_no_death() -> None:
    # A launcher that exits 137 while its trainer (here: this process) lives: a crash, not a signal.
    assert death_below(137, 12345, [os.getpid()], {}) is None
    assert death_below(137, 12345, [], {}) is None
    kind, _ = classify(AttemptFacts(returncode=137))
    assert kind is Kind.CRASH
