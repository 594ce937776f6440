"""Streamer: what a user of the established API, and a demanding one, can rely on."""

from __future__ import annotations

import collections
import math
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import multitables

DTYPES = ["<i1", "<u2", "<i4", "<i8", "<f2", "<f4", "<f8", "<c8", "?"]
FILTERS = {
    "none": None,
    "zlib": tables.Filters(3, "zlib", shuffle=True),
    "blosc": tables.Filters(3, "blosc", shuffle=True),
    "blosc-lz4": tables.Filters(5, "blosc:lz4", bitshuffle=True),
    "blosc2-zstd": tables.Filters(5, "blosc2:zstd"),
    "bzip2": tables.Filters(5, "bzip2"),
    "fletcher32": tables.Filters(0, fletcher32=True),
}


def write(path: Path, data: np.ndarray, filters: "tables.Filters | None", chunk_rows: "int | None") -> None:
    with tables.open_file(path, "w") as f:
        if chunk_rows is None:
            f.create_array("/", "data", data)  # contiguous
        else:
            f.create_carray("/", "data", obj=data, filters=filters, chunkshape=(chunk_rows,) + data.shape[1:])


def blocks_of(queue: multitables.Queue) -> list[np.ndarray]:
    out = []
    for guard in queue.iter():
        with guard as block:
            out.append(block.copy())
    return out


def as_counter(arrays: "list[np.ndarray]") -> collections.Counter:
    return collections.Counter(a.tobytes() for a in arrays)


def expected_blocks(data: np.ndarray, bs: int, remainder: bool) -> list[np.ndarray]:
    n = len(data)
    stops = list(range(bs, n + 1, bs))
    blocks = [data[s - bs : s] for s in stops]
    if remainder and n % bs:
        blocks.append(data[n - n % bs :])
    return blocks


@st.composite
def streams(draw: st.DrawFn) -> dict:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    n_rows = draw(st.integers(1, 200))
    row_shape = draw(st.sampled_from([(), (3,), (2, 5)]))
    data = draw(hnp.arrays(dtype, (n_rows,) + row_shape, elements=hnp.from_dtype(dtype, allow_nan=False)))
    filt = draw(st.sampled_from(sorted(FILTERS)))
    chunk_rows = None if filt == "none" and draw(st.booleans()) else draw(st.integers(1, n_rows))
    return dict(
        data=data,
        filters=filt,
        chunk_rows=chunk_rows,
        n_procs=draw(st.integers(1, 3)),
        block_size=draw(st.integers(1, n_rows)),
        ordered=draw(st.booleans()),
        cyclic=draw(st.booleans()),
        remainder=draw(st.booleans()),
        engine=draw(st.sampled_from(["h5py", "tables"])),
        read_ahead=draw(st.one_of(st.none(), st.integers(1, 4))),
    )


