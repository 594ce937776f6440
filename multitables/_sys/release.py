"""Unmapping off the caller's path: a stream's ring given back on a thread of its own.

NOTE [release off the path]
    A stream's ring is unmapped by the consumer after its readers are gone,
    and that last unmapping gives its pages back: 24 ms for the 136 MiB ring
    of 16 readers on a 2-core machine (7 ms the page tables, 17 ms the
    pages), and on a lent H100 0.017-0.026 s of a 0.14-0.19 s pass of 1 GiB
    with 16 readers (BENCHMARKS.md, seventh session). munmap lets the GIL
    go, so when a pass has delivered its last block and the caller holds none
    of its rows, the ring is unmapped on a thread of its own and the stream's
    close returns; its name is already gone, so nothing is left in /dev/shm
    meanwhile. An early stop, an error or an interrupt unmaps before close
    returns: whoever handles it may look at the memory at once. A fork waits
    for those threads first (:func:`settle_releases`): a child would inherit
    the mapping being released, and Python warns of a fork in a process with
    threads. It waits until they are gone from the process, not only until
    their Python part ended: Python 3.12 counts the threads the kernel
    counts, and an OS thread outlives its join by a little (a reader forked
    right after a stream's close drew that warning on 3.12). A thread still
    running at exit is joined by the interpreter.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

_running: "set[threading.Thread]" = set()
_ending: "list[int]" = []  # the native ids of threads whose unmapping is done, perhaps not yet gone from the process
_lock = threading.Lock()
#: Seconds :func:`settle_releases` waits at most for a thread that ended to leave the process.
GONE_TIMEOUT = 0.05


def release_later(unmap: Callable[[], None]) -> None:
    """Run ``unmap`` (a segment's close, nothing kept) on a thread of its own; :func:`settle_releases` waits for it."""
    thread = threading.Thread(target=_run, args=(unmap,), name="multitables-release")
    with _lock:  # started inside: another thread's settle_releases must not join it before its start
        thread.start()
        _running.add(thread)


def _run(unmap: Callable[[], None]) -> None:
    try:
        unmap()
    finally:
        with _lock:
            _running.discard(threading.current_thread())
            _ending.append(threading.get_native_id())


def settle_releases() -> None:
    """Return once every unmapping handed to :func:`release_later` is done, and its thread gone from the process."""
    with _lock:
        pending = list(_running)
    for thread in pending:
        thread.join()
    with _lock:
        ending = _ending[:]
        del _ending[:]
    _wait_gone(ending)


def _wait_gone(native_ids: "list[int]") -> None:
    """Until no thread of ``native_ids`` is left in ``/proc/self/task`` (where there is none: at once), or
    :data:`GONE_TIMEOUT`."""
    deadline = time.monotonic() + GONE_TIMEOUT
    for tid in native_ids:
        while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
            time.sleep(20e-6)


def _none_in_child() -> None:
    # A child has none of its parent's threads (and one of them may have held the lock at the fork).
    global _lock
    _running.clear()
    _ending.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_none_in_child)
