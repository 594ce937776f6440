"""Waiting awake: look for an answer a short while before sleeping on a semaphore, where answers come that soon.

NOTE [waiting awake]
A request of a few rows is a round trip between the caller and a reader: the
caller puts it in the reader's inbox and releases the reader's semaphore; the
reader reads the rows and releases the stage's channel, which the caller waits
on. Each side asleep on a semaphore takes some 30 us to wake on this project's
VM, and each release that wakes a sleeper makes a futex call: one row of a
cached dataset took 190 us a request, 5x what the two processes' work took
(BENCHMARKS.md). A side that looks (without sleeping) for up to :data:`AWAKE`
before it sleeps is woken by nothing: the other side's release is a counter's
increment, and its answer is seen at once.

Only where it pays: each side looks only while its last wait ended within
:data:`AWAKE` (:class:`Eagerness`): a reader whose caller trains between
requests, or a caller whose requests take milliseconds, sleeps as before, and
a look that failed costs at most :data:`AWAKE` of a core once. A look yields
the CPU between looks (other threads take the GIL, other processes the core),
and the request goes to the reader that answered the last one where that one
is idle (``Reader._submit``), so the others sleep.
"""

from __future__ import annotations

import os
import time
from typing import Callable

#: Seconds a side looks for the other's answer before it sleeps.
AWAKE = 250e-6


def look(ready: Callable[[], bool], seconds: float = AWAKE) -> bool:
    """Whether ``ready()`` became true within ``seconds``, asked again and again with the CPU yielded between."""
    end = time.perf_counter() + seconds
    while not ready():
        if time.perf_counter() >= end:
            return False
        os.sched_yield()
    return True


class Eagerness:
    """Whether a side looks before it sleeps: while the last wait it :meth:`saw` was shorter than :data:`AWAKE`."""

    def __init__(self) -> None:
        self.eager = True

    def saw(self, seconds: float) -> None:
        """A wait of ``seconds`` ended (counted from when the answer was asked for)."""
        self.eager = seconds < AWAKE
