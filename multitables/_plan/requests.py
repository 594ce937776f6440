"""Planning a random-access request: a numpy-style index turned into rows to read. Pure: no I/O.

NOTE [request plan]
    A request is an index ``key`` on a node of shape ``(n_rows, *row_shape)``
    (for a table column: the column's shape). :func:`normalize_key` checks it
    the way numpy would and writes it out in full: one entry per axis (the
    Ellipsis expanded; one that spans no axis between advanced entries is
    kept, since numpy then moves their axes first), ``None`` kept, negative
    positions made positive, lists made arrays, boolean arrays replaced by
    their ``nonzero()`` integer arrays (which is what numpy does with them).

    :func:`plan_rows` then splits the work in two:

    * the *rows read*: the rows the first-axis entry selects, sorted, each
      once, either an arithmetic progression ``start + step * i`` (ints,
      slices, evenly spaced index lists: nothing to store) or an explicit
      array. Readers read them, in that order, straight into the stage.
    * the *local key*: the index that, applied to the ``(n_read, *row_shape)``
      array of rows read, gives exactly ``data[key]``. The first-axis entry is
      replaced by its position among the rows read (a slice when the rows
      arrive in the right order already, else an integer array); the other
      entries are kept.

    When the local key is *basic* (ints, slices, ``None`` only) numpy returns a
    view: the result is the stage itself, zero-copy. That is the case for a
    slice, an int, or a sorted (or reverse-sorted) index list without repeats
    on the first axis, with basic indexing on the other axes. Any other index
    is gathered from the rows read by numpy, into private memory.

    Splitting the rows read among readers (:func:`split_shares`) cuts at chunk
    boundaries and balances the number of chunks each reader touches, since
    decompressing a chunk is what a read costs.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from types import EllipsisType
from typing import Any, Sequence, Union

import numpy as np

#: One entry of a normalized key: an int, a slice, an integer array, None (a new axis), or an Ellipsis that takes no
#: axis between advanced entries, which numpy's rule of where their axes go still counts (NOTE [request plan]).
Entry = Union[int, slice, np.ndarray, None, "EllipsisType"]

#: Whole axes: what follows the row in a normalized key that picks whole rows (a prefix of it, one per axis of a row).
_WHOLE = (slice(None),) * 64

#: Rows per "chunk" assumed for contiguous (unchunked) datasets: runs closer than this are read together.
CONTIGUOUS_GROUP_BYTES = 64 * 1024


def _entry_kind(entry: Any) -> str:
    if entry is None:
        return "newaxis"
    if entry is Ellipsis:
        return "ellipsis"
    if isinstance(entry, slice):
        return "slice"
    if isinstance(entry, (bool, np.bool_)):
        return "bool"
    if isinstance(entry, (list, tuple, range, np.ndarray)):
        return "array"
    if isinstance(entry, (str, bytes)):
        return "str"
    try:
        operator.index(entry)
    except TypeError:  # an array of another library (a torch tensor, say) is one, as numpy takes it
        return "array" if hasattr(entry, "__array__") else "other"
    return "int"


def _as_index_array(entry: Any) -> np.ndarray:
    arr = np.asarray(entry)
    if arr.dtype == np.bool_:
        return arr
    if arr.size == 0 and arr.dtype.kind not in "iu" and not isinstance(entry, np.ndarray):
        return arr.astype(np.intp)  # [] is a valid (empty) index list; an empty float array is not, as in numpy
    if arr.dtype.kind not in "iu":
        raise IndexError("arrays used as indices must be of integer (or boolean) type")
    return arr


#: The largest slice step planned: a larger one selects as much (one element of any axis), and a stage's header holds
#: int64.
_STEP_MAX = 1 << 62


def _check_slice(s: slice) -> slice:
    for part in (s.start, s.stop, s.step):
        if part is not None:
            try:
                operator.index(part)
            except TypeError:
                raise TypeError("slice indices must be integers or None or have an __index__ method") from None
    if s.step is not None and operator.index(s.step) == 0:
        raise ValueError("slice step cannot be zero")
    if s.step is not None and abs(operator.index(s.step)) > _STEP_MAX:  # past any axis: one element, as numpy's
        return slice(s.start, s.stop, _STEP_MAX if operator.index(s.step) > 0 else -_STEP_MAX)
    return s


def _norm_int(i: Any, dim: int, axis: int) -> int:
    i = operator.index(i)
    if not -dim <= i < dim:
        raise IndexError(f"index {i} is out of bounds for axis {axis} with size {dim}")
    return i + dim if i < 0 else i


def _norm_int_array(arr: np.ndarray, dim: int, axis: int) -> np.ndarray:
    arr = arr.astype(np.intp, copy=False)
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < -dim or hi >= dim:
            bad = lo if lo < -dim else hi
            raise IndexError(f"index {bad} is out of bounds for axis {axis} with size {dim}")
        if lo < 0:
            arr = np.where(arr < 0, arr + dim, arr)
    return arr


def normalize_key(key: Any, shape: Sequence[int]) -> tuple[Entry, ...]:
    """Check ``key`` against ``shape`` as numpy would and write it out in full; see NOTE [request plan].

    Raises ``IndexError`` (out of range, too many indices, mismatched
    arrays or masks), ``TypeError`` or ``ValueError`` (zero step) like numpy.
    """
    shape = tuple(map(int, shape))
    ndim = len(shape)
    if ndim and type(key) in (int, slice):  # one row or one slice of rows, the commonest: a third of a request's planning
        first = _norm_int(key, shape[0], 0) if type(key) is int else _check_slice(key)
        return (first,) + (slice(None),) * (ndim - 1)
    entries = list(key) if isinstance(key, tuple) else [key]
    kinds = [_entry_kind(e) for e in entries]
    if kinds.count("ellipsis") > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    for e, kind in zip(entries, kinds):
        if kind == "bool":
            raise IndexError("a boolean scalar is not a supported index; use a boolean array (a mask)")
        if kind == "str":
            raise IndexError(
                f"{e!r}: a field name goes alone in the brackets (dataset[{e!r}]), several in a list "
                f"(dataset[[{e!r}, ...]]), never in a tuple of indices"
            )
        if kind == "other":
            raise IndexError(
                "only integers, slices (`:`), ellipsis (`...`), None and integer or boolean arrays are "
                f"valid indices, not {type(e).__name__}"
            )
    arrays = {i: _as_index_array(e) for i, (e, k) in enumerate(zip(entries, kinds)) if k == "array"}
    # A 0-d integer array is an int; a k-d boolean array covers k axes.
    width = {}
    for i, arr in arrays.items():
        if arr.dtype == np.bool_:
            if arr.ndim == 0:
                raise IndexError("a boolean scalar is not a supported index; use a boolean array (a mask)")
            width[i] = arr.ndim
        else:
            width[i] = 1
    used = sum(width.get(i, 1) for i, k in enumerate(kinds) if k not in ("newaxis", "ellipsis"))
    if used > ndim:
        raise IndexError(f"too many indices: the data is {ndim}-dimensional, but {used} were indexed")
    out: list[Entry] = []
    out_of_bounds: "IndexError | None" = None  # numpy checks an index array's bounds only where it selects something
    axis = 0
    for i, (e, kind) in enumerate(zip(entries, kinds)):
        if kind == "newaxis":
            out.append(None)
        elif kind == "ellipsis":
            advanced = [j for j, k in enumerate(kinds) if k in ("array", "int")]
            if used == ndim and "array" in kinds and advanced and advanced[0] < i < advanced[-1]:
                out.append(Ellipsis)  # no axis, but it parts the advanced entries: numpy puts their axes first
            for _ in range(ndim - used):
                out.append(slice(None))
                axis += 1
        elif kind == "slice":
            out.append(_check_slice(e))
            axis += 1
        elif kind == "int":
            out.append(_norm_int(e, shape[axis], axis))
            axis += 1
        else:
            arr = arrays[i]
            if arr.dtype == np.bool_:
                dims = shape[axis : axis + arr.ndim]
                if arr.shape != dims:
                    for j, (got, want) in enumerate(zip(arr.shape, dims)):
                        # numpy lets a mask of length 0 index an axis of any
                        # length (it selects nothing), so do we.
                        if got != want and got != 0:
                            raise IndexError(
                                f"boolean index did not match indexed array along axis {axis + j}; size of "
                                f"axis is {want} but size of corresponding boolean axis is {got}"
                            )
                out.extend(arr.nonzero())
                axis += arr.ndim
            elif arr.ndim == 0:
                out.append(_norm_int(arr, shape[axis], axis))
                axis += 1
            else:
                try:
                    out.append(_norm_int_array(arr, shape[axis], axis))
                except IndexError as exc:
                    out_of_bounds = out_of_bounds or exc
                    out.append(arr.astype(np.intp, copy=False))
                axis += 1
    while axis < ndim:  # no Ellipsis: the remaining axes are taken whole
        out.append(slice(None))
        axis += 1
    array_shapes = [e.shape for e in out if isinstance(e, np.ndarray)]
    selected = array_shapes[0] if array_shapes else ()
    if len(array_shapes) > 1:
        try:
            selected = np.broadcast_shapes(*array_shapes)
        except ValueError:
            shapes = " ".join(str(s) for s in array_shapes)
            raise IndexError(f"shape mismatch: indexing arrays could not be broadcast together with shapes {shapes}") from None
    if out_of_bounds is not None:
        if math.prod(selected):
            raise out_of_bounds
        # Nothing selected (an empty array broadcast with the others): numpy gives an empty result, as do we.
        out = [np.zeros(selected, np.intp) if isinstance(e, np.ndarray) else e for e in out]
    return tuple(out)


def is_basic(nkey: Sequence[Entry]) -> bool:
    """Whether numpy indexes with ``nkey`` by view (ints, slices and None only)."""
    return not any(isinstance(e, np.ndarray) for e in nkey)


def result_shape(nkey: Sequence[Entry], shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of ``data[key]`` for a normalized key, by numpy's rules (no data needed)."""
    dims = iter(shape)
    out: list[int] = []
    if is_basic(nkey):
        for e in nkey:
            if e is None:
                out.append(1)
            else:
                d = next(dims)
                if isinstance(e, slice):
                    out.append(len(range(*e.indices(d))))
        return tuple(out)
    # Advanced indexing: ints join the arrays; their broadcast shape goes where the
    # first of them is when they are all next to each other, else first.
    advanced = [i for i, e in enumerate(nkey) if isinstance(e, (int, np.ndarray))]  # neither None, ... nor a slice
    contiguous = advanced == list(range(advanced[0], advanced[-1] + 1))
    broadcast = np.broadcast_shapes(*(np.shape(e) for e in nkey if isinstance(e, (int, np.ndarray))))
    for i, e in enumerate(nkey):
        if e is None:
            out.append(1)
            continue
        if e is Ellipsis:
            continue
        d = next(dims)
        if isinstance(e, slice):
            out.append(len(range(*e.indices(d))))
        elif contiguous and i == advanced[0]:
            out.extend(broadcast)
    return tuple(out) if contiguous else tuple(broadcast) + tuple(out)


