"""Trial 9: wall-clock jumps (heartbeat mtimes, time.time in both processes) cause no false hang."""

from __future__ import annotations

import os
import threading
import time

from tests.conftest import REPO
from tests.supervisor.helpers import ended_kinds, run_cli, sup_env

from .common import TOY, assert_bit_exact, assert_no_survivors, reference

# ~6 s of training with 2 s timeouts: several timeouts' worth of jumps.
JOB = ("--epochs", "2", "--samples", "96", "--batch-size", "8", "--save-every", "5", "--step-sleep", "0.25")
SUP = ("--backoff", "0", "--heartbeat-timeout", "2", "--grace-period", "2")

SITECUSTOMIZE = '''
import time as _t
_real, _mono = _t.time, _t.monotonic
def _jumping():
    # The wall clock swings a day forward and a day back every half second (NTP step, VM restore).
    return _real() + (86400.0 if int(_mono() * 2) % 2 else -86400.0)
_t.time = _jumping
'''


def test_heartbeat_mtime_jumps_are_not_a_hang(tmp_path):
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    stop = threading.Event()
    touched = []

    def warp() -> None:
        hb = run_dir / "heartbeats" / "rank-0.json"
        while not stop.is_set():
            for offset in (-86400 * 365, 86400 * 365, -3600):
                try:
                    t = time.time() + offset
                    os.utime(hb, (t, t))
                    touched.append(offset)
                except OSError:
                    pass
                time.sleep(0.05)

    w = threading.Thread(target=warp, daemon=True)
    w.start()
    try:
        r = run_cli("--run-dir", str(run_dir), *SUP, TOY, *JOB, "--out", str(out), timeout=180)
    finally:
        stop.set()
        w.join(5)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(touched) > 50
    assert ended_kinds(run_dir) == ["success"]
    assert_bit_exact(out, ref)


def test_time_time_swinging_a_day_in_supervisor_and_trainer_is_not_a_hang(tmp_path):
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    site = tmp_path / "fakeclock"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = sup_env()
    env["PYTHONPATH"] = f"{site}{os.pathsep}{REPO}"
    import subprocess
    import sys
    probe = subprocess.run([sys.executable, "-c", "import time; print(time.time())"], env=env,
                           capture_output=True, text=True, check=True)
    assert abs(float(probe.stdout) - time.time()) > 86000  # the fake clock is in effect for any python here
    r = run_cli("--run-dir", str(run_dir), *SUP, TOY, *JOB, "--out", str(out), env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["success"]
    assert_bit_exact(out, ref)
    assert_no_survivors(run_dir, str(out))
