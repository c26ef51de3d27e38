"""What `import trainer_shim` + a default `init()` cost a training process, side by side with the same
process without the shim (import torch, build the model and optimizer): fresh processes, alternated,
median of ROUNDS; and how much of the shim is loaded (modules, lines) after a fresh start's init(),
after its first training stream, step and save, and after a resumed init(). Goals (the small-shim
issue): init() loads at most 35 modules and 4,000 lines."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROUNDS = 7

_TORCH = """
import time
t = time.perf_counter()
import torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
print(time.perf_counter() - t)
"""
_SHIM = r"""
import json, sys, time
t = time.perf_counter()
import torch
import trainer_shim
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = trainer_shim.init(model=model, optimizer=opt, run_dir=sys.argv[1])
took = time.perf_counter() - t


def loaded():
    mods = [m for m in sys.modules if m.startswith("trainer_shim")]
    files = [sys.modules[m].__file__ for m in mods if getattr(sys.modules[m], "__file__", None)]
    return len(mods), sum(sum(1 for _ in open(f)) for f in files)


at_init = loaded()
if sys.argv[2] == "save":
    for batch in run.batches([torch.zeros(64)] * 2):
        run.step()
    run.save()
print(json.dumps([took, *at_init, *loaded(), run.global_step]))
"""


def _run(code: str, *args: str) -> str:
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return p.stdout.strip().splitlines()[-1]


def main() -> None:
    torch_s, shim_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(ROUNDS):
            torch_s.append(float(_run(_TORCH)))
            took, fresh_mods, fresh_lines, *_ = json.loads(_run(_SHIM, str(Path(tmp) / f"fresh-{i}"), "-"))
            shim_s.append(took)
        resumed = Path(tmp) / "resumed"
        *_, saved_mods, saved_lines, _ = json.loads(_run(_SHIM, str(resumed), "save"))
        _, res_mods, res_lines, *_, step = json.loads(_run(_SHIM, str(resumed), "-"))
    t, s = statistics.median(torch_s), statistics.median(shim_s)
    print(f"fresh processes, alternated, median of {ROUNDS}")
    print(f"{'what':<44}{'value':>12}{'goal':>10}")
    print(f"{'torch, model, optimizer (s)':<44}{t:>12.3f}")
    print(f"{'the same + import trainer_shim + init() (s)':<44}{s:>12.3f}")
    print(f"{'ratio':<44}{s / t:>12.2f}")
    print(f"{'shim modules loaded by init(), fresh start':<44}{fresh_mods:>12}{'<= 35':>10}")
    print(f"{'shim lines loaded by init(), fresh start':<44}{fresh_lines:>12}{'<= 4000':>10}")
    print(f"{'shim modules after batches, step, save':<44}{saved_mods:>12}")
    print(f"{'shim lines after batches, step, save':<44}{saved_lines:>12}")
    print(f"{'shim modules loaded, resumed (step %d)' % step:<44}{res_mods:>12}")
    print(f"{'shim lines loaded, resumed':<44}{res_lines:>12}")


if __name__ == "__main__":
    main()
