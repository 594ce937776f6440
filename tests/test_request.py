"""Request planning: numpy's semantics, exactly, without I/O (see NOTE [request plan])."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from multitables._plan.requests import (
    effective_chunk_rows,
    group_bounds,
    normalize_key,
    plan_rows,
    result_shape,
    run_bounds,
    split_shares,
    zero_d,
)


@st.composite
def shapes(draw: st.DrawFn) -> tuple[int, ...]:
    n_rows = draw(st.integers(1, 9))
    rest = draw(st.lists(st.integers(0, 4), min_size=0, max_size=2))
    return (n_rows, *rest)


def entry(draw: st.DrawFn, dim: int, wild: bool) -> object:
    """One index entry for an axis of size ``dim``; ``wild`` allows out-of-range values."""
    lo, hi = (-dim - 2, dim + 1) if wild else (-dim, dim - 1)
    kind = draw(st.sampled_from(["int", "slice", "list", "array", "array2d", "mask", "none", "ellipsis"]))
    if kind == "int" and hi >= lo:
        return draw(st.integers(lo, hi)) if dim or wild else 0
    if kind == "slice":
        bound = st.one_of(st.none(), st.integers(-dim - 2, dim + 2))
        step = st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0 or wild))
        return slice(draw(bound), draw(bound), draw(step))
    if kind in ("list", "array", "array2d") and (dim or wild):
        values = st.lists(st.integers(lo, hi), min_size=0, max_size=6)
        got = draw(values)
        if kind == "list":
            return got
        arr = np.array(got, dtype=draw(st.sampled_from([np.int64, np.int32, np.uint8])) if all(v >= 0 for v in got) else np.int64)
        if kind == "array2d" and len(arr) % 2 == 0:
            arr = arr.reshape(2, -1)
        return arr
    if kind == "mask":
        n = dim if not wild or draw(st.booleans()) else dim + 1
        return np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    if kind == "none":
        return None
    if kind == "ellipsis":
        return Ellipsis
    return slice(None)


@st.composite
def keys(draw: st.DrawFn, wild: bool = False) -> tuple[tuple[int, ...], object]:
    shape = draw(shapes())
    n = draw(st.integers(0, len(shape) + 1))
    entries = []
    axis = 0
    for _ in range(n):
        dim = shape[min(axis, len(shape) - 1)]
        e = entry(draw, dim, wild)
        if e is Ellipsis and any(x is Ellipsis for x in entries) and not wild:
            continue
        entries.append(e)
        if e is not None and e is not Ellipsis:
            axis += 1
    if len(entries) == 1 and draw(st.booleans()):
        return shape, entries[0]
    return shape, tuple(entries)


def numpy_result(data: np.ndarray, key: object) -> "np.ndarray | type":
    try:
        return data[key]
    except (IndexError, ValueError, TypeError) as exc:
        return type(exc)


def data_of(shape: tuple[int, ...]) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)


@settings(max_examples=800, deadline=None)
@given(keys(wild=True))
# A mask of length 0 selects nothing from an axis of any length, in numpy (found by hypothesis).
@example(case=((1, 0, 1), (0, Ellipsis, np.array([], dtype=bool))))
@example(case=((4, 3), (slice(None), np.array([], dtype=bool))))
@example(case=((4, 3), np.zeros((0, 3), dtype=bool)))
# An Ellipsis of no axis between index arrays still parts them: numpy puts their axes first (found by hypothesis).
@example(case=((1, 0, 0), (slice(None), np.array([], dtype=np.int64), Ellipsis, [])))
@example(case=((2, 3, 4), (slice(None), [0], Ellipsis, [1])))
def test_plan_reads_then_indexes_like_numpy(case: tuple) -> None:
    """Reading the planned rows, then applying the local key, is ``data[key]``; bad keys fail as in numpy."""
    shape, key = case
    data = data_of(shape)
    expected = numpy_result(data, key)
    try:
        nkey = normalize_key(key, shape)
    except (IndexError, ValueError, TypeError) as exc:
        # Stricter than numpy in one corner: numpy skips bounds checks when the
        # arrays broadcast to nothing; a request checks every index.
        empty_ok = isinstance(exc, IndexError) and "out of bounds" in str(exc) and np.size(expected) == 0
        assert isinstance(expected, type) or empty_ok, f"numpy accepts {key!r} on {shape} but the plan rejects it: {exc}"
        return
    assert not isinstance(expected, type), f"numpy rejects {key!r} on {shape} ({expected.__name__}) but the plan accepts it"
    plan = plan_rows(nkey, shape, keep_0d=zero_d(key, nkey))
    rows = plan.rows_between(0, plan.n_read)
    assert len(rows) == plan.n_read
    assert (np.diff(rows) > 0).all(), "rows read are sorted, each once"
    got = data[rows][plan.local_key]
    assert np.shape(got) == np.shape(expected) == plan.shape == result_shape(nkey, shape)
    np.testing.assert_array_equal(got, expected)
    assert type(got) is type(expected), f"{key!r} on {shape}: numpy gives {type(expected).__name__}, the plan {type(got).__name__}"
    if plan.view:
        read = data[rows]
        assert isinstance(read[plan.local_key], np.generic) or np.shares_memory(read[plan.local_key], read) or read[plan.local_key].size == 0


@settings(max_examples=300, deadline=None)
@given(keys())
def test_row_span_and_rows_between_agree(case: tuple) -> None:
    shape, key = case
    try:
        nkey = normalize_key(key, shape)
    except (IndexError, ValueError, TypeError):
        return
    plan = plan_rows(nkey, shape)
    rows = plan.rows_between(0, plan.n_read)
    span = plan.row_span()
    if plan.n_read == 0:
        assert span is None
    else:
        assert span == (int(rows[0]), int(rows[-1]) + 1)
        assert 0 <= rows[0] and rows[-1] < shape[0]
    # Pieces concatenate to the whole.
    for cut in range(plan.n_read + 1):
        np.testing.assert_array_equal(np.concatenate([plan.rows_between(0, cut), plan.rows_between(cut, plan.n_read)]), rows)


def test_common_forms_are_zero_copy() -> None:
    shape = (100, 4, 5)
    for key in [np.s_[3:40], np.s_[40:3:-2], 7, np.s_[[1, 5, 9]], np.s_[[9, 5, 1]], np.s_[2:9, ..., :3], np.s_[..., 1], np.s_[5, None]]:
        plan = plan_rows(normalize_key(key, shape), shape)
        assert plan.view, key
    for key in [np.s_[[5, 1, 9]], np.s_[[1, 1]], np.s_[[1, 2], :, [0, 1]], np.s_[:, [0, 2]]]:
        plan = plan_rows(normalize_key(key, shape), shape)
        assert not plan.view, key


def test_slices_and_progressions_store_no_rows() -> None:
    for key in [np.s_[3:40:3], np.s_[[2, 4, 6, 8]], np.s_[::-1], 5]:
        plan = plan_rows(normalize_key(key, (100,)), (100,))
        assert plan.rows is None
    plan = plan_rows(normalize_key(np.s_[[1, 2, 7]], (100,)), (100,))
    np.testing.assert_array_equal(plan.rows, [1, 2, 7])


def test_clear_errors() -> None:
    with pytest.raises(IndexError, match="out of bounds for axis 0 with size 10"):
        normalize_key(10, (10, 3))
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 1"):
        normalize_key((0, [1, 5]), (10, 3))
    with pytest.raises(IndexError, match="too many indices"):
        normalize_key((0, 0, 0), (10, 3))
    with pytest.raises(IndexError, match="boolean index did not match"):
        normalize_key(np.ones(9, bool), (10, 3))
    with pytest.raises(IndexError, match="single ellipsis"):
        normalize_key((..., ...), (10, 3))
    with pytest.raises(IndexError, match="broadcast"):
        normalize_key(([1, 2], [1, 2, 0]), (10, 3))
    with pytest.raises(IndexError, match="field name"):
        normalize_key("a", (10,))
    with pytest.raises(IndexError, match="integer .or boolean. type"):
        normalize_key(np.array([1.0]), (10,))
    with pytest.raises(IndexError, match="boolean scalar"):
        normalize_key(True, (10,))
    with pytest.raises(ValueError, match="step cannot be zero"):
        normalize_key(slice(None, None, 0), (10,))


def test_index_arrays_that_select_nothing_are_not_bounds_checked_as_numpy_does() -> None:
    # Found by the Reader's property test: ([], range(2, 3)) on two columns. numpy checks an index array's bounds
    # only where the arrays broadcast to something; then the rows asked for are none.
    data = np.arange(20).reshape(10, 2)
    for key in [([], range(2, 3)), ([50], []), (np.zeros((0, 1), int), [7])]:
        nkey = normalize_key(key, data.shape)
        plan = plan_rows(nkey, data.shape)
        assert plan.n_read == 0 and data[key].shape == result_shape(nkey, data.shape)
    with pytest.raises(IndexError, match="index 7 is out of bounds for axis 1"):
        normalize_key(([1], [7]), data.shape)


sorted_rows = st.lists(st.integers(0, 400), min_size=0, max_size=60, unique=True).map(lambda v: np.array(sorted(v), dtype=np.int64))


@given(sorted_rows)
def test_runs_are_maximal_consecutive(rows: np.ndarray) -> None:
    b = run_bounds(rows)
    assert b[0] == 0 and b[-1] == len(rows)
    for i0, i1 in zip(b[:-1], b[1:]):
        assert i1 > i0
        assert (np.diff(rows[i0:i1]) == 1).all()
    for i in b[1:-1]:
        assert rows[i] != rows[i - 1] + 1


@given(sorted_rows, st.integers(1, 50))
def test_groups_are_dense_runs_or_within_one_chunk(rows: np.ndarray, chunk: int) -> None:
    b = group_bounds(rows, chunk)
    assert b[0] == 0 and b[-1] == len(rows)
    assert (np.diff(b) > 0).all() or len(rows) == 0
    runs = set(run_bounds(rows).tolist())
    assert set(b.tolist()) <= runs, "groups never split a run"
    for i0, i1 in zip(b[:-1], b[1:]):
        g = rows[i0:i1]
        dense = g[-1] - g[0] + 1 == len(g)
        assert dense or g[0] // chunk == g[-1] // chunk


@given(sorted_rows, st.integers(1, 50), st.integers(1, 5))
def test_shares_cover_the_rows_at_chunk_changes(rows: np.ndarray, chunk: int, n: int) -> None:
    plan = plan_rows(normalize_key(rows, (401,)), (401,)) if len(rows) else None
    if plan is None:
        return
    shares = split_shares(plan, chunk, n)
    assert 1 <= len(shares) <= n
    assert shares[0][0] == 0 and shares[-1][1] == plan.n_read
    assert all(a < b for a, b in shares)
    assert all(s[1] == t[0] for s, t in zip(shares[:-1], shares[1:]))
    read = plan.rows_between(0, plan.n_read)
    for a, _ in shares[1:]:
        assert read[a] // chunk != read[a - 1] // chunk


@given(st.integers(0, 1000), st.integers(1, 5), st.integers(0, 300), st.integers(1, 64), st.integers(1, 4))
def test_slice_shares_cut_at_chunk_boundaries(start: int, step: int, m: int, chunk: int, n: int) -> None:
    shape = (start + step * m + 1,)
    plan = plan_rows(normalize_key(slice(start, start + step * m, step), shape), shape)
    assert plan.n_read == m
    shares = split_shares(plan, chunk, n)
    if m == 0:
        assert shares == []
        return
    assert shares[0][0] == 0 and shares[-1][1] == m and len(shares) <= n
    assert all(s[1] == t[0] for s, t in zip(shares[:-1], shares[1:]))
    read = plan.rows_between(0, m)
    for a, _ in shares[1:]:
        assert read[a] // chunk != read[a - 1] // chunk
    if step == 1 and m >= n * chunk * 2:
        sizes = [b - a for a, b in shares]
        assert len(shares) == n and max(sizes) - min(sizes) <= 2 * chunk


def test_effective_chunk_rows() -> None:
    assert effective_chunk_rows(100, 8) == 100
    assert effective_chunk_rows(None, 1024) == 64
    assert effective_chunk_rows(None, 10**9) == 1
