"""`make bench`: every benchmark, each printing its table of ratios measured side by side."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

for name in ("bench_init.py", "bench_shim.py", "bench_supervisor.py", "bench_ddp.py", "bench_ddp_restart.py", "bench_integrations.py",
             "bench_async.py", "bench_lightning_async.py", "bench_restore.py", "bench_goodput.py",
             "bench_warm_commands.py"):
    path = HERE / name
    if path.exists():
        print(f"\n== {name}")
        sys.stdout.flush()
        subprocess.run([sys.executable, str(path)], check=True)
