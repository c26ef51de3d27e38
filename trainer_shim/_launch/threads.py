"""A warm interpreter honours the thread-count variables its attempt sets, as a cold start would.

Scripts often write `os.environ.setdefault("OMP_NUM_THREADS", "1")` before `import torch`: a cold
start then runs one intra-op thread. A warm interpreter imported torch before the script ran, and
OpenMP read the variable at that moment, so without this the attempt would run with the standby's
thread count: other numerics than the cold attempt before it, and on a busy box an OpenMP team that
stalls whenever one of its threads loses its core (measured: steps 5x slower while the next standby
imported torch beside a two-thread attempt on two cores).

`follow()` makes os.environ apply OMP_NUM_THREADS (else MKL_NUM_THREADS, the order ATen reads them in)
to torch.set_num_threads whenever either is set, from the attempt's own environment on.
"""

from __future__ import annotations

import os
from typing import Optional

__all__ = ["follow", "THREAD_VARIABLES"]

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def wanted() -> Optional[int]:
    """The intra-op thread count the environment asks for (None: it does not say, or not validly)."""
    for name in THREAD_VARIABLES:
        value = os.environ.get(name)
        if value is not None:
            try:
                n = int(value)
            except ValueError:
                return None
            return n if n > 0 else None
    return None


def apply() -> None:
    import torch

    n = wanted()
    if n is not None and n != torch.get_num_threads():
        torch.set_num_threads(n)


class _FollowingEnviron(type(os.environ)):  # type: ignore[misc]  # os.environ's own class
    def __setitem__(self, key: str, value: str) -> None:
        super().__setitem__(key, value)
        if key in THREAD_VARIABLES:
            apply()


def follow() -> None:
    """From now on, setting a thread variable in os.environ sets torch's thread count (once torch is
    imported: the warm interpreter has); and apply what the environment says now."""
    os.environ.__class__ = _FollowingEnviron
    apply()