def _full(e: Entry, dim: int) -> bool:
    return isinstance(e, slice) and e.indices(dim) == (0, dim, 1)


def _range_slice(r: range) -> slice:
    """The slice that selects ``r`` (from a range's normalized start, stop, step)."""
    if len(r) == 0:
        return slice(0, 0, 1)
    return slice(r.start, r.stop if r.stop >= 0 else None, r.step)


def compose_keys(nkey: tuple[Entry, ...], shape: Sequence[int], key: Any) -> "tuple[Entry, ...] | None":
    """One normalized key on ``shape`` that selects ``data[nkey][key]``, or None where there is none.

    NOTE [chained keys]: ``dataset[a:b][k]`` reads only what ``k`` keeps
    when the first key selects rows and nothing else: its first-axis entry
    (an int, a slice, a list of rows) is composed with the entry of ``k``
    that indexes that axis, *of the same kind* (an int stays an int, a slice
    a slice, an array an array), so numpy places the axes of the composed
    key where it places those of ``k`` (advanced indices move axes). Where
    that cannot hold, None: the caller indexes the rows read instead.
    Raises what numpy raises for ``key`` on ``data[nkey]``.
    """
    shape = tuple(int(d) for d in shape)
    inner = result_shape(nkey, shape)
    nk2 = normalize_key(key, inner)
    e0 = nkey[0] if nkey else None
    if e0 is None or any(e is None for e in nkey) or not all(_full(e, d) for e, d in zip(nkey[1:], shape[1:])):
        return None
    if isinstance(e0, int):
        # data[i][k] is data[i, *k] only when k is basic (an int joins advanced indices and can move axes), and
        # not when k makes a scalar a 0-d array.
        return (e0,) + nk2 if is_basic(nk2) and not zero_d(key, (e0,) + nk2) else None
    if isinstance(e0, np.ndarray) and e0.ndim != 1:
        return None
    p = next(i for i, e in enumerate(nk2) if e is not None)
    f0 = nk2[p]
    if isinstance(e0, slice):
        rows: "range | np.ndarray" = range(*e0.indices(shape[0]))
    else:
        assert isinstance(e0, np.ndarray)  # normalized: an Ellipsis only ever parts advanced entries, never first
        rows = e0
    if isinstance(f0, int):
        c0: Entry = int(rows[f0])
    elif isinstance(f0, slice):
        picked = rows[f0]
        if isinstance(picked, range):
            c0 = _range_slice(picked)
        else:
            prog = _progression(picked) if len(picked) else (0, 1)
            if prog is not None and prog[1] > 0:
                c0 = slice(prog[0], prog[0] + prog[1] * len(picked), prog[1])
            elif any(e is not None and not isinstance(e, slice) for e in nk2[p + 1 :]):
                return None  # an array here would join the other advanced indices
            else:
                c0 = np.asarray(picked, dtype=np.intp)
    else:
        assert isinstance(f0, np.ndarray)
        c0 = np.asarray(rows, dtype=np.intp)[f0] if isinstance(rows, np.ndarray) else (
            rows.start + rows.step * f0.astype(np.intp)
        )
    return nk2[:p] + (c0,) + nk2[p + 1 :]


