"""The body of a background writer thread that holds one job at a time (async saves: the raw loop's
FastSaver and the Lightning callback's background save)."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterable

__all__ = ["low_priority", "serve", "stop"]


def low_priority() -> None:
    """The calling (writer) thread yields the CPU to training."""
    try:  # Linux: a thread's own nice value; training keeps the CPU it needs
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (OSError, AttributeError):
        pass


def serve(cv: threading.Condition, pending: Callable[[], Any], closed: Callable[[], bool],
          run: Callable[[Any], None], done: Callable[[], None]) -> None:
    """A writer thread's body, at low priority: wait on `cv` for the job `pending()` returns (None:
    none), run it outside the lock (`run` reports its own failures), then `done()` under the lock (it
    clears the job) and wake every waiter; return once `closed()` with no job left."""
    low_priority()
    while True:
        with cv:
            while pending() is None and not closed():
                cv.wait()
            job = pending()
            if job is None:
                return
        run(job)
        with cv:
            done()
            cv.notify_all()


def stop(cv: threading.Condition, mark_closed: Callable[[], None], threads: Iterable[threading.Thread],
         timeout: float) -> None:
    """Close the writer threads (`mark_closed()` under `cv`, every waiter woken) and wait until they
    have ended, at most `timeout` s each. Why wait: a daemon thread still returning when the interpreter
    finalizes is ended by pthread_exit wherever it next takes the GIL; inside the C++ destructor of a
    tensor it drops (its staging buffers, its bound target) that is std::terminate, a SIGABRT after a
    successful run."""
    with cv:
        mark_closed()
        cv.notify_all()
    for t in threads:
        if t is not threading.current_thread():
            t.join(timeout)
