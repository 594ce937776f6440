"""Streamer: what a user of the established API, and a demanding one, can rely on."""

from __future__ import annotations

import collections
import contextlib
import math
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
import typing
from pathlib import Path
from typing import Any, Iterator

import h5py
import numpy as np
import psutil
import pytest
import tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import multitables
from multitables import QueueClosed

from _guards import hang_guard

#: Seconds any one threaded test may run: a guard against a hang, not a speed limit.
GUARD = 60.0
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


def blocks_of(queue: multitables.Queue, change: bool = False) -> list[np.ndarray]:
    """Copies of every block; ``change``: then overwrite every byte of each in its guard, as a consumer may."""
    out = []
    for guard in queue.iter():
        with guard as block:
            out.append(block.copy())
            if change:  # inline: pytest prints a failing call's arguments, and a block after close is unmapped
                block.view(np.uint8)[...] = 0xA5
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


def check_stream(case: dict, start_method: "str | None" = None, change: bool = False) -> None:
    """Stream one case and compare with what plain PyTables reads; ``change``: overwrite every block once copied."""
    data, bs = case["data"], case["block_size"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.h5"
        write(path, data, FILTERS[case["filters"]], case["chunk_rows"])
        stream = multitables.Streamer(path, engine=case["engine"], start_method=start_method)
        kwargs = dict(n_procs=case["n_procs"], block_size=bs, ordered=case["ordered"], read_ahead=case["read_ahead"])
        if case["cyclic"]:
            n_pass = -(-len(data) // bs)
            with stream.get_queue("/data", cyclic=True, **kwargs) as queue:
                got = [blocks_of_n(queue, 2 * n_pass + 1, change)]
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
            if case["ordered"]:  # the generator reads its rows in blocks of its own (NOTE [read plan]): the same rows
                gen = stream.get_generator("/data", cyclic=True, **kwargs)
                rows = [next(gen) for _ in range(2 * n_pass * bs + 1)]
                gen.close()
                np.testing.assert_array_equal(np.array(rows), data[np.arange(len(rows)) % len(data)])
        else:
            with stream.get_queue("/data", remainder=case["remainder"], **kwargs) as queue:
                got = blocks_of(queue, change)
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
            rows = list(stream.get_generator("/data", remainder=False, **kwargs))
            whole = data[: len(data) - len(data) % bs]
            if case["ordered"]:
                np.testing.assert_array_equal(np.array(rows).reshape(whole.shape), whole)
            else:
                assert as_counter(rows) == as_counter(list(whole))
        with h5py.File(path, "r") as f:  # nothing written into a block reached the file
            np.testing.assert_array_equal(f["data"][()], data)


def blocks_of_n(queue: multitables.Queue, n: int, change: bool = False) -> list[np.ndarray]:
    out = []
    for _ in range(n):
        with queue.get() as block:
            out.append(block.copy())
            if change:
                block.view(np.uint8)[...] = 0xA5
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(streams())
def test_every_row_exactly_once_or_in_order_or_wrapping(case: dict) -> None:
    check_stream(case)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(streams(), st.booleans(), st.sampled_from(["h5py", "tables", "auto"]))
def test_writes_into_blocks_reach_no_later_block_no_row_nor_the_file(case: dict, in_process: bool, engine: str) -> None:
    """Every block is overwritten in its guard once copied: the copies, the generator and the file stay exact.

    ``in_process``: n_procs=None, which reads these small datasets in this process.
    """
    check_stream(dict(case, n_procs=None if in_process else case["n_procs"], engine=engine), change=True)


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


def test_the_fork_server_imports_the_reader_and_its_libraries_once_keeping_its_other_preloads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import multiprocessing
    from multiprocessing import forkserver

    from multitables._io.prefork import READING_LIBRARIES
    from multitables._procs.pool import preload_in_forkserver
    from multitables._procs.process import reader_main

    server = forkserver._forkserver
    monkeypatch.setattr(server, "_preload_modules", ["__main__", "json", "h5py"])
    for _ in range(2):
        preload_in_forkserver(multiprocessing.get_context("forkserver"))
    # What this process reads with (h5py at least: it planned the files), each once, after the reader's module.
    libraries = [name for name in READING_LIBRARIES if name in sys.modules and name != "h5py"]
    assert server._preload_modules == ["__main__", "json", "h5py", reader_main.__module__, *libraries]
    monkeypatch.setattr(server, "_preload_modules", ["__main__"])
    preload_in_forkserver(multiprocessing.get_context("spawn"))  # only the fork server has a list
    assert server._preload_modules == ["__main__"]


def test_table_fields_stream_one_column(table_file) -> None:
    path, rows = table_file
    stream = multitables.Streamer(path)
    for field in ("a", "v"):
        with stream.get_queue("/table", n_procs=2, block_size=64, ordered=True, field=field, remainder=True) as q:
            np.testing.assert_array_equal(np.concatenate(blocks_of(q)), rows[field])
    with stream.get_queue("/table", n_procs=2, block_size=64, ordered=True, remainder=True) as q:
        np.testing.assert_array_equal(np.concatenate(blocks_of(q)), rows)


def test_the_remainder_of_the_default_block_size(make_array) -> None:
    """``get_remainder(path, None)`` (2.x's default) is what a queue of default blocks leaves."""
    data = np.arange(1_200_007, dtype="<i8")
    stream = multitables.Streamer(make_array(data, chunkshape=(1000,)))
    with stream.get_queue("/data") as queue:
        got = blocks_of(queue)
        block_size = queue.block_size
    assert block_size < len(data)
    for rest in (stream.get_remainder("/data", None), stream.get_remainder("/data")):
        assert len(rest) == len(data) % block_size > 0
        np.testing.assert_array_equal(np.sort(np.concatenate(got + [rest])), data)


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


@pytest.mark.parametrize("n_procs", [None, 1], ids=["in-process", "readers"])
def test_blocks_are_writable_on_reused_slots_and_changes_never_reach_the_file(make_array, n_procs: "int | None") -> None:
    data = np.arange(400 * 3, dtype="<f8").reshape(400, 3) ** 1.5
    path = make_array(data, chunkshape=(16, 3))
    stream = multitables.Streamer(path)
    seen, addresses = [], set()
    with stream.get_queue("/data", n_procs=n_procs, read_ahead=1, block_size=25, ordered=True) as queue:
        assert (queue.n_procs == 0) == (n_procs is None)
        memory = queue.slot_memory()
        for guard in queue.iter():
            with guard as block:
                assert block.flags.writeable and not block.flags.owndata
                block -= block.mean(axis=0)  # normalised in place, as code written for 2.x does
                seen.append(block.copy())
                addresses.add(block.__array_interface__["data"][0])
    if n_procs is not None:  # every block lies in the ring's one slot, filled again and again: no copies
        start, size = memory
        assert all(start <= address < start + size for address in addresses)
    expected = [b - b.mean(axis=0) for b in expected_blocks(data, 25, False)]
    np.testing.assert_array_equal(np.concatenate(seen), np.concatenate(expected))
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["data"][()], data)
    rows = list(stream.get_generator("/data", n_procs=n_procs, read_ahead=1, block_size=25, ordered=True))
    np.testing.assert_array_equal(np.array(rows), data)


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


def test_n_procs_is_capped_at_the_blocks_of_a_pass_and_four_readers_per_cpu(make_array, monkeypatch, no_leaks) -> None:
    data = np.arange(3000 * 4, dtype="<f4").reshape(3000, 4)
    stream = multitables.Streamer(make_array(data, chunkshape=(100, 4)))
    with stream.get_queue("/data", n_procs=40, block_size=1000, ordered=True) as queue:  # 3 blocks
        assert queue.n_procs == len(queue.reader_pids) == 3
        np.testing.assert_array_equal(np.concatenate(blocks_of(queue)), data)
    monkeypatch.setattr("multitables._plan.readers.available_cpus", lambda: 1)
    with stream.get_queue("/data", n_procs=40, block_size=100, ordered=True) as queue:  # 30 blocks, 1 CPU
        assert queue.n_procs == len(queue.reader_pids) == 4
        np.testing.assert_array_equal(np.concatenate(blocks_of(queue)), data)


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
    from multitables._stream import backends

    made = []
    # The generator's copies, and the in-process backend's buffers.
    for module, name in ((streamer, "empty_block"), (backends, "block_memory")):
        monkeypatch.setattr(module, name, lambda spec, real=getattr(module, name): made.append(1) or real(spec))
    data = np.arange(500 * 3, dtype="<i4").reshape(500, 3)
    stream = multitables.Streamer(make_array(data, chunkshape=(10, 3)))
    gen = stream.get_generator("/data", n_procs=n_procs, block_size=20, read_ahead=2)
    total = sum(int(row.sum()) for row in gen)  # no row outlives its turn
    assert total == int(data.sum())
    assert len(made) <= 2  # two buffers used in turn for 25 blocks


@pytest.mark.parametrize("keeps_name", [False, True], ids=["dropped", "still-named"])
def test_in_process_blocks_taken_one_at_a_time_reuse_their_buffers(
    make_array, monkeypatch: pytest.MonkeyPatch, keeps_name: bool, blocks_as_asked: None
) -> None:
    """Read in this process, a block given back before the next is taken leaves its buffer to a later block.

    So a pass faults in the pages of one buffer, or of two where the loop
    still names its last block when it takes the next: not of every slot.
    """
    from multitables._stream import backends

    made = []
    real = backends.block_memory
    monkeypatch.setattr(backends, "block_memory", lambda spec: made.append(1) or real(spec))
    data = np.arange(500 * 3, dtype="<i4").reshape(500, 3)
    queue = multitables.Streamer(make_array(data, chunkshape=(10, 3))).get_queue(
        "/data", n_procs=0, block_size=20, read_ahead=4)
    blocks = []
    for guard in queue.iter():
        with guard as block:
            blocks.append(block.copy())
        if not keeps_name:
            del block
    np.testing.assert_array_equal(np.concatenate(blocks), data)
    assert len(made) == (2 if keeps_name else 1)  # 25 blocks, 4 slots


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
    from multitables._stream import backends

    made = []
    # The generator's copies, and the in-process backend's buffers.
    for module, name in ((streamer, "empty_block"), (backends, "block_memory")):
        monkeypatch.setattr(module, name, lambda spec, real=getattr(module, name): made.append(1) or real(spec))
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


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_generator_closed_mid_block_gives_no_more_rows_and_lets_the_ring_go(
    make_array, shm_mappings, no_leaks, n_procs: int
) -> None:
    # As generator.close(): no row after it, though the rows of the block being walked are still there to hand
    # out; holding none of them, the caller holds no memory of the stream either.
    data = np.arange(500 * 3, dtype="<i4").reshape(500, 3)
    stream = multitables.Streamer(make_array(data, chunkshape=(10, 3)))
    gen = stream.get_generator("/data", n_procs=n_procs, block_size=20, ordered=True)
    assert [int(next(gen)[0]) for _ in range(25)] == [3 * i for i in range(25)]  # into the second block
    gen.close()
    assert shm_mappings() == []
    with pytest.raises(StopIteration):
        next(gen)
    gen.close()  # again: nothing to do
    assert list(gen) == []


def test_the_generator_is_annotated_as_what_it_is_rows_and_a_close(make_array) -> None:
    """A user's type checker sees the ``close()`` the docs promise (a bare ``Iterator`` has none) and rows that are
    arrays; not a ``Generator``, whose ``send`` and ``throw`` it lacks."""
    hint = typing.get_type_hints(multitables.Streamer.get_generator)["return"]
    assert hint is multitables.RowIterator, f"get_generator is annotated {hint}, not the public class it returns"
    assert [typing.get_args(base) for base in hint.__orig_bases__] == [(np.ndarray,)]
    assert callable(hint.close) and not hasattr(hint, "send") and not hasattr(hint, "throw")
    gen = multitables.Streamer(make_array(np.arange(10.0))).get_generator("/data", n_procs=0)
    assert isinstance(gen, hint)
    gen.close()


def test_the_default_ring_fits_a_small_shared_memory_and_every_row_comes(
    make_array, monkeypatch: pytest.MonkeyPatch, no_leaks
) -> None:
    # A container's /dev/shm (Docker's default: 64 MiB) is smaller than the default ring of many readers. Here
    # 8 MiB are free: the default ring of two readers (6 slots of 2 MiB blocks) would need 12; the defaults fit
    # into half of what is free (NOTE [read plan]), and a ring asked for whole is still refused up front.
    from multitables._shm import space

    monkeypatch.setattr(space, "shm_free_bytes", lambda: 8 << 20)
    monkeypatch.setattr(space, "cgroup_free_bytes", lambda: None)
    data = np.arange(4096 * 1024, dtype="<f4").reshape(4096, 1024)  # 16 MiB of 4 KiB rows in 256 KiB chunks
    stream = multitables.Streamer(make_array(data, chunkshape=(64, 1024)))
    with stream.get_queue("/data", n_procs=2, ordered=True, remainder=True) as queue:
        assert (queue.read_ahead, queue.block_size) == (3, 5 * 64)  # 3 slots of 1.25 MiB: within 4 MiB
        got = []
        for guard in queue.iter():
            with guard as block:
                got.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(got), data)
    rows = stream.get_generator("/data", n_procs=2, ordered=True, block_size=512)
    np.testing.assert_array_equal(np.array(list(rows)), data)  # the blocks asked for, in as few slots as allowed
    with pytest.raises(multitables.ShmSpaceError, match="read_ahead or block_size"):
        stream.get_queue("/data", n_procs=2, read_ahead=6, block_size=512)