@dataclass(frozen=True, eq=False)
class RowPlan:
    """Which rows of the node a request reads, and how to index them; see NOTE [request plan].

    The rows read are ``rows`` when it is set, else ``start + step * i`` for
    ``i`` in ``range(n_read)``; either way sorted and without repeats.
    """

    n_read: int
    start: int
    step: int
    rows: "np.ndarray | None"
    local_key: tuple[Any, ...]  # Entry, and a last Ellipsis where a 0-d array is kept (plan_rows' keep_0d)
    shape: tuple[int, ...]

    @property
    def view(self) -> bool:
        """Whether the result is a view of the rows read (zero-copy)."""
        return is_basic(self.local_key)

    def rows_between(self, a: int, b: int) -> np.ndarray:
        """Rows read number ``a`` to ``b - 1``."""
        if self.rows is not None:
            return self.rows[a:b]
        return self.start + self.step * np.arange(a, b, dtype=np.int64)

    def row_span(self) -> "tuple[int, int] | None":
        """``(first, last + 1)`` of the rows read (None when none are)."""
        if self.n_read == 0:
            return None
        last = int(self.rows[-1]) if self.rows is not None else self.start + self.step * (self.n_read - 1)
        first = int(self.rows[0]) if self.rows is not None else self.start
        return first, last + 1


