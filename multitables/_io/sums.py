"""A cheap sum of what a file's dataset holds: a state's check that it resumes on the same values (NOTE [data sums]).

NOTE [data sums]
    A file written again with the same rows, type and bytes but other values
    (preprocessing run again with another seed, labels fixed, rows shuffled
    otherwise) keeps all else a state records of it
    (NOTE [resumed data] in ``_train.resume``). Reading it all to tell would
    cost an epoch's reads, so a file's *sum* is the CRC-32 of a sample of
    it, taken once per file when batches are made:

    * ``SAMPLED`` units of rows, the first, the last and others evenly
      between. Where the dataset is chunked a unit is a chunk (up to
      ``SAMPLED`` of them where chunks split a row), summed as stored,
      compressed, with no decode: its size, filter mask and bytes, of a
      chunk over ``2 * EDGE_BYTES`` its first and last ``EDGE_BYTES`` (a
      deflated chunk ends with the Adler-32 of all its decoded bytes). Read
      whole, 3 deflated chunks of 1 MiB took 3.3 ms against 58 ms for h5py
      to decode them (2 loaded cores). Else a unit is ``UNIT_BYTES`` of
      rows, read (variable-length rows and virtual datasets too: their
      stored bytes are references, the same for other values).
    * Where a chunked dataset has at most ``SIZES_LIMIT`` chunks, every
      chunk's place, size and filter mask, from the chunk index: a value
      changed anywhere in compressed data almost always changes its chunk's
      size.

    So a change of values throughout (a re-run, another shuffle) is seen in
    any file, and any change in a file of at most ``SAMPLED`` units (of
    deflated chunks or of chunks of at most ``2 * EDGE_BYTES``); a few values
    changed elsewhere in a large file are seen where its chunks are
    compressed, mostly, and not where they are stored as they are. The sum
    is of the file as stored: a copy has it, so does the same data written
    again the same way; a repack with other filters does not (its bytes
    differ too). Nothing is summed (None, not compared) where it would cost
    a download (an object in a bucket or on a server: its size, compared,
    is all the state has), where the file may grow (``swmr=True``), or
    where h5py cannot read the rows (PyTables-only types).

    The sum is taken by the inspection that describes the file for batches
    (``summed=True``), while it has the file open: no open more, the chunk
    index and a few preads. Measured on 2 loaded cores (the inspection's own
    0.2-1.4 ms a file), it added 0.3-0.4 ms a file of 4 KiB chunks and
    0.2-0.6 ms one of 1 MiB chunks (ends of 16 KiB: ~1 ms). It is the node's
    ``data_sum``, kept with the description (``_io.fileset``): batches made
    again over settled files read nothing. A stream's inspection takes none.
"""

from __future__ import annotations

import math
import os
import zlib
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from .node import NodeInfo, close_dataset, reopen_dataset
from .outside import h5py_outside_problem

#: Units of rows summed per file (NOTE [data sums]).
SAMPLED = 4
#: Bytes of a unit where the dataset is not chunked.
UNIT_BYTES = 1 << 16
#: Bytes read at each end of a sampled chunk larger than twice this.
EDGE_BYTES = 1 << 12
#: Chunk indexes listed whole up to this many chunks (``chunk_iter``: ~100-400k chunks/s).
SIZES_LIMIT = 4096


def summable(node: NodeInfo) -> bool:
    """Whether the one-file ``node`` is summed (NOTE [data sums]: not an object, nor a file that may grow)."""
    return node.remote is None and isinstance(node.identity, tuple) and node.h5py_problem is None


def unsummed(node: NodeInfo) -> bool:
    """Whether ``node`` is summable and its ``data_sum`` was not taken (an inspection not asked for it)."""
    return node.data_sum is None and summable(node)


def with_sum(node: NodeInfo, dataset: Any) -> NodeInfo:
    """``node`` with its ``data_sum`` where summable, read through ``dataset`` (its ``h5py.Dataset``, left open); not
    where h5py cannot read a piece of it kept outside the file, which the engines' checks refuse, naming it (NOTE
    [data outside the file] in ``outside``)."""
    if not summable(node) or h5py_outside_problem(node, dataset):
        return node
    return replace(node, data_sum=_summed(node, dataset))


