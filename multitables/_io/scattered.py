"""Rows at given positions, sorted, into a caller's buffer: what a request reader reads with.

A request's rows are sorted (NOTE [request plan] in ``_plan.requests``) and read
in runs: h5py through its low-level calls (:meth:`~multitables._io.h5py_engine.H5pySource.read_runs`,
the h5py engine's own open), any other engine through its ``Source.read_into``,
one call per group of rows that share chunks.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .._plan.requests import effective_chunk_rows, group_bounds, run_bounds
from .engines import open_source
from .h5py_engine import H5pySource
from .node import NodeInfo

#: Most runs of rows in one h5py read: HDF5 builds a union of hyperslabs in
#: quadratic time (256 runs: ~2 ms; 2560: ~120 ms), so longer lists are read in pieces.
RUNS_PER_READ = 64


class Stopped(Exception):
    """The consumer asked the readers to stop while one was reading."""


class _H5pyRows:
    """Reads sorted rows with h5py's low-level calls: one HDF5 read per up to ``RUNS_PER_READ`` runs.

    The high-level ``read_direct`` costs ~100 us more per call than
    ``DatasetID.read``; a request of 256 scattered rows makes 256 runs.
    """

    def __init__(self, node: NodeInfo, open_kwargs: dict[str, Any]) -> None:
        self._source = H5pySource(node, open_kwargs)

    def read(self, rows: np.ndarray, out: np.ndarray, stopped: Callable[[], bool]) -> None:
        if out.nbytes == 0:
            return
        bounds = run_bounds(rows)
        firsts = rows[bounds[:-1]].tolist()
        lasts = rows[bounds[1:] - 1].tolist()
        idx = bounds.tolist()
        for r0 in range(0, len(firsts), RUNS_PER_READ):
            r1 = min(r0 + RUNS_PER_READ, len(firsts))
            self._source.read_runs(firsts[r0:r1], lasts[r0:r1], out[idx[r0] : idx[r1]])
            if stopped():
                raise Stopped

    def close(self) -> None:
        self._source.close()


class _SourceRows:
    """Reads sorted rows through any engine's ``Source.read_into``, one call per group (NOTE [request plan])."""

    def __init__(self, engine: str, node: NodeInfo, open_kwargs: dict[str, Any]) -> None:
        self._source = open_source(engine, node, open_kwargs)
        self._node = node
        self._chunk = effective_chunk_rows(node.chunk_rows, node.row_nbytes)
        self._scratch: "np.ndarray | None" = None

    def read(self, rows: np.ndarray, out: np.ndarray, stopped: Callable[[], bool]) -> None:
        if out.nbytes == 0:
            return
        bounds = group_bounds(rows, self._chunk).tolist()
        values = rows.tolist()
        for i0, i1 in zip(bounds[:-1], bounds[1:]):
            lo, hi = values[i0], values[i1 - 1] + 1
            if hi - lo == i1 - i0:
                self._source.read_into(lo, hi, out[i0:i1])
            else:  # runs within one chunk: read the span they cover once, then gather
                if self._scratch is None or len(self._scratch) < hi - lo:
                    self._scratch = np.empty((max(hi - lo, self._chunk),) + self._node.row_shape, self._node.dtype)
                span = self._scratch[: hi - lo]
                self._source.read_into(lo, hi, span)
                np.take(span, rows[i0:i1] - lo, axis=0, out=out[i0:i1])
            if stopped():
                raise Stopped

    def close(self) -> None:
        self._source.close()


def open_rows(engine: str, node: NodeInfo, open_kwargs: dict[str, Any]) -> "_H5pyRows | _SourceRows":
    if engine == "h5py" and not node.parts:  # a set reads each file's rows through its own source
        return _H5pyRows(node, open_kwargs)
    return _SourceRows(engine, node, open_kwargs)
