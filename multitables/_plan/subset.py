"""Training on a subset of a dataset's rows: which file rows each planned piece reads. No I/O.

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

    A weighted draw (``weights=``) is a subset drawn afresh each epoch, with
    replacement, from ``(seed, epoch)``: its rows, sorted, may repeat, and a
    piece takes a repeated row as often as it was drawn. Since blocks are
    runs of the sorted draw, the copies of a row fall in one shuffle window:
    they come within that window's batches, not spread over the epoch.
    Each epoch's draw is made once (:class:`EpochRows`), the next epoch's
    on a thread while this one is read (``_train.draws``), kept for its
    start. A draw takes 20 ms for 131,072 rows here, 0.25 s for a million;
    before, an epoch's first batch drew its rows and its second the next
    epoch's, each in the caller's thread (``benchmarks/epoch_start.py
    --sampling weights``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, overload

import numpy as np

from .._sys.checks import check_int
from .epoch import piece_array, rng


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
        if arr.size == 0 and arr.ndim == 1 and not isinstance(indices, np.ndarray):
            arr = arr.astype(np.int64)  # [] or (): numpy makes them float, but they name no row
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


class Selections(Sequence["np.ndarray | None"]):
    """Which rows of its span each piece takes, made when asked for: piece ``i``'s is ``rows[a:b] - rows[a]`` for its
    positions ``[a, b)``, or None where its rows are its whole span once each. A slice is a view of the same kind.

    Made when asked for, not per piece with the epoch: an epoch of 25,600 pieces, every one of them a selection
    (every other row), took 65 ms of Python to make them (a weighted draw 120 ms; 2-core VM), on the thread that plans
    the next epoch, mostly holding the interpreter's lock; each window now makes its own pieces' as it pulls them.
    """

    def __init__(self, rows: np.ndarray, starts: np.ndarray, stops: np.ndarray, whole: np.ndarray) -> None:
        self._rows, self._starts, self._stops, self._whole = rows, starts, stops, whole

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, i: int) -> "np.ndarray | None": ...
    @overload
    def __getitem__(self, i: slice) -> "Selections": ...
    def __getitem__(self, i: "int | slice") -> "np.ndarray | None | Selections":
        if isinstance(i, slice):
            return Selections(self._rows, self._starts[i], self._stops[i], self._whole[i])
        if self._whole[i]:
            return None
        a, b = int(self._starts[i]), int(self._stops[i])
        return self._rows[a:b] - self._rows[a]

    def __iter__(self) -> Iterator["np.ndarray | None"]:
        return (self[i] for i in range(len(self)))


@dataclass(frozen=True, eq=False)
class Spans:
    """What the pieces of an epoch read: file row ranges (read-only int64 arrays), and the subset rows within each."""

    starts: np.ndarray
    stops: np.ndarray
    selections: Selections


def piece_spans(rows: np.ndarray, starts: "Sequence[int] | np.ndarray", stops: "Sequence[int] | np.ndarray") -> Spans:
    """The span of each piece ``[starts[i], stops[i])`` of positions, and the offsets of its rows in the span."""
    a, b = np.asarray(starts, np.intp), np.asarray(stops, np.intp)
    # A piece is its whole span, once each, where no step inside it is other than 1 (a weighted draw may repeat a
    # row and skip the next): the steps other than 1 before each position, counted once for the epoch.
    breaks = np.concatenate([[0], np.cumsum(np.diff(rows) != 1)])
    return Spans(piece_array(rows[a]), piece_array(rows[b - 1] + 1), Selections(rows, a, b, breaks[b - 1] == breaks[a]))


def subset_key(rows: np.ndarray) -> str:
    """A short fingerprint of a subset: a saved position only loads into batches over the same rows."""
    return f"{len(rows)}:{zlib.crc32(np.ascontiguousarray(rows, np.int64).tobytes()):08x}"


#: Spawn-key tag of the weighted draws, apart from ``_plan.epoch``'s block-order (0) and window (1) tags.
_DRAW = 2


def check_weights(weights: Any, n_rows: int) -> np.ndarray:
    """``weights`` as float64, one per row, finite, >= 0, not all 0; ``ValueError``/``TypeError`` otherwise."""
    w = np.asarray(weights)
    if w.dtype.kind not in "iuf" or w.ndim != 1:
        raise TypeError(f"weights must be a 1-d array of numbers (one per row), not {type(weights).__name__} of dtype {w.dtype}")
    if len(w) != n_rows:
        raise ValueError(f"weights needs one value per row ({n_rows}), not {len(w)}")
    w = w.astype(np.float64)
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights must be finite and not negative")
    if not w.any():
        raise ValueError("weights are all 0: no row could be drawn")
    return w


def epoch_rows(
    file_rows: int, indices: Any = None, weights: Any = None, num_samples: Any = None
) -> "tuple[np.ndarray | None, np.ndarray | None, int]":
    """What an epoch draws from ``file_rows`` rows: the subset's rows, the weights, and the positions of an epoch.

    ``indices`` (a subset, :func:`subset_rows`) or ``weights`` with an
    optional ``num_samples`` (a weighted draw, default ``file_rows`` a
    epoch), or neither (every row). ``ValueError``/``TypeError`` for what
    does not go together or is not of its kind.
    """
    subset = subset_rows(indices, file_rows) if indices is not None else None
    checked = None if weights is None else check_weights(weights, file_rows)
    num_samples = check_int("num_samples", num_samples, 1)
    if checked is not None and subset is not None:
        raise ValueError("give indices= (a subset) or weights= (a weighted draw), not both; weight 0 leaves rows out")
    if num_samples is not None and checked is None:
        raise ValueError("num_samples= is the size of a weighted draw: give weights= too")
    if checked is not None:
        return None, checked, num_samples or file_rows
    return subset, None, file_rows if subset is None else len(subset)


def weighted_draw(weights: np.ndarray, n_samples: int, seed: int, epoch: int) -> np.ndarray:
    """Epoch ``epoch``'s ``n_samples`` rows drawn with replacement, row ``i`` in proportion to ``weights[i]``; sorted.

    The same on every rank and machine: drawn from ``(seed, epoch)`` alone.
    """
    drawn = rng(seed, epoch, _DRAW).choice(len(weights), size=n_samples, replace=True, p=weights / weights.sum())
    drawn.sort()
    return drawn.astype(np.int64)


def weights_key(weights: np.ndarray, n_samples: int) -> str:
    """A short fingerprint of a weighted draw's settings (see :func:`subset_key`)."""
    return f"weights:{n_samples}:{zlib.crc32(np.ascontiguousarray(weights).tobytes()):08x}"


