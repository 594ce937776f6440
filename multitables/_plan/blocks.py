"""Which rows each block holds: pure functions, no I/O.

A *block* is ``block_size`` consecutive rows (the last one may be short when
``remainder=True``; in cyclic mode a block may wrap from the end of the
dataset to its start). Block ``k`` is split into *pieces*: contiguous runs of
source rows and where they land in the slot.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def ahead(plan: "BlockPlan | RangePlan", k: int, distance: int) -> tuple[Piece, ...]:
    """The pieces a reader that claimed block ``k`` hints before reading it: block ``k + distance``, the one it is likely to read next.

    Readers claim blocks in increasing order from one counter, so with
    ``distance`` readers each takes about every ``distance``-th block. A
    reader's first block (``k < distance``) hints blocks ``k`` to ``k +
    distance``, itself included: the first blocks are otherwise read
    unhinted, after later blocks' hints, and a disk goes back for them (on
    the RAID 0 model, two readers' passes had 16-28 seeks against one
    process's 3; BENCHMARKS.md). Blocks past the end are left out.
    """
    if distance < 1:
        return ()
    last = k + distance if plan.n_blocks is None else min(k + distance, plan.n_blocks - 1)
    first = k if k < distance else k + distance
    return tuple(p for j in range(first, last + 1) for p in plan.pieces(j))


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
