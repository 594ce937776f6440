"""Small reads of objects through a cache of blocks, and a read-only file object over an object, for h5py.

HDF5 reads metadata a few bytes at a time, here and there, and the chunk
engine reads its B-tree a node at a time: each read would be a request, a
round trip of tens of milliseconds. So small reads (:func:`read_small`) go
through a cache of aligned blocks that every reader of an object in this
process shares (a miss fetches the whole block, which usually holds the
next reads too; the misses of one call are fetched together), and the
object's first bytes, fetched when it was looked at, serve the superblock
and what follows it with no request at all. A read of a block or more goes
straight to :meth:`~multitables._io.objects.reader.ObjectReader.read_into`,
which splits it into requests in flight. Every byte comes from the object as
it was first looked at (NOTE [object identity] in ``reader``): the cache is
keyed by that identity.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from typing import Any, Sequence

from ..._sys.forks import renew_lock_in_children
from .reader import ObjectReader

#: Bytes of one cached block, and how many this process keeps (of every object together).
BLOCK = 256 << 10
BLOCKS_KEPT = 32

_BLOCKS: "OrderedDict[tuple[str, str, int], bytes]" = OrderedDict()
_BLOCKS_LOCK = threading.Lock()

renew_lock_in_children(globals(), "_BLOCKS_LOCK")


def read_small(reader: ObjectReader, ranges: "Sequence[tuple[int, int]]", outs: "Sequence[Any]") -> None:
    """Fill each ``outs[i]`` with bytes ``ranges[i]`` = (offset, n) of ``reader``'s object through the block cache:
    the blocks missing fetched together, then copied out."""
    head = reader.head
    if all(offset + n <= len(head) for offset, n in ranges):  # fetched when the object was looked at
        reader.read_into(ranges, outs)
        return
    key = (reader.remote.url, reader.identity.key)
    wanted = sorted({i for offset, n in ranges if n for i in range(offset // BLOCK, (offset + n - 1) // BLOCK + 1)})
    with _BLOCKS_LOCK:
        found: "dict[int, bytes | None]" = {i: _BLOCKS.get(key + (i,)) for i in wanted}
    missing = [i for i in wanted if found[i] is None]
    if missing:
        bufs = [bytearray(min(BLOCK, reader.size - i * BLOCK)) for i in missing]
        reader.read_into([(i * BLOCK, len(b)) for i, b in zip(missing, bufs)], bufs)
        for i, buf in zip(missing, bufs):
            found[i] = bytes(buf)
    with _BLOCKS_LOCK:
        for i in wanted:
            _BLOCKS[key + (i,)] = found[i]  # type: ignore[assignment]  # every one fetched: bytes
            _BLOCKS.move_to_end(key + (i,))
        while len(_BLOCKS) > BLOCKS_KEPT:
            _BLOCKS.popitem(last=False)
    for (offset, n), out in zip(ranges, outs):
        view = memoryview(out).cast("B")
        done = 0
        while done < n:
            i, at = divmod(offset + done, BLOCK)
            block = found[i]
            assert block is not None
            k = min(n - done, len(block) - at)
            view[done : done + k] = block[at : at + k]
            done += k


class RangeFile(io.RawIOBase):
    """The object ``reader`` reads, as a seekable read-only file; closing it closes the reader."""

    def __init__(self, reader: ObjectReader) -> None:
        super().__init__()
        self.reader = reader
        self._size = reader.size
        self._pos = 0

    def __repr__(self) -> str:  # h5py names the file by it
        return f"<RangeFile {self.reader.shown!r}>"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        if n == 0:
            return 0
        if n >= BLOCK or self._pos + n <= len(self.reader.head):
            self.reader.read_into([(self._pos, n)], [view[:n]])
        else:
            read_small(self.reader, [(self._pos, n)], [view[:n]])
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            self.reader.close()
        super().close()