def check_stream(case: dict, start_method: "str | None" = None) -> None:
    """Stream one case and compare with what plain PyTables reads."""
    data, bs = case["data"], case["block_size"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.h5"
        write(path, data, FILTERS[case["filters"]], case["chunk_rows"])
        stream = multitables.Streamer(path, engine=case["engine"], start_method=start_method)
        kwargs = dict(n_procs=case["n_procs"], block_size=bs, ordered=case["ordered"], read_ahead=case["read_ahead"])
        if case["cyclic"]:
            n_pass = -(-len(data) // bs)
            with stream.get_queue("/data", cyclic=True, **kwargs) as queue:
                got = [blocks_of_n(queue, 2 * n_pass + 1)]
            windows = [data[(k * bs + np.arange(bs)) % len(data)] for k in range(2 * n_pass + 1)]
            if case["ordered"]:
                np.testing.assert_array_equal(np.concatenate(got[0]), np.concatenate(windows))
            else:
                # Unordered, a delivered block may be any claimed one, up to read_ahead
                # blocks past the first 2 * n_pass + 1: accept every window of the cycle
                # (block starts repeat with period n / gcd(n, block_size)).
                period = len(data) // math.gcd(len(data), bs)
                valid = {data[(k * bs + np.arange(bs)) % len(data)].tobytes() for k in range(period)}
                assert all(b.tobytes() in valid for b in got[0])
            return
        with stream.get_queue("/data", remainder=case["remainder"], **kwargs) as queue:
            got = blocks_of(queue)
        expected = expected_blocks(data, bs, case["remainder"])
        if case["ordered"]:
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                np.testing.assert_array_equal(g, e)
        else:
            assert as_counter(got) == as_counter(expected)
        if not case["remainder"]:
            np.testing.assert_array_equal(stream.get_remainder("/data", bs), data[len(data) - len(data) % bs :])
        rows = list(stream.get_generator("/data", **kwargs))
        if case["ordered"]:
            np.testing.assert_array_equal(np.array(rows).reshape(data.shape), data)
        else:
            assert as_counter(rows) == as_counter(list(data))


def blocks_of_n(queue: multitables.Queue, n: int) -> list[np.ndarray]:
    out = []
    for _ in range(n):
        with queue.get() as block:
            out.append(block.copy())
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(streams())
def test_every_row_exactly_once_or_in_order_or_wrapping(case: dict) -> None:
    check_stream(case)


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize(
    "ordered,cyclic,remainder,engine",
    [(True, False, True, "h5py"), (False, False, False, "tables"), (True, True, False, "h5py"), (False, True, False, "tables")],
)
def test_core_matrix_under_each_start_method(start_method: str, ordered: bool, cyclic: bool, remainder: bool, engine: str) -> None:
    data = np.arange(997 * 4, dtype="<f4").reshape(997, 4)
    case = dict(
        data=data, filters="blosc", chunk_rows=50, n_procs=2, block_size=100, ordered=ordered,
        cyclic=cyclic, remainder=remainder, engine=engine, read_ahead=None,
    )
    check_stream(case, start_method)


def test_table_fields_stream_one_column(table_file) -> None:
    path, rows = table_file
    stream = multitables.Streamer(path)
    for field in ("a", "v"):
        with stream.get_queue("/table", n_procs=2, block_size=64, ordered=True, field=field, remainder=True) as q:
            np.testing.assert_array_equal(np.concatenate(blocks_of(q)), rows[field])
    with stream.get_queue("/table", n_procs=2, block_size=64, ordered=True, remainder=True) as q:
        np.testing.assert_array_equal(np.concatenate(blocks_of(q)), rows)


def test_the_established_api_runs_unchanged(make_array) -> None:
    data = np.arange(1000 * 8, dtype="<i8").reshape(1000, 8)
    stream = multitables.Streamer(filename=str(make_array(data, chunkshape=(32, 8))))
    queue = stream.get_queue(path="/data", n_procs=2, read_ahead=5, cyclic=False, block_size=96)
    assert isinstance(queue, multitables.Streamer.Queue)
    got = []
    while True:
        guard = queue.get()
        if guard is multitables.QueueClosed:
            break
        with guard as block:
            got.append(block.copy())
    assert queue.get() is multitables.QueueClosed  # and stays closed
    queue.close()
    last = stream.get_remainder("/data", queue.block_size)
    assert as_counter(got + [last]) == as_counter(expected_blocks(data, 96, True))
    rows = list(stream.get_generator("/data", 2, 5, False, 96))
    assert as_counter(rows) == as_counter(list(data))


def test_a_direct_block_is_a_read_only_view_on_a_reused_slot(make_array) -> None:
    data = np.arange(64 * 1024, dtype="<f4").reshape(-1, 1024)
    stream = multitables.Streamer(make_array(data, chunkshape=(4, 1024)))
    with stream.get_queue("/data", n_procs=1, read_ahead=1, block_size=4, ordered=True) as queue:
        addresses = set()
        for guard in queue.iter():
            with guard as block:
                assert not block.flags.writeable and not block.flags.owndata
                with pytest.raises(ValueError):
                    block[0, 0] = 1
                addresses.add(block.__array_interface__["data"][0])
        assert len(addresses) == 1  # one slot, filled again and again: no copies


def test_consumer_memory_stays_flat_over_twenty_rings(make_array) -> None:
    rows, block = 20 * 4 * 64, 64  # 20x a ring of 4 slots of 64 rows of 16 KiB = 4 MiB
    data = np.random.default_rng(0).standard_normal((rows, 4096), dtype=np.float32)
    stream = multitables.Streamer(make_array(data, complib="blosc", chunkshape=(64, 4096)))
    me = psutil.Process()
    with stream.get_queue("/data", n_procs=2, read_ahead=4, block_size=block) as queue:
        ring_bytes = 4 * block * 4096 * 4
        first = queue.get()
        first.release()
        base = me.memory_info().rss
        peak = base
        for guard in queue.iter():
            with guard as b:
                b.sum()
            peak = max(peak, me.memory_info().rss)
    assert peak - base <= ring_bytes + (16 << 20)


def test_consumer_memory_stays_flat_under_the_generator(make_array) -> None:
    rows, block = 20 * 4 * 64, 64  # 20x a ring of 4 slots of 64 rows of 16 KiB = 4 MiB
    data = np.random.default_rng(0).standard_normal((rows, 4096), dtype=np.float32)
    stream = multitables.Streamer(make_array(data, complib="blosc", chunkshape=(64, 4096)))
    me = psutil.Process()
    gen = stream.get_generator("/data", n_procs=2, read_ahead=4, block_size=block)
    next(gen)
    base = peak = me.memory_info().rss
    for i, row in enumerate(gen):
        if i % block == 0:
            peak = max(peak, me.memory_info().rss)
    ring_bytes = 4 * block * 4096 * 4
    assert peak - base <= ring_bytes + (16 << 20)


def test_several_threads_share_one_queue_each_block_once(make_array) -> None:
    data = np.arange(3000 * 16, dtype="<i4").reshape(3000, 16)
    stream = multitables.Streamer(make_array(data, chunkshape=(25, 16)))
    got: list[np.ndarray] = []
    lock = threading.Lock()
    with stream.get_queue("/data", n_procs=2, block_size=50, read_ahead=6) as queue:

        def consume() -> None:
            for guard in queue.iter():
                with guard as block:
                    copy = block.copy()
                with lock:
                    got.append(copy)

        threads = [threading.Thread(target=consume) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    assert as_counter(got) == as_counter(expected_blocks(data, 50, False))


def test_small_datasets_are_read_in_process_by_default(make_array) -> None:
    data = np.arange(1000, dtype="<f8")
    stream = multitables.Streamer(make_array(data))
    with stream.get_queue("/data", remainder=True, ordered=True) as queue:
        assert queue.n_procs == 0 and queue.reader_pids == []
        np.testing.assert_array_equal(np.concatenate(blocks_of(queue)), data)
    np.testing.assert_array_equal(np.array(list(stream.get_generator("/data"))), data)


@pytest.mark.parametrize("n_procs", [None, 2], ids=["in-process", "readers"])
def test_generator_rows_are_safe_to_keep_and_to_change(make_array, n_procs: "int | None") -> None:
    data = np.arange(500 * 3, dtype="<i4").reshape(500, 3)
    stream = multitables.Streamer(make_array(data, chunkshape=(10, 3)))
    kept = list(stream.get_generator("/data", n_procs=n_procs, block_size=20, ordered=True, read_ahead=2))
    np.testing.assert_array_equal(np.array(kept), data)
    kept[0][:] = -1  # private memory: changing a kept row changes nothing else
    np.testing.assert_array_equal(np.array(kept[1:]), data[1:])


@pytest.mark.parametrize("n_procs", [None, 2], ids=["in-process", "readers"])
def test_generator_reuses_blocks_nobody_holds(make_array, monkeypatch: pytest.MonkeyPatch, n_procs: "int | None") -> None:
    from multitables import streamer

    made = []
    real = streamer._empty_block
    monkeypatch.setattr(streamer, "_empty_block", lambda spec: made.append(1) or real(spec))
    data = np.arange(500 * 3, dtype="<i4").reshape(500, 3)
    stream = multitables.Streamer(make_array(data, chunkshape=(10, 3)))
    gen = stream.get_generator("/data", n_procs=n_procs, block_size=20, read_ahead=2)
    total = sum(int(row.sum()) for row in gen)  # no row outlives its turn
    assert total == int(data.sum())
    assert len(made) <= 2  # two buffers used in turn for 25 blocks


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generator_rows_kept_are_never_overwritten(data: st.DataObject) -> None:
    """Whatever rows the caller keeps (and changes), nothing else writes to them, during the pass or after."""
    n_rows = data.draw(st.integers(1, 300))
    table = np.arange(n_rows * 4, dtype="<i4").reshape(n_rows, 4)  # row i starts with 4 * i
    kwargs = dict(
        n_procs=data.draw(st.integers(1, 3)),
        block_size=data.draw(st.integers(1, n_rows)),
        read_ahead=data.draw(st.one_of(st.none(), st.integers(1, 4))),
        ordered=data.draw(st.booleans()),
    )
    keep = data.draw(st.lists(st.sampled_from(["drop", "keep", "change"]), min_size=n_rows, max_size=n_rows))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.h5"
        write(path, table, FILTERS["zlib"], data.draw(st.integers(1, n_rows)))
        kept: dict[int, np.ndarray] = {}
        for row in multitables.Streamer(path).get_generator("/data", **kwargs):
            i = int(row[0]) // 4
            if keep[i] != "drop":
                kept[i] = row
            if keep[i] == "change":
                row[:] = -i
    for i, row in kept.items():
        np.testing.assert_array_equal(row, -i if keep[i] == "change" else table[i])


def test_a_plain_loop_gets_the_readers_slots_without_copies(make_array, monkeypatch: pytest.MonkeyPatch) -> None:
    from multitables import streamer

    made = []
    real = streamer._empty_block
    monkeypatch.setattr(streamer, "_empty_block", lambda spec: made.append(1) or real(spec))
    data = np.arange(500 * 3, dtype="<i4").reshape(500, 3)
    stream = multitables.Streamer(make_array(data, chunkshape=(10, 3)))
    total = 0
    for row in stream.get_generator("/data", n_procs=2, block_size=20):
        total += int(row.sum())
    assert total == int(data.sum())
    # 25 blocks: every one lent but the last, which is copied so that the
    # loop's name, still holding its last row, does not hold the ring.
    assert len(made) == 1


def test_rows_kept_past_close_stay_valid_and_the_ring_goes(
    make_array, shm_mappings, no_leaks, monkeypatch: pytest.MonkeyPatch
) -> None:
    from multitables import streamer

    def close_late(queue: streamer.Queue, real=streamer.Queue.close) -> None:
        time.sleep(0.3)  # time for the readers to refill any slot given back before the close
        real(queue)

    monkeypatch.setattr(streamer.Queue, "close", close_late)
    data = np.arange(500 * 3, dtype="<i4").reshape(500, 3)
    stream = multitables.Streamer(make_array(data, chunkshape=(10, 3)))
    gen = stream.get_generator("/data", n_procs=2, block_size=20, ordered=True)
    first, second = next(gen), next(gen)  # rows of a lent slot
    assert shm_mappings()
    gen.close()
    assert shm_mappings() == []  # the ring is released although its rows live on
    np.testing.assert_array_equal(np.array([first, second]), data[:2])
    first[:] = 7  # still the caller's to change
    np.testing.assert_array_equal(second, data[1])


def test_cyclic_generator_wraps(make_array) -> None:
    data = np.arange(30, dtype="<i2")
    stream = multitables.Streamer(make_array(data, chunkshape=(4,)))
    gen = stream.get_generator("/data", n_procs=2, block_size=7, cyclic=True, ordered=True)
    rows = [int(next(gen)) for _ in range(75)]
    gen.close()
    assert rows == [i % 30 for i in range(75)]


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(n_procs=0), ValueError, "n_procs"),
        (dict(n_procs=1.5), TypeError, "n_procs"),
        (dict(n_procs=True), TypeError, "n_procs"),
        (dict(block_size=0), ValueError, "block_size"),
        (dict(block_size=-3), ValueError, "block_size"),
        (dict(block_size=101), ValueError, "block_size=101 is larger"),
        (dict(block_size="10"), TypeError, "block_size"),
        (dict(read_ahead=0), ValueError, "read_ahead"),
        (dict(cyclic="yes"), TypeError, "cyclic"),
        (dict(ordered=None), TypeError, "ordered"),
        (dict(remainder=1), TypeError, "remainder"),
        (dict(field=3), TypeError, "field"),
        (dict(field="x"), KeyError, "not a table"),
    ],
)
def test_bad_arguments_fail_before_any_process_starts(make_array, kwargs: dict, error: type, match: str) -> None:
    stream = multitables.Streamer(make_array(np.zeros(100)))
    before = psutil.Process().children()
    with pytest.raises(error, match=match):
        stream.get_queue("/data", **kwargs)
    with pytest.raises(error, match=match):
        stream.get_generator("/data", **kwargs)
    assert psutil.Process().children() == before


