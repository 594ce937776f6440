"""Epoch planning (pure): every row once across ranks, equal batch counts, determinism, resume, mixing."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from multitables._plan.epoch import EpochSettings, RankEpoch


@st.composite
def epoch_settings(draw: st.DrawFn, max_rows: int = 3000) -> EpochSettings:
    n_rows = draw(st.integers(1, max_rows))
    world_size = draw(st.integers(1, 8))
    batch_size = draw(st.integers(1, 300))
    drop_last = draw(st.booleans())
    assume(not drop_last or n_rows >= world_size * batch_size)
    return EpochSettings(
        n_rows=n_rows,
        block_size=draw(st.integers(1, n_rows)),
        batch_size=batch_size,
        world_size=world_size,
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**63)),
        drop_last=drop_last,
        window=draw(st.integers(1, 12)),
    )


def all_ranks(s: EpochSettings, epoch: int = 0) -> list[list[np.ndarray]]:
    return [list(s.rank_epoch(epoch, r).batches()) for r in range(s.world_size)]


@settings(max_examples=400, deadline=None)
@given(epoch_settings(), st.integers(0, 5))
def test_the_ranks_of_an_epoch_see_every_row_once(s: EpochSettings, epoch: int) -> None:
    rows = np.concatenate([b for batches in all_ranks(s, epoch) for b in batches])
    assert len(np.unique(rows)) == len(rows), "a row came twice"
    assert rows.min(initial=0) >= 0 and rows.max(initial=0) < s.n_rows
    if s.drop_last:
        used = s.world_size * s.n_batches * s.batch_size
        assert len(rows) == used and s.n_rows - used < s.world_size * s.batch_size
    else:
        assert len(rows) == s.n_rows


@settings(max_examples=400, deadline=None)
@given(epoch_settings())
def test_every_rank_gets_the_same_number_of_batches_all_full_but_the_last(s: EpochSettings) -> None:
    ranks = all_ranks(s)
    sizes = [[len(b) for b in batches] for batches in ranks]
    assert {len(x) for x in sizes} == {s.n_batches}
    for x in sizes:
        assert all(n == s.batch_size for n in x[:-1])
        assert 0 <= x[-1] <= s.batch_size
        if s.drop_last:
            assert x[-1] == s.batch_size
    totals = [sum(x) for x in sizes]
    assert max(totals) - min(totals) <= 1, "rank shares differ by more than one row"
    # An empty batch happens exactly when fewer rows than ranks are left for the last step.
    left = s.n_rows - s.world_size * (s.n_batches - 1) * s.batch_size
    has_empty = any(x[-1] == 0 for x in sizes)
    assert has_empty == (not s.drop_last and left < s.world_size) == s.empty_last_batch
    for r, x in enumerate(sizes):
        assert [s.batch_rows(r, k) for k in range(s.n_batches)] == x


@settings(max_examples=300, deadline=None)
@given(epoch_settings(), st.integers(0, 5))
def test_reads_stay_within_blocks_and_keep_whole_blocks(s: EpochSettings, epoch: int) -> None:
    for r in range(s.world_size):
        plan = s.rank_epoch(epoch, r)
        for i, (a, b) in enumerate(zip(plan.starts, plan.stops)):
            assert a // s.block_size == (b - 1) // s.block_size, "a piece spans two blocks"
            if 0 < i < len(plan.starts) - 1:  # only a rank's first and last piece may be part of a block
                assert a % s.block_size == 0 and b == min(a + s.block_size, s.n_rows)
        assert all(hi - lo <= s.window for lo, hi in zip(plan.bounds, plan.bounds[1:]))


@given(epoch_settings(), st.integers(0, 5))
def test_a_plans_piece_sizes_and_window_offsets_are_those_of_its_pieces(s: EpochSettings, epoch: int) -> None:
    # rank_epoch makes them from its arrays; a plan made of its pieces alone, from those.
    for r in range(s.world_size):
        plan = s.rank_epoch(epoch, r)
        again = RankEpoch(s, epoch, r, plan.starts.tolist(), tuple(plan.stops), plan.bounds)
        sizes = [b - a for a, b in zip(plan.starts.tolist(), plan.stops.tolist())]
        assert plan.sizes.tolist() == again.sizes.tolist() == sizes
        assert plan.window_offsets == again.window_offsets == tuple(sum(sizes[:i]) for i in plan.bounds)
        assert all(type(x) is int for x in plan.window_offsets)  # Python's: looked up one at a time
        # NOTE [pieces as arrays]: read-only int64, the same for a plan made of its pieces alone
        for array in (plan.starts, plan.stops, plan.sizes, again.starts, again.stops, again.sizes):
            assert array.dtype == np.int64 and not array.flags.writeable
        assert plan == again and plan.n_rows == s.rank_rows(r)
        assert hash(plan) == hash(again) and plan != RankEpoch(s, epoch + 1, r, plan.starts, plan.stops, plan.bounds)


@settings(max_examples=200, deadline=None)
@given(epoch_settings(), st.integers(0, 5), st.data())
def test_resuming_at_any_batch_gives_the_rest_of_the_order(s: EpochSettings, epoch: int, data: st.DataObject) -> None:
    r = data.draw(st.integers(0, s.world_size - 1))
    k = data.draw(st.integers(0, s.n_batches))
    plan = s.rank_epoch(epoch, r)
    order = plan.order()
    w, skip = plan.locate(k * s.batch_size)
    rest = [plan.window_order(v) for v in range(w, plan.n_windows)]
    resumed = np.concatenate(rest)[skip:] if rest else np.empty(0, np.int64)
    np.testing.assert_array_equal(resumed, order[k * s.batch_size :])


@settings(max_examples=100, deadline=None)
@given(epoch_settings(), st.integers(0, 5))
def test_the_same_seed_and_epoch_give_the_same_order(s: EpochSettings, epoch: int) -> None:
    again = EpochSettings(**{f: getattr(s, f) for f in s.__dataclass_fields__})
    for r in range(s.world_size):
        np.testing.assert_array_equal(s.rank_epoch(epoch, r).order(), again.rank_epoch(epoch, r).order())


@settings(max_examples=100, deadline=None)
@given(
    n_rows=st.integers(50, 3000),
    block_fraction=st.floats(0.0, 1.0),
    window=st.integers(1, 12),
    world_size=st.integers(1, 8),
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 5),
)
def test_epochs_and_seeds_differ_when_shuffled(
    n_rows: int, block_fraction: float, window: int, world_size: int, seed: int, epoch: int
) -> None:
    block_size = max(1, int(block_fraction * n_rows))
    s = EpochSettings(n_rows=n_rows, block_size=block_size, batch_size=7, world_size=world_size, seed=seed, window=window)
    other = EpochSettings(**{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "seed": seed + 1})

    def order(s: EpochSettings, epoch: int) -> np.ndarray:
        return np.concatenate([s.rank_epoch(epoch, r).order() for r in range(world_size)])

    assert not np.array_equal(order(s, epoch), order(s, epoch + 1))
    assert not np.array_equal(order(s, epoch), order(other, epoch))


def test_the_order_is_pinned() -> None:
    """The same numbers on every machine: a change here changes every user's epochs."""
    s = EpochSettings(n_rows=10, block_size=3, batch_size=4, world_size=2, seed=7, window=2)
    got = [[b.tolist() for b in s.rank_epoch(1, r).batches()] for r in range(2)]
    assert got == PINNED


