"""Sets OMP_NUM_THREADS=1 before it imports torch, as many training scripts do, and says how many
intra-op threads torch runs; attempt 1 then fails (exit 1) so that attempt 2 runs warm."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402

from trainer_shim import rundir  # noqa: E402

attempt = os.environ.get(rundir.ENV_ATTEMPT)
print(f"threads_job: attempt {attempt} runs {torch.get_num_threads()} torch threads", flush=True)
sys.exit(1 if attempt == "1" else 0)
