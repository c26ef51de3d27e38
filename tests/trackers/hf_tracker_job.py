"""A zero-code HF Trainer job (no resilient-run code) that reports to TensorBoard in its default
log dir (output_dir/runs/<date>_<host>, made anew at every start), and to the trackers
TRACKER_REPORT_TO names (comma-separated; default: tensorboard).

TRACKER_KILLS="1:12,2:23": SIGKILL at the end of that global step in that attempt.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import TrainerCallback  # noqa: E402

from examples.hf_train import build  # noqa: E402

kills = dict(item.split(":") for item in filter(None, os.environ.get("TRACKER_KILLS", "").split(",")))
kill_at = int(kills.get(os.environ.get("RESILIENT_ATTEMPT", "1"), 0))


class Kill(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


trainer = build(sys.argv[1], callbacks=[Kill()], report_to=os.environ.get("TRACKER_REPORT_TO", "tensorboard").split(","))
trainer.train()