@pytest.mark.parametrize("n_procs", [0, 2])
@pytest.mark.parametrize("block_size,remainder", [(7, True), (7, False), (30, False), (None, True), (4000, False)])
def test_len_is_what_a_pass_gives_so_tqdm_shows_a_total(
    make_array, n_procs: int, block_size: "int | None", remainder: bool
) -> None:
    """``len()`` of the generator is the rows of a pass and of a queue its blocks, as ``len()`` of batches is the
    batches of an epoch: the same before, during and after the pass; blocks read several at a time (7 rows here)
    count as the caller's. A cyclic stream has none, and is true all the same."""
    from tqdm import tqdm

    data = np.arange(1000 * 3, dtype="<f4").reshape(1000, 3)
    stream = multitables.Streamer(make_array(data, chunkshape=(10, 3)))
    kwargs = dict(n_procs=n_procs, block_size=block_size, remainder=remainder, ordered=True)
    with stream.get_generator("/data", **kwargs) as rows:
        total = len(rows)
        with tqdm(rows, disable=True) as bar:
            assert bar.total == total
            got = [row for row in bar]
        assert len(got) == total == len(rows) and rows
    with stream.get_queue("/data", **kwargs) as queue:
        blocks = len(queue)
        assert sum(1 for guard in queue if guard.release() is None) == blocks == len(queue)
        assert blocks == -(-total // queue.block_size)
        assert queue.block_size == min(block_size or queue.block_size, len(data))  # more than every row: every row
    assert total == (len(data) if remainder or block_size is None else len(data) - len(data) % min(block_size, 1000))
    if n_procs:
        with stream.get_generator("/data", n_procs=n_procs, cyclic=True) as rows, pytest.raises(TypeError, match="cyclic"):
            len(rows)
        assert rows and tqdm(rows, disable=True).total is None
        with stream.get_queue("/data", n_procs=n_procs, cyclic=True) as queue, pytest.raises(TypeError, match="cyclic"):
            len(queue)
        assert queue


def test_cyclic_generator_wraps(make_array) -> None:
    data = np.arange(30, dtype="<i2")
    stream = multitables.Streamer(make_array(data, chunkshape=(4,)))
    gen = stream.get_generator("/data", n_procs=2, block_size=7, cyclic=True, ordered=True)
    rows = [int(next(gen)) for _ in range(75)]
    gen.close()
    assert rows == [i % 30 for i in range(75)]


def test_flags_given_as_1_or_0_act_as_true_or_false(make_array) -> None:
    # 2.x took any truthy value; a flag from argparse(type=int) or a config file is an int.
    data = np.arange(30, dtype="<i2")
    stream = multitables.Streamer(make_array(data, chunkshape=(4,)))
    gen = stream.get_generator("/data", n_procs=2, block_size=7, cyclic=1, ordered=np.int64(1))
    rows = [int(next(gen)) for _ in range(40)]
    gen.close()
    assert rows == [i % 30 for i in range(40)]
    got: list[int] = []
    with stream.get_queue("/data", n_procs=2, block_size=7, cyclic=0, ordered=1, remainder=0) as queue:
        for guard in queue.iter():
            with guard as block:
                got.extend(block.tolist())
    assert got == list(range(28))  # one pass, in order, without the 2 rows that fill no block


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(n_procs=-1), ValueError, "n_procs"),
        (dict(n_procs=1.5), TypeError, "n_procs"),
        (dict(n_procs=True), TypeError, "n_procs"),
        (dict(block_size=0), ValueError, "block_size"),
        (dict(block_size=-3), ValueError, "block_size"),
        (dict(block_size="10"), TypeError, "block_size"),
        (dict(read_ahead=0), ValueError, "read_ahead"),
        (dict(cyclic="yes"), TypeError, "cyclic"),
        (dict(ordered=None), TypeError, "ordered"),
        (dict(remainder=2), TypeError, "remainder"),
        (dict(remainder="False"), TypeError, "remainder"),
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


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_block_size_beyond_the_rows_is_one_block_of_them_all(make_array, n_procs: int) -> None:
    # The established API read block_size rows with h5py-style slicing: the dataset's rows, when fewer.
    data = np.arange(12, dtype="<i4").reshape(3, 4)
    stream = multitables.Streamer(make_array(data))
    for kwargs in (dict(), dict(remainder=True), dict(cyclic=True)):
        with stream.get_queue("/data", n_procs=n_procs, block_size=10, **kwargs) as queue:
            assert queue.block_size == 3
            blocks = blocks_of_n(queue, 1) if kwargs.get("cyclic") else blocks_of(queue)
        assert len(blocks) == 1
        np.testing.assert_array_equal(blocks[0], data)
    np.testing.assert_array_equal(np.stack(list(stream.get_generator("/data", n_procs=n_procs, block_size=10))), data)
    assert stream.get_remainder("/data", 3).shape == (0, 4)


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_released_guard_gives_no_block_again(make_array, n_procs: int) -> None:
    stream = multitables.Streamer(make_array(np.arange(100, dtype="<i8")))
    with stream.get_queue("/data", n_procs=n_procs, block_size=10, ordered=True) as queue:
        guard = queue.get()
        with guard as block:
            assert block.tolist() == list(range(10))
            with pytest.raises(RuntimeError, match="this guard's with is open already"):
                with guard:  # its end would give the slot back under the outer with
                    pass
            assert block.tolist() == list(range(10))  # still held: the inner with gave nothing back
        with pytest.raises(multitables.StreamClosedError, match="released already"):
            with guard:
                pass  # its slot may hold another block by now
        assert [int(b[0]) for b in blocks_of(queue)] == list(range(10, 100, 10))


