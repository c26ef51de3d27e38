"""Cost of the step-boundary probe outside doctor mode (not a test), side by side in one process.

    .venv/bin/python bench/bench_probe.py

The probe sums tensor version counters at run.step() and at the next batch handout. Rows: the
README model's training step with run.step() and a batch handout, probe on vs a no-op probe;
and the probe's own cost for a 160-tensor model. Goal: within the 2 % step-overhead budget.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import trainer_shim  # noqa: E402


class _NoProbe:
    def on_step(self) -> None: ...
    def on_batch(self, batch: object) -> None: ...


def _loop(run, model, opt, x, y, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        run._probe.on_batch(x)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        run.step(loss=loss.item())
    return (time.perf_counter() - t0) / n


def main() -> None:
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-probe-"))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    run = trainer_shim.init(model=model, optimizer=opt, run_dir=tmp / "r", save_on_epoch_end=False)
    probe, noop = run._probe, _NoProbe()
    on, off = [], []
    for r in range(9):  # interleaved, best of rounds: other load only ever adds time
        for p in ((probe, noop) if r % 2 == 0 else (noop, probe)):
            run._probe = p
            (on if p is probe else off).append(_loop(run, model, opt, x, y, 1500))
    run._probe = probe
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        probe.on_step()
        probe.on_batch(x)
    per_small = (time.perf_counter() - t0) / n
    big = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)) for _ in range(40)])  # 160 params, 120 buffers
    run.model = big
    t0 = time.perf_counter()
    for _ in range(n):
        probe.on_step()
        probe.on_batch(x)
    per_big = (time.perf_counter() - t0) / n
    run.engine.hb.stop()
    b, s = min(off), min(on)
    print(f"{'measure':<48}{'value':>22}{'target':>10}")
    print(f"{'README step, no-op probe -> probe':<48}{f'{b * 1e6:.1f} -> {s * 1e6:.1f} us':>22}")
    print(f"{'  probe overhead':<48}{f'{(s / b - 1) * 100:+.2f} %':>22}{'<= 2 %':>10}")
    print(f"{'probe on_step+on_batch measured directly':<48}{f'{per_small * 1e6:.2f} us':>22}"
          f"{f'{per_small / b * 100:.2f} %':>10}")
    print(f"{'probe on_step+on_batch, 280-tensor model':<48}{f'{per_big * 1e6:.1f} us':>22}")


if __name__ == "__main__":
    main()
