"""The supervisor's periodic duties: what must happen every few seconds, whatever the job does.

Feed the systemd watchdog, retry the journal writes that failed, rewrite the metrics textfile,
save what the timeout learner has learned, poll the mirror's uploads. Each is cheap when it is not
due, so the loop runs them on every turn, and so does every wait on a kill: a supervisor that
waits for a trainer to die is not hung, and the watchdog must not end it as if it were.
"""

from __future__ import annotations

import time
from typing import Optional

from trainer_shim.rundir import RunDir

from ..decisions.learned_timeout import TimeoutLearner
from ..mirror.mirror import Mirror
from ..process.attempts import Attempt
from .journal import History, Journal
from .metrics import collect, write_textfile
from .notify import Notifier
from .progress import CostCache

__all__ = ["PeriodicDuties", "METRICS_EVERY", "RETRY_WRITES_EVERY"]

METRICS_EVERY = 10.0
RETRY_WRITES_EVERY = 5.0


class PeriodicDuties:
    """The duties of `Supervisor._tick`. The loop's state (its attempt, its history) is passed to
    each call, not kept: the supervisor replaces its history once it holds the lock."""

    def __init__(self, rd: RunDir, notifier: Notifier, journal: Journal, learner: Optional[TimeoutLearner],
                 mirror: Mirror, metrics_dir: Optional[str]) -> None:
        self.rd = rd
        self.notifier = notifier
        self.journal = journal
        self.learner = learner
        self.mirror = mirror
        self.metrics_dir = metrics_dir
        self._costs = CostCache(rd)  # goodput, lost steps, recovery times for the metrics file
        self._last_metrics = 0.0
        self._last_retry = 0.0

    def tick(self, attempt: Optional[Attempt], history: History) -> None:
        now = time.monotonic()
        if self.notifier.watchdog_due(now):
            self.notifier.watchdog()
        if now - self._last_retry >= RETRY_WRITES_EVERY and self.journal.behind:
            self._last_retry = now
            self.journal.flush()
        if now - self._last_metrics >= METRICS_EVERY:
            self.write_metrics(attempt, history)
        if self.learner is not None:
            self.learner.save(now, force=attempt is None)
        self.mirror.poll()

    def write_metrics(self, attempt: Optional[Attempt], history: History) -> None:
        self._last_metrics = time.monotonic()
        snap = collect(self.rd, attempt.monitor if attempt else None,
                       attempts_total=history.attempts_total, failures=history.failures,
                       poisoned=history.poisoned, costs={**self._costs.get(), **self.mirror.metrics()})
        try:
            write_textfile(self.rd, snap, self.metrics_dir)
        except OSError as e:
            self.journal.warn(str(self.rd.metrics), e)