def _progression(rows: np.ndarray) -> "tuple[int, int] | None":
    """``(start, step)`` when sorted unique ``rows`` are evenly spaced."""
    if len(rows) == 0:
        return 0, 1
    if len(rows) == 1:
        return int(rows[0]), 1
    steps = np.diff(rows)
    if (steps == steps[0]).all():
        return int(rows[0]), int(steps[0])
    return None


def zero_d(key: Any, nkey: tuple[Entry, ...]) -> bool:
    """Whether numpy gives a 0-d array for ``key``, not a scalar: an int on every axis, and an Ellipsis."""
    entries = key if isinstance(key, tuple) else (key,)
    return any(e is Ellipsis for e in entries) and all(type(e) is int for e in nkey)


def plan_rows(nkey: tuple[Entry, ...], shape: Sequence[int], *, keep_0d: bool = False) -> RowPlan:
    """Plan a normalized key on ``shape``: the rows to read and the local key; see NOTE [request plan].

    ``keep_0d``: the key picks one element and held an Ellipsis (:func:`zero_d`), so the local key ends with one,
    which makes numpy give a 0-d view of the stage, as it gives for that key, instead of a scalar.
    """
    shape = tuple(map(int, shape))
    rest = nkey[1:]  # one whole row (a map-style Dataset's per sample), planned directly; == only on slices (not arrays)
    if nkey and len(nkey) == len(shape) and type(nkey[0]) is int and all(type(e) is slice for e in rest) and rest == _WHOLE[: len(rest)]:
        return RowPlan(1, nkey[0], 1, None, local_key=(0,) + rest + ((Ellipsis,) if keep_0d else ()), shape=shape[1:])
    pos0 = next(i for i, e in enumerate(nkey) if e is not None)
    e0 = nkey[pos0]
    out_shape = result_shape(nkey, shape)

    def plan(n: int, start: int, step: int, local0: Entry, rows: "np.ndarray | None" = None) -> RowPlan:
        local = nkey[:pos0] + (local0,) + nkey[pos0 + 1 :] + ((Ellipsis,) if keep_0d else ())
        return RowPlan(n_read=n, start=start, step=step, rows=rows, local_key=local, shape=out_shape)

    def plan_array(rows: np.ndarray, local0: Entry) -> RowPlan:
        prog = _progression(rows)
        if prog is not None:  # evenly spaced: nothing to store
            return plan(len(rows), prog[0], prog[1], local0)
        return plan(len(rows), 0, 1, local0, rows.astype(np.int64, copy=False))

    if isinstance(e0, int):
        return plan(1, e0, 1, 0)
    if isinstance(e0, slice):
        r = range(*e0.indices(shape[0]))
        if r.step > 0:
            return plan(len(r), r.start, r.step, slice(None))
        return plan(len(r), r[-1] if len(r) else 0, -r.step, slice(None, None, -1))
    assert isinstance(e0, np.ndarray)  # normalized, neither an int nor a slice: rows, an array of them
    others = [e for i, e in enumerate(nkey) if i != pos0 and e is not None and e is not Ellipsis and not isinstance(e, slice)]
    # Replacing the array by a slice keeps numpy's semantics only when no other
    # advanced entry could change where its axis goes.
    alone = not any(isinstance(e, np.ndarray) for e in others) and (not others or pos0 == 0)
    if e0.ndim == 1 and alone and len(e0) > 0:
        steps = np.diff(e0)
        if (steps > 0).all():
            return plan_array(e0, slice(None))
        if (steps < 0).all():
            return plan_array(e0[::-1], slice(None, None, -1))
    rows, inverse = np.unique(e0, return_inverse=True)
    return plan_array(rows, inverse.reshape(e0.shape).astype(np.intp, copy=False))


