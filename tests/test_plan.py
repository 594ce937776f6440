"""Block planning: which source rows each block holds (pure, property-tested)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from multitables._plan import (
    BUSY_FRACTION,
    MiB,
    PROBE_MIN_BLOCKS,
    BlockPlan,
    RangePlan,
    ReadProbe,
    ahead,
    default_block_size,
    default_read_ahead,
    parallel_pays,
    probe_applies,
)

sizes = st.integers(1, 500).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n)))


def gather(plan: BlockPlan, k: int) -> np.ndarray:
    """The source row numbers block ``k`` holds, slot order, from its pieces."""
    out = np.full(plan.rows(k), -1)
    for p in plan.pieces(k):
        out[p.dst : p.dst + p.stop - p.start] = np.arange(p.start, p.stop)
    return out


@given(sizes, st.booleans())
def test_one_pass_covers_every_row_once_in_order(size: tuple[int, int], remainder: bool) -> None:
    n, bs = size
    plan = BlockPlan(n, bs, remainder=remainder)
    rows = np.concatenate([gather(plan, k) for k in range(plan.n_blocks)]) if plan.n_blocks else np.array([], int)
    expected_len = n if remainder else (n // bs) * bs
    assert np.array_equal(rows, np.arange(expected_len))
    assert all(plan.rows(k) == bs for k in range(n // bs))


@given(sizes, st.integers(0, 50))
def test_cyclic_blocks_wrap_end_to_start(size: tuple[int, int], k: int) -> None:
    n, bs = size
    plan = BlockPlan(n, bs, cyclic=True)
    assert plan.n_blocks is None
    assert np.array_equal(gather(plan, k), np.arange(k * bs, (k + 1) * bs) % n)
    assert len(plan.pieces(k)) <= 2


def test_a_plan_refuses_blocks_larger_than_the_dataset() -> None:
    with pytest.raises(ValueError):
        BlockPlan(10, 11)


@given(
    n_rows=st.integers(1, 10**8),
    row_nbytes=st.integers(1, 1 << 22),
    chunk_rows=st.one_of(st.none(), st.integers(1, 10**5)),
    n_procs=st.integers(1, 64),
)
def test_default_block_size_is_whole_chunks_within_the_dataset(n_rows: int, row_nbytes: int, chunk_rows: "int | None", n_procs: int) -> None:
    bs = default_block_size(n_rows, row_nbytes, chunk_rows, n_procs)
    assert 1 <= bs <= n_rows
    if chunk_rows and bs < n_rows:
        assert bs % chunk_rows == 0
    if chunk_rows and chunk_rows * row_nbytes <= (4 << 20) and n_rows >= 4 * n_procs * (4 << 20) // row_nbytes + chunk_rows:
        assert bs * row_nbytes > (2 << 20)  # near the 4 MiB target for large datasets


def test_defaults_for_a_pytables_float_array() -> None:
    # 1024 float32 per row, PyTables' chunk of 64 rows (256 KiB): 16 chunks = 4 MiB.
    assert default_block_size(1 << 20, 4096, 64, 2) == 1024
    assert default_read_ahead(2) == 6
    assert default_block_size(1000, 4096, 64, 0) == 1000  # in-process: no readers to share blocks with


def test_parallel_reading_pays_only_for_enough_work_and_more_than_one_cpu() -> None:
    zlib, blosc = (1,), (32001,)
    assert not parallel_pays(4 << 20, zlib, "fork", 2)  # a 4 MiB file: start-up costs more
    assert parallel_pays(256 << 20, zlib, "fork", 2)
    assert not parallel_pays(1 << 40, zlib, "fork", 1)  # one CPU: never
    # Fast codecs and slow start methods need more data before processes pay.
    assert parallel_pays(128 << 20, zlib, "fork", 2) and not parallel_pays(128 << 20, blosc, "fork", 2)
    assert parallel_pays(256 << 20, zlib, "fork", 2) and not parallel_pays(256 << 20, zlib, "spawn", 2)


@given(st.lists(st.tuples(st.integers(0, 100), st.integers(1, 30)), min_size=1, max_size=20))
def test_a_range_plan_reads_exactly_the_ranges_given(ranges: list[tuple[int, int]]) -> None:
    plan = RangePlan(tuple(a for a, _ in ranges), tuple(a + n for a, n in ranges))
    assert plan.n_blocks == len(ranges)
    assert plan.block_size == max(n for _, n in ranges)
    for k, (a, n) in enumerate(ranges):
        assert np.array_equal(gather(plan, k), np.arange(a, a + n))


def test_a_range_plan_refuses_empty_or_reversed_ranges() -> None:
    for starts, stops in [((), ()), ((5,), (5,)), ((3, 1), (4,))]:
        with pytest.raises(ValueError):
            RangePlan(starts, stops)


@given(sizes, st.booleans(), st.integers(0, 60), st.integers(1, 6))
def test_ahead_is_the_block_distance_past_the_one_claimed(size: tuple[int, int], remainder: bool, k: int, distance: int) -> None:
    n, bs = size
    plan = BlockPlan(n, bs, remainder=remainder)
    assert plan.n_blocks is not None
    if k + distance < plan.n_blocks:
        assert ahead(plan, k, distance) == plan.pieces(k + distance)
    else:
        assert ahead(plan, k, distance) == ()


@given(sizes, st.integers(0, 60), st.integers(1, 6))
def test_ahead_of_a_cyclic_plan_never_ends_and_wraps(size: tuple[int, int], k: int, distance: int) -> None:
    n, bs = size
    plan = BlockPlan(n, bs, cyclic=True)
    assert ahead(plan, k, distance) == plan.pieces(k + distance)
    assert sum(p.stop - p.start for p in ahead(plan, k, distance)) == bs


def test_ahead_follows_a_range_plan_and_stops_at_its_end() -> None:
    plan = RangePlan((40, 0, 20), (50, 10, 30))
    assert ahead(plan, 0, 1) == plan.pieces(1)
    assert [(p.start, p.stop) for p in ahead(plan, 0, 2)] == [(20, 30)]
    assert ahead(plan, 1, 2) == ()
    assert ahead(plan, 0, 0) == ()  # no readers, nothing ahead


def _probe(blocks: "list[tuple[float, float, float]]", skip: int = 2, block_bytes: int = 4 * MiB) -> ReadProbe:
    """A probe fed (read s, cpu s, outside s) per block."""
    probe = ReadProbe(skip=skip, target_bytes=(len(blocks) - skip) * block_bytes)
    for read_s, cpu_s, outside_s in blocks:
        assert not probe.complete
        probe.add(read_s, cpu_s, outside_s, block_bytes)
    assert probe.complete
    return probe


def test_readers_pay_when_decoding_keeps_the_consumer_core_busy() -> None:
    # zlib 3 cold: the consumer is on the CPU 97% of each read.
    assert _probe([(0.010, 0.002, 0.0)] * 2 + [(0.004, 0.0039, 0.0)] * 6).readers_pay()


def test_readers_do_not_pay_when_the_consumer_waits_on_the_disk() -> None:
    # blosc 3 cold: the consumer is on the CPU 60% of each read, and has no work of its own.
    probe = _probe([(0.004, 0.0024, 0.00001)] * 8)
    assert probe.busy_fraction() == pytest.approx(0.6, abs=0.01)
    assert not probe.readers_pay()


def test_the_consumers_own_work_between_blocks_counts_as_busy() -> None:
    # The same disk-bound reads, but the consumer computes 2 ms per block:
    # readers would overlap the reading with that work.
    probe = _probe([(0.004, 0.0024, 0.002)] * 8)
    assert probe.busy_fraction() == pytest.approx((0.0024 + 0.002) / 0.006)
    assert not probe.readers_pay()  # 0.73: the disk still idles the core
    assert _probe([(0.004, 0.0024, 0.020)] * 8).readers_pay()  # 0.93


def test_the_first_blocks_are_not_counted() -> None:
    # Two start-up blocks that waited long on the disk do not outvote six CPU-bound ones.
    probe = _probe([(0.050, 0.001, 0.0)] * 2 + [(0.004, 0.004, 0.0)] * 6)
    assert probe.busy_fraction() == 1.0 and probe.readers_pay()
    assert not _probe([(0.050, 0.001, 0.0)] * 2 + [(0.004, 0.004, 0.0)] * 6, skip=0).readers_pay()


def test_the_probe_completes_after_its_bytes_past_the_skipped_blocks() -> None:
    probe = ReadProbe(skip=2, target_bytes=10)
    for _ in range(2):
        probe.add(1.0, 1.0, 0.0, 100)
    assert not probe.complete and probe.nbytes == 0
    probe.add(1.0, 1.0, 0.0, 6)
    assert not probe.complete
    probe.add(1.0, 1.0, 0.0, 6)
    assert probe.complete and probe.blocks == 4 and probe.read_s == 2.0


def test_cpu_time_beyond_the_wall_time_counts_as_fully_busy() -> None:
    probe = _probe([(0.004, 0.0041, 0.0)] * 4, skip=0)  # thread and wall clocks tick differently
    assert probe.busy_fraction() == 1.0
    assert BUSY_FRACTION < 1.0


def test_probe_applies_to_large_page_cache_streams_of_the_in_process_engines() -> None:
    big = BlockPlan(PROBE_MIN_BLOCKS * 10, 10)
    assert probe_applies(big, "h5py", "page") and probe_applies(big, "chunks", "page")
    assert probe_applies(BlockPlan(100, 10, cyclic=True), "h5py", "page")  # endless
    assert not probe_applies(big, "tables", "page")
    assert not probe_applies(big, "chunks", "direct")  # O_DIRECT: no readahead, waiting says nothing of the disk
    assert not probe_applies(BlockPlan((PROBE_MIN_BLOCKS - 1) * 10, 10), "h5py", "page")
