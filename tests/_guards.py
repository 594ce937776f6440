"""Guards against hangs for the tests: limits that fail a test which would otherwise never end, never speed limits.

How soon things happen is measured by ``benchmarks/failure_latency.py``, not here.
"""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Any, Callable, Iterator

import pytest


@contextlib.contextmanager
def hang_guard(seconds: float, what: str) -> Iterator[None]:
    """Fail (not hang) if the body runs past ``seconds``. Nests: an enclosing guard's time goes on running."""

    def hung(signum: int, frame: Any) -> None:
        pytest.fail(f"{what}: still running after {seconds:g} s (hung?)")

    previous = signal.signal(signal.SIGALRM, hung)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    if outer:
        signal.setitimer(signal.ITIMER_REAL, min(seconds, outer))
    t0 = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - t0), 0.001))


def wait_until(condition: Callable[[], bool], limit: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail if it still does not after ``limit`` s (a hang guard)."""
    with hang_guard(limit, f"waiting until {what}"):
        while not condition():
            time.sleep(0.01)


def is_gone(pid: int) -> bool:
    """The process has exited, every thread of it. A zombie waiting for a parent that may never reap it counts as
    exited; its first thread shows as one while the others (a reader's watch among them) still end, its files open."""
    import os

    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except (psutil.NoSuchProcess, FileNotFoundError):
        return True
