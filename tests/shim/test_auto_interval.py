"""Auto save interval: Young/Daly on a simulated Poisson failure trace vs a sweep of fixed intervals."""

from __future__ import annotations

import random

import pytest

from trainer_shim._policies.save_interval import (
    MAX_INTERVAL_S, MIN_INTERVAL_S, AutoInterval, mtbf_from_events, young_daly,
)


def wasted(interval: float, cost: float, failures: list[float], work: float) -> float:
    """Save overhead + lost work to finish `work` seconds of training, failures at the given wall-clock gaps.

    Training runs in segments of `interval` followed by a save of `cost`; a failure loses what was
    done since the last completed save (a save cut short is lost too). Restart time is not counted
    (the same for every interval).
    """
    done, waste, gaps = 0.0, 0.0, iter(failures)
    to_fail = next(gaps)
    while done < work:
        seg = min(interval, work - done)
        need = seg + cost
        if to_fail >= need:
            to_fail -= need
            done += seg
            waste += cost
        else:
            waste += to_fail
            to_fail = next(gaps)
    return waste


@pytest.mark.parametrize("mtbf, cost", [(3600.0, 20.0), (8 * 3600.0, 120.0), (1800.0, 5.0)])
def test_young_daly_within_10_percent_of_the_best_fixed_interval(mtbf, cost):
    rng = random.Random(16)
    failures = [rng.expovariate(1.0 / mtbf) for _ in range(20000)]   # one trace for every interval
    work = 400 * mtbf
    sweep = {t: wasted(t, cost, failures, work) for t in [mtbf * f for f in (
        0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5)]}
    best = min(sweep.values())
    auto = wasted(young_daly(cost, mtbf), cost, failures, work)
    assert auto <= 1.10 * best, (auto, best, sweep)


def test_clamps_and_recomputes_as_cost_and_mtbf_change():
    assert young_daly(0.01, 3600) == MIN_INTERVAL_S and young_daly(3600, 10 * 86400) == MAX_INTERVAL_S
    a = AutoInterval(mtbf_s=3600)
    assert a.interval_s == MIN_INTERVAL_S          # before the first save: save early to measure C
    assert a.observe_save(20) == pytest.approx(379.47, rel=1e-3)
    assert a.observe_save(20) == pytest.approx(379.47, rel=1e-3)
    assert a.observe_mtbf(4 * 3600) == pytest.approx(2 * 379.47, rel=1e-3)


def test_mtbf_from_the_run_dirs_events():
    def ev(name, attempt, t, **kw):
        return {"event": name, "attempt": attempt, "time": f"2026-01-01T{t}+00:00", **kw}
    none = [ev("attempt_started", 1, "00:00:00"), ev("attempt_ended", 1, "01:00:00", kind="success")]
    assert mtbf_from_events(none, default_hours=24) == 24 * 3600
    hist = [ev("attempt_started", 1, "00:00:00"), ev("attempt_ended", 1, "01:00:00", kind="oom"),
            ev("attempt_started", 2, "01:00:05"), ev("attempt_ended", 2, "02:00:05", kind="preempted"),
            ev("attempt_started", 3, "02:00:10"), ev("attempt_ended", 3, "03:00:10", kind="hang")]
    assert mtbf_from_events(hist) == pytest.approx(3 * 3600 / 2)


def test_init_auto_uses_the_run_dirs_mtbf_and_the_measured_save(tmp_path):
    """A real shim process: MTBF from the run dir's history, C from its own save, interval in the heartbeat."""
    import json

    hist = [("attempt_started", 1, "00:00:00", {}), ("attempt_ended", 1, "01:00:00", {"kind": "oom"}),
            ("attempt_started", 2, "01:00:00", {}), ("attempt_ended", 2, "02:00:00", {"kind": "hang"})]
    rd = _run_dir_with_history(tmp_path, hist)
    code = (
        "import json, torch, trainer_shim\n"
        "m = torch.nn.Linear(512, 512); o = torch.optim.Adam(m.parameters())\n"
        f"run = trainer_shim.init(model=m, optimizer=o, run_dir={str(rd)!r}, save_every_seconds='auto')\n"
        "before = run.save_every_seconds\n"
        "run.save()\n"
        "print(json.dumps([before, run.save_every_seconds, run.engine.auto.save_cost_s]))\n"
        "run.finish()\n"
    )
    stdout = _run_shim(code)
    before, after, cost = json.loads(stdout[-1])
    assert before == MIN_INTERVAL_S and cost > 0
    assert after == pytest.approx(young_daly(cost, 3600.0))     # 2 h of attempts, 2 failures
    hb = json.loads((rd / "heartbeats" / "rank-0.json").read_text())
    assert hb["save_interval_s"] == pytest.approx(after, abs=1e-3)


def test_memory_auto_is_young_daly_capped_at_its_share_of_training_time():
    from trainer_shim._policies.memory_interval import BUDGET, AutoMemory, memory_interval_s

    assert memory_interval_s(0.04, 24 * 3600) == pytest.approx(0.04 / BUDGET)    # rare failures: the cap
    assert memory_interval_s(0.04, 10) == pytest.approx((2 * 0.04 * 10) ** 0.5)  # frequent ones: Young/Daly
    a = AutoMemory(mtbf_s=10)
    assert a.every == 1                       # the first snapshot at once: it measures C
    a.observe_step(0.1)
    assert a.observe_cost(0.04) == round((2 * 0.04 * 10) ** 0.5 / 0.1)
    assert AutoMemory(mtbf_s=10, step_s=5.0).observe_cost(0.04) == 1     # never less than every step