def test_bad_streamer_arguments(make_array) -> None:
    with pytest.raises(ValueError, match="engine='gpu'"):
        multitables.Streamer(make_array(np.zeros(3)), engine="gpu")
    with pytest.raises(ValueError, match="start_method='thread'"):
        multitables.Streamer(make_array(np.zeros(3)), start_method="thread")


@pytest.mark.filterwarnings("ignore:The use of uppercase keyword parameters:DeprecationWarning")
def test_pytables_open_options_go_to_pytables(make_array) -> None:
    data = np.arange(100, dtype="<f4")
    stream = multitables.Streamer(make_array(data), DRIVER="H5FD_CORE")
    with stream.get_queue("/data", n_procs=1, block_size=10, ordered=True) as q:
        assert q.engine == "tables"
        np.testing.assert_array_equal(np.concatenate(blocks_of(q)), data)
    with pytest.raises(Exception, match="H5FD_NOPE|DRIVER|driver"):
        multitables.Streamer(make_array(data), DRIVER="H5FD_NOPE").get_queue("/data", n_procs=1)


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_queue_over_explicit_ranges_delivers_them_in_order(make_array, n_procs: int) -> None:
    from multitables._plan import RangePlan

    data = np.arange(1000, dtype="<i8")
    stream = multitables.Streamer(make_array(data, chunkshape=(16,)))
    starts, stops = (900, 0, 333, 512), (1000, 7, 400, 513)
    with stream._queue_for_plan("/data", RangePlan(starts, stops), n_procs=n_procs) as queue:
        got = blocks_of(queue)
    assert [list(g) for g in got] == [list(range(a, b)) for a, b in zip(starts, stops)]


@pytest.mark.parametrize("n_procs", [None, 2])
def test_holding_every_slot_is_an_error_not_a_hang(make_array, n_procs: "int | None") -> None:
    stream = multitables.Streamer(make_array(np.arange(1000.0), chunkshape=(10,)))
    with stream.get_queue("/data", n_procs=n_procs, read_ahead=2, block_size=10) as queue:
        held = [queue.get(), queue.get()]
        with pytest.raises(RuntimeError, match="all 2 slots of the queue are held"):
            queue.get()
        held[0].release()
        with queue.get() as block:  # one slot free again: the stream goes on
            assert len(block) == 10