def test_bad_streamer_arguments(make_array) -> None:
    with pytest.raises(ValueError, match="engine='gpu'"):
        multitables.Streamer(make_array(np.zeros(3)), engine="gpu")
    with pytest.raises(ValueError, match="start_method='thread'"):
        multitables.Streamer(make_array(np.zeros(3)), start_method="thread")


# The established API's upper-case names (documented) reach PyTables without its DeprecationWarning, which fails a
# program run with -W error: here in this process (the engine's probe) and in the readers, which inherit the filter.
@pytest.mark.filterwarnings("error::DeprecationWarning")
def test_pytables_open_options_go_to_pytables(make_array, table_file) -> None:
    data = np.arange(100, dtype="<f4")
    stream = multitables.Streamer(make_array(data), DRIVER="H5FD_CORE")
    with stream.get_queue("/data", n_procs=1, block_size=10, ordered=True) as q:
        assert q.engine == "tables"
        np.testing.assert_array_equal(np.concatenate(blocks_of(q)), data)
    path, rows = table_file
    with multitables.Reader(str(path), n_procs=1, start_method="fork", DRIVER="H5FD_CORE") as reader:
        table = reader.get_dataset("/table")
        with table.create_stage(1000) as stage:
            got = reader.request(table.where("a < 3"), stage).get()
    np.testing.assert_array_equal(got, rows[:3])
    with pytest.raises(Exception, match="H5FD_NOPE|DRIVER|driver"):
        multitables.Streamer(make_array(data), DRIVER="H5FD_NOPE").get_queue("/data", n_procs=1)


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_queue_over_explicit_ranges_delivers_them_in_order(make_array, n_procs: int) -> None:
    from multitables._io.fileset import inspect_files
    from multitables._plan.blocks import RangePlan

    data = np.arange(1000, dtype="<i8")
    stream = multitables.Streamer(make_array(data, chunkshape=(16,)))
    starts, stops = (900, 0, 333, 512), (1000, 7, 400, 513)
    node = inspect_files(stream.filename, "/data")
    engine = stream.options.resolve(node)
    with stream.options.queue_over(node, engine, RangePlan(starts, stops), n_procs=n_procs) as queue:
        got = blocks_of(queue)
    assert [list(g) for g in got] == [list(range(a, b)) for a, b in zip(starts, stops)]


