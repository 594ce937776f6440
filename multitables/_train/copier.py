"""The consumer's copies of rows for training batches, split across threads where they are large.

NOTE [parallel copies]
    Every row of a shuffled batch is copied twice by the consumer: out of
    its slot into a window buffer, and out of the window into the batch
    (for ``pin_memory=``, page-locked memory; for ``device=``, the second
    copy is the GPU's: NOTE [staging] in ``_train.windows``). On a lent
    machine with 16 cores (H100, 512 MiB of zlib-3 rows, batches of 1,024
    rows of 4 KiB) those two
    copies were the limit: 3.5 GB/s of batches, the consumer busy every
    second, half its time in each copy, while 16 readers decode 11.9 GB/s
    (``benchmarks/batches_profile.py``). numpy lets the GIL go during both
    (``copyto``, ``take``), so a :class:`Copier` cuts each copy of at least
    2 MiB into parts of at least 1 MiB across threads: one per four CPUs,
    at most 4, and none with fewer than 8 CPUs, where the readers need the
    cores. The same threads make each shuffle window's permutation while the
    window before it is delivered (:meth:`Copier.later`; numpy's shuffle
    lets the GIL go); with none, one thread of the copier's own makes them,
    in turn with the next epoch's plan (NOTE [the next epoch in steps] in
    ``feed``), kept until the copier closes: starting a thread for each cost
    the batch that asked 84-91 us of the consumer's CPU on the 2-core VM,
    handing the work to one waiting 21-25 us (an epoch's window's second
    batch was 2.4 times the others). In the caller's thread a permutation
    stalled the batch that started it: 0.8 ms for 65,536 rows, 18 ms for a
    million, 167 ms for four million (a 256 MiB window of 64-byte rows) on
    the 2-core VM. The threads belong to the batches (``WindowMemory``) and
    end when it is closed.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, TypeVar

import numpy as np

from .._sys.background import on_thread
from .._sys.copies import copy_rows


def copy_threads() -> int:
    """Threads for a batches' copies (NOTE [parallel copies]): one per four CPUs this process may use, 1 to 4."""
    return max(1, min(4, len(os.sched_getaffinity(0)) // 4)) if hasattr(os, "sched_getaffinity") else 1


T = TypeVar("T")


class Copier:
    """The consumer's copies of rows, each of at least ``2 * PART`` bytes split across ``threads`` threads.

    NOTE [parallel copies]. Owns its threads (none for ``threads=1``, but
    for :meth:`later`'s); :meth:`close` ends them.
    """

    #: Bytes below which a part is not worth a thread's hand-off.
    PART = 1 << 20

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="multitables-copy") if threads > 1 else None
        self._later: "list[Future[Any]]" = []  # later()'s work off the pool (there is none), until close
        self._own: "ThreadPoolExecutor | None" = None  # that thread, made at the first later(), kept until close
        self._closed = False

    def _parts(self, rows: int, nbytes: int) -> "list[tuple[int, int]]":
        n = min(self.threads, rows, nbytes // self.PART) if self._pool is not None else 1
        if n <= 1:
            return [(0, rows)]
        cuts = [rows * i // n for i in range(n + 1)]
        return list(zip(cuts[:-1], cuts[1:]))

    def _run(self, parts: "list[tuple[int, int]]", one: Callable[[int, int], None]) -> None:
        if len(parts) == 1:
            one(*parts[0])
            return
        assert self._pool is not None
        futures = [self._pool.submit(one, a, b) for a, b in parts[1:]]
        try:
            one(*parts[0])
        finally:
            for f in futures:
                f.result()  # each part done (and its error raised) before the arrays are used or given back

    def copy(self, out: np.ndarray, rows: np.ndarray) -> None:
        """``out[...] = rows`` (as many rows; cast as that assignment casts)."""

        if self._pool is None or out.nbytes < 2 * self.PART:  # one part: no closure, no plan (a small batch's path)
            copy_rows(out, rows, casting="unsafe")
            return

        def one(a: int, b: int) -> None:
            copy_rows(out[a:b], rows[a:b], casting="unsafe")

        self._run(self._parts(len(out), out.nbytes), one)

    def take(self, rows: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
        """``out[i] = rows[index[i]]``; ``index`` is in range (it is not checked)."""

        if self._pool is None or out.nbytes < 2 * self.PART:  # one part: no closure, no plan (a small batch's path)
            rows.take(index, axis=0, out=out, mode="clip")  # "clip": "raise" copies twice; the method skips np.take's wrapper
            return

        def one(a: int, b: int) -> None:
            np.take(rows, index[a:b], axis=0, out=out[a:b], mode="clip")

        self._run(self._parts(len(out), out.nbytes), one)

    def later(self, fn: "Callable[..., T]", *args: Any, small: bool = False) -> "Future[T]":
        """``fn(*args)``, for a result wanted later, on one of the threads (work that lets the GIL go: a window's
        permutation), its error raised by ``result()``; where there are none, on the copier's own thread (kept
        until :meth:`close`; after it, one that ends with the work), or, where it is ``small`` (shorter than
        handing it to a thread: 21-25 us on the 2-core VM), at once in the caller's."""
        if self._pool is not None:
            return self._pool.submit(fn, *args)
        if small or self._closed:  # closed: a thread that ends with the work, which nothing is left to end
            future = on_thread("multitables-later", fn, *args, inline=small)
        else:
            if self._own is None:  # one thread: work handed to it while it is busy waits (a second cost 84 us)
                self._own = ThreadPoolExecutor(1, thread_name_prefix="multitables-later")
            future = self._own.submit(fn, *args)
        self._later = [f for f in self._later if not f.done()] + [future]
        return future

    def close(self) -> None:
        """End the threads: the pool's, and wait for :meth:`later`'s; idempotent. Copies go on in the caller's thread."""
        self._closed = True
        later, self._later = self._later, []
        wait(later)
        own, self._own = self._own, None
        if own is not None:
            own.shutdown(wait=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
            self.threads = 1
