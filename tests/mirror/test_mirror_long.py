"""--mirror with the S3 server taken down mid-training (a long variant: it trains with --step-sleep)."""

from __future__ import annotations

import pytest

from tests.faults.common import reference
from tests.support import FAST, TOY, assert_equal_state, events, start_cli, sup_env, wait_until, weights
from trainer_shim.rundir import Event

from .conftest import S3Server

pytestmark = pytest.mark.long


def test_server_down_during_training_training_goes_on_one_event_then_retried(tmp_path, s3_server):
    server = S3Server().start()   # its own, to take down
    try:
        bucket = server.new_bucket()
        rd, out = tmp_path / "run", tmp_path / "weights.pt"
        sup = start_cli("--run-dir", str(rd), "--mirror", f"s3://{bucket}/toy", "--no-prestart", *FAST, TOY,
                        "--step-sleep", "0.3", "--out", str(out), env=sup_env(**server.env()))
        wait_until(lambda: events(rd, Event.CHECKPOINT_MIRRORED), timeout=120, what="a first checkpoint mirrored")
        server.stop()
        failed = wait_until(lambda: events(rd, Event.MIRROR_FAILED), timeout=60, what="mirror_failed")
        server.start()
        server.client().create_bucket(Bucket=bucket)   # moto keeps its buckets in memory
        _, err = sup.communicate(timeout=180)
    finally:
        server.stop()
    assert sup.returncode == 0, err[-3000:]
    assert len(events(rd, Event.MIRROR_FAILED)) == 1
    assert [e["kind"] for e in events(rd, Event.ATTEMPT_ENDED)] == ["success"]   # training never stopped
    after = [e for e in events(rd, Event.CHECKPOINT_MIRRORED) if e["time"] > failed[0]["time"]]
    assert after, "no upload succeeded after the server came back"
    assert_equal_state(weights(out), reference(tmp_path), "final weights")