class EpochRows:
    """The file rows of each epoch's positions (NOTE [subsets]): a subset's, the same every epoch; a weighted draw's,
    made once per epoch (the last two drawn are kept: 8 bytes a row each); or None, every row in order.

    ``subset``, ``weights`` and ``n_rows``: as :func:`epoch_rows` gives them; ``seed``: the draws'. A draw may be
    made elsewhere (:meth:`draw`, from any thread) and handed to :meth:`of`: ``_train.draws.DrawsAhead`` makes the
    next epoch's on a thread of its own.
    """

    def __init__(self, subset: "np.ndarray | None", weights: "np.ndarray | None", n_rows: int, seed: int) -> None:
        self._subset, self._weights, self._n_rows, self._seed = subset, weights, n_rows, seed
        self._kept: "dict[int, np.ndarray]" = {}

    def draw(self, epoch: int) -> np.ndarray:
        """Draw ``epoch``'s rows (a weighted draw's only); keeps nothing, so any thread may."""
        assert self._weights is not None
        return weighted_draw(self._weights, self._n_rows, self._seed, epoch)

    def kept(self, epoch: int) -> bool:
        """Whether :meth:`of` gives ``epoch``'s rows without drawing them (nothing to draw, or a draw kept)."""
        return self._weights is None or epoch in self._kept

    def of(self, epoch: int, made: "Callable[[], np.ndarray] | None" = None) -> "np.ndarray | None":
        """The file rows of ``epoch``'s positions, sorted; None: every row, in order.

        Where the epoch is drawn and its draw is not kept, ``made()`` gives it
        (a draw made elsewhere, raising its error if it failed), or else it is
        drawn here; then it is kept.
        """
        if self._weights is None:
            return self._subset
        if epoch not in self._kept:
            rows = made() if made is not None else self.draw(epoch)
            if len(self._kept) >= 2:
                del self._kept[next(iter(self._kept))]  # the one drawn first
            self._kept[epoch] = rows
        return self._kept[epoch]

    def key(self) -> "str | None":
        """A fingerprint of what is drawn (a saved position loads only where it is the same); None: every row."""
        if self._weights is not None:
            return weights_key(self._weights, self._n_rows)
        return None if self._subset is None else subset_key(self._subset)
