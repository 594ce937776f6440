"""How the chunk engine reaches a file's bytes: the transport protocol, and the buffer its reads land in.

Everything else in the chunk engine (the B-tree, the grid, the codecs, the
source) works on byte ranges; a *transport* fetches them. There are two, one
module each: :class:`~multitables._io.chunks.pread.PreadFile` (``os.preadv``
on a local file) and :class:`~multitables._io.chunks.ranged.RangedFile`
(ranged GETs of an object in a bucket or on an HTTP server);
:func:`open_transport` picks one for a file.

A transport must provide (:class:`Transport`):

* ``read_into(offset, into) -> int``: fill the writable byte buffer ``into``
  from byte ``offset``, returning the bytes read, fewer only where the
  file ends. The caller owns ``into``; where ``align`` > 1, ``offset``,
  ``len(into)`` and the buffer's address are multiples of it (the chunk
  engine then reads through a :class:`ScratchBuffer`, never straight into
  a block).
* ``read_ranges(offsets, outs) -> list[int]``: fill each buffer of ``outs``
  from its offset, as ``read_into`` does, all at once where the transport
  can (an object store: the requests in flight together); the bytes read
  into each.
* ``hint(extents)``: the :class:`~multitables._io.chunks.grid.Extent` byte
  ranges, in file order, will be read soon; start fetching them in the
  background and return at once. May do nothing.
* ``resident(start, stop)``: whether the page cache holds bytes ``[start,
  stop)`` now, so that a hint of them would do nothing (NOTE [hints on
  cached bytes] in ``pread``); False where that cannot be told.
* ``identity()``: what identifies the bytes now (NOTE [file identity] in
  ``_io.files``; for a local file, the open descriptor's device, inode, size
  and times): the B-tree index compares it before it reads more of a file it
  listed earlier.
* ``close()``: release what it holds (idempotent).
* attributes ``name`` (what errors call it), ``align`` (1: any offset and
  buffer), ``hints`` (False where ``hint`` does nothing, so callers skip
  working out what to hint), ``max_gap`` and ``max_read`` (stored chunks
  closer than ``max_gap`` bytes are fetched in one read, of at most
  ``max_read`` bytes: a local disk's seek and an object store's request cost
  differently), ``index_ahead`` (True where a read waits a round trip: the
  chunk index's leaves a block needs are read before the block, together,
  not as the rows reach them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from ..._sys.spares import spare_bytes
from .grid import Extent
from .pread import DIRECT_ALIGN, PreadFile

if TYPE_CHECKING:
    from ..objects.reader import RemoteObject


class Transport(Protocol):
    """Byte ranges of one file, read into the caller's buffers (the module docstring says what each member must do)."""

    name: str
    align: int
    hints: bool
    max_gap: int
    max_read: int
    index_ahead: bool

    def read_into(self, offset: int, into: Any) -> int:
        """Fill ``into`` from byte ``offset``; the bytes read (fewer only at the end of the file)."""

    def read_ranges(self, offsets: Sequence[int], outs: Sequence[Any]) -> "list[int]":
        """Fill each of ``outs`` from its offset (together where the transport can); the bytes read into each."""

    def hint(self, extents: Sequence[Extent]) -> None:
        """``extents`` will be read soon; returns at once, and may do nothing."""

    def resident(self, start: int, stop: int) -> bool:
        """Whether the page cache holds bytes ``[start, stop)`` now; False where unknown."""

    def identity(self) -> Any:
        """What identifies the file's bytes now (equal while they are unchanged)."""

    def close(self) -> None:
        """Release what the transport holds (idempotent)."""


def open_transport(name: str, cache: str = "page", *, random: bool = False, remote: "RemoteObject | None" = None) -> Transport:
    """The transport that reads ``name``: the object ``remote`` where given (:class:`~multitables._io.chunks.ranged.RangedFile`),
    else a local file, read with ``pread`` (``cache``, ``random``: :class:`~multitables._io.chunks.pread.PreadFile`)."""
    if remote is not None:
        if cache != "page":
            raise ValueError(f"cache={cache!r} reads local files; {remote.shown!r} is an object")
        from .ranged import RangedFile  # NOTE [objects on demand] in ``_io.objects``

        return RangedFile(remote, random)
    return PreadFile(name, cache, random=random)


class ScratchBuffer:
    """A growable byte buffer, aligned for any transport (``O_DIRECT``'s 4 KiB), that holds the stored bytes of one read at a time.

    The sources of a set's files share one (one process reads one block at a
    time): a fresh buffer per file paid its page faults again on every block,
    0.5 ms for a block of 4 MiB, a fifth of a shuffled epoch over shards.
    """

    def __init__(self) -> None:
        self._buffer = np.empty(0, np.uint8)

    def get(self, n: int) -> np.ndarray:
        """``n`` bytes of scratch, valid until the next call (their contents are the caller's to overwrite)."""
        if len(self._buffer) < n:
            # Twice the size it had, at least: a larger read now and then (stored bytes vary from block to block)
            # would otherwise take fresh memory each time, a page fault a page, 330 a block of blosc (issue 29's
            # counters). Over-allocate by one alignment unit and start on a boundary, as O_DIRECT needs.
            raw = spare_bytes(max(n, 1 << 20, 2 * len(self._buffer)) + DIRECT_ALIGN)  # NOTE [spare buffers]
            skip = -raw.ctypes.data % DIRECT_ALIGN
            self._buffer = raw[skip : skip + len(raw) - DIRECT_ALIGN]
        return self._buffer[:n]

    def release(self) -> None:
        self._buffer = np.empty(0, np.uint8)
