"""Decoded chunks a request reader keeps, so that rows asked for again, or near the last ones, are not decoded again.

A stream reads each chunk once, in order, and keeps at most the chunk a block
ends inside (``ChunkSource``'s next-block chunk). A request reader reads rows
in whatever order its caller asks: a map-style dataset's random rows, one row
at a time in order, a sample drawn again next epoch. h5py keeps the chunks it
decoded in its chunk cache (8 MiB a dataset by default), so reading a row of a
chunk read before costs it a copy; without a store of our own every such
request decoded its whole chunk again (2,000 random rows of an 8 MB zlib
dataset: 144x h5py's time; BENCHMARKS.md). How many bytes, and for which
datasets, ``_io.scattered.rows_decoded_bytes`` decides.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class DecodedChunks:
    """Decoded chunks by chunk index, the least recently used dropped first beyond ``nbytes`` bytes in all.

    The arrays are this object's once given to :meth:`put`; :meth:`get` lends one until the next :meth:`put`.
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._chunks: "OrderedDict[tuple[int, ...], np.ndarray]" = OrderedDict()
        self._held = 0

    def takes(self, chunk_nbytes: int) -> bool:
        """Whether a chunk of ``chunk_nbytes`` is kept at all (HDF5 keeps none larger than its cache either)."""
        return 0 < chunk_nbytes <= self.nbytes

    def get(self, index: "tuple[int, ...]") -> "np.ndarray | None":
        """The decoded chunk at ``index`` (now the most recently used), or None."""
        chunk = self._chunks.get(index)
        if chunk is not None:
            self._chunks.move_to_end(index)
        return chunk

    def put(self, index: "tuple[int, ...]", chunk: np.ndarray) -> "list[np.ndarray]":
        """Keep ``chunk`` as the decoded chunk at ``index``; returns the chunks dropped to make room, for reuse."""
        old = self._chunks.pop(index, None)
        dropped = [] if old is None else [old]
        if old is not None:
            self._held -= old.nbytes
        while self._chunks and self._held + chunk.nbytes > self.nbytes:
            _, gone = self._chunks.popitem(last=False)
            self._held -= gone.nbytes
            dropped.append(gone)
        self._chunks[index] = chunk
        self._held += chunk.nbytes
        return dropped

    def clear(self) -> None:
        self._chunks.clear()
        self._held = 0

    def __len__(self) -> int:
        return len(self._chunks)
