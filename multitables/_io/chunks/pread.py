"""The chunk engine's bytes from a local file: ``os.preadv``, through the page cache or past it (``O_DIRECT``).

The one transport today (what a transport provides: :class:`~multitables._io.chunks.transport.Transport`).
``cache="page"`` reads through the page cache, and a hint starts the kernel
reading ahead (``POSIX_FADV_WILLNEED``); ``cache="direct"`` opens the file with
``O_DIRECT``: page-aligned buffers and file ranges, past the page cache, with
the stock wheels, so the cold-cache figure needs no HDF5 rebuilt with its
direct driver, and there is nothing to hint.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
from typing import Any, Sequence

from ..files import FileSignature, file_signature
from .descriptors import Lease, open_shared
from .grid import Extent, coalesce

#: Where chunk bytes come from: the page cache, or the disk past it (``O_DIRECT``).
CACHES = ("page", "direct")
#: Stored chunks closer than this in the file are read with one call (the gap is read and dropped).
MAX_GAP = 64 << 10
#: The most bytes one read call covers.
MAX_READ = 16 << 20
#: ``O_DIRECT`` file offsets, lengths and buffers are aligned to this (the largest common logical block size).
DIRECT_ALIGN = 4096


def will_need(fd: int, extents: Sequence[Extent]) -> None:
    """Start reading ``extents`` of the file open as ``fd`` into the page cache in the background; a hint.

    ``POSIX_FADV_WILLNEED`` over the extents coalesced: the kernel queues
    large reads in file order, which a spinning disk serves without seeking
    back and forth between readers (BENCHMARKS.md, the disk model).
    """
    for group in coalesce(extents, MAX_GAP, MAX_READ) if extents else ():
        try:
            os.posix_fadvise(fd, group.start, group.stop - group.start, os.POSIX_FADV_WILLNEED)
        except OSError:  # pragma: no cover - a filesystem without readahead; reading works the same
            return


def resident(fd: int, start: int, stop: int) -> bool:
    """Whether the page cache holds every page of bytes ``[start, stop)`` of the file open as ``fd`` now.

    NOTE [hints on cached bytes]: a hint of a cached file's bytes does
    nothing, yet costs a walk over their pages in the kernel (16 us for 1
    MiB here) and, before it, their extents (a chunk lookup per chunk).
    ``cachestat(2)`` (Linux 6.5) counts the cached pages of a range, 7 us
    for 1.3 MiB, and reads nothing: where every page is cached, nothing is
    hinted. Every page, not a look at the ends: a block's first and last
    pages are also its neighbours', read or hinted by another reader a
    moment before (asking about those two alone, two readers on the disk
    model made 68 seeks a pass instead of 14), and a one-byte read that may
    not wait (``RWF_NOWAIT``) starts reading a page it does not find, a
    seek to the end of a block before its hint. False where the kernel
    cannot tell (older, or a sandbox refuses the call), and the hint goes
    as before. One pass of a cached 1 GiB blosc file in one process spent
    10.1-10.6 ms on hints with the chunk engine and 8.8-9.1 ms with h5py's;
    4.7 and 3.1-3.3 ms with the count (``benchmarks/hint_cost.py``;
    BENCHMARKS.md, issue 29, twelfth session).
    """
    global _can_ask
    if stop <= start or not _can_ask:
        return False
    first, end = start // PAGE, -(-stop // PAGE)
    span, got = _CachestatRange(first * PAGE, (end - first) * PAGE), _Cachestat()
    if _syscall(_SYS_CACHESTAT, ctypes.c_long(fd), ctypes.byref(span), ctypes.byref(got), ctypes.c_long(0)) != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            _can_ask = False  # the kernel lacks it, or a seccomp filter refuses it: no use asking again
        return False
    return got.nr_cache >= end - first


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted",
                                                     "nr_recently_evicted")]


#: The page cache's unit (bytes).
PAGE = mmap.PAGESIZE
#: ``cachestat``'s number, the same on every architecture (the unified table).
_SYS_CACHESTAT = ctypes.c_long(451)
#: False off Linux, and once the kernel has said it cannot answer.
_can_ask = sys.platform.startswith("linux")
if _can_ask:
    _syscall = ctypes.CDLL(None, use_errno=True).syscall
    _syscall.restype = ctypes.c_long


class PreadFile:
    """One local file open for reading byte ranges (a :class:`~multitables._io.chunks.transport.Transport`).

    ``cache``: one of :data:`CACHES`. ``random``: the reads are a few KiB
    each, here and there (the chunk index's nodes), so the kernel is told not
    to read ahead; the stream's own reads and hints fetch the rest. Holds a
    file descriptor until :meth:`close`, shared with this process's other
    openers of the file (NOTE [shared descriptors] in ``descriptors``).
    """

    max_gap = MAX_GAP
    max_read = MAX_READ
    index_ahead = False  # a leaf of the chunk index is read where the disk's head reaches it

    def __init__(self, filename: str, cache: str = "page", *, random: bool = False) -> None:
        if cache not in CACHES:
            raise ValueError(f"cache={cache!r} is not one of {CACHES}")
        direct = cache == "direct"
        self.name = filename
        self.align = DIRECT_ALIGN if direct else 1
        self.hints = not direct  # past the page cache there is nothing to warm
        flags = os.O_RDONLY
        if direct:
            if not hasattr(os, "O_DIRECT"):  # pragma: no cover - not Linux
                raise ValueError("cache='direct' needs O_DIRECT, which this platform lacks")
            flags |= os.O_DIRECT
        try:
            self._lease: "Lease | None" = open_shared(filename, flags, random)  # NOTE [shared descriptors]
        except OSError as exc:
            if direct and exc.errno == errno.EINVAL:
                raise OSError(exc.errno, f"cache='direct': the filesystem refuses O_DIRECT ({exc.strerror})", filename) from None
            raise
        self.fd = self._lease.fd

    def read_into(self, offset: int, into: Any) -> int:
        """Fill ``into`` (a writable byte buffer) from file ``offset``; returns the bytes read (fewer only at the end of the file)."""
        view = memoryview(into).cast("B")
        got, n = 0, len(view)
        while got < n:
            k = os.preadv(self.fd, [view[got:]], offset + got)
            if k == 0:
                break
            got += k
        return got

    def read_ranges(self, offsets: Sequence[int], outs: Sequence[Any]) -> "list[int]":
        """Fill each of ``outs`` (byte arrays, or anything ``os.preadv`` takes) from its offset, one after another; the
        bytes read into each."""
        fd, got = self.fd, []
        for offset, out in zip(offsets, outs):  # a row of a contiguous dataset each, for random rows: one call apiece
            k = os.preadv(fd, [out], offset)
            got.append(k if k in (0, len(out)) else k + self.read_into(offset + k, memoryview(out).cast("B")[k:]))
        return got

    def hint(self, extents: Sequence[Extent]) -> None:
        """Start reading ``extents`` into the page cache in the background (:func:`will_need`); nothing with ``O_DIRECT``."""
        if self.hints:
            will_need(self.fd, extents)

    def resident(self, start: int, stop: int) -> bool:
        """Whether the page cache holds bytes ``[start, stop)`` (:func:`resident`); False with ``O_DIRECT``."""
        return self.hints and resident(self.fd, start, stop)

    def identity(self) -> FileSignature:
        """The open file's identity (NOTE [file identity] in ``_io.files``), from the descriptor, not the path."""
        return file_signature(self.fd)

    def close(self) -> None:
        """Let go of the descriptor, closed with its last opener in this process (idempotent)."""
        lease = self._lease
        if lease is not None:
            lease.release()  # first: one cut short by a handler's exception is done again by the next close
            self._lease, self.fd = None, -1
