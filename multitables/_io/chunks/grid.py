"""Which chunks a row range covers, and where each part of them lands: pure functions, no I/O.

The chunk engine (:mod:`multitables._io.chunks.source`) reads rows ``[start, stop)`` of
a chunked dataset as a list of :class:`ChunkPart`: one per chunk the range
touches, saying which region of the decoded chunk goes to which region of the
output block. HDF5 stores every chunk whole, edge chunks too (padded past the
dataset's extent), so a part's region of the chunk never reaches past the
dataset and a decoded chunk always holds ``prod(chunks)`` elements.

The engine also reads the stored bytes of several chunks with one system call
where they lie close together in the file: :func:`coalesce` plans those reads.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Sequence


@dataclass(frozen=True)
class ChunkGrid:
    """The regular grid of chunks of ``chunks`` elements over a dataset of ``shape``."""

    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    #: Chunks along each dimension.
    counts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.chunks) or not self.shape:
            raise ValueError(f"shape {self.shape} and chunks {self.chunks} need the same rank, at least 1")
        if any(c < 1 for c in self.chunks) or any(s < 0 for s in self.shape):
            raise ValueError(f"invalid grid: shape {self.shape}, chunks {self.chunks}")
        object.__setattr__(self, "counts", tuple(-(-s // c) for s, c in zip(self.shape, self.chunks)))

    @property
    def per_chunk_row(self) -> int:
        """Chunks that share one range of rows (1 unless the rows themselves are split into chunks)."""
        n = 1
        for k in self.counts[1:]:
            n *= k
        return n

    @property
    def whole_rows(self) -> bool:
        """Whether each chunk holds whole rows, so that a chunk's rows are contiguous in a C-ordered block."""
        return self.chunks[1:] == self.shape[1:]

    def origin(self, index: tuple[int, ...]) -> tuple[int, ...]:
        """The element coordinates of chunk ``index``'s first element (HDF5's chunk offset)."""
        return tuple(i * c for i, c in zip(index, self.chunks))

    def index_of(self, origin: Sequence[int]) -> tuple[int, ...]:
        """The grid index of the chunk whose first element is at ``origin``."""
        return tuple(int(o) // c for o, c in zip(origin, self.chunks))

    def linear(self, index: tuple[int, ...]) -> int:
        """Chunk ``index``'s position in C order over the grid."""
        if len(index) == 1:
            return index[0]
        n = 0
        for i, k in zip(index, self.counts):
            n = n * k + i
        return n

    @functools.cached_property
    def trailing(self) -> "list[tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]]":
        """For every chunk of one chunk-row, in C order: its index, selection in the chunk and in a row, past axis 0.

        The same for every chunk-row, so worked out once per grid: building it
        cost half of :func:`chunk_parts` for a block of 8 chunks (14 us).
        """
        per_axis = [
            [(i, slice(0, min(c, s - i * c)), slice(i * c, min(i * c + c, s))) for i in range(k)]
            for k, c, s in zip(self.counts[1:], self.chunks[1:], self.shape[1:])
        ]
        return [
            (tuple(t[0] for t in combo), tuple(t[1] for t in combo), tuple(t[2] for t in combo))
            for combo in itertools.product(*per_axis)
        ]

    def is_edge(self, index: tuple[int, ...]) -> bool:
        """Whether chunk ``index`` reaches past the dataset's extent in some dimension (a partial edge chunk)."""
        return any((i + 1) * c > s for i, c, s in zip(index, self.chunks, self.shape))


class ChunkPart(NamedTuple):
    """Elements ``chunk_sel`` of the decoded chunk ``index`` go to ``out_sel`` of the output block.

    ``whole``: the part is the entire chunk and it fills output rows
    ``out_sel[0]`` completely, so the chunk can be decoded straight into
    those rows' bytes of a C-contiguous block.
    """

    index: tuple[int, ...]  # type: ignore[assignment]  # shadows tuple.index(), never called on a part
    chunk_sel: tuple[slice, ...]
    out_sel: tuple[slice, ...]
    whole: bool

    @property
    def rows(self) -> tuple[int, int]:
        """Output rows ``[a, b)`` this part writes to."""
        return self.out_sel[0].start, self.out_sel[0].stop


def chunk_parts(grid: ChunkGrid, start: int, stop: int) -> list[ChunkPart]:
    """The parts of every chunk that rows ``[start, stop)`` cover, in C order of the grid (ascending rows).

    Output coordinates count rows from ``start``; the output block has
    ``stop - start`` rows of the dataset's full row shape.
    """
    n_rows = grid.shape[0]
    if not 0 <= start <= stop <= n_rows:
        raise ValueError(f"rows [{start}, {stop}) are not within the {n_rows} rows of the dataset")
    if start == stop or any(s == 0 for s in grid.shape[1:]):
        return []
    c0 = grid.chunks[0]
    whole_rows = grid.whole_rows
    combos = grid.trailing
    parts = []
    for i0 in range(start // c0, (stop - 1) // c0 + 1):
        o0 = i0 * c0
        a, b = max(start, o0), min(stop, o0 + c0)
        # A chunk is decoded in place only if none of it falls outside the block (nor past the dataset).
        whole = whole_rows and a == o0 and b == o0 + c0
        rows_in_chunk, rows_in_out = slice(a - o0, b - o0), slice(a - start, b - start)
        for index, chunk_sel, out_sel in combos:
            parts.append(ChunkPart((i0, *index), (rows_in_chunk, *chunk_sel), (rows_in_out, *out_sel), whole))
    return parts


def chunk_indices(grid: ChunkGrid, start: int, stop: int) -> "tuple[int, Iterator[tuple[int, ...]]]":
    """How many chunks hold rows ``[start, stop)``, and their grid indices in C order (as :func:`chunk_parts`), made as
    they are taken: a hint looks at the first few of a block's chunks, once for each leaf of the index read in it,
    and listing thousands of small chunks each time made a pass over 256-byte chunks take 1.4x as long."""
    if start >= stop or any(s == 0 for s in grid.shape[1:]):
        return 0, iter(())
    c0 = grid.chunks[0]
    rows = range(start // c0, (stop - 1) // c0 + 1)
    if grid.per_chunk_row == 1:
        rest = (0,) * (len(grid.chunks) - 1)
        return len(rows), map(lambda i: (i, *rest), rows)
    trailing = [t[0] for t in grid.trailing]
    # map/starmap, not a generator: a generator dropped unfinished runs Python code as it closes, where a signal
    # handler's exception is dropped (tests/test_landings.py)
    return len(rows) * len(trailing), itertools.starmap(lambda i, t: (i, *t), itertools.product(rows, trailing))


class Extent(NamedTuple):
    """``size`` stored bytes at file ``offset``, for the caller's item ``key``."""

    offset: int
    size: int
    key: int


class ReadGroup(NamedTuple):
    """One read of file bytes ``[start, stop)`` that covers every extent in ``members``."""

    start: int
    stop: int
    members: tuple[Extent, ...]


def coalesce(extents: Sequence[Extent], max_gap: int, max_bytes: int, align: int = 1) -> list[ReadGroup]:
    """Group extents into reads, in file order: neighbours closer than ``max_gap`` bytes share a read.

    A read spans at most ``max_bytes`` (an extent larger than that gets a read
    of its own). With ``align`` > 1 every read starts and stops on a multiple
    of ``align`` (as ``O_DIRECT`` requires), rounding outwards.
    """
    if align < 1 or max_gap < 0 or max_bytes < 1:
        raise ValueError("align and max_bytes must be positive, max_gap not negative")
    groups: list[ReadGroup] = []
    members: list[Extent] = []
    lo = hi = 0
    for e in sorted(extents, key=lambda e: (e.offset, e.key)):
        a = e.offset - e.offset % align
        b = -(-(e.offset + e.size) // align) * align
        if members and a - hi <= max_gap and max(b, hi) - lo <= max_bytes:
            members.append(e)
            hi = max(hi, b)
            continue
        if members:
            groups.append(ReadGroup(lo, hi, tuple(members)))
        members, lo, hi = [e], a, b
    if members:
        groups.append(ReadGroup(lo, hi, tuple(members)))
    return groups
