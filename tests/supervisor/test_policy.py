"""Restart decisions on plain data: what a rendezvous failure costs (nothing, within its window)."""

from __future__ import annotations

from supervisor.decisions.classify import AttemptFacts, Kind, classify
from supervisor.process.launch import ProcessFailure
from supervisor.process.launch import RendezvousFailure, parse_rendezvous_failure
from supervisor.decisions.policy import Action, RestartPolicy

CKPT = "/run/checkpoints/step-00000008"


def _policy(**kw) -> RestartPolicy:
    args = dict(max_restarts=1, backoff=0.0, backoff_max=60.0, no_restart_exit_codes=(), crash_loop_attempts=2,
                rendezvous_window=100.0)
    args.update(kw)
    return RestartPolicy(**args)


def _rendezvous(p: RestartPolicy, now: float):
    return p.decide(Kind.RENDEZVOUS, 1, progressed=False, resumed_from=CKPT, stop_requested=False, now=now)


def test_rendezvous_failures_within_the_window_spend_no_restart_and_never_poison():
    p = _policy()
    delays = [_rendezvous(p, now=t) for t in (0.0, 1.5, 4.0, 9.0, 17.5, 99.0)]
    assert [d.action for d in delays] == [Action.RESTART] * 6
    assert [d.delay_s for d in delays] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert all(d.poison == () and not d.crash_loop for d in delays) and p.restarts == 0
    # The job's one restart is still there for a real failure, which also ends the run of retries.
    crash = p.decide(Kind.CRASH, 1, progressed=False, resumed_from=CKPT, stop_requested=False, now=100.0)
    assert crash.action is Action.RESTART and p.restarts == 1
    assert _rendezvous(p, now=101.0).delay_s == 1.0


def test_rendezvous_failing_past_the_window_counts_but_does_not_condemn_the_checkpoint():
    p = _policy(max_restarts=3)
    assert _rendezvous(p, now=0.0).action is Action.RESTART and p.restarts == 0
    late = [_rendezvous(p, now=t) for t in (101.0, 102.0, 103.0)]
    assert [d.action for d in late] == [Action.RESTART] * 3 and p.restarts == 3
    assert all(d.poison == () and not d.crash_loop for d in late)  # crash_loop_attempts=2 would have condemned it
    gave_up = _rendezvous(p, now=104.0)
    assert gave_up.action is Action.GIVE_UP and "restarts exhausted" in gave_up.reason


def test_torchruns_closed_rendezvous_is_recognised_only_when_no_rank_failed():
    tail = ["    raise RendezvousClosedError",
            "torch.distributed.elastic.rendezvous.api.RendezvousClosedError"]
    closed = parse_rendezvous_failure(tail)
    assert closed == RendezvousFailure("RendezvousClosedError") and closed.closed
    timeout = parse_rendezvous_failure(["torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: "
                                        "The node 'x' has failed to join"])
    assert timeout == RendezvousFailure("RendezvousTimeoutError", "The node 'x' has failed to join")
    assert not timeout.closed
    assert parse_rendezvous_failure(["Traceback", "RuntimeError: boom"]) is None
    kind, evidence = classify(AttemptFacts(returncode=1, rendezvous_error=closed))
    assert kind is Kind.RENDEZVOUS and "another node's previous attempt had not ended yet" in evidence
    assert "torchrun could not join its peers: RendezvousClosedError" in evidence
    kind, _ = classify(AttemptFacts(returncode=1, rendezvous_error=closed,
                                    rank_failures=(ProcessFailure(rank=1, pid=7, exitcode=1),)))
    assert kind is Kind.CRASH