@contextlib.contextmanager
def slots_held_elsewhere(queue: multitables.Queue, n: int) -> Iterator[None]:
    """Another thread gets ``n`` guards and holds them until the ``with`` ends."""
    taken, give_back = threading.Event(), threading.Event()

    def hold() -> None:
        guards = [queue.get() for _ in range(n)]
        taken.set()
        give_back.wait()
        for guard in guards:
            guard.release()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(GUARD)
        yield
    finally:
        give_back.set()
        holder.join()


@pytest.mark.parametrize("n_procs", [None, 2], ids=["in-process", "readers"])
def test_a_thread_holding_every_slot_itself_gets_an_error_not_a_hang(make_array, n_procs: "int | None") -> None:
    """Waiting could never end: no other thread holds a guard. Unrelated threads change nothing."""
    stream = multitables.Streamer(make_array(np.arange(1000.0), chunkshape=(10,)))
    bystander = threading.Timer(GUARD, lambda: None)  # alive throughout, holding no guard
    bystander.daemon = True
    bystander.start()
    with hang_guard(GUARD, "a hang"), stream.get_queue("/data", n_procs=n_procs, read_ahead=2, block_size=10) as queue:
        held = [queue.get(), queue.get()]
        with pytest.raises(RuntimeError, match="all 2 slots .* held by unreleased guards of this thread"):
            queue.get()
        held[0].release()
        with queue.get() as block:  # one slot free again: the stream goes on
            assert len(block) == 10
    bystander.cancel()
    bystander.join()


