"""A reader's view of its ring's block table, as a plan (NOTE [readers across epochs] in ``_procs.stream``)."""

from __future__ import annotations

from .._plan.blocks import Piece
from .ring import Ring


class TablePlan:
    """A reader's view of its ring's block table, as a plan (``_plan.blocks.RangePlan``'s protocol).

    A block this reader claimed reads from the copy made under the lock; a
    later one (for hints) from the table as it is, or not at all.
    """

    def __init__(self, ring: Ring) -> None:
        self._ring = ring
        self.block_size = ring.layout.block_size

    @property
    def n_blocks(self) -> int:
        """Blocks published so far."""
        return self._ring.published

    def _entry(self, k: int) -> tuple[int, int]:
        got = self._ring.entry(k)
        if got is None:
            raise KeyError(f"block {k} is not in the table")
        return got

    def start(self, k: int) -> int:
        return self._entry(k)[0]

    def rows(self, k: int) -> int:
        a, b = self._entry(k)
        return b - a

    def pieces(self, k: int) -> tuple[Piece, ...]:
        got = self._ring.entry(k)
        return () if got is None else (Piece(got[0], got[1], 0),)
