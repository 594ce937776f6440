"""The chunk plan: which chunks a row range covers and where each part lands (pure, no I/O)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multitables._io.chunks.grid import ChunkGrid, Extent, chunk_indices, chunk_parts, coalesce


@st.composite
def grids_and_ranges(draw: st.DrawFn) -> tuple[ChunkGrid, int, int]:
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    shape = (draw(st.integers(1, 40)),) + shape[1:]
    # Chunks may be larger than the dataset (one partial edge chunk) or equal to the row shape.
    chunks = tuple(draw(st.integers(1, s + 2)) for s in shape)
    if rank > 1 and draw(st.booleans()):
        chunks = chunks[:1] + shape[1:]
    start = draw(st.integers(0, shape[0] - 1))
    stop = draw(st.integers(start + 1, shape[0]))
    return ChunkGrid(shape, chunks), start, stop


def _stored_chunk(data: np.ndarray, grid: ChunkGrid, index: tuple[int, ...]) -> np.ndarray:
    """Chunk ``index`` as HDF5 stores it: whole, the part past the dataset padded (here with -1)."""
    chunk = np.full(grid.chunks, -1, data.dtype)
    origin = grid.origin(index)
    region = tuple(slice(o, min(o + c, s)) for o, c, s in zip(origin, grid.chunks, grid.shape))
    chunk[tuple(slice(0, r.stop - r.start) for r in region)] = data[region]
    return chunk


@settings(max_examples=300, deadline=None)
@given(grids_and_ranges())
def test_parts_assemble_the_rows_exactly_once(case: tuple[ChunkGrid, int, int]) -> None:
    grid, start, stop = case
    data = np.arange(int(np.prod(grid.shape)), dtype=np.int64).reshape(grid.shape)
    out = np.full((stop - start,) + grid.shape[1:], -2, np.int64)
    written = np.zeros(out.shape, np.int64)
    parts = chunk_parts(grid, start, stop)
    for part in parts:
        chunk = _stored_chunk(data, grid, part.index)
        out[part.out_sel] = chunk[part.chunk_sel]
        written[part.out_sel] += 1
        if part.whole:
            # Decoding in place: the whole stored chunk is exactly these output rows' bytes.
            a, b = part.rows
            assert grid.whole_rows and not grid.is_edge(part.index)
            assert chunk.tobytes() == out[a:b].tobytes()
    np.testing.assert_array_equal(out, data[start:stop])
    assert (written == 1).all()
    # In C order of the grid, so chunk rows come in ascending order.
    indices = [p.index for p in parts]
    assert indices == sorted(indices)
    assert len(parts) == len(set(indices))


@settings(max_examples=200, deadline=None)
@given(grids_and_ranges())
def test_chunk_indices_are_the_parts_chunks_in_order(case: tuple[ChunkGrid, int, int]) -> None:
    grid, start, stop = case
    count, indices = chunk_indices(grid, start, stop)
    expected = [part.index for part in chunk_parts(grid, start, stop)]
    assert list(indices) == expected and count == len(expected)
    assert chunk_indices(grid, start, start)[0] == 0


@settings(max_examples=200, deadline=None)
@given(grids_and_ranges())
def test_a_chunk_is_whole_exactly_when_it_lies_inside_the_rows(case: tuple[ChunkGrid, int, int]) -> None:
    grid, start, stop = case
    c0 = grid.chunks[0]
    for part in chunk_parts(grid, start, stop):
        o0 = grid.origin(part.index)[0]
        inside = start <= o0 and o0 + c0 <= stop
        assert part.whole == (grid.whole_rows and inside)


@settings(max_examples=200, deadline=None)
@given(grids_and_ranges())
def test_grid_numbering_is_a_bijection(case: tuple[ChunkGrid, int, int]) -> None:
    grid = case[0]
    import itertools

    all_indices = list(itertools.product(*(range(k) for k in grid.counts)))
    assert [grid.linear(i) for i in all_indices] == list(range(len(all_indices)))
    for index in all_indices:
        assert grid.index_of(grid.origin(index)) == index
        padded = any((i + 1) * c > s for i, c, s in zip(index, grid.chunks, grid.shape))
        assert grid.is_edge(index) == padded
    assert grid.per_chunk_row == int(np.prod(grid.counts[1:]))


def test_examples() -> None:
    grid = ChunkGrid((100, 6), (32, 6))
    parts = chunk_parts(grid, 30, 70)
    assert [p.index for p in parts] == [(0, 0), (1, 0), (2, 0)]
    assert [p.whole for p in parts] == [False, True, False]
    assert parts[0].chunk_sel[0] == slice(30, 32) and parts[0].out_sel[0] == slice(0, 2)
    assert parts[2].chunk_sel[0] == slice(0, 6) and parts[2].out_sel[0] == slice(34, 40)
    # N-d chunking: each chunk row is cut in two along the second dimension; the edge chunk is partial.
    parts = chunk_parts(ChunkGrid((10, 5), (4, 3)), 8, 10)
    assert [(p.index, p.chunk_sel, p.out_sel) for p in parts] == [
        ((2, 0), (slice(0, 2), slice(0, 3)), (slice(0, 2), slice(0, 3))),
        ((2, 1), (slice(0, 2), slice(0, 2)), (slice(0, 2), slice(3, 5))),
    ]
    assert not any(p.whole for p in parts)
    assert chunk_parts(ChunkGrid((10, 0), (4, 1)), 0, 10) == []
    with pytest.raises(ValueError):
        chunk_parts(grid, 50, 101)
    with pytest.raises(ValueError):
        ChunkGrid((10, 5), (4,))


@st.composite
def extent_sets(draw: st.DrawFn) -> tuple[list[Extent], int, int, int]:
    n = draw(st.integers(0, 30))
    offset, extents = draw(st.integers(0, 10_000)), []
    for k in range(n):
        offset += draw(st.integers(0, 5_000))
        size = draw(st.integers(1, 20_000))
        extents.append(Extent(offset, size, k))
        offset += size
    order = draw(st.permutations(range(n)))
    return [extents[i] for i in order], draw(st.integers(0, 8192)), draw(st.integers(1, 100_000)), draw(st.sampled_from([1, 512, 4096]))


@settings(max_examples=300, deadline=None)
@given(extent_sets())
def test_coalesced_reads_cover_every_extent_once_within_the_limits(case: tuple[list[Extent], int, int, int]) -> None:
    extents, max_gap, max_bytes, align = case
    groups = coalesce(extents, max_gap, max_bytes, align)
    members = [e for g in groups for e in g.members]
    assert sorted(members, key=lambda e: e.key) == sorted(extents, key=lambda e: e.key)
    for g in groups:
        assert g.start % align == 0 and g.stop % align == 0
        assert all(g.start <= e.offset and e.offset + e.size <= g.stop for e in g.members)
        assert len(g.members) == 1 or g.stop - g.start <= max_bytes
        ends = sorted(g.members, key=lambda e: e.offset)
        for a, b in zip(ends, ends[1:]):  # neighbours in one read lie within max_gap (after alignment)
            assert b.offset - b.offset % align - (-(-(a.offset + a.size) // align) * align) <= max_gap
    starts = [g.start for g in groups]
    assert starts == sorted(starts)


def test_adjacent_extents_share_one_read() -> None:
    extents = [Extent(1000 + 300 * k, 300, k) for k in range(10)]
    (group,) = coalesce(extents, 0, 1 << 20)
    assert (group.start, group.stop, len(group.members)) == (1000, 4000, 10)
    groups = coalesce(extents, 0, 1000)
    assert [len(g.members) for g in groups] == [3, 3, 3, 1]
    (group,) = coalesce(extents, 0, 1 << 20, align=4096)
    assert (group.start, group.stop) == (0, 4096)
    with pytest.raises(ValueError):
        coalesce(extents, -1, 10)