def test_guards_left_by_an_ended_thread_are_an_error_when_no_other_thread_runs(make_array) -> None:
    import subprocess
    import sys

    # In a fresh interpreter: this one may run other threads (tqdm's monitor, say), which could release a guard.
    script = (
        "import threading, multitables\n"
        "stream = multitables.Streamer(PATH)\n"
        "with stream.get_queue('/data', n_procs=2, read_ahead=2, block_size=10) as queue:\n"
        "    held = []\n"
        "    taker = threading.Thread(target=lambda: held.extend([queue.get(), queue.get()]))\n"
        "    taker.start(); taker.join()\n"
        "    assert threading.active_count() == 1, threading.enumerate()\n"
        "    try:\n"
        "        queue.get()\n"
        "    except RuntimeError as exc:\n"
        "        print('raised:', exc)\n"
    ).replace("PATH", repr(str(make_array(np.arange(1000.0), chunkshape=(10,)))))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=GUARD)
    assert done.returncode == 0, done.stderr
    assert "raised: all 2 slots" in done.stdout and "no other thread runs to release one" in done.stdout


@pytest.mark.parametrize("n_procs", [None, 2], ids=["in-process", "readers"])
def test_a_get_waits_while_other_threads_hold_every_slot(make_array, n_procs: "int | None") -> None:
    """``read_ahead`` threads each hold a guard; another's get() waits for one. Every block reaches one thread."""
    k = 3
    data = np.arange(600 * 2, dtype="<i4").reshape(600, 2)
    stream = multitables.Streamer(make_array(data, chunkshape=(10, 2)))
    got: list[np.ndarray] = []  # list.append is atomic
    all_held, go = threading.Barrier(k + 1), threading.Event()
    released_first: list[bool] = []  # each time the late thread's get() returned: had the holders been let go?

    def hold() -> None:
        with queue.get() as block:
            all_held.wait()
            go.wait()
            got.append(block.copy())

    def consume() -> None:
        for guard in queue.iter():
            released_first.append(go.is_set())
            with guard as block:
                got.append(block.copy())

    with hang_guard(GUARD, "a hang"), stream.get_queue("/data", n_procs=n_procs, read_ahead=k, block_size=20) as queue:
        assert (queue.n_procs == 0) == (n_procs is None)
        threads = [threading.Thread(target=hold) for _ in range(k)]
        for t in threads:
            t.start()
        all_held.wait()  # every slot is held now
        threads.append(threading.Thread(target=consume))
        threads[-1].start()
        try:
            time.sleep(0.2)  # time for the late thread to reach its wait (nothing is timed)
            assert threads[-1].is_alive() and not released_first  # it waits: no error, no block
        finally:
            go.set()
            for t in threads:
                t.join()
    assert released_first and all(released_first)
    assert as_counter(got) == as_counter(expected_blocks(data, 20, False))