PINNED = [[[4, 7, 3, 6], [8]], [[9, 5, 2, 1], [0]]]


def test_unshuffled_is_on_disk_order_split_in_runs() -> None:
    s = EpochSettings(n_rows=10, block_size=3, batch_size=2, world_size=3, shuffle=False)
    assert [s.rank_epoch(0, r).order().tolist() for r in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [len(list(s.rank_epoch(0, r).batches())) for r in range(3)] == [2, 2, 2]


def test_fewer_rows_than_ranks_gives_empty_batches() -> None:
    s = EpochSettings(n_rows=3, block_size=1, batch_size=8, world_size=5)
    assert s.empty_last_batch and s.n_batches == 1
    assert [[len(b) for b in s.rank_epoch(0, r).batches()] for r in range(5)] == [[1], [1], [1], [0], [0]]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_rows=10, block_size=11, batch_size=1), "block_size"),
        (dict(n_rows=10, block_size=1, batch_size=0), "batch_size"),
        (dict(n_rows=10, block_size=1, batch_size=1, seed=-1), "seed"),
        (dict(n_rows=10, block_size=1, batch_size=4, world_size=3, drop_last=True), "no batch"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EpochSettings(**kwargs)


def test_bad_rank_or_epoch_is_refused() -> None:
    s = EpochSettings(n_rows=10, block_size=2, batch_size=2, world_size=2)
    with pytest.raises(ValueError, match="rank"):
        s.rank_epoch(0, 2)
    with pytest.raises(ValueError, match="epoch"):
        s.rank_epoch(-1, 0)


# -- mixing ---------------------------------------------------------------------


def same_block_pairs(batches: list[np.ndarray], block_size: int) -> float:
    """Of all pairs of rows that share a batch, the fraction that come from the same block."""
    same = pairs = 0
    for b in batches:
        counts = np.bincount(b // block_size)
        same += int((counts * (counts - 1) // 2).sum())
        pairs += len(b) * (len(b) - 1) // 2
    return same / pairs


def expected_same_block_pairs(s: EpochSettings) -> float:
    """What a uniform shuffle of each window gives: within a window of W rows in blocks of s, (s - 1) / (W - 1).

    A batch's rows from one window pair up within it; pairs across two
    windows never share a block. Needs full blocks (``block_size`` divides ``n_rows``).
    """
    plan = s.rank_epoch(0, 0)
    edges = plan.window_offsets
    same = pairs = 0.0
    for k in range(s.n_batches):
        lo, hi = k * s.batch_size, min((k + 1) * s.batch_size, s.n_rows)
        pairs += (hi - lo) * (hi - lo - 1) / 2
        for w in range(plan.n_windows):
            m = max(0, min(hi, edges[w + 1]) - max(lo, edges[w]))
            rows = edges[w + 1] - edges[w]
            if m > 1:
                same += m * (m - 1) / 2 * (s.block_size - 1) / (rows - 1)
    return same / pairs


@pytest.mark.parametrize("window", [1, 4, 16, 64])
def test_mixing_within_a_window_is_that_of_a_full_shuffle_of_the_window(window: int) -> None:
    """Two rows of a batch share a block with probability ~ (s - 1) / (K s - 1), K = window blocks of s rows.

    A full shuffle of N rows gives (s - 1) / (N - 1); no shuffle gives ~1.
    """
    n, s_rows, bs = 200_000, 500, 256
    s = EpochSettings(n_rows=n, block_size=s_rows, batch_size=bs, window=window, seed=3)
    measured = same_block_pairs(list(s.rank_epoch(0, 0).batches()), s_rows)
    expected = expected_same_block_pairs(s)
    assert abs(measured / expected - 1) < 0.05, (measured, expected)
    if window >= 4:  # batches inside one window dominate: the headline figure holds
        assert abs(measured / ((s_rows - 1) / (window * s_rows - 1)) - 1) < 0.2
    full = EpochSettings(n_rows=n, block_size=s_rows, batch_size=bs, window=n // s_rows, seed=3)
    assert abs(same_block_pairs(list(full.rank_epoch(0, 0).batches()), s_rows) * (n - 1) / (s_rows - 1) - 1) < 0.05
    plain = EpochSettings(n_rows=n, block_size=s_rows, batch_size=bs, shuffle=False)
    assert same_block_pairs(list(plain.rank_epoch(0, 0).batches()), s_rows) > 0.6


def test_blocks_meet_different_partners_each_epoch() -> None:
    """Which blocks share a window changes with the epoch, so rows meet different rows."""
    s = EpochSettings(n_rows=100_000, block_size=1000, batch_size=100, window=10, seed=0)
    partners: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for epoch in range(5):
        plan = s.rank_epoch(epoch, 0)
        for lo, hi in zip(plan.bounds, plan.bounds[1:]):
            blocks = [a // 1000 for a in plan.starts[lo:hi]]
            for b in blocks:
                partners[b].update(x for x in blocks if x != b)
    # Over 5 epochs a block meets ~45 others; never (nearly) the same 9 again.
    assert np.mean([len(c) for c in partners.values()]) > 35