def effective_chunk_rows(chunk_rows: "int | None", row_nbytes: int) -> int:
    """Rows that are read together: a chunk's, or :data:`CONTIGUOUS_GROUP_BYTES` worth for contiguous data."""
    if chunk_rows:
        return int(chunk_rows)
    return max(1, CONTIGUOUS_GROUP_BYTES // max(row_nbytes, 1))


#: The rows a reader reads (NOTE [request plan]): a sorted array, or a range where the plan is a progression.
ReadRows = Union[np.ndarray, range]


def rows_array(rows: ReadRows) -> np.ndarray:
    """``rows`` as an int64 array: a range's rows made (8 bytes each, owned by the caller), an array as it is."""
    if isinstance(rows, range):
        return np.arange(rows.start, rows.stop, rows.step, dtype=np.int64)
    return rows


def run_bounds(rows: np.ndarray) -> np.ndarray:
    """Where the runs of consecutive values of sorted unique ``rows`` start, and ``len(rows)`` last."""
    m = len(rows)
    if m == 0:
        return np.zeros(1, dtype=np.intp)
    breaks = np.flatnonzero(rows[1:] != rows[:-1] + 1) + 1
    return np.concatenate(([0], breaks, [m])).astype(np.intp)


def group_bounds(rows: np.ndarray, chunk_rows: int) -> np.ndarray:
    """Split sorted unique ``rows`` into groups to read with one call each.

    A group is either a run of consecutive rows (read straight into place) or
    runs that all lie in one chunk (read as the span they cover, then
    gathered: the chunk is decoded once). Returns the bounds, as
    :func:`run_bounds` does.
    """
    bounds = run_bounds(rows)
    if len(bounds) <= 2:
        return bounds
    first = rows[bounds[:-1]] // chunk_rows
    last = rows[bounds[1:] - 1] // chunk_rows
    inside = first == last  # the run lies in one chunk
    merge = inside[1:] & inside[:-1] & (first[1:] == last[:-1])
    return np.concatenate((bounds[:-1][np.concatenate(([True], ~merge))], bounds[-1:]))


def split_shares(plan: RowPlan, chunk_rows: int, n: int) -> list[tuple[int, int]]:
    """Cut the rows read into at most ``n`` contiguous shares ``[a, b)`` touching about as many chunks each.

    Cuts fall where the chunk changes, so no chunk is decoded by two readers
    (except within a run of rows spread over several chunks' worth of groups).
    """
    m = plan.n_read
    if m == 0:
        return []
    if n == 1:  # nothing to cut: no pass over the rows
        return [(0, m)]
    if plan.rows is None:
        first = plan.start // chunk_rows
        n_chunks = (plan.start + plan.step * (m - 1)) // chunk_rows - first + 1
        n = max(1, min(n, n_chunks, m))
        cuts = []
        for k in range(1, n):
            row = (first + (k * n_chunks) // n) * chunk_rows
            cuts.append(min(m, max(0, -(-(row - plan.start) // plan.step))))
    else:
        chunk = plan.rows // chunk_rows
        starts = np.flatnonzero(chunk[1:] != chunk[:-1]) + 1  # where each chunk after the first starts
        n_chunks = len(starts) + 1
        n = max(1, min(n, n_chunks))
        cuts = starts[(np.arange(1, n) * n_chunks) // n - 1].tolist()
    edges = sorted(set([0, *cuts, m]))
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