@pytest.mark.parametrize("n_procs", [None, 2], ids=["in-process", "readers"])
def test_a_guard_entered_by_a_reader_thread_is_the_readers(make_array, n_procs: "int | None") -> None:
    """A producer hands a guard to a reader that enters it: the producer's get() then waits for the reader."""
    data = np.arange(1000.0)
    stream = multitables.Streamer(make_array(data, chunkshape=(10,)))
    entered, leaving = threading.Event(), threading.Event()

    def work(guard: multitables.Guard) -> None:
        with guard as block:
            entered.set()
            time.sleep(0.2)  # the producer's get() waits meanwhile (nothing is timed)
            block -= 1000  # every value negative, until the guard is released
            leaving.set()

    with hang_guard(GUARD, "a hang"), stream.get_queue("/data", n_procs=n_procs, read_ahead=2, block_size=10) as queue:
        first = queue.get()
        reader = threading.Thread(target=work, args=(queue.get(),))
        reader.start()
        entered.wait()
        with queue.get() as block:  # waits for the reader to leave its guard
            assert leaving.is_set()
            assert len(block) == 10 and (block >= 0).all()  # the reader's changes are gone
        first.release()
        reader.join()


def test_a_reader_failing_while_get_waits_for_a_slot_reaches_the_waiting_thread(make_array, no_leaks) -> None:
    stream = multitables.Streamer(make_array(np.arange(1000.0), chunkshape=(10,)))
    with hang_guard(GUARD, "a hang"), stream.get_queue("/data", n_procs=2, read_ahead=2, block_size=10) as queue:
        with slots_held_elsewhere(queue, 2):
            victim = queue.reader_pids[1]
            killer = threading.Timer(0.2, os.kill, (victim, signal.SIGKILL))
            killer.start()
            with pytest.raises(multitables.ReaderError, match="SIGKILL") as info:
                queue.get()  # waits for a slot: the holder gives none back
            assert info.value.pid == victim
            killer.join()


@pytest.mark.parametrize("n_procs", [None, 2], ids=["in-process", "readers"])
def test_closing_the_queue_ends_a_get_waiting_for_a_slot(make_array, no_leaks, n_procs: "int | None") -> None:
    stream = multitables.Streamer(make_array(np.arange(1000.0), chunkshape=(10,)))
    with hang_guard(GUARD, "a hang"), stream.get_queue("/data", n_procs=n_procs, read_ahead=2, block_size=10) as queue:
        with slots_held_elsewhere(queue, 2):
            closer = threading.Timer(0.2, queue.close)
            closer.start()
            assert queue.get() is QueueClosed
            assert queue.closed  # it was the close that ended the wait
            closer.join()


