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
      to decode them (a loaded machine). Else a unit is ``UNIT_BYTES`` of
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
    where h5py cannot read the rows (PyTables-only types). Sums of files
    settled when summed are kept under their identity (NOTE [file identity]
    in ``files``), as their descriptions are: batches made again read none.
"""

from __future__ import annotations

import math
import os
import threading
import zlib
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from .._sys.forks import renew_lock_in_children
from .files import settled
from .node import NodeInfo, close_dataset, reopen_dataset

#: Units of rows summed per file (NOTE [data sums]).
SAMPLED = 4
#: Bytes of a unit where the dataset is not chunked.
UNIT_BYTES = 1 << 16
#: Bytes read at each end of a sampled chunk larger than twice this.
EDGE_BYTES = 1 << 14
#: Chunk indexes listed whole up to this many chunks (``chunk_iter``: ~100-400k chunks/s).
SIZES_LIMIT = 4096
#: Sums kept, of files settled when summed (NOTE [file identity] in ``files``): batches made again sum nothing again.
KEPT = 4096
_KEPT: "OrderedDict[tuple[Any, ...], int]" = OrderedDict()
_lock = threading.Lock()
renew_lock_in_children(globals(), "_lock")


def file_sum(node: NodeInfo) -> "int | None":
    """The sum of the one-file ``node``'s data (NOTE [data sums]), read from the file it was described from; None where
    it is not taken."""
    identity = node.identity
    if node.remote is not None or not isinstance(identity, tuple) or node.h5py_problem is not None:
        return None
    key = (node.filename, node.path, identity)
    with _lock:
        if key in _KEPT:
            _KEPT.move_to_end(key)
            return _KEPT[key]
    total = _summed(node)
    if settled(identity) and node.linked_file is None and not node.virtual:  # else its identity may hide a change
        with _lock:
            _KEPT[key] = total
            while len(_KEPT) > KEPT:
                _KEPT.popitem(last=False)
    return total


def _summed(node: NodeInfo) -> int:
    """:func:`file_sum`, read from the file."""
    import h5py

    dataset = reopen_dataset(node)
    try:
        if node.chunk_shape is None or node.virtual or node.vlen:  # rows as read: their stored bytes, or references
            unit = max(1, UNIT_BYTES // max(1, math.prod(dataset.shape[1:]) * dataset.dtype.itemsize))  # a stored row
            return _sampled(node.n_rows, unit, lambda start: _rows(dataset[start:start + unit]))
        listed = None
        if dataset.id.get_num_chunks() <= SIZES_LIMIT:  # every chunk's place, and where it is, in one call
            listed = {}
            dataset.id.chunk_iter(lambda info: listed.__setitem__(info.chunk_offset, info))
        fd = h5py.h5i.get_file_id(dataset.id).get_vfd_handle()  # of the file holding it (a link's target)
        shape = node.chunk_shape[1:]
        across = [math.ceil(n / c) for n, c in zip(dataset.shape[1:], shape)]  # chunks along a row
        picked = _evenly(math.prod(across))
        rest = [tuple(int(i) * c for i, c in zip(np.unravel_index(k, across), shape)) for k in picked]

        def chunks(start: int) -> bytes:  # the sampled chunks of a unit of rows, where chunks split a row
            at = listed.get if listed is not None else dataset.id.get_chunk_info_by_coord
            return b"".join(_chunk(fd, at((start, *r))) for r in rest)

        total = _sampled(node.n_rows, node.chunk_shape[0], chunks)
        if listed is None:
            return total
        places = sorted(listed)  # in the order of their places: a copy may list them in another
        kept = [[*place, listed[place].size, listed[place].filter_mask] for place in places]
        return zlib.crc32(np.array(kept, np.int64).tobytes(), total)
    finally:
        close_dataset(dataset)


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


def forget_sums() -> None:
    """Forget the sums kept (``_io.fileset.forget_learned``)."""
    with _lock:
        _KEPT.clear()
