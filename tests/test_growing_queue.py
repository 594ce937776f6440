"""A stream that grows (NOTE [readers across epochs] in ``_procs.stream``): blocks published as it goes, withdrawn on a rewind.

Whatever the order of publishing, taking and rewinding, every block taken
is the next one published since the last rewind, with its rows, and no slot
is lost: the readers keep up however many rewinds there were.
"""

from __future__ import annotations

import random
from pathlib import Path

import h5py
import numpy as np
import pytest

import multitables
from multitables._io.fileset import inspect_files
from multitables._plan.blocks import GrowingPlan

ROWS = 6000
SLOT = 300


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("y", data=np.arange(ROWS), chunks=(100,), compression="gzip")
    return path


def growing_queue(path: Path, n_procs: int, read_ahead: int, first: "list[tuple[int, int]]") -> multitables.Queue:
    stream = multitables.Streamer(path)
    node = inspect_files(stream.filename, "/y")
    blocks = GrowingPlan(SLOT)
    blocks.extend([a for a, _ in first], [b for _, b in first])
    return stream.options.queue_over(node, stream.options.resolve(node), blocks, n_procs, read_ahead, table=64, most_blocks=8)


def random_blocks(rng: random.Random, n: int) -> "list[tuple[int, int]]":
    out = []
    for _ in range(n):
        a = rng.randrange(0, ROWS - 1)
        out.append((a, min(ROWS, a + rng.randrange(1, SLOT + 1))))
    return out


@pytest.mark.parametrize("n_procs, read_ahead", [(0, 2), (1, 1), (2, 2), (2, 6)])
@pytest.mark.parametrize("seed", range(3))
def test_taken_blocks_are_the_published_ones_in_order_across_rewinds(rows_file: Path, n_procs: int, read_ahead: int, seed: int,
                                                                      no_leaks: None) -> None:
    rng = random.Random(seed)
    first = random_blocks(rng, 5)
    expected = list(first)  # published, not yet taken nor withdrawn
    queue = growing_queue(rows_file, n_procs, read_ahead, first)
    with queue:
        for _ in range(40):
            move = rng.choice(["take", "take", "take", "extend", "rewind"])
            if move == "extend" and len(expected) > 40:  # the table holds 64: keep what is unclaimed within it
                move = "take"
            if move == "extend" or (move == "take" and not expected):
                more = random_blocks(rng, rng.randrange(1, 6))
                queue.extend(tuple(a for a, _ in more), tuple(b for _, b in more))
                expected += more
            elif move == "take":
                guard = queue.get()
                with guard as block:
                    a, b = expected.pop(0)
                    np.testing.assert_array_equal(block, np.arange(a, b))
            else:
                queue.rewind()
                expected = []
        assert queue.at_end == (not expected)
    assert queue.closed


@pytest.mark.parametrize("n_procs", [0, 2])
def test_blocks_published_across_the_end_of_the_block_table_are_taken_as_published(rows_file: Path, n_procs: int,
                                                                                      no_leaks: None) -> None:
    # The table holds 64 blocks: each extend of 50 after the first lands on its end and wraps round to its start.
    rng = random.Random(7)
    first = random_blocks(rng, 50)
    with growing_queue(rows_file, n_procs, 2, first) as queue:
        published = list(first)
        for _ in range(4):
            for a, b in published:
                with queue.get() as block:
                    np.testing.assert_array_equal(block, np.arange(a, b))
            published = random_blocks(rng, 50)
            queue.extend(tuple(a for a, _ in published), tuple(b for _, b in published))


def test_a_rewind_with_a_guard_held_is_refused(rows_file: Path, no_leaks: None) -> None:
    with growing_queue(rows_file, 2, 2, [(0, 100), (100, 200)]) as queue:
        guard = queue.get()
        with pytest.raises(RuntimeError, match="still held"):
            queue.rewind()
        guard.release()
        queue.rewind()
        assert queue.at_end


def test_a_block_larger_than_a_slot_is_refused(rows_file: Path, no_leaks: None) -> None:
    with growing_queue(rows_file, 1, 2, [(0, 100)]) as queue:
        with pytest.raises(ValueError, match="does not fit a slot"):
            queue.extend((0,), (SLOT + 1,))