@pytest.mark.parametrize("n_procs", [None, 2], ids=["in-process", "readers"])
def test_a_close_from_another_thread_while_get_takes_a_block_ends_the_pass(make_array, no_leaks, n_procs) -> None:
    """2.x's how-to stops a cyclic queue with ``queue.close()`` from another thread while the consumer loops on
    ``get()`` until ``QueueClosed``. A close landing while ``get()`` took a block returned that block's guard, whose
    ``with`` then raised StreamClosedError (9 runs in 10 of such a loop): that ``get()`` gives ``QueueClosed``."""
    stream = multitables.Streamer(make_array(np.arange(1000.0), chunkshape=(10,)))
    with hang_guard(GUARD, "a hang"), stream.get_queue("/data", n_procs=n_procs, cyclic=True, block_size=10) as queue:
        real_take = queue._backend.take

        def take_then_closed_elsewhere() -> Any:
            got = real_take()
            closer = threading.Thread(target=queue.close)
            closer.start()
            closer.join()
            return got

        queue._backend.take = take_then_closed_elsewhere
        assert queue.get() is QueueClosed
        assert queue.closed


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_generator_shared_by_threads_loses_no_row(
    make_array, n_procs: int, no_leaks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python's generators serve one thread at a time: a ``next`` in a second thread while the first is inside raises
    ValueError there, and the generator goes on. Here a thread that asked while another took the next block ended
    the chain for every thread, silently, after a row or two."""
    from multitables._stream.queue import Queue

    real_get = Queue.get

    def slow_get(queue: Queue, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.002)  # the GIL let go while a block is taken: the other threads reach the generator meanwhile
        return real_get(queue, *args, **kwargs)

    monkeypatch.setattr(Queue, "get", slow_get)
    rows = np.arange(20_000 * 4, dtype="<f4").reshape(20_000, 4)
    path = make_array(rows, chunkshape=(250, 4))
    gen = multitables.Streamer(path).get_generator("/data", n_procs=n_procs, block_size=250)
    got: "list[list[float]]" = [[] for _ in range(3)]
    busy = [0, 0, 0]

    def take(i: int) -> None:
        while True:
            try:
                for row in gen:
                    got[i].append(float(row[0]))
                return
            except ValueError as exc:  # as a plain generator's "already executing": try again
                assert "another thread is taking its next block" in str(exc)
                busy[i] += 1

    with hang_guard(120, "threads sharing a generator"):
        threads = [threading.Thread(target=take, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    gen.close()
    assert sorted(x for g in got for x in g) == rows[:, 0].tolist()
    assert sum(busy) > 0, "the threads met inside the generator"


def _live_children() -> "list[psutil.Process]":
    """This process's children that run (a zombie, such as an engine's finished probe, is not one), tracker aside."""
    live = []
    for child in psutil.Process().children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                live.append(child)
        except psutil.NoSuchProcess:  # gone, or a zombie, meanwhile
            pass
    return live


def test_a_ctrl_c_between_the_rows_and_their_blocks_stops_the_readers_before_the_user_sees_it(
    make_array, no_leaks: None
) -> None:
    """A Ctrl-C lands between any two instructions. Here it lands, at each line in turn, in the step that takes the
    next block for the rows: the only Python code between the rows' chain (C) and the blocks' generator. Wherever it
    lands, the readers are gone before the user's handler runs, though the traceback it handles holds that step. The
    loop is as users write it: nothing else holds the generator."""
    # Blocks of 1 MiB, as asked: the generator reads smaller ones several at a time (NOTE [read plan]).
    rows = np.arange(1_000 * 1024, dtype="<f4").reshape(1_000, 1024)
    stream = multitables.Streamer(make_array(rows, chunkshape=(250, 1024)))
    from multitables._stream import rows as row_iteration

    step = row_iteration._OneTaker.__next__.__code__
    landing = 0
    while True:
        events: "list[str]" = []

        def in_step(frame: Any, event: str, arg: Any) -> Any:
            events.append(event)
            if len(events) - 1 == landing:
                raise KeyboardInterrupt
            return in_step

        def third_block(frame: Any, event: str, arg: Any) -> Any:
            if frame.f_code is step and event == "call":
                taken.append(None)
                if len(taken) == 2:  # the third block: two went to the loop (the first before the trace)
                    return in_step(frame, event, arg)
            return None

        got, taken, readers = [], [], []  # cyclic: the readers stay busy, none ends before the interrupt
        others = _live_children()  # a forkserver an earlier stream started, say
        try:
            for row in stream.get_generator("/data", n_procs=2, block_size=250, cyclic=True, ordered=True):
                if not got:
                    readers = [p for p in _live_children() if p not in others]
                    sys.settrace(third_block)
                got.append(float(row[0]))
                if len(got) == 1_000:
                    break
        except KeyboardInterrupt:
            sys.settrace(None)
            left = [p.pid for p in _live_children() if p in readers]
            assert (len(readers), left) == (2, []), f"Ctrl-C at event {landing} of the step ({events[-1]})"
            assert got == rows[:500, 0].tolist()
            landing += 1
            continue
        finally:
            sys.settrace(None)
        break
    assert landing > 5, "the interrupts landed on every line of the step, and then the step ran through"
    assert got == rows[:, 0].tolist()


def test_a_queue_and_its_guards_say_what_they_are(make_array) -> None:
    path = make_array(np.arange(1000, dtype="<f4"), chunkshape=(256,))  # 1 KiB chunks: the chunk engine's
    stream = multitables.Streamer(path)
    assert repr(stream) == f"<multitables.Streamer {str(path)!r}>"
    asked = multitables.Streamer([path, path], engine="h5py", start_method="spawn")
    assert repr(asked) == f"<multitables.Streamer '2 files: {path} .. {path}', engine='h5py', start_method='spawn'>"
    with stream.get_queue("/data", n_procs=1, block_size=200) as queue:
        assert repr(queue) == f"<multitables.Queue '/data' of {str(path)!r}: 1 reader, blocks of 200 rows, 'chunks' engine>"
        guard = queue.get()
        assert repr(guard) == "<multitables.Guard (a block of 200 rows)>"
        guard.release()
        assert repr(guard) == "<multitables.Guard (released)>"
    assert repr(queue).endswith("'chunks' engine, closed>")
    with stream.get_queue("/data", n_procs=0) as queue:
        assert "read in this process, blocks of 1000 rows" in repr(queue)



def test_a_queue_read_in_this_process_lends_no_block_and_says_why(make_array) -> None:
    """``Queue.lend`` (NOTE [lent blocks]) on a queue whose blocks are read here was an ``AttributeError`` of an
    internal class ('InlineBackend' object has no attribute 'lend'); a ``TypeError`` that says why, as for a queue
    whose blocks are cut from larger ones. The guard is still the caller's, with its rows."""
    path = make_array(np.arange(1000, dtype="<f4"), chunkshape=(100,))
    with multitables.Streamer(path).get_queue("/data", n_procs=0) as queue:  # one block of every row
        guard = queue.get()
        assert isinstance(guard, multitables.Guard)
        with pytest.raises(TypeError, match="read in this process lends none"):
            queue.lend(guard)
        with guard as block:
            np.testing.assert_array_equal(block, np.arange(1000, dtype="<f4"))
        assert queue.get() is QueueClosed

