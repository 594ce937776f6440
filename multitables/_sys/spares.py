"""Working memory kept across streams in one process: buffers whose pages were made once, taken again.

NOTE [spare buffers]
A stream read in this process (``_stream.backends.InlineBackend``) writes its
blocks into buffers of its own, and the chunk engine decodes through buffers
of its own (the stored bytes, a decoded chunk, a codec's scratch). Made afresh
by numpy for each stream, their pages fault on their first write unless glibc
hands back heap memory it kept, and whether it does depends on what else the
process allocated meanwhile: a program looping over three 4 MB files, a
Streamer each, took 1,968-2,097 faults a pass and twice h5py's time
(``benchmarks/small_work.py --order loop``, BENCHMARKS.md, issue 29), where
h5py's one array a file came back from the heap with none.

So these buffers are mappings of their own (anonymous ``mmap``: they move
nothing in glibc's heap, for us or for the caller's own arrays), and once
nothing references one, it becomes a spare that the next buffer asked for in
this process takes before a new one is mapped: at most :data:`MAX_SPARES` of
them, :data:`MAX_SPARE_BYTES` in all, the oldest unmapped first. "Nothing
references it" is the death of the array :func:`spare_bytes` returns: made
over the mapping, which is no array, it is the base of every view of it (a
block, a row, a row the caller kept), and a finaliser on it gives the mapping
back after the last view is gone, however late the caller drops its last row.

Taking a spare holds the lock; giving one back only tries it: the collector
runs finalisers wherever it runs, perhaps inside a take on this very thread.
A forked child starts with no spares (writing to the parent's would copy
each page) and a new lock. The mappings are private (``MAP_PRIVATE``),
copy-on-write in a forked child as the heap is: a DataLoader's worker forked
from a process holding a Reader's decoded chunks drops its copies of them,
which become its spares, and decodes into them; shared (``mmap``'s default),
its writes landed in the parent's chunks and in the other workers' (rows of
another chunk).
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref

import numpy as np

from .forks import renew_lock_in_children

#: The most spares kept, and their most bytes in all (glibc itself keeps up to 64 MiB of heap after a free).
MAX_SPARES = 16
MAX_SPARE_BYTES = 64 << 20
#: Where numpy asks for huge pages for its own arrays (4 MiB and more), a mapping does too.
HUGE_PAGES_FROM = 4 << 20

_SPARES: "list[mmap.mmap]" = []  # oldest first
_LOCK = threading.Lock()
renew_lock_in_children(globals(), "_LOCK")


def _forget_in_child() -> None:
    _SPARES.clear()  # the list the module holds now (tests put one of their own)


os.register_at_fork(after_in_child=_forget_in_child)


def spare_bytes(nbytes: int) -> np.ndarray:
    """``nbytes`` bytes (a uint8 array of that length, page-aligned, contents undefined): a spare that fits (from
    ``nbytes`` to twice that), else a new mapping. The caller's; they become a spare once the array and every view
    of it are gone (NOTE [spare buffers])."""
    if nbytes <= 0:
        return np.empty(0, np.uint8)
    spare = None
    with _LOCK:
        fits = [i for i, kept in enumerate(_SPARES) if nbytes <= len(kept) <= 2 * nbytes]
        if fits:
            spare = _SPARES.pop(min(fits, key=lambda i: len(_SPARES[i])))
    if spare is None:
        spare = new_mapping(nbytes)
    memory = np.frombuffer(spare, np.uint8, count=nbytes)  # the base of its views: none of them reaches ``spare``
    weakref.finalize(memory, _keep, spare).atexit = False
    return memory


def new_mapping(nbytes: int) -> mmap.mmap:
    """A new anonymous mapping of ``nbytes``, private to this process (zeros, each page made on its first touch)."""
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if nbytes >= HUGE_PAGES_FROM and hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    return mapping


def _keep(spare: mmap.mmap) -> None:
    """Keep ``spare`` (a mapping nothing references now) for a later buffer, unmapping the oldest spares past the
    limits; unmap it instead if another thread is taking a spare."""
    # A finaliser, where a signal's handler may run too: its exception is dropped, and must leave no lock held. One
    # that comes as acquire returns would find no answer stored, so the answer goes into ``got`` in the same C call.
    got: "list[bool]" = []
    try:
        got.extend(map(_LOCK.acquire, (False,)))
        if got[0]:
            _SPARES.append(spare)
            while len(_SPARES) > MAX_SPARES or sum(len(kept) for kept in _SPARES) > MAX_SPARE_BYTES:
                del _SPARES[0]
    finally:
        if got and got[0]:
            _LOCK.release()
