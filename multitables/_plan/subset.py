"""Training on a subset of a dataset's rows: which file rows each planned piece reads. Pure, no I/O.

NOTE [subsets]
    An epoch over a subset is planned as over any dataset, in *positions*
    ``0 .. m-1`` of the subset's rows sorted in file order (``_plan.epoch``):
    blocks, shards, windows and resumption are as for a whole dataset of
    ``m`` rows. A planned piece, positions ``[a, b)``, is read as one range
    of file rows, ``rows[a] .. rows[b-1] + 1`` (its *span*), and the rows of
    the subset are taken out of it (``rows[a:b] - rows[a]``). Reading whole
    spans costs nothing where the subset is contiguous (a slice), and little
    where it is dense; where it is sparse, the rows between are read too, as
    they would be anyway where they share chunks with subset rows (chunks are
    the unit of decoding). The default block holds as many subset rows as
    make a span of the usual block size, so a slot holds about what it
    would for the whole dataset.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


def subset_rows(indices: Any, n_rows: int) -> np.ndarray:
    """The rows ``indices`` selects of ``n_rows``, sorted, as int64: an integer array, a slice, or a boolean mask.

    Negative integers count from the end, as numpy's. Raises ``IndexError``
    for rows out of range, ``ValueError`` for a row given twice, an empty
    selection or a mask of the wrong length, ``TypeError`` for anything else.
    """
    if isinstance(indices, slice):
        rows = np.arange(n_rows, dtype=np.int64)[indices]
        if len(rows) and rows[0] > rows[-1]:
            rows = rows[::-1].copy()
    else:
        arr = np.asarray(indices)
        if arr.dtype == np.bool_:
            if arr.shape != (n_rows,):
                raise ValueError(f"a boolean mask of indices needs one value per row ({n_rows}), not shape {arr.shape}")
            rows = np.flatnonzero(arr).astype(np.int64)
        elif arr.dtype.kind in "iu" and arr.ndim == 1:
            rows = arr.astype(np.int64)
            bad = (rows < -n_rows) | (rows >= n_rows)
            if bad.any():
                raise IndexError(f"indices {rows[bad][:5].tolist()} are out of range for {n_rows} rows")
            rows = np.where(rows < 0, rows + n_rows, rows)
            rows.sort()
            twice = rows[1:][rows[1:] == rows[:-1]]
            if len(twice):
                raise ValueError(
                    f"indices give rows {np.unique(twice)[:5].tolist()} more than once; a subset names each row once "
                    f"(to draw rows with replacement, use weights=)"
                )
        else:
            raise TypeError(
                f"indices must be an integer array, a slice or a boolean mask, not {type(indices).__name__}"
                + (f" of dtype {arr.dtype} and shape {arr.shape}" if isinstance(indices, (np.ndarray, list)) else "")
            )
    if not len(rows):
        raise ValueError(f"indices select none of the {n_rows} rows")
    return rows


def default_subset_block(file_block: int, m: int, n_rows: int) -> int:
    """Subset rows per block: as many as make a span of ``file_block`` file rows on average (NOTE [subsets])."""
    return max(1, min(m, int(file_block * m / n_rows)))


@dataclass(frozen=True)
class Spans:
    """What the pieces of an epoch read: file row ranges, and the subset rows within each (None: all of it)."""

    starts: tuple[int, ...]
    stops: tuple[int, ...]
    selections: tuple["np.ndarray | None", ...]


def piece_spans(rows: np.ndarray, starts: Sequence[int], stops: Sequence[int]) -> Spans:
    """The span of each piece ``[starts[i], stops[i])`` of positions, and the offsets of its rows in the span."""
    span_starts, span_stops, selections = [], [], []
    for a, b in zip(starts, stops):
        first, last = int(rows[a]), int(rows[b - 1])
        span_starts.append(first)
        span_stops.append(last + 1)
        selections.append(None if last + 1 - first == b - a else rows[a:b] - first)
    return Spans(tuple(span_starts), tuple(span_stops), tuple(selections))


def subset_key(rows: np.ndarray) -> str:
    """A short fingerprint of a subset: a saved position only loads into batches over the same rows."""
    return f"{len(rows)}:{zlib.crc32(np.ascontiguousarray(rows, np.int64).tobytes()):08x}"
