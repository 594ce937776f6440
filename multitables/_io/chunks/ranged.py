"""The chunk engine's bytes from an object (``s3://``, ``http(s)://``): ranged GETs, a transport beside ``pread``.

What a transport provides: :class:`~multitables._io.chunks.transport.Transport`.
A read of a group of chunks is one range of the object, split by the reader
(:class:`~multitables._io.objects.reader.ObjectReader`) into parts of a few MiB
fetched in parallel, straight into the caller's buffer; chunks closer than
``merge_gap`` (1 MiB) are one group, since a request costs tens of
milliseconds where a local seek costs a fraction of one. The identity it
gives is the one the consumer saw, checked by every request itself (NOTE
[object identity] in ``_io.objects.reader``), so it costs no request.

There is nothing to hint: a hint warms a cache that every reader shares
(the page cache), and a reader's own prefetched bytes would serve only the
blocks it happens to claim next (readers claim from one counter); the
parallel parts of each read keep the link busy instead, and the leaves of
the chunk index a block needs are read before it, together
(``index_ahead``), rather than one round trip each as the rows reach them.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..objects.fileobj import BLOCK, read_small
from ..objects.identity import ObjectIdentity
from ..objects.reader import RemoteObject
from .grid import Extent

#: The most bytes one read of the chunk engine covers: the reader splits it into parts in flight.
MAX_READ = 64 << 20
#: Reads of at most this many bytes each (a chunk index's leaves) are sent ``SMALL_INFLIGHT`` at once, past
#: ``max_inflight``: their time is the round trip, so an index of 64 leaves is read in one, not four. They are
#: merged only where closer than ``SMALL_GAP``: merged across ``merge_gap`` (1 MiB), the leaves of an index of small
#: chunks, a few hundred KiB apart, fetched the file's data between them (575 leaves of a 288 MB file: 1.04 GB
#: fetched in a pass).
SMALL_READ = 64 << 10
SMALL_INFLIGHT = 64
SMALL_GAP = 16 << 10


class RangedFile:
    """One object open for reading byte ranges (a :class:`~multitables._io.chunks.transport.Transport`).

    ``random``: its reads are a few KiB here and there (the chunk index's
    header and inner nodes at open): they go through the block cache the file
    objects of this process use too (:func:`~multitables._io.objects.fileobj.read_small`),
    so the index and HDF5's own reads share their requests.
    """

    align = 1
    hints = False
    max_read = MAX_READ
    index_ahead = True  # a request waits a round trip: the leaves a block needs are read before it, together

    def __init__(self, remote: RemoteObject, random: bool = False) -> None:
        self.name = remote.shown
        self._random = random
        self.max_gap = remote.store.tuning.merge_gap
        self._identity = remote.identity
        self._reader: Any = remote.open()

    def read_into(self, offset: int, into: Any) -> int:
        """Fill ``into`` from byte ``offset``; the bytes read (fewer only where the object ends)."""
        view = memoryview(into).cast("B")
        n = max(0, min(len(view), self._identity.size - offset))
        if n and self._random and n < BLOCK:
            read_small(self._reader, [(offset, n)], [view[:n]])
        elif n:
            self._reader.read_into([(offset, n)], [view[:n]])
        return n

    def read_ranges(self, offsets: Sequence[int], outs: Sequence[Any]) -> "list[int]":
        """Fill each of ``outs`` from its offset, the requests in flight together; the bytes read into each.

        (Not through the block cache: these are the leaves a block needs, whose blocks nothing else reads.)
        """
        views = [memoryview(out).cast("B") for out in outs]
        got = [max(0, min(len(view), self._identity.size - offset)) for offset, view in zip(offsets, views)]
        wanted = [(offset, n) for offset, n in zip(offsets, got) if n]
        if wanted:
            small = all(n <= SMALL_READ for _, n in wanted)
            filled = [view[:n] for view, n in zip(views, got) if n]
            self._reader.read_into(wanted, filled, SMALL_INFLIGHT if small else None, SMALL_GAP if small else None)
        return got

    def hint(self, extents: Sequence[Extent]) -> None:
        """Nothing (see the module's docstring)."""

    def resident(self, start: int, stop: int) -> bool:
        """False: an object has no page cache."""
        return False

    def identity(self) -> ObjectIdentity:
        """The object's identity as the consumer saw it (every request checks it)."""
        return self._identity

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
