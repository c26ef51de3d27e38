"""The framework callbacks' writer thread (`BackgroundSaves`) has ended when `close()` returns.

A daemon thread still returning when the interpreter finalizes is ended by pthread_exit where it next
takes the GIL; inside the C++ destructor of a tensor it drops, that is std::terminate: a successful
training run that ends in SIGABRT ("terminate called without an active exception"), which a supervisor
restarts. The switch interval keeps the GIL with the closing thread unless it blocks, as when the
process exits right after its last save.
"""

from __future__ import annotations

import sys

import torch

from tests.support import writer_threads
from trainer_shim.integrations._background import BackgroundSaves


def test_close_returns_only_once_the_writer_thread_has_ended() -> None:
    written = []
    bg = BackgroundSaves(lambda job: written.append(job.sum().item()), "test")
    bg.submit(torch.ones(4))
    assert bg.wait(30)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        bg.close()
        left = writer_threads()
    finally:
        sys.setswitchinterval(interval)
    assert written == [4.0]
    assert not left, f"close() returned with {left} still running"
