"""What `import trainer_shim` + a default `init()` cost a training process, side by side with `import
torch` alone: fresh processes, alternated, median of ROUNDS; and how much of the shim a default
init() loads (modules, lines), fresh and resumed. Goals (the small-shim issue): at most 35 modules and
4,000 lines."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROUNDS = 7

_TORCH = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
_SHIM = r"""
import json, sys, time
t = time.perf_counter()
import torch
import trainer_shim
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = trainer_shim.init(model=model, optimizer=opt, run_dir=sys.argv[1])
took = time.perf_counter() - t
if sys.argv[2] == "save":
    run.step()
    run.save()
mods = [m for m in sys.modules if m.startswith("trainer_shim")]
lines = sum(sum(1 for _ in open(sys.modules[m].__file__)) for m in mods if getattr(sys.modules[m], "__file__", None))
print(json.dumps([took, len(mods), lines, run.global_step]))
"""


def _run(code: str, *args: str) -> str:
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return p.stdout.strip().splitlines()[-1]


def main() -> None:
    torch_s, shim_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(ROUNDS):
            torch_s.append(float(_run(_TORCH)))
            took, fresh_mods, fresh_lines, _ = json.loads(_run(_SHIM, str(Path(tmp) / f"fresh-{i}"), "-"))
            shim_s.append(took)
        resumed = Path(tmp) / "resumed"
        _run(_SHIM, str(resumed), "save")
        _, res_mods, res_lines, step = json.loads(_run(_SHIM, str(resumed), "-"))
    t, s = statistics.median(torch_s), statistics.median(shim_s)
    print(f"fresh processes, alternated, median of {ROUNDS}")
    print(f"{'what':<44}{'value':>12}{'goal':>10}")
    print(f"{'import torch (s)':<44}{t:>12.3f}")
    print(f"{'import torch + trainer_shim + init() (s)':<44}{s:>12.3f}")
    print(f"{'ratio':<44}{s / t:>12.2f}")
    print(f"{'shim modules loaded, fresh start':<44}{fresh_mods:>12}{'<= 35':>10}")
    print(f"{'shim lines loaded, fresh start':<44}{fresh_lines:>12}{'<= 4000':>10}")
    print(f"{'shim modules loaded, resumed (step %d)' % step:<44}{res_mods:>12}")
    print(f"{'shim lines loaded, resumed':<44}{res_lines:>12}")


if __name__ == "__main__":
    main()