def test_memory_auto_costs_a_snapshot_what_the_steps_beside_it_lost():
    """The background copy and hash cost what they slow training by, not their CPU time: the
    excess of the steps they ran beside over a quiet step; their CPU only while no quiet step is known."""
    from trainer_shim._policies.memory_interval import AutoMemory

    a = AutoMemory(mtbf_s=10)
    a.snapshot_started()                       # no quiet step known yet: the fallback counts
    a.observe_step(0.12, busy=True, hashing=True)
    a.snapshot_hashed(0.07, measure=True)
    a.observe_step(0.12, busy=True, hashing=False)
    assert a.cost_s == pytest.approx(0.07)
    for _ in range(20):
        a.observe_step(0.10)                   # quiet steps: the base
    a.snapshot_started()
    a.observe_step(0.115, busy=True, hashing=True)
    a.snapshot_hashed(0.07, measure=True)
    a.observe_step(0.105, busy=True, hashing=False)
    assert a.cost_s == pytest.approx(0.7 * 0.07 + 0.3 * 0.02)
    a.snapshot_started()                       # a slot's first fill is no measure
    a.snapshot_hashed(0.5, measure=False)
    a.observe_step(0.3, busy=True, hashing=False)
    assert a.cost_s == pytest.approx(0.7 * 0.07 + 0.3 * 0.02) and a.pending is None

@pytest.mark.parametrize("kwargs, message", [
    ({"save_every_steps": "often"}, "save_every_steps must be a positive integer or 'auto', got 'often'"),
    ({"memory_every_steps": 0}, "memory_every_steps must be a positive integer or 'auto', got 0"),
    ({"memory_every_steps": 2.5}, "memory_every_steps must be a positive integer or 'auto', got 2.5"),
    ({"save_every_steps": "auto", "save_every_seconds": 60}, "drop save_every_seconds=60"),
])
def test_bad_intervals_are_one_line_config_errors(tmp_path, kwargs, message):
    import trainer_shim
    from trainer_shim.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        trainer_shim.init(run_dir=tmp_path / "run", **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_memory_auto_measures_its_snapshots_and_the_run_dirs_mtbf(tmp_path):
    """A real shim process with memory_every_steps="auto" and save_every_steps="auto": the snapshot
    interval follows the measured cost, step time and the history's MTBF, in the heartbeat."""
    import json
    from trainer_shim._policies.memory_interval import memory_interval_s

    hist = [("attempt_started", 1, "00:00:00", {}), ("attempt_ended", 1, "00:00:20", {"kind": "signal"})]
    rd = _run_dir_with_history(tmp_path, hist)
    code = (
        "import json, time, torch, trainer_shim\n"
        "m = torch.nn.Linear(1024, 1024); o = torch.optim.Adam(m.parameters())\n"
        f"run = trainer_shim.init(model=m, optimizer=o, run_dir={str(rd)!r}, save_every_steps='auto',"
        " memory_every_steps='auto', save_on_epoch_end=False)\n"
        "for _ in range(40):\n"
        "    o.zero_grad(); m(torch.randn(4, 1024)).sum().backward(); o.step(); time.sleep(0.02); run.step()\n"
        "fast = run.engine.fast; fast.drain()\n"
        "a = fast.hasher.auto_memory\n"
        "print(json.dumps([a.every, a.cost_s, a.step_s, a.mtbf_s, run.save_every_seconds]))\n"
        "run.engine.hb.write_now()\n"
        "print(json.dumps(json.load(open(run.rd.heartbeat(0)))))\n"
        "run.finish()\n"
    )
    stdout = _run_shim(code)
    lines = stdout
    (every, cost, step_s, mtbf, save_s), hb = json.loads(lines[-2]), json.loads(lines[-1])
    assert mtbf == pytest.approx(20.0, abs=1.0)   # 20 s of attempt, one kill -9
    assert cost > 0 and step_s >= 0.02
    assert every == max(1, round(memory_interval_s(cost, mtbf) / step_s))
    assert hb["memory_every_steps"] == every and hb["memory_snapshots_skipped"] >= 0
    assert save_s == MIN_INTERVAL_S    # save_every_steps="auto" is the Young/Daly time interval


def _run_dir_with_history(tmp_path, hist):
    """A run dir whose events.jsonl holds `hist`: (event, attempt, time of day, fields) tuples."""
    import json

    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "events.jsonl").write_text("".join(json.dumps({"event": e, "attempt": a, "time": f"2026-01-01T{t}+00:00", **kw}) + "\n"
                                             for e, a, t, kw in hist))
    return rd


def _run_shim(code):
    """`code` in a fresh Python (the shim's env); its stdout lines. It must succeed."""
    import subprocess

    from tests.conftest import PYTHON
    from tests.supervisor.helpers import sup_env

    p = subprocess.run([PYTHON, "-c", code], env=sup_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip().splitlines()


def test_memory_auto_takes_a_pause_in_the_loop_for_no_step():
    """An evaluation or a break between run.step() calls is no step time: the interval stays."""
    from trainer_shim._policies.memory_interval import AutoMemory

    a = AutoMemory(mtbf_s=24 * 3600)
    for _ in range(10):
        a.observe_step(0.1)
    a.observe_cost(0.01)
    every = a.every
    a.observe_step(30.0)
    assert (a.every, a.step_s, a.base_s) == (every, pytest.approx(0.1), pytest.approx(0.1))
