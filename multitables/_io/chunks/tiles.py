"""Chunks narrower than a row (tiles), decoded side by side and copied into the block a chunk-row at a time.

A chunk that holds part of each of its rows (images in ``(1, 64, 64)`` tiles) cannot be decoded straight into the
block: it is decoded elsewhere and its elements copied. Copied one chunk at a time, the Python around each copy (a
view, two selections, the check whether the next block keeps the chunk) cost more than the copy of an 8 KiB chunk:
blosc ``(1, 64, 64)`` uint16 tiles took 1.6x h5py's CPU a pass. :class:`TileRows` decodes the chunks of one
chunk-row (those sharing its rows) next to each other in one buffer and, once the last of them is decoded, copies
them all with one ``np.copyto`` of a transposed view (where the chunks divide the rows exactly; else one copy a
chunk, as before).
"""

from __future__ import annotations

import math

import numpy as np

from ..._sys.spares import spare_bytes
from .grid import ChunkGrid, ChunkPart


class TileRows:
    """Decoded chunks of the chunk-rows a block is reading, by chunk-row, each in the place of its chunk in C order.

    ``expect`` says how many chunks of each chunk-row will come; :meth:`into` lends the bytes a chunk is decoded into
    (this object's until its chunk-row is copied); :meth:`decoded` copies a chunk-row into ``out`` once its last
    chunk is decoded, and takes its buffer back. The buffers (a chunk-row's decoded bytes each) are this object's.
    """

    def __init__(self, grid: ChunkGrid, edtype: np.dtype, chunk_nbytes: int) -> None:
        self._grid = grid
        self._edtype = edtype
        self._chunk_nbytes = chunk_nbytes
        self._nbytes = grid.per_chunk_row * chunk_nbytes
        trailing = len(grid.chunks) - 1
        #: Where the chunks tile the rows exactly: the buffer as (k1.., c0, c1..), and the axes that make it
        #: (c0, k1, c1, ..).
        self._even = all(s == k * c for s, k, c in zip(grid.shape[1:], grid.counts[1:], grid.chunks[1:]))
        self._tiled = grid.counts[1:] + grid.chunks
        self._axes = (trailing,) + tuple(a for i in range(trailing) for a in (i, trailing + 1 + i))
        self._split = tuple(n for k, c in zip(grid.counts[1:], grid.chunks[1:]) for n in (k, c))
        #: Where in a chunk-row's bytes each chunk's lie, by its index past axis 0.
        self._at = {index: k * chunk_nbytes for k, (index, _, _) in enumerate(grid.trailing)}
        self._left: dict[int, int] = {}
        self._rows: dict[int, np.ndarray] = {}
        self._parts: dict[int, list[tuple[ChunkPart, int]]] = {}
        self._free: list[np.ndarray] = []

    def expect(self, parts: "list[ChunkPart]", kept_row: int) -> None:
        """The chunks of ``parts`` but those of chunk-row ``kept_row`` will be decoded into :meth:`into`'s bytes
        (what an earlier read left is dropped)."""
        self.clear()
        left = self._left
        for part in parts:
            i0 = part.index[0]
            if i0 != kept_row:
                left[i0] = left.get(i0, 0) + 1

    def into(self, part: ChunkPart) -> np.ndarray:
        """The bytes (uint8, the chunk's) to decode the chunk of ``part`` into."""
        i0 = part.index[0]
        row = self._rows.get(i0)
        if row is None:
            row = self._rows[i0] = self._free.pop() if self._free else spare_bytes(self._nbytes)  # NOTE [spare buffers]
            self._parts[i0] = []
        at = self._at[part.index[1:]]
        self._parts[i0].append((part, at))
        return row[at : at + self._chunk_nbytes]

    def decoded(self, part: ChunkPart, out: np.ndarray) -> None:
        """The chunk of ``part`` is decoded: where it was its chunk-row's last, copy the chunk-row into ``out``
        (C-contiguous, the block's elements)."""
        i0 = part.index[0]
        self._left[i0] -= 1
        if self._left[i0]:
            return
        del self._left[i0]
        row, parts = self._rows.pop(i0), self._parts.pop(i0)
        elements = row[: self._nbytes].view(self._edtype)
        if self._even and len(parts) == self._grid.per_chunk_row:
            rows_in_chunk, rows_in_out = part.chunk_sel[0], part.out_sel[0]
            tiles = elements.reshape(self._tiled).transpose(self._axes)[rows_in_chunk]
            target = out[rows_in_out]
            np.copyto(target.reshape(target.shape[:1] + self._split), tiles)
        else:  # edge chunks, or some chunks of the row come otherwise (kept, never written): a copy a chunk
            chunks = self._grid.chunks
            size = math.prod(chunks)
            for one, at in parts:
                at //= self._edtype.itemsize
                np.copyto(out[one.out_sel], elements[at : at + size].reshape(chunks)[one.chunk_sel])
        self._free.append(row)

    def clear(self) -> None:
        """Drop what a read cut short left (its chunk-rows are read again whole)."""
        self._free.extend(self._rows.values())
        self._rows, self._parts, self._left = {}, {}, {}