def test_the_generator_is_a_with_block_whose_end_stops_its_readers(make_array, no_leaks: None) -> None:
    """In a notebook, a traceback or ``Out[]`` keeps a generator alive after its loop: a ``with`` ends it anyway."""
    path = make_array(np.arange(4000.0).reshape(1000, 4), chunkshape=(100, 4))
    with multitables.Streamer(path).get_generator("/data", n_procs=2, block_size=100) as rows:
        assert repr(rows) == f"<multitables.RowIterator over '/data' of {str(path)!r}>"
        first = next(rows)
        held = rows  # as a traceback or Out[] would hold it
    assert not multiprocessing.active_children()  # gone, though the iterator is held
    assert list(held) == [] and first.shape == (4,)


_USED_AFTER_CLOSE = r"""
import gc, sys
import numpy as np
import multitables

stream = multitables.Streamer(sys.argv[1])
queue = stream.get_queue("/data", n_procs=2, block_size=100, ordered=True)
with queue.get() as inside:
    queue.close()  # under the with: the guard's block outlives its ring
    print("inside", int(inside[:, 0].sum()))
with stream.get_queue("/data", n_procs=2, block_size=100, ordered=True) as queue:
    for guard in queue.iter():
        with guard as block:
            kept = block  # past its with: another block's by the next get, and past the close
del queue, guard, block
gc.collect()
print("kept", int(kept[:, 0].sum()))
"""


def test_a_block_used_after_its_queue_closed_reads_its_last_bytes_rather_than_crash(make_array) -> None:
    """A block is only valid inside its guard's with, and the queue's close ends every guard: a use after it breaks
    that contract. It reads the bytes the slot last held (NOTE [segment lifetime]); it crashed the interpreter."""
    import subprocess

    data = np.arange(1000 * 3, dtype="<i4").reshape(1000, 3)
    path = make_array(data, chunkshape=(10, 3))
    run = subprocess.run([sys.executable, "-c", _USED_AFTER_CLOSE, str(path)], capture_output=True, text=True, timeout=GUARD)
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    assert run.stdout.split() == ["inside", str(int(data[:100, 0].sum())), "kept", str(int(data[900:, 0].sum()))]


#: What ``mypy --strict`` says of 2.x's loop over ``get()`` (the marks: tests/_typecheck.py).
QUEUE_LOOP = """
import multitables

def total(stream: multitables.Streamer) -> float:
    queue = stream.get_queue("/data")
    s = 0.0
    while True:
        guard = queue.get()
        if guard is multitables.QueueClosed:
            break
        with guard as block:
            reveal_type(block)  # reveal: ndarray
            s += float(block.sum())
    while (guard := queue.get()) is not multitables.QueueClosed:
        reveal_type(guard)  # reveal: Guard
    queue.get().release()  # error: union-attr
    queue.close()
    return s
"""


def test_a_type_checker_sees_a_guard_once_queue_closed_is_ruled_out(tmp_path: Path) -> None:
    """``get()`` gives a guard or ``QueueClosed``: past ``is QueueClosed`` the checker knows the block (no ``Any``),
    and a guard used without the test is reported."""
    from _typecheck import expected_of, mypy_says

    assert mypy_says(QUEUE_LOOP, tmp_path) == expected_of(QUEUE_LOOP)


def _rows_sum(rows: Any) -> float:  # a pool's task
    return float(np.sum(list(rows)))


def _stream_sum(stream: multitables.Streamer) -> float:  # a pool's task, as it should be written
    return _rows_sum(stream.get_generator("/data"))


@pytest.mark.parametrize("n_procs", [0, 1], ids=["in-process", "readers"])
def test_a_queue_a_guard_or_a_generator_handed_to_a_process_pool_says_what_to_pass(
    make_array, n_procs: int, no_leaks: None
) -> None:
    """A process pool's task pickles its arguments; a queue, a guard or a generator there failed with Python's words
    about a lock or a weakref. Each says what it is and what to pass; the stream goes on, and the Streamer pickles."""
    import copy
    import pickle
    from concurrent.futures import ProcessPoolExecutor

    data = np.arange(4_000, dtype="<f8").reshape(1_000, 4)
    stream = multitables.Streamer(make_array(data, chunkshape=(100, 4)))
    with stream.get_queue("/data", n_procs=n_procs, block_size=100, ordered=True) as queue:
        guard = queue.get()
        rows = stream.get_generator("/data", n_procs=n_procs, block_size=100)
        assert next(rows).tolist() == data[0].tolist()
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
            for obj, name in ((queue, "a Queue"), (guard, "a Guard"), (rows, "a generator's rows over '/data'")):
                with pytest.raises(TypeError, match=f"^{name}.* neither pickled nor copied: pass .*the Streamer "
                                                    r"\(it pickles\) or the file's name"):
                    pool.submit(_rows_sum, obj).result(GUARD)
                for how in (pickle.dumps, copy.copy, copy.deepcopy):
                    with pytest.raises(TypeError, match=f"^{name}"):
                        how(obj)
            assert pool.submit(_stream_sum, stream).result(GUARD) == data.sum()
        with guard as block:
            assert block.tolist() == data[:100].tolist()
        assert next(rows).tolist() == data[1].tolist()
        rows.close()
        assert sum(len(b) for b in blocks_of(queue)) == 900
