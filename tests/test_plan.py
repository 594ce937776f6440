"""Block planning: which source rows each block holds (pure, property-tested)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from multitables._plan.blocks import BlockPlan, RangePlan, ahead
from multitables._plan.costs import (
    RATE_SAMPLE_BYTES, RATE_SAMPLE_SHARE, parallel_cpus, parallel_pays, rate_sample_rows, start_cost, transform_s,
)
from multitables._plan.readers import (
    READERS_PER_CPU, SHM_SHARE, DatasetShape, Machine, ReadPlan, cap_readers, default_block_size, default_read_ahead,
    hint_distance, plan_batches, plan_blocks, plan_stream, rate_decides, transform_stake, would_save_s, TOGETHER_BYTES,
    TOGETHER_RING_BYTES,
)

sizes = st.integers(1, 500).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n)))
FORK, SPAWN = start_cost("fork"), start_cost("spawn")


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


@given(
    n_rows=st.integers(1, 10**8),
    row_nbytes=st.integers(1, 1 << 24),
    chunk_rows=st.integers(1, 10**5),
    n_procs=st.integers(0, 64),
)
def test_a_transforms_blocks_stay_within_the_target_in_equal_parts_of_a_chunk_where_they_can(
    n_rows: int, row_nbytes: int, chunk_rows: int, n_procs: int
) -> None:
    """NOTE [read plan]: a transform's slots hold what it writes, so a block never exceeds the target to hold a whole
    chunk; it cuts the chunk in equal parts of half the target's rows or more, else holds the target's rows."""
    bs = default_block_size(n_rows, row_nbytes, chunk_rows, n_procs, transformed=True)
    most = max(1, (4 << 20) // row_nbytes)
    if chunk_rows * row_nbytes <= (4 << 20):  # a chunk fits: whole chunks, as untransformed
        assert bs == default_block_size(n_rows, row_nbytes, chunk_rows, n_procs)
    else:
        assert 1 <= bs <= min(n_rows, most)
        assert bs == n_rows or (chunk_rows % bs == 0 and bs >= most // 2) or bs == most


def test_defaults_for_a_pytables_float_array() -> None:
    # 1024 float32 per row, PyTables' chunk of 64 rows (256 KiB): 16 chunks = 4 MiB.
    assert default_block_size(1 << 20, 4096, 64, 2) == 1024
    assert default_read_ahead(2) == 6
    assert default_block_size(1000, 4096, 64, 0) == 1000  # in-process: no readers to share blocks with


def test_parallel_reading_pays_only_for_enough_work_and_more_than_one_cpu() -> None:
    zlib, blosc = (1,), (32001,)
    assert not parallel_pays(4 << 20, zlib, FORK, 2, "h5py")  # a 4 MiB file: start-up costs more
    assert parallel_pays(256 << 20, zlib, FORK, 2, "h5py")
    assert not parallel_pays(1 << 40, zlib, FORK, 1, "h5py")  # one CPU: never
    # Fast codecs and slow start methods need more data before processes pay.
    assert parallel_pays(128 << 20, zlib, FORK, 2, "h5py") and not parallel_pays(128 << 20, blosc, FORK, 2, "h5py")
    assert parallel_pays(256 << 20, zlib, FORK, 2, "h5py") and not parallel_pays(256 << 20, zlib, SPAWN, 2, "h5py")
    # Stored bytes: a reader's work is the copy the consumer would make, however much there is.
    assert not parallel_pays(1 << 40, (), FORK, 64, "chunks") and not parallel_pays(1 << 40, (), FORK, 64, "h5py")


def test_a_measured_rate_decides_in_place_of_the_table() -> None:
    zlib, blosc = (1,), (32001,)
    assert not parallel_pays(128 << 20, blosc, FORK, 2, "h5py")  # the table: blosc decodes fast
    assert parallel_pays(128 << 20, blosc, FORK, 2, "h5py", rate=0.3e9)  # this machine says otherwise
    assert parallel_pays(256 << 20, zlib, FORK, 2, "h5py") and not parallel_pays(256 << 20, zlib, FORK, 2, "h5py",
                                                                                    rate=20e9)
    assert not parallel_pays(1 << 40, (), FORK, 64, "h5py", rate=1e3)  # stored bytes: never, whatever the rate


def test_a_fork_server_costs_its_first_start_until_one_of_ours_runs_or_streams_forwent_as_much() -> None:
    """NOTE [fork server]: the server's first start is dear, a start from our running server costs a fork's, and
    what streams read in the consumer forgo meanwhile is taken off the first start's price (rent, then buy)."""
    zlib = DatasetShape(n_rows=65536, row_nbytes=4096, chunk_rows=64, filter_ids=(1,))  # 256 MiB
    cold = Machine(cpus=2, start_method="forkserver")
    ready = dataclasses.replace(cold, server_ready=True)
    assert cold.start_cost() == start_cost("forkserver") > ready.start_cost() == FORK
    assert plan_stream(zlib, "h5py", cold).n_procs == 0 and plan_stream(zlib, "h5py", ready).n_procs == 2
    assert plan_stream(zlib, "h5py", Machine(2, "fork")).n_procs == 2
    forgone = would_save_s(zlib, "h5py", cold)
    assert forgone > 0  # readers from a ready server would have paid: what this stream forgoes
    assert would_save_s(zlib, "h5py", ready) == would_save_s(zlib, "h5py", Machine(2, "fork")) == 0
    # The streams forgo it again and again: once they have forgone the first start's price, readers start.
    after = [dataclasses.replace(cold, forgone_s=k * forgone) for k in range(100)]
    streams = next(k for k, machine in enumerate(after) if plan_stream(zlib, "h5py", machine).n_procs)
    assert 1 < streams <= -(-(start_cost("forkserver") - FORK) // forgone)
    assert Machine(2, "forkserver", forgone_s=1e9).start_cost() == FORK  # never below a start from a ready server
    tiny = DatasetShape(n_rows=64, row_nbytes=4096, chunk_rows=64, filter_ids=(1,))
    assert would_save_s(tiny, "h5py", cold) == 0  # readers would not pay even from a ready server: nothing forgone


def test_the_rate_is_measured_only_where_it_can_change_the_answer() -> None:
    two = Machine(cpus=2, start_method="fork")

    def zlib(mib: int, **kw: object) -> DatasetShape:
        return DatasetShape(n_rows=mib * 256, row_nbytes=4096, chunk_rows=16, filter_ids=(1,), **kw)  # type: ignore[arg-type]

    assert rate_decides(zlib(128), "chunks", two)  # near where readers start to pay, on some machine
    assert not rate_decides(zlib(4), "chunks", two)  # a small file: readers would not pay at any measured rate
    assert not rate_decides(zlib(1 << 16), "chunks", two)  # 64 GiB: they pay at any
    assert not rate_decides(zlib(128), "chunks", Machine(cpus=1, start_method="fork"))  # one CPU: no readers
    assert not rate_decides(zlib(128), "chunks", Machine(cpus=2, start_method="spawn"))  # too dear to start
    assert not rate_decides(zlib(128, remote=True), "chunks", two)  # an object: its own rule
    stored = DatasetShape(n_rows=128 * 256, row_nbytes=4096, chunk_rows=16)
    assert not rate_decides(stored, "chunks", two)
    # The plan takes the measured rate where the shape carries one.
    slow, fast = (plan_stream(dataclasses.replace(zlib(128), decode_rate=r), "chunks", two).n_procs for r in (0.3e9, 20e9))
    assert (slow, fast) == (2, 0)


def test_readers_pay_only_for_the_chunks_of_rows_that_can_be_decoded_at_once() -> None:
    """A block is whole chunks of rows: a dataset in k of them keeps at most k readers busy, whatever the CPUs."""
    assert [parallel_cpus(16, 1000, c) for c in (None, 1000, 250, 300, 1)] == [16, 1, 4, 4, 16]
    # Blocks that cut a chunk: each a reader's, as many as work at once (blocks of whole chunks change nothing).
    assert [parallel_cpus(16, 1000, 1000, b) for b in (100, 300, 1000, 2000)] == [10, 4, 1, 1]
    assert parallel_cpus(16, 1000, 250, 500) == 4 and parallel_cpus(16, 1000, None, 10) == 16
    sixteen = Machine(cpus=16, start_method="fork")
    one_chunk = DatasetShape(n_rows=1 << 23, row_nbytes=8, chunk_rows=1 << 23, filter_ids=(1,))  # 64 MiB, one chunk
    for rate in (None, 1e6):  # however slowly it decodes: one reader would decode what the consumer would
        shape = dataclasses.replace(one_chunk, decode_rate=rate)
        assert plan_stream(shape, "chunks", sixteen).n_procs == 0 and not rate_decides(shape, "chunks", sixteen)
    four = dataclasses.replace(one_chunk, n_rows=4 << 23, decode_rate=1e6)  # 256 MiB in four chunks, decoded slowly
    assert plan_stream(four, "chunks", sixteen).n_procs == 4


def test_the_rate_is_measured_on_a_sample_small_beside_the_dataset() -> None:
    """Whole chunks of RATE_SAMPLE_BYTES, or of the dataset's RATE_SAMPLE_SHARE where less; none where a chunk is more
    (the sample is read twice before the pass: it must cost little of it)."""
    assert RATE_SAMPLE_SHARE == 1 / 32
    assert rate_sample_rows(1 << 20, 1024, 16) * 1024 == RATE_SAMPLE_BYTES  # 1 GiB in 16 KiB chunks
    assert rate_sample_rows(1 << 20, 1024, 100) == 600  # rounded up to whole chunks
    assert rate_sample_rows(1 << 20, 1024, None) * 1024 == RATE_SAMPLE_BYTES  # contiguous: rows
    assert rate_sample_rows(64 * 1024, 16, 64) * 16 == 32 * 1024  # 1 MiB: a 32nd of it
    assert rate_sample_rows(1 << 20, 64, 1 << 15) == 1 << 15  # 64 MiB in 32 chunks: one
    assert rate_sample_rows(1 << 20, 64, 1 << 16) == 0  # in 16: none
    two = Machine(cpus=2, start_method="fork")
    small = DatasetShape(n_rows=128 * 256, row_nbytes=4096, chunk_rows=16, filter_ids=(1,))  # 128 MiB in 64 KiB chunks
    assert rate_decides(small, "chunks", two)
    assert not rate_decides(dataclasses.replace(small, chunk_rows=2048), "chunks", two)  # in 16 chunks of 8 MiB


def test_a_daemonic_process_plans_no_readers_by_default() -> None:
    """multiprocessing lets a daemonic process (a Pool's or a DataLoader's worker) start none: the defaults read in
    it, and measure no rate to decide."""
    zlib = DatasetShape(n_rows=1 << 20, row_nbytes=4096, chunk_rows=64, filter_ids=(1,))  # 4 GiB of zlib
    remote = dataclasses.replace(zlib, remote=True)
    free, daemon = Machine(cpus=4, start_method="fork"), Machine(cpus=4, start_method="fork", daemon=True)
    for shape in (zlib, remote):
        assert plan_stream(shape, "chunks", free).n_procs > 0 and plan_stream(shape, "chunks", daemon).n_procs == 0
    assert plan_batches([zlib, zlib], ["chunks"] * 2, free, n_rows=1 << 20).n_procs == (2, 2)
    assert plan_batches([zlib, zlib], ["chunks"] * 2, daemon, n_rows=1 << 20).n_procs == (0, 0)
    half = dataclasses.replace(zlib, n_rows=128 * 256, row_nbytes=4096, chunk_rows=16)
    assert rate_decides(half, "chunks", Machine(2, "fork")) and not rate_decides(half, "chunks", Machine(2, "fork", True))
    assert plan_stream(zlib, "chunks", daemon, n_procs=2).n_procs == 2  # asked for: refused where the pool starts


def test_batches_read_stored_bytes_in_the_consumer_unless_a_transform_runs_on_them() -> None:
    machine = Machine(cpus=4, start_method="fork")
    stored = DatasetShape(n_rows=1 << 20, row_nbytes=4096, chunk_rows=64)  # 4 GiB, no filter
    assert plan_batches([stored], ["chunks"], machine, n_rows=1 << 20).n_procs == (0,)
    transformed = DatasetShape(n_rows=1 << 20, row_nbytes=4096, chunk_rows=64, transformed=True, transform_row_s=1e-6)
    assert plan_batches([transformed], ["chunks"], machine, n_rows=1 << 20).n_procs == (4,)  # 1 s of transform
    zlib = DatasetShape(n_rows=1 << 20, row_nbytes=4096, chunk_rows=64, filter_ids=(1,))
    assert plan_batches([zlib], ["chunks"], machine, n_rows=1 << 20).n_procs == (4,)


def test_a_transform_is_priced_at_its_time_a_row_over_the_rows_of_the_epochs() -> None:
    """Readers save ``1 - 1/n`` of a transform's one-core time over a pass's rows and must save twice their start
    (NOTE [read plan]); stored rows without a transform never pay, however large."""
    fork, spawn = Machine(cpus=2, start_method="fork"), Machine(cpus=2, start_method="spawn")
    small = DatasetShape(n_rows=1000, row_nbytes=24, chunk_rows=64, transformed=True)  # 24 KB: a copy to read

    def readers(machine: Machine, row_s: float, n_rows: int = 1000, passes: int = 1) -> "tuple[int, ...]":
        shape = dataclasses.replace(small, transform_row_s=row_s)
        return plan_batches([shape], ["h5py"], machine, n_rows=n_rows, passes=passes, block_size=50).n_procs

    assert readers(fork, 3e-3) == (2,) and readers(spawn, 3e-3) == (2,)  # 3 s an epoch: readers share it
    assert readers(fork, 5e-4) == (2,) and readers(spawn, 5e-4) == (0,)  # 0.5 s: beats a fork's start, not a spawn's
    assert readers(fork, 1e-6) == (0,)  # 1 ms an epoch: never worth a start
    assert readers(spawn, 5e-4, passes=20) == (2,)  # over the epochs read so far (NOTE [readers bought])
    assert readers(fork, 1e-5, n_rows=100_000) == (2,) and readers(fork, 1e-5) == (0,)  # the epoch's rows, a draw's
    assert readers(Machine(cpus=1, start_method="fork"), 1.0) == (0,)  # one CPU: never
    for size in (1000, 1 << 30):  # stored bytes without a transform: a copy either way, at any size
        assert not parallel_pays(size * 24, (), FORK, 64, "h5py") and parallel_pays(size * 24, (), FORK, 2, "h5py", 1.0)


def test_a_transforms_time_a_call_is_priced_once_a_block_and_its_time_a_row_once_a_row() -> None:
    """A sleep of 1 ms a call on 100,000 rows of 24 B: priced a row (as the first 2 rows timed it), 0.5 ms a row, 50 s
    an epoch; priced a call a block (NOTE [read plan]), 1 ms a block, readers pay only where the blocks are many."""
    fork = Machine(cpus=2, start_method="fork")
    shape = DatasetShape(n_rows=100_000, row_nbytes=24, chunk_rows=4096, transformed=True, transform_call_s=1e-3)

    def readers(block_size: "int | None", call_s: float = 1e-3, row_s: float = 0.0) -> "tuple[int, ...]":
        priced = dataclasses.replace(shape, transform_call_s=call_s, transform_row_s=row_s)
        return plan_batches([priced], ["h5py"], fork, n_rows=100_000, block_size=block_size).n_procs

    assert readers(None) == (0,)  # the default blocks: 1 call of 1 ms a pass (one block of 2.4 MB)
    assert readers(4096) == (0,) and readers(4096, call_s=0.05) == (2,)  # 25 calls: 25 ms, or 1.25 s at 50 ms a call
    assert readers(None, call_s=0.0, row_s=5e-4) == (2,)  # the same per row: 50 s an epoch
    assert transform_s(1e-6, 1e-3, 100_000, 4096) == pytest.approx(25 * 1e-3 + 0.1)
    assert transform_s(1e-6, 1e-3, 100_000, None) == pytest.approx(1e-3 + 0.1)  # blocks not known: one
    fork_server = Machine(cpus=2, start_method="forkserver")  # what a stream forgoes counts the same calls
    assert would_save_s(dataclasses.replace(shape, transform_call_s=0.05), "h5py", fork_server, 4096) > 0
    assert would_save_s(dataclasses.replace(shape, transform_call_s=0.05), "h5py", fork_server, 100_000) == 0


@given(st.integers(1, 16), st.integers(1, 1 << 16), st.sampled_from([(), (1,), (32001,)]),
       st.sampled_from(["fork", "spawn", "forkserver"]), st.sampled_from([0.5, 0.99, 1.01, 2.0]))
def test_a_transforms_stake_is_what_its_work_must_exceed_for_the_default_readers_to_pay(
    cpus: int, chunks: int, filter_ids: "tuple[int, ...]", method: str, factor: float
) -> None:
    """``transform_stake``: work above it gets the default's readers, work below it none (what a transform is timed
    against: NOTE [transforms]); None where no work changes that, after any number of epochs."""
    machine = Machine(cpus=cpus, start_method=method)
    shape = DatasetShape(n_rows=chunks * 64, row_nbytes=24, chunk_rows=64, filter_ids=filter_ids, transformed=True)

    def readers(work_s: float, passes: int = 1) -> int:
        priced = dataclasses.replace(shape, transform_row_s=work_s / shape.n_rows)
        return plan_batches([priced], ["h5py"], machine, n_rows=shape.n_rows, block_size=64, passes=passes).n_procs[0]

    stake = transform_stake(shape, "h5py", machine, 64)
    if stake is None:
        assert len({readers(w, p) for w in (1e-12, 1e3) for p in (1, 1000)}) == 1
    else:
        assert (readers(stake * factor) > 0) == (factor > 1)


def test_a_transforms_stake_is_none_where_no_work_changes_the_default_readers() -> None:
    fork = Machine(cpus=4, start_method="fork")
    many = DatasetShape(n_rows=64 * 1024, row_nbytes=24, chunk_rows=64, transformed=True)
    assert transform_stake(many, "h5py", fork, 64) == pytest.approx(2 * FORK / 0.75 - many.nbytes / 3.5e9)
    one_chunk = dataclasses.replace(many, chunk_rows=many.n_rows)
    assert transform_stake(one_chunk, "h5py", fork, many.n_rows) is None  # its one block: one reader at work
    assert transform_stake(one_chunk, "h5py", fork, 64) is not None  # blocks that cut it: several
    assert transform_stake(many, "h5py", Machine(cpus=1, start_method="fork"), 64) is None
    assert transform_stake(many, "h5py", Machine(cpus=4, start_method="fork", daemon=True), 64) is None
    assert transform_stake(dataclasses.replace(many, remote=True), "h5py", fork, 64) is None
    large = DatasetShape(n_rows=1 << 20, row_nbytes=4096, chunk_rows=64, filter_ids=(1,), transformed=True)
    assert transform_stake(large, "h5py", fork, 64) is None  # 4 GiB of zlib: readers pay for the read alone


def test_hints_go_where_the_kernel_would_not_read_ahead_or_a_decode_leaves_the_disk_idle() -> None:
    assert hint_distance(4, ()) == 4 and hint_distance(2, (1,)) == 2  # several readers in turn: a strided pattern
    assert hint_distance(1, (1,)) == 1 and hint_distance(0, (32001,)) == 1  # one reader that decodes: the next block
    assert hint_distance(1, ()) == 0 and hint_distance(0, ()) == 0  # one reader of stored bytes: nothing


def test_readers_are_capped_at_the_blocks_of_a_pass_and_four_per_cpu() -> None:
    assert READERS_PER_CPU == 4
    assert cap_readers(1000, 3, 16) == 3  # a reader per block of the pass at most
    assert cap_readers(1000, None, 2) == 8  # endless (cyclic): the CPUs alone cap
    assert cap_readers(1000, 5000, 2) == 8
    assert cap_readers(2, 100, 16) == 2  # what was asked, where it can be used
    assert cap_readers(0, 3, 2) == 0  # 0 still means reading in the consumer


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
    first = k < distance and k + 1 < plan.n_blocks  # a reader's first block, with later blocks to hint: itself too
    hinted = [j for j in range(plan.n_blocks) if j == k + distance or (first and k <= j <= k + distance)]
    assert ahead(plan, k, distance) == tuple(p for j in hinted for p in plan.pieces(j))


def test_the_first_blocks_are_hinted_in_order_by_each_readers_first_claim() -> None:
    plan = BlockPlan(100, 10)
    blocks = lambda pieces: [p.start // 10 for p in pieces]  # noqa: E731
    assert blocks(ahead(plan, 0, 2)) == [0, 1, 2]
    assert blocks(ahead(plan, 1, 2)) == [1, 2, 3]
    assert blocks(ahead(plan, 2, 2)) == [4]
    assert blocks(ahead(plan, 9, 2)) == []


@given(sizes, st.integers(0, 60), st.integers(1, 6))
def test_ahead_of_a_cyclic_plan_never_ends_and_wraps(size: tuple[int, int], k: int, distance: int) -> None:
    n, bs = size
    plan = BlockPlan(n, bs, cyclic=True)
    k += distance  # past each reader's first block
    assert ahead(plan, k, distance) == plan.pieces(k + distance)
    assert sum(p.stop - p.start for p in ahead(plan, k, distance)) == bs


def test_ahead_follows_a_range_plan_and_stops_at_its_end() -> None:
    plan = RangePlan((40, 0, 20), (50, 10, 30))
    assert ahead(plan, 0, 1) == plan.pieces(0) + plan.pieces(1)  # a reader's first block: itself too
    assert ahead(RangePlan((40,), (50,)), 0, 1) == ()  # a block alone: read at once, unhinted
    assert ahead(plan, 1, 1) == plan.pieces(2)
    assert [(p.start, p.stop) for p in ahead(plan, 1, 2)] == [(0, 10), (20, 30)]
    assert ahead(plan, 2, 1) == ()
    assert ahead(plan, 0, 0) == ()  # no readers, nothing ahead


# -- shared memory: a ring of the defaults fits what is free (NOTE [read plan]) ------------------------------------


def ring_bytes(plan: ReadPlan, row_nbytes: int) -> int:
    """The bytes of a plan's slots (the ring's header and page rounding aside)."""
    return plan.read_ahead * plan.block_size * row_nbytes


@given(
    n_rows=st.integers(1, 10**7),
    row_nbytes=st.integers(1, 1 << 20),
    chunk_rows=st.one_of(st.none(), st.integers(1, 10**4)),
    n_procs=st.integers(1, 64),
    free=st.integers(0, 1 << 32),
)
def test_a_default_ring_takes_at_most_its_share_of_free_shared_memory_or_the_fewest_slots_of_the_smallest_blocks(
    n_rows: int, row_nbytes: int, chunk_rows: "int | None", n_procs: int, free: int
) -> None:
    shape = DatasetShape(n_rows, row_nbytes, chunk_rows, (1,))
    machine = Machine(64, "fork")
    plan = plan_stream(shape, "chunks", machine, n_procs=n_procs, shm_free=free)
    unfitted = plan_stream(shape, "chunks", machine, n_procs=n_procs)
    assert plan.n_procs == unfitted.n_procs
    assert plan.block_size <= unfitted.block_size and plan.read_ahead <= unfitted.read_ahead
    smallest = min(chunk_rows or 1, n_rows)
    if ring_bytes(plan, row_nbytes) > SHM_SHARE * free:  # only at the floor: one slot per reader and one, blocks of a chunk
        assert plan.read_ahead == plan.n_procs + 1 and plan.block_size == smallest
    if chunk_rows and plan.block_size < n_rows:
        assert plan.block_size % chunk_rows == 0  # whole chunks still
    if ring_bytes(unfitted, row_nbytes) <= SHM_SHARE * free:
        assert plan == unfitted  # room enough: the plan of old


def test_what_the_caller_gives_is_kept_and_the_rest_fitted_around_it() -> None:
    shape = DatasetShape(1 << 20, 4096, 64, (1,))  # 4 GiB of 4 KiB rows in 256 KiB chunks
    machine = Machine(8, "fork")
    free = 64 << 20  # Docker's default /dev/shm
    default = plan_stream(shape, "chunks", machine)
    assert (default.n_procs, default.read_ahead, default.block_size * 4096) == (8, 18, 4 << 20)  # 72 MiB: too much
    fitted = plan_stream(shape, "chunks", machine, shm_free=free)
    assert fitted.n_procs == 8 and ring_bytes(fitted, 4096) <= free // 2
    # Blocks of whole chunks for the fewest slots (32 MiB / 9: 14 chunks), then as many slots as they leave room for.
    assert (fitted.read_ahead, fitted.block_size) == (9, 14 * 64)
    slots = plan_stream(shape, "chunks", machine, block_size=1024, shm_free=free)
    assert (slots.block_size, slots.read_ahead) == (1024, 8)  # the blocks asked for; slots as few as allowed,
    assert slots.n_procs == 7  # for fewer default readers: 9 slots of 4 MiB would take more than half
    blocks = plan_stream(shape, "chunks", machine, read_ahead=16, shm_free=free)
    assert (blocks.read_ahead, blocks.block_size) == (16, 8 * 64)  # the slots asked for; blocks to fit them (2 MiB)
    assert plan_stream(shape, "chunks", machine, read_ahead=4, shm_free=free).block_size == 1024  # room: 4 MiB blocks
    assert plan_stream(shape, "chunks", machine, read_ahead=18, block_size=1024, shm_free=free) == default
    sixteen = plan_stream(shape, "chunks", Machine(16, "fork"), shm_free=free)  # 136 MiB by default
    assert (sixteen.n_procs, sixteen.read_ahead, sixteen.block_size) == (16, 18, 7 * 64)  # 31.5 MiB: 18 of 1.75


def test_default_readers_whose_smallest_ring_does_not_fit_are_fewer_down_to_none() -> None:
    """A 4 MiB chunk is the smallest default block: in 8 MiB of shared memory (half of it for the ring) not even
    one reader's two slots fit, so the defaults read in the consumer (no shared memory) rather than refuse with a
    ShmSpaceError what the caller never asked for; in 24 MiB two readers do (3 slots), not eight. Readers asked
    for are kept, and refused later if their ring does not fit."""
    shape = DatasetShape(1 << 18, 4096, 1024, (1,))  # 1 GiB of 4 KiB rows in 4 MiB chunks
    machine = Machine(8, "fork")
    assert plan_stream(shape, "chunks", machine).n_procs == 8
    none = plan_stream(shape, "chunks", machine, shm_free=8 << 20)
    assert (none.n_procs, none.block_size) == (0, plan_stream(shape, "chunks", machine, n_procs=0).block_size)
    two = plan_stream(shape, "chunks", machine, shm_free=24 << 20)
    assert (two.n_procs, two.read_ahead, two.block_size) == (2, 3, 1024)
    assert plan_stream(shape, "chunks", machine, block_size=2048, shm_free=32 << 20).n_procs == 1  # 2 x 8 MiB
    assert plan_stream(shape, "chunks", machine, n_procs=8, shm_free=8 << 20).n_procs == 8  # asked: kept
    assert plan_stream(shape, "chunks", machine, read_ahead=2, shm_free=8 << 20).n_procs == 8  # slots asked: kept


def test_small_blocks_asked_for_are_read_several_at_a_time() -> None:
    shape = DatasetShape(1 << 20, 16, 16384, ())  # 16 MiB of 16-byte rows
    machine = Machine(2, "fork")
    times = TOGETHER_BYTES // (256 * 16)
    queue = plan_stream(shape, "h5py", machine, n_procs=2, block_size=256, remainder=True)
    assert (queue.block_size, queue.split_rows) == (256 * times, 256)  # a queue hands out the blocks asked for
    assert queue.block_size * 16 == TOGETHER_BYTES and queue.blocks.n_rows == 1 << 20
    rows = plan_stream(shape, "h5py", machine, n_procs=2, block_size=256, read_ahead=8, remainder=True, rows_only=True)
    assert (rows.block_size, rows.split_rows) == (256 * times, 256)  # the generator walks the rows of the blocks read
    assert rows.read_ahead == 3  # the 32 KiB in flight asked for: the fewest slots for 2 readers
    inline = plan_stream(shape, "h5py", machine, n_procs=0, block_size=256, read_ahead=8, rows_only=True)
    assert inline.read_ahead == 1
    # Without the remainder, the rows of the last whole block asked for are the last read.
    odd = DatasetShape(1000, 16, None, ())
    cut = plan_stream(odd, "h5py", machine, n_procs=0, block_size=7)
    assert (cut.blocks.n_rows, cut.block_size, cut.blocks.n_blocks, cut.split_rows) == (994, 994, 1, 7)
    assert plan_stream(odd, "h5py", machine, n_procs=0, block_size=7, remainder=True).blocks.n_rows == 1000
    # Cyclic, any multiple cuts the endless sequence alike, within the dataset's rows.
    assert plan_stream(odd, "h5py", machine, n_procs=0, block_size=7, cyclic=True).block_size == 7 * (1000 // 7)


def test_blocks_read_together_leave_every_reader_its_blocks_and_a_given_ring_its_bytes() -> None:
    shape = DatasetShape(1 << 20, 16, 16384, ())
    machine = Machine(2, "fork")
    asked = plan_stream(shape, "h5py", machine, n_procs=2, block_size=1 << 16)  # 1 MiB: as asked
    assert (asked.block_size, asked.split_rows) == (1 << 16, 0)
    few = plan_stream(shape, "h5py", machine, n_procs=2, block_size=1 << 14)  # 64 blocks: 8 each at most
    assert (few.block_size, few.split_rows, few.blocks.n_blocks) == (1 << 16, 1 << 14, 16)
    slots = plan_stream(shape, "h5py", machine, n_procs=2, block_size=256, read_ahead=100)
    assert slots.read_ahead == 100 and 100 * slots.block_size * 16 <= TOGETHER_RING_BYTES  # a queue's caller holds 100
    assert slots.split_rows == 256 and slots.block_size > 256
    tiny = DatasetShape(200, 8, None, ())
    assert plan_stream(tiny, "h5py", machine, n_procs=2, block_size=20).split_rows == 0  # 10 blocks: 5 a reader
    assert plan_stream(tiny, "h5py", machine, n_procs=2, block_size=7).block_size == 21  # 28: 3 a block read


def test_training_blocks_are_never_fitted_only_their_slots() -> None:
    # An epoch's order is made of its blocks (NOTE [epoch plan]): only the read-ahead gives way.
    blocks = BlockPlan(1 << 16, 1024)
    machine = Machine(8, "fork")
    fitted = plan_blocks(blocks, machine, n_procs=8, slot_bytes=4 << 20, shm_free=64 << 20)
    assert fitted.blocks is blocks and fitted.read_ahead == 9
    assert plan_blocks(blocks, machine, n_procs=8, slot_bytes=4 << 20, shm_free=1 << 30).read_ahead == default_read_ahead(8)
    assert plan_blocks(blocks, machine, n_procs=8, read_ahead=30, slot_bytes=4 << 20, shm_free=64 << 20).read_ahead == 30
    assert plan_blocks(blocks, machine, n_procs=0, slot_bytes=4 << 20, shm_free=0).read_ahead == default_read_ahead(0)


def test_a_caller_that_holds_a_share_of_the_slots_gets_as_many_more_by_default() -> None:
    # NOTE [slots on a device]: the readers keep the default's slots; fitted to the room as any default; given, kept.
    blocks = BlockPlan(1 << 16, 1024)
    machine = Machine(16, "fork")
    assert plan_blocks(blocks, machine, n_procs=16, held=0.5).read_ahead == 2 * default_read_ahead(16)
    assert plan_blocks(blocks, machine, n_procs=16, held=0.25).read_ahead == -(-default_read_ahead(16) * 4 // 3)
    room = int(40 / SHM_SHARE) << 20  # a ring of 40 MiB: 10 slots of 4 MiB, fewer than 16 readers' fewest
    assert plan_blocks(blocks, machine, n_procs=16, held=0.5, slot_bytes=4 << 20, shm_free=room).read_ahead == 16 + 1
    room = int(200 / SHM_SHARE) << 20
    assert plan_blocks(blocks, machine, n_procs=16, held=0.5, slot_bytes=4 << 20, shm_free=room).read_ahead == 50
    assert plan_blocks(blocks, machine, n_procs=16, read_ahead=30, held=0.5).read_ahead == 30
