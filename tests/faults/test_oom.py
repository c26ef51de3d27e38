"""Trial 2: the kernel OOM killer ends the trainer; the attempt is `oom` with evidence and resumes bit-exact."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time

import pytest

from tests.supervisor.helpers import CLI, ended_kinds, events, sup_env

from .common import FAST, TOY, assert_bit_exact, assert_no_survivors, reference, v1_memory_parent

JOB = ("--epochs", "2", "--samples", "96", "--batch-size", "8", "--save-every", "5")  # 24 steps


def test_oom_inside_memory_limit_cgroup(tmp_path):
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    r = subprocess.run([*CLI, "--run-dir", str(run_dir), *FAST, "--memory-limit", "700M", TOY, *JOB,
                        "--out", str(out)], env=sup_env(TOY_FAULTS="1:alloc@13"), capture_output=True,
                       text=True, timeout=240)
    if "needs a writable memory cgroup" in r.stderr:
        pytest.skip(f"no writable memory cgroup: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert ended_kinds(run_dir) == ["oom", "success"]
    oom = events(run_dir, "attempt_ended")[0]
    assert oom["signal"] == signal.SIGKILL and "oom_kill rose 0->1" in oom["evidence"], oom["evidence"]
    assert events(run_dir, "attempt_started")[1]["resume_from"].endswith("step-00000012")
    assert_bit_exact(out, ref)
    assert_no_survivors(run_dir, str(out))


def test_oom_without_memory_limit_is_found_in_the_kernel_log(tmp_path):
    """The supervisor itself sits in a limited cgroup it did not create: only /dev/kmsg can tell."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable: the kernel-log evidence path cannot be exercised")
    parent = v1_memory_parent()
    cg = parent / f"rr-faults-{os.getpid()}"
    try:
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(700 << 20))
    except OSError as e:
        pytest.skip(f"no writable v1 memory cgroup under {parent}: {e}")
    ref = reference(tmp_path, *JOB)
    run_dir, out = tmp_path / "run", tmp_path / "weights.pt"
    argv = [*CLI, "--run-dir", str(run_dir), *FAST, TOY, *JOB, "--out", str(out)]
    try:
        r = subprocess.run(["sh", "-c", f'echo $$ > {shlex.quote(str(cg / "cgroup.procs"))} && exec "$@"', "sh", *argv],
                           env=sup_env(TOY_FAULTS="1:alloc@13"), capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr[-3000:]
        assert ended_kinds(run_dir) == ["oom", "success"]
        oom = events(run_dir, "attempt_ended")[0]
        pid = events(run_dir, "attempt_started")[0]["pid"]
        assert oom["signal"] == signal.SIGKILL
        assert f"kernel log: Killed process {pid}" in oom["evidence"], oom["evidence"]
        assert "cgroup" not in oom["evidence"]  # no cgroup of its own: the kernel log alone said so
        assert_bit_exact(out, ref)
        assert_no_survivors(run_dir, str(out))
    finally:
        deadline = time.monotonic() + 10
        while True:
            try:
                cg.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