def file_sum(node: NodeInfo) -> "int | None":
    """The sum of the one-file ``node``'s data (NOTE [data sums]): the inspection's, else read from the file it was
    described from (one more open); None where it is not taken."""
    if not summable(node) or node.data_sum is not None:
        return node.data_sum
    dataset = reopen_dataset(node)
    try:
        return _summed(node, dataset)
    finally:
        close_dataset(dataset)


def _summed(node: NodeInfo, dataset: Any) -> int:
    """The sum of ``node``'s data, read through its open ``h5py.Dataset``."""
    import h5py

    if node.chunk_shape is None or node.virtual or node.vlen:  # rows as read: their stored bytes, or references
        unit = max(1, UNIT_BYTES // max(1, math.prod(dataset.shape[1:]) * dataset.dtype.itemsize))  # a stored row
        return _sampled(node.n_rows, unit, lambda start: _rows(dataset[start:start + unit]))
    shape, chunk_shape = dataset.shape, node.chunk_shape
    grid = [math.ceil(n / c) for n, c in zip(shape, chunk_shape)]  # chunks along each axis
    listed: "dict[tuple[int, ...], Any] | None" = None  # h5py's StoreInfo of each chunk, by its offset
    if math.prod(grid) <= SIZES_LIMIT:  # every chunk's place, and where it is, in one call
        listed = {}
        dataset.id.chunk_iter(lambda info: listed.__setitem__(info.chunk_offset, info))
    fd = h5py.h5i.get_file_id(dataset.id).get_vfd_handle()  # of the file holding it (a link's target)
    across = grid[1:]  # chunks along a row
    picked = _evenly(math.prod(across))
    rest = [tuple(int(i) * c for i, c in zip(np.unravel_index(k, across), chunk_shape[1:])) for k in picked]

    def chunks(start: int) -> bytes:  # the sampled chunks of a unit of rows, where chunks split a row
        at = listed.get if listed is not None else dataset.id.get_chunk_info_by_coord
        return b"".join(_chunk(fd, at((start, *r))) for r in rest)

    total = _sampled(node.n_rows, chunk_shape[0], chunks)
    if listed is None:
        return total
    places = sorted(listed)  # in the order of their places: a copy may list them in another
    kept = [[*place, listed[place].size, listed[place].filter_mask] for place in places]
    return zlib.crc32(np.array(kept, np.int64).tobytes(), total)


def _sampled(n_rows: int, unit: int, read: "Callable[[int], bytes]") -> int:
    """The CRC-32 of ``read(start)`` for the units of ``unit`` rows summed (:func:`_evenly`)."""
    total = 0
    for u in _evenly(math.ceil(n_rows / unit)):
        total = zlib.crc32(read(u * unit), total)
    return total


def _evenly(n: int) -> "list[int]":
    """``SAMPLED`` of ``range(n)`` (all where it is no longer): the first, the last, and others evenly between."""
    return sorted({i * (max(1, n) - 1) // (SAMPLED - 1) for i in range(SAMPLED)})


def _chunk(fd: int, info: Any) -> bytes:
    """The stored bytes of the chunk ``info`` (h5py's ``StoreInfo``) tells of, with its size and filter mask: its first
    and last ``EDGE_BYTES`` where it is larger (deflate's stream ends with a sum of the whole chunk)."""
    if info is None or info.byte_offset is None:
        return b"unallocated"
    head = np.array([info.size, info.filter_mask], np.int64).tobytes()
    if info.size <= 2 * EDGE_BYTES:
        return head + os.pread(fd, info.size, info.byte_offset)
    end = info.byte_offset + info.size - EDGE_BYTES
    return head + os.pread(fd, EDGE_BYTES, info.byte_offset) + os.pread(fd, EDGE_BYTES, end)


def _rows(rows: np.ndarray) -> bytes:
    """The bytes of ``rows`` as read; of variable-length ones, each element's bytes and length."""
    if rows.dtype.kind != "O":
        return np.ascontiguousarray(rows).tobytes()
    return b"".join(len(b).to_bytes(8, "little") + b for b in (np.asarray(e).tobytes() for e in rows.flat))

