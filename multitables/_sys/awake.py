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

A stream's ring is waited on the same way (:func:`acquire`, in ``Ring.take``
and ``Ring.claim``): small blocks (4 KiB: 16-byte rows, ``block_size=256``)
come every few tens of us, and each side slept on most of them (a reader
busy 40 us of CPU a block, 30 us awake; BENCHMARKS.md). Blocks of
megabytes keep both sides asleep as before: their waits are long.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

#: Seconds a side looks for the other's answer before it sleeps.
AWAKE = 250e-6


def look(ready: Callable[[], bool], seconds: float = AWAKE) -> bool:
    """Whether ``ready()`` became true within ``seconds``, asked again and again with the CPU yielded between."""
    end = time.perf_counter() + seconds
    while True:
        over = time.perf_counter() >= end  # read before asking: the last ask comes after the seconds, not just before
        if ready():
            return True
        if over:
            return False
        os.sched_yield()


class Eagerness:
    """Whether a side looks before it sleeps: while the last wait it :meth:`saw` was shorter than :data:`AWAKE`."""

    def __init__(self) -> None:
        self.eager = True

    def saw(self, seconds: float) -> None:
        """A wait of ``seconds`` ended (counted from when the answer was asked for)."""
        self.eager = seconds < AWAKE


def acquire(semaphore: Any, eagerness: Eagerness, timeout: float) -> bool:
    """Take a token of ``semaphore`` (a ``multiprocessing`` one): at once where one is there, else after looking for
    up to :data:`AWAKE` where ``eagerness`` says so, else asleep for up to ``timeout`` s; False if none came.

    Only a wait that found no token at once tells ``eagerness`` how long it took: a side that always finds its
    token has nothing to learn, and one whose waits are long does not start looking again after a token it found.
    """
    if semaphore.acquire(False):
        return True
    asked = time.perf_counter()
    got = (eagerness.eager and look(lambda: semaphore.acquire(False))) or semaphore.acquire(timeout=timeout)
    eagerness.saw(time.perf_counter() - asked)
    return got


def release_if_held(lock: Any) -> None:
    """Release ``lock`` (a ``multiprocessing.Lock``) where this process's thread holds it: a handler's exception that
    came as its ``acquire`` returned left it held, and nothing recorded that."""
    if lock._semlock._is_mine():
        lock.release()
