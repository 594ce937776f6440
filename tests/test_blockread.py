"""A block read (``_io.blockread``): where it holds several of the caller's blocks (NOTE [read plan]), a read that
fails is read again one caller's block at a time, so that the error names the caller's block it is in."""

from __future__ import annotations

import numpy as np
import pytest

from multitables._io.blockread import read_block
from multitables._plan.blocks import BlockPlan


class BadFrom:
    """A source of rows ``i`` (one value each) whose reads fail once they reach row ``bad``."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def prefetch(self, start: int, stop: int) -> None: ...

    def fetch(self, spans: "list[tuple[int, int]]") -> None: ...

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if start <= self.bad < stop:
            raise OSError(f"cannot decode row {self.bad}")
        out[:] = np.arange(start, stop)


class SplitAt:
    """A pacer (NOTE [orphans]) that times its reads in two: up to row ``at``, and from it."""

    def __init__(self, at: int) -> None:
        self.at = at

    def split(self, a: int, b: int) -> "list[tuple[int, int]]":
        return [(a, self.at), (self.at, b)] if a < self.at < b else [(a, b)]

    def took(self, rows: int, seconds: float) -> None: ...


@pytest.mark.parametrize("pacer_at", [None, 1000, 1100])
def test_a_failed_read_of_several_blocks_names_the_callers_block_of_the_failure(pacer_at: "int | None") -> None:
    """Blocks of 256 caller's rows read 8 at a time; row 1,100 fails: the caller's block 1,024-1,280 is named, even
    where a timed read began inside it (at row 1,000) or at the failing row itself."""
    noted: "list[tuple[int, int]]" = []
    out = np.full(2048, -1)
    with pytest.raises(OSError, match="row 1100"):
        read_block(BadFrom(1100), BlockPlan(4096, 2048), 0, out, 0, None if pacer_at is None else SplitAt(pacer_at),
                   lambda a, b: noted.append((a, b)), cut=256)
    assert noted[-1] == (1024, 1280)
    np.testing.assert_array_equal(out[:1024], np.arange(1024))  # the caller's blocks before it were read whole


def test_a_read_of_one_callers_block_fails_as_it_is() -> None:
    noted: "list[tuple[int, int]]" = []
    with pytest.raises(OSError, match="row 300"):
        read_block(BadFrom(300), BlockPlan(4096, 256), 1, np.empty(256, int), 0, None, lambda a, b: noted.append((a, b)),
                   cut=256)
    assert noted == [(256, 512)]


def test_a_wrapped_block_names_no_row_before_its_piece() -> None:
    """A cyclic block that wraps: its second piece (rows 0-280, at slot row 360) starts inside a caller's block (slot
    rows 320-383); the block named begins where the piece does, never at a row before it."""
    noted: "list[tuple[int, int]]" = []
    plan = BlockPlan(1000, 640, cyclic=True)  # block 1: rows 640-999, then 0-279
    with pytest.raises(OSError, match="row 10"):
        read_block(BadFrom(10), plan, 1, np.empty(640, int), 0, None, lambda a, b: noted.append((a, b)), cut=64)
    assert noted[-1] == (0, 24)


class FetchFails(BadFrom):
    """A source whose fetch of a block's bytes (an object's ranged GETs: ``Source.fetch``) fails."""

    def fetch(self, spans: "list[tuple[int, int]]") -> None:
        raise OSError(f"gave up fetching {spans}")


@pytest.mark.parametrize(("cut", "named"), [(0, (2048, 4096)), (256, (2048, 2304))])
def test_a_fetch_that_fails_names_the_block_it_was_for(cut: int, named: "tuple[int, int]") -> None:
    """An object's bytes are fetched before any row is read: a fetch that fails names the block it fetched for (the
    first caller's block, where a read holds several), as a read's failure does; it named no rows at all."""
    noted: "list[tuple[int, int]]" = []
    with pytest.raises(OSError, match=r"gave up fetching \[\(2048, 4096\)\]"):
        read_block(FetchFails(-1), BlockPlan(4096, 2048), 1, np.empty(2048, int), 0, None,
                   lambda a, b: noted.append((a, b)), cut=cut)
    assert noted == [named]
