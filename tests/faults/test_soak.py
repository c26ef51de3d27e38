"""Trial 11 (a `long` test only): a long chaos soak of kills, hangs and SIGTERM stops + reruns.

RRTEST_SOAK_SECONDS (default 900) and RRTEST_SOAK_KILLS (default 50) bound it from below:
rounds run until both are reached. Every round must end bit-exact with no leaked process, and
the checkpoint count never exceeds keep_last + keep_epochs + keep_best + 1.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from tests.supervisor.helpers import ended_kinds, heartbeat, kill_group, start_cli, sup_env, wait_until

from .common import TOY, Killer, assert_bit_exact, killer_config, assert_no_survivors, checkpoint_steps, current_trainer, reference

pytestmark = pytest.mark.long

JOB = ("--hidden", "256", "--samples", "400", "--batch-size", "4", "--epochs", "3", "--save-every", "10",
       "--step-sleep", "0.01", "--keep-last", "3")
BOUND = 3 + 10 + 1 + 1  # keep_last + keep_epochs (shim default) + keep_best (default) + 1 in flight
SUP = ("--backoff", "0", "--heartbeat-timeout", "2", "--grace-period", "2")


def test_chaos_soak(tmp_path):
    seconds = float(os.environ.get("RRTEST_SOAK_SECONDS", "900"))
    want_kills = int(os.environ.get("RRTEST_SOAK_KILLS", "50"))
    seed = int(os.environ.get("RRTEST_SOAK_SEED", str(int(time.time()))))
    print(f"soak seed {seed}")
    rng = random.Random(seed)
    ref = reference(tmp_path, *JOB)
    t0, kills, rounds, stops = time.monotonic(), 0, 0, 0
    while kills < want_kills or time.monotonic() - t0 < seconds:
        rounds += 1
        run_dir, out = tmp_path / f"run-{rounds}", tmp_path / f"weights-{rounds}.pt"
        faults = f"{rng.randint(2, 4)}:hang@{rng.randint(20, 280)}"
        env = sup_env(TOY_FAULTS=faults)
        most = [0]
        done = threading.Event()

        def count_checkpoints() -> None:
            while not done.is_set():
                try:
                    most[0] = max(most[0], len(checkpoint_steps(run_dir)))
                except OSError:
                    pass
                time.sleep(0.05)

        counter = threading.Thread(target=count_checkpoints, daemon=True)
        counter.start()
        stop_it = rng.random() < 0.4
        n_kills = rng.randint(3, 6)
        args = ("--run-dir", str(run_dir), *killer_config(run_dir, n_kills), *SUP, TOY, *JOB, "--out", str(out))
        p = start_cli(*args, env=env)
        killer = Killer(run_dir, rng.randrange(1 << 30), n_kills, p)
        killer.start()
        try:
            if stop_it:
                killer.join(240)
                # Stop while an attempt is training (not between attempts), so a preempt save runs.
                wait_until(lambda: p.poll() is not None or (
                    (t := current_trainer(run_dir)) is not None and (heartbeat(run_dir) or {}).get("pid") == t.pid
                    and (heartbeat(run_dir) or {}).get("phase") == "training"), timeout=60, what="a training attempt")
                if p.poll() is None:
                    stops += 1
                    p.send_signal(signal.SIGTERM)
                    assert p.wait(60) == 75, f"round {rounds}: SIGTERM did not exit 75"
                    p = start_cli(*args, env=env)
            rc = p.wait(300)
            killer.stop()
            killer.join(10)
        finally:
            kill_group(p)
            done.set()
            counter.join(5)
        assert killer.error is None, killer.error
        kills += len(killer.log)
        kinds = ended_kinds(run_dir)
        assert rc == 0, f"round {rounds} (seed {seed}): exit {rc}, kinds {kinds}"
        assert kinds[-1] == "success" and set(kinds) <= {"signal", "hang", "preempted", "success"}, kinds
        assert_bit_exact(out, ref)
        assert_no_survivors(run_dir, str(out))
        assert most[0] <= BOUND, f"round {rounds}: {most[0]} checkpoints on disk (bound {BOUND})"
        print(f"round {rounds}: kills {len(killer.log)} (total {kills}), kinds {kinds}, max ckpts {most[0]}")
    print(f"soak: {rounds} rounds, {kills} kills, {stops} stops in {time.monotonic() - t0:.0f}s, all bit-exact")
