"""Rows at given positions, sorted, into a caller's buffer: what a request reader reads with.

A request's rows are sorted (NOTE [request plan] in ``_plan.requests``).
Each engine gives its own reader for them (``open_rows`` of
:class:`~multitables._io.engines.Engine`; :func:`~multitables._io.engines.open_rows`
asks the registry): the h5py engine reads runs of rows in one HDF5 call
(:class:`~multitables._io.h5py_engine.H5pyRows`); any other reads through
its source's ``read_into`` with :class:`GroupRows`, one call per group of
rows that share chunks.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .._plan.requests import ReadRows, effective_chunk_rows, group_bounds, run_bounds
from .node import NodeInfo


#: Bytes of decoded chunks a request reader keeps for each dataset, so that a row of a chunk read before costs a copy:
#: h5py's default chunk cache since 3.16, whatever h5py is installed (random rows of an 8 MB zlib dataset decoded
#: their chunk on every request, 144x h5py).
ROWS_DECODED_BYTES = 8 << 20
#: Kept only for datasets of at most this many times those bytes, where rows asked for at random find their chunk
#: kept at least one time in this many. Each chunk kept is decoded into a buffer out of the CPU's caches, where one
#: reused buffer stays in them: 256-row requests of random rows of a 256 MiB dataset took 8% more CPU so.
ROWS_DECODED_REACH = 8


def rows_decoded_bytes(node: NodeInfo) -> int:
    """Bytes of decoded chunks a request reader of ``node`` keeps: :data:`ROWS_DECODED_BYTES`, or 0 for a dataset
    beyond their reach (:data:`ROWS_DECODED_REACH`)."""
    return ROWS_DECODED_BYTES if node.n_rows * node.row_nbytes <= ROWS_DECODED_REACH * ROWS_DECODED_BYTES else 0


class Stopped(Exception):
    """The consumer asked the readers to stop while one was reading."""


class RowSpans:
    """Spans of a node's rows (delivered dtype) for one reader to read into and pick rows from: its own, reused by its
    next read; a chunk's rows at least, made at the first."""

    def __init__(self, node: NodeInfo, chunk: int) -> None:
        self._node, self._chunk = node, chunk
        self._rows: "np.ndarray | None" = None

    def __call__(self, n: int) -> np.ndarray:
        """``n`` rows of it (valid until the next call)."""
        if self._rows is None or len(self._rows) < n:
            self._rows = np.empty((max(n, self._chunk),) + self._node.row_shape, self._node.dtype)
        return self._rows[:n]


class GroupRows:
    """Reads sorted rows through any engine's ``Source.read_into``, one call per group (NOTE [request plan]).

    ``source``: an open :class:`~multitables._io.engines.Source` of ``node``,
    which this reader owns and closes.
    """

    def __init__(self, source: Any, node: NodeInfo) -> None:
        self._source = source
        self._node = node
        self._chunk = effective_chunk_rows(node.chunk_rows, node.row_nbytes)
        self._span = RowSpans(node, self._chunk)
        # A contiguous dataset of the chunk engine reads runs of rows together (its ``read_runs``)
        self._runs = getattr(source, "reads_runs", False)

    def read(self, rows: ReadRows, out: np.ndarray, stopped: Callable[[], bool]) -> None:
        """Rows ``rows`` (sorted) into ``out``; :class:`Stopped` where ``stopped()`` says so between reads."""
        if out.nbytes == 0:
            return
        if isinstance(rows, range):
            read_progression(self._source.read_into, rows, out, self._chunk, self._span, stopped)
            return
        if self._runs:
            read_runs(self._source.read_runs, rows, out, stopped)
            return
        edges = group_bounds(rows, self._chunk)
        # The groups' first and last rows only: a Python int of every row costs a request of a million rows 30 MiB.
        los, his, bounds = rows[edges[:-1]].tolist(), (rows[edges[1:] - 1] + 1).tolist(), edges.tolist()
        for i0, i1, lo, hi in zip(bounds[:-1], bounds[1:], los, his):
            if hi - lo == i1 - i0:
                self._source.read_into(lo, hi, out[i0:i1])
            else:  # runs within one chunk: read the span they cover once, then gather
                span = self._span(hi - lo)
                self._source.read_into(lo, hi, span)
                np.take(span, rows[i0:i1] - lo, axis=0, out=out[i0:i1])
            if stopped():
                raise Stopped

    def close(self) -> None:
        self._source.close()


#: Runs of rows read by one ``read_runs`` call: a reader checks between them whether it is to stop.
RUNS_PER_CALL = 1024


def read_runs(read: Callable[[Sequence[int], Sequence[int], np.ndarray], None], rows: np.ndarray, out: np.ndarray,
              stopped: Callable[[], bool]) -> None:
    """Sorted unique ``rows`` into ``out`` through ``read(starts, stops, out)``, :data:`RUNS_PER_CALL` runs of
    consecutive rows a call; :class:`Stopped` where ``stopped()`` says so between calls."""
    bounds = run_bounds(rows)
    starts, stops, at = rows[bounds[:-1]].tolist(), (rows[bounds[1:] - 1] + 1).tolist(), bounds.tolist()
    for r0 in range(0, len(starts), RUNS_PER_CALL):
        r1 = min(r0 + RUNS_PER_CALL, len(starts))
        read(starts[r0:r1], stops[r0:r1], out[at[r0] : at[r1]])
        if stopped():
            raise Stopped


def read_progression(read_into: Callable[[int, int, np.ndarray], None], rows: range, out: np.ndarray, chunk: int,
                     span: Callable[[int], np.ndarray], stopped: Callable[[], bool]) -> None:
    """Rows ``rows`` (a range: a slice's rows, never made) into ``out`` through ``read_into(start, stop, out)``.

    Consecutive rows are one read. Rows apart are read a chunk (``chunk``
    rows) at a time, as :class:`GroupRows` groups them, found by arithmetic:
    the span of a chunk's rows into ``span(n)`` (the reader's scratch), its
    rows picked by a strided view. :class:`Stopped` where ``stopped()`` says
    so between reads.
    """
    step, n = rows.step, len(rows)
    if step == 1 or n == 1:
        read_into(rows[0], rows[-1] + 1, out)
        if stopped():
            raise Stopped
        return
    i = 0
    while i < n:
        lo = rows[i]
        j = min(n, i + (chunk - 1 - lo % chunk) // step + 1)  # rows[i:j]: those in lo's chunk
        hi = rows[j - 1] + 1
        if j - i == 1:
            read_into(lo, hi, out[i:j])
        else:  # the chunk's span read once
            got = span(hi - lo)
            read_into(lo, hi, got)
            out[i:j] = got[::step]
        i = j
        if stopped():
            raise Stopped
