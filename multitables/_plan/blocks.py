"""Which rows each block holds: pure functions, no I/O.

A *block* is ``block_size`` consecutive rows (the last one may be short when
``remainder=True``; in cyclic mode a block may wrap from the end of the
dataset to its start). Block ``k`` is split into *pieces*: contiguous runs of
source rows and where they land in the slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import numpy as np

MiB = 1 << 20


@dataclass(frozen=True)
class Piece:
    """Source rows ``[start, stop)`` go to slot rows ``[dst, dst + stop - start)``."""

    start: int
    stop: int
    dst: int


@dataclass(frozen=True)
class BlockPlan:
    """The blocks of one pass (or of an endless cyclic stream) over ``n_rows`` rows."""

    n_rows: int
    block_size: int
    cyclic: bool = False
    remainder: bool = False

    def __post_init__(self) -> None:
        if self.n_rows < 1 or self.block_size < 1 or self.block_size > self.n_rows:
            raise ValueError(f"invalid plan: {self}")

    @property
    def n_blocks(self) -> "int | None":
        """Blocks in one pass; None when cyclic (endless)."""
        if self.cyclic:
            return None
        full, rest = divmod(self.n_rows, self.block_size)
        return full + (1 if self.remainder and rest else 0)

    @property
    def pass_rows(self) -> "int | None":
        """Rows in one pass; None when cyclic (endless)."""
        if self.cyclic:
            return None
        return self.n_rows if self.remainder else self.n_rows - self.n_rows % self.block_size

    def start(self, k: int) -> int:
        """First source row of block ``k``."""
        return (k * self.block_size) % self.n_rows if self.cyclic else k * self.block_size

    def rows(self, k: int) -> int:
        """Rows in block ``k``."""
        if self.cyclic:
            return self.block_size
        return min(self.block_size, self.n_rows - k * self.block_size)

    def pieces(self, k: int) -> tuple[Piece, ...]:
        """The contiguous source runs of block ``k``: one, or two where a cyclic block wraps."""
        start, n = self.start(k), self.rows(k)
        first = min(n, self.n_rows - start)
        if first == n:
            return (Piece(start, start + n, 0),)
        return (Piece(start, self.n_rows, 0), Piece(0, n - first, first))


def ahead(plan: "BlockPlan | RangePlan | GrowingPlan", k: int, distance: int) -> tuple[Piece, ...]:
    """The pieces a reader that claimed block ``k`` hints before reading it: block ``k + distance``, the one it is likely to read next.

    Readers claim blocks in increasing order from one counter, so with
    ``distance`` readers each takes about every ``distance``-th block. A
    reader's first block (``k < distance``) hints blocks ``k`` to ``k +
    distance``, itself included: the first blocks are otherwise read
    unhinted, after later blocks' hints, and a disk goes back for them (on
    the RAID 0 model, two readers' passes had 16-28 seeks against one
    process's 3; BENCHMARKS.md; one reader, 8 against 4). Only where there
    is a later block to hint: a block alone is read at once, unhinted.
    Blocks past the end are left out; ``distance`` 0 hints nothing.
    """
    if distance < 1:
        return ()
    last = k + distance if plan.n_blocks is None else min(k + distance, plan.n_blocks - 1)
    first = k if k < distance and last > k else k + distance
    return tuple(p for j in range(first, last + 1) for p in plan.pieces(j))


def chunk_part(chunk_rows: int, most: int) -> int:
    """Rows of a block that holds part of a chunk of ``chunk_rows`` rows, ``most`` at most: an equal part of the chunk
    where one holds ``most // 2`` rows or more, so that no block spans two chunks (each block a chunk is cut into
    decodes it whole), else ``most``."""
    most = max(most, 1)
    parts = range(-(-chunk_rows // most), chunk_rows // max(most // 2, 1) + 1)
    return next((chunk_rows // k for k in parts if chunk_rows % k == 0), most)


@dataclass(frozen=True)
class RangePlan:
    """Blocks given explicitly: block ``k`` is source rows ``[starts[k], stops[k])``.

    For orders the regular plan cannot express: shuffled blocks of an epoch,
    one rank's part of a dataset. Same protocol as :class:`BlockPlan`.
    """

    starts: tuple[int, ...]
    stops: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.starts) != len(self.stops) or not self.starts:
            raise ValueError("a range plan needs as many starts as stops, and at least one block")
        if any(b <= a or a < 0 for a, b in zip(self.starts, self.stops)):
            raise ValueError("every block of a range plan needs 0 <= start < stop")

    @property
    def block_size(self) -> int:
        """Rows in the largest block (the size of a slot)."""
        return max(b - a for a, b in zip(self.starts, self.stops))

    @property
    def n_blocks(self) -> int:
        return len(self.starts)

    def start(self, k: int) -> int:
        return self.starts[k]

    def rows(self, k: int) -> int:
        return self.stops[k] - self.starts[k]

    def pieces(self, k: int) -> tuple[Piece, ...]:
        return (Piece(self.starts[k], self.stops[k], 0),)


class GrowingPlan:
    """Blocks published as the stream goes (NOTE [readers across epochs] in ``_procs.stream``): block ``k`` is
    rows ``[start, stop)`` of its entry. The consumer's copy of the published entries; :class:`RangePlan`'s protocol.

    ``block_size``: the slot's rows, which no block may exceed. Block numbers
    go on across :meth:`truncate` (a rewind): entries are never renumbered.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._entries: dict[int, tuple[int, int]] = {}
        self._published = 0

    @property
    def n_blocks(self) -> int:
        """Blocks published so far (numbers ``0 .. n_blocks - 1``; some may have been withdrawn)."""
        return self._published

    @property
    def starts(self) -> tuple[int, ...]:
        """First rows of the entries still held, in block order."""
        return tuple(self._entries[k][0] for k in sorted(self._entries))

    @property
    def stops(self) -> tuple[int, ...]:
        return tuple(self._entries[k][1] for k in sorted(self._entries))

    def extend(self, starts: "Sequence[int] | np.ndarray", stops: "Sequence[int] | np.ndarray") -> None:
        """Publish blocks ``[starts[i], stops[i])`` after the last one."""
        for a, b in zip(starts, stops):
            if not 0 <= a < b or b - a > self.block_size:
                raise ValueError(f"block [{a}, {b}) does not fit a slot of {self.block_size} rows")
            self._entries[self._published] = (int(a), int(b))
            self._published += 1

    def truncate(self, next_k: int) -> None:
        """Withdraw the blocks from ``next_k`` on (a rewind): the next one published is numbered ``next_k``."""
        for k in [k for k in self._entries if k >= next_k]:
            del self._entries[k]
        self._published = next_k

    def forget(self, k: int) -> None:
        """Block ``k`` is read: its entry is no longer needed."""
        self._entries.pop(k, None)

    def start(self, k: int) -> int:
        return self._entries[k][0]

    def rows(self, k: int) -> int:
        a, b = self._entries[k]
        return b - a

    def pieces(self, k: int) -> tuple[Piece, ...]:
        got = self._entries.get(k)
        return () if got is None else (Piece(got[0], got[1], 0),)
