"""A queue's back ends (``_stream.backends``): the in-process one's buffers, which a closed stream's leaves to the next
stream as spares (NOTE [spare buffers] in ``_sys.spares``), never while a row or a guard of them is alive; the
caller's blocks cut from larger ones read (NOTE [read plan]), in threads and forks; a guard after its queue closed;
a warning for readers that stay alive and deliver nothing (NOTE [stalled readers])."""

from __future__ import annotations

import linecache
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables
from multitables._stream import backends
from multitables._sys import spares

from _guards import hang_guard, is_gone, wait_until


@pytest.fixture(autouse=True)
def no_spares(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no spares, and leaves none to the next."""
    monkeypatch.setattr(spares, "_SPARES", [])


def spec_of(rows: int, row_shape: "tuple[int, ...]", dtype: str) -> SimpleNamespace:
    """What ``block_memory`` and ``as_block`` read of a stream's spec."""
    return SimpleNamespace(plan=SimpleNamespace(block_size=rows), row_shape=row_shape, dtype=np.dtype(dtype))


def spare_addresses() -> list[int]:
    return [np.frombuffer(spare, np.uint8).ctypes.data for spare in spares._SPARES]


def write(path: Path, data: np.ndarray, chunk_rows: int = 10) -> Path:
    with tables.open_file(path, "w") as f:
        f.create_carray("/", "data", obj=data, filters=tables.Filters(3, "zlib"), chunkshape=(chunk_rows,) + data.shape[1:])
    return path


# -- a block's memory ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["<f4", ">i8", "?", "S5", [("a", "<i2"), ("b", "<f8", (2,))]])
def test_a_block_is_a_view_of_its_memory_and_every_row_references_the_memory(dtype: object) -> None:
    spec = spec_of(7, (2, 3), dtype)  # type: ignore[arg-type]
    spares._keep(spares.new_mapping(2 * 7 * 2 * 3 * spec.dtype.itemsize))  # a larger spare: its first bytes
    memory = backends.block_memory(spec)
    block = backends.as_block(memory, spec)
    assert block.shape == (7, 2, 3) and block.dtype == spec.dtype
    assert block.ctypes.data == memory.ctypes.data and block.flags.c_contiguous and block.flags.writeable
    assert block[3].base is memory  # so the memory's reference count says whether a row is alive


def test_rows_of_no_size_get_an_array_of_their_own_and_leave_no_spare() -> None:
    spec = spec_of(10, (0,), "<f8")
    memory = backends.block_memory(spec)
    assert memory.shape == (10, 0) and memory.dtype == spec.dtype
    assert backends.as_block(memory, spec) is memory
    del memory
    assert spares._SPARES == []


# -- streams in this process ---------------------------------------------------------------------


def block_addresses(path: Path, **kwargs: object) -> "tuple[set[int], np.ndarray]":
    """Where each block of one in-process pass lay, and the rows read."""
    where, rows = set(), []
    with multitables.Streamer(path).get_queue("/data", n_procs=0, **kwargs) as queue:
        for guard in queue.iter():
            with guard as block:
                where.add(block.ctypes.data)
                rows.append(block.copy())
    return where, np.concatenate(rows)


def test_a_stream_in_this_process_reads_into_the_buffers_of_the_one_before(tmp_path: Path, blocks_as_asked: None) -> None:
    data = np.arange(500 * 3, dtype="<i4").reshape(500, 3)
    path = write(tmp_path / "a.h5", data)
    first, rows = block_addresses(path, block_size=20)
    np.testing.assert_array_equal(rows, data)
    assert first <= set(spare_addresses())  # every block buffer (and the engine's own), once its last block is dropped
    second, rows = block_addresses(path, block_size=20)
    np.testing.assert_array_equal(rows, data)
    assert second <= first  # no new memory: the first stream's buffers


def test_rows_kept_from_a_closed_stream_are_never_a_later_streams_buffer(tmp_path: Path) -> None:
    a = np.arange(300 * 4, dtype="<i4").reshape(300, 4)
    b = -np.arange(300 * 4, dtype="<i4").reshape(300, 4)
    path_a, path_b = write(tmp_path / "a.h5", a), write(tmp_path / "b.h5", b)
    kept = [row for i, row in enumerate(multitables.Streamer(path_a).get_generator("/data", n_procs=0, block_size=30))
            if i % 50 == 0]  # one row of every other block keeps its buffer
    for _ in range(3):
        assert len(list(multitables.Streamer(path_b).get_generator("/data", n_procs=0, block_size=30))) == 300
    np.testing.assert_array_equal(np.array(kept), a[::50])


def test_a_guard_held_when_its_stream_closes_keeps_its_block_from_later_streams(tmp_path: Path) -> None:
    a = np.arange(100 * 4, dtype="<i4").reshape(100, 4)
    path_a, path_b = write(tmp_path / "a.h5", a), write(tmp_path / "b.h5", -a)
    queue = multitables.Streamer(path_a).get_queue("/data", n_procs=0, block_size=100)
    with queue.get() as block:
        queue.close()
        where, rows = block_addresses(path_b, block_size=100)
        np.testing.assert_array_equal(rows, -a)
        assert block.ctypes.data not in where
        np.testing.assert_array_equal(block, a)


@pytest.mark.parametrize("engine", ["chunks", "h5py"])
def test_streams_in_threads_never_share_a_buffer(tmp_path: Path, engine: str) -> None:
    """Also each engine's opening of a file from several threads at once: the chunk engine's calls into HDF5
    through ``ctypes`` once ran beside h5py's and crashed it (``tests/test_hdf5lib.py``)."""
    files = [write(tmp_path / f"{i}.h5", np.full((200, 8), i, "<i8"), chunk_rows=7) for i in range(4)]
    errors: list[BaseException] = []

    def stream(first: int) -> None:
        try:
            for n in range(25):
                i = (first + n) % len(files)
                stream = multitables.Streamer(files[i], engine=engine)
                for row in stream.get_generator("/data", n_procs=0, block_size=16 + n):
                    assert (row == i).all(), f"a row of file {i} holds {row}"
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(3)]
    with hang_guard(120, "three threads streaming small files"):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rows_kept_from_any_stream_are_never_overwritten_by_later_ones(data: st.DataObject) -> None:
    """Streams one after another in this process, each keeping (and changing) rows at random: every kept row
    stays as it was kept, whatever the later streams read."""
    n_streams = data.draw(st.integers(2, 4))
    kept: list[tuple[np.ndarray, np.ndarray]] = []  # (row, what it must hold)
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(n_streams):
            n_rows = data.draw(st.integers(1, 120))
            table = np.arange(n_rows * 3, dtype="<i4").reshape(n_rows, 3) + 1000 * s
            path = write(Path(tmp) / f"{s}.h5", table, chunk_rows=data.draw(st.integers(1, n_rows)))
            block_size = data.draw(st.integers(1, n_rows))
            keep = data.draw(st.lists(st.sampled_from(["drop", "keep", "change"]), min_size=n_rows, max_size=n_rows))
            gen = multitables.Streamer(path).get_generator("/data", n_procs=0, block_size=block_size)
            for i, row in enumerate(gen):
                if keep[i] == "keep":
                    kept.append((row, table[i].copy()))
                elif keep[i] == "change":
                    row[:] = -i
                    kept.append((row, np.full(3, -i, "<i4")))
    for row, expected in kept:
        np.testing.assert_array_equal(row, expected)


class Blocks:
    """A back end whose blocks read are given: ``take()`` hands them out in turn, each in its slot; records releases."""

    def __init__(self, blocks: "list[np.ndarray]") -> None:
        self._blocks = list(enumerate(blocks))
        self.released: "list[int]" = []
        self.returned: "list[int]" = []
        self.pids: "list[int]" = []

    out = None  # what take() gave, until the caller records it (NOTE [a slot in hand] in ``_stream.queue``)

    def take(self) -> "tuple[int, np.ndarray]":
        return self._blocks.pop(0)

    def give_back(self) -> None:
        """Take back the slots ``returned`` lists (NOTE [a slot given back] in ``_stream.queue``)."""
        self.released += self.returned
        self.returned.clear()


def test_blocks_cut_from_a_block_read_come_in_order_and_its_slot_goes_back_after_the_last_is_released() -> None:
    rows = np.arange(23 * 2).reshape(23, 2)
    inner = Blocks([rows[:12], rows[12:]])  # blocks read of 12 rows, the last short; the caller's of 5
    split = backends.SplitBackend(inner, 5, 3)
    taken = []
    for _ in range(6):
        taken.append(split.take())
        assert split.take() is taken[-1]  # again, until the caller records it (NOTE [a slot in hand])
        split.out = None  # recorded, as the queue does
    assert [len(block) for _, block in taken] == [5, 5, 2, 5, 5, 1]
    np.testing.assert_array_equal(np.concatenate([block for _, block in taken]), rows)
    assert all(np.shares_memory(block, rows) for _, block in taken)  # views: nothing copied
    names = [name for name, _ in taken]
    assert len(set(names)) == 6

    def release(name: int) -> None:  # as a guard does
        split.returned.append(name)
        split.give_back()

    for name in (names[1], names[0], names[4], names[3]):
        release(name)
    assert inner.released == []  # each slot still has a block out
    release(names[5])
    assert inner.released == [1]
    release(names[2])
    assert inner.released == [1, 0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_procs=st.sampled_from([0, 1, 2]), read_ahead=st.integers(1, 4), ordered=st.booleans(), data=st.data())
def test_a_caller_holding_fewer_blocks_than_slots_always_gets_the_next(
    n_procs: int, read_ahead: int, ordered: bool, data: st.DataObject
) -> None:
    rows = np.arange(2000 * 2, dtype="<i4").reshape(2000, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp) / "d.h5", rows, chunk_rows=50)
        queue = multitables.Streamer(str(path)).get_queue(
            "/data", n_procs=n_procs, read_ahead=read_ahead, block_size=7, ordered=ordered, remainder=True)
        held: "list[tuple[multitables.Guard, np.ndarray]]" = []
        got = []
        with hang_guard(30, "a pass holding blocks"), queue:
            for guard in queue.iter():
                block = guard.__enter__()
                got.append(block.copy())
                held.append((guard, block))
                # Keep blocks from anywhere in the pass, up to one less than the slots.
                while len(held) >= read_ahead or (held and data.draw(st.booleans())):
                    guard, _ = held.pop(data.draw(st.integers(0, len(held) - 1)))
                    guard.release()
        for guard, _ in held:
            guard.release()
    assert [len(block) for block in got].count(7) == 2000 // 7
    np.testing.assert_array_equal(np.sort(np.concatenate(got), axis=0), rows)
    if ordered:
        np.testing.assert_array_equal(np.concatenate(got), rows)


def small_rows(path: Path) -> np.ndarray:
    """388 blocks of 256 rows of 16 bytes, zlib: one reader reads them 97 at a time (NOTE [read plan])."""
    import h5py

    rows = np.arange(256 * 388 * 4, dtype="<f4").reshape(-1, 4)
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=rows, chunks=(1000, 4), compression="gzip")
    return rows


@pytest.mark.parametrize("ordered", [True, False])
def test_a_get_waiting_for_another_threads_slot_outlives_readers_that_are_done(tmp_path: Path, ordered: bool) -> None:
    """Every slot held by guards of other threads, and the readers done and gone: the rows left are cut from a block
    this process holds, so a get() waits for a release, as while they run; no "never came" failure."""
    rows = small_rows(tmp_path / "d.h5")
    with hang_guard(60, "a get waiting for a slot"):
        q = multitables.Streamer(str(tmp_path / "d.h5")).get_queue(
            "/d", n_procs=1, read_ahead=2, block_size=256, ordered=ordered)
        with q:
            for _ in range(291):
                q.get().release()
            elsewhere: "list[multitables.Guard]" = []
            taker = threading.Thread(target=lambda: elsewhere.append(q.get()))
            taker.start()
            taker.join()  # the last block read is in its slot: the reader has nothing left to read
            pids = q.reader_pids
            wait_until(lambda: all(is_gone(pid) for pid in pids), 30, "the reader to exit")
            mine = q.get()
            threading.Timer(0.3, elsewhere[0].release).start()
            with mine as block:  # both slots are held now: the next get() waits for the timer's release
                got = [block.copy()]
                for guard in q:
                    with guard as block:
                        got.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(got), rows[292 * 256 :])  # one reader: in order either way


def test_a_fork_goes_on_with_its_own_copy_of_a_stream_read_here(tmp_path: Path) -> None:
    """A forked child that takes blocks from a queue read in this process reads on from where the parent was, in its
    own memory, as a queue whose blocks are read as asked does; the parent's stream is untouched."""
    rows = small_rows(tmp_path / "d.h5")
    q = multitables.Streamer(str(tmp_path / "d.h5")).get_queue("/d", n_procs=0, block_size=256)
    with q:
        with q.get() as block:
            np.testing.assert_array_equal(block, rows[:256])
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if its next two blocks are the parent's next two
            try:
                ok = all(np.array_equal(guard.block, rows[k * 256 : (k + 1) * 256]) for k, guard in
                         ((k, q.get()) for k in (1, 2)))
            except BaseException:
                ok = False
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with q.get() as block:
            np.testing.assert_array_equal(block, rows[256:512])


@pytest.mark.parametrize("n_procs", [0, 1], ids=["in-process", "readers"])
def test_a_guard_handed_out_before_its_queue_closed_gives_its_block_after(tmp_path: Path, n_procs: int) -> None:
    """2.x's guards went on working after close() (it only stopped the readers): code that takes a guard, and
    enters it once another thread closed the queue, gets its block. Its slot keeps the block's bytes, held by the
    guard at the close (NOTE [segment lifetime]); in a child, as a use would once crash the process. A guard
    taken after the close cannot be (get() gives QueueClosed)."""
    rows = small_rows(tmp_path / "d.h5")
    code = textwrap.dedent(f"""
        import multitables
        q = multitables.Streamer({str(tmp_path / "d.h5")!r}).get_queue("/d", n_procs={n_procs}, block_size=256,
                                                                        ordered=True)
        guard = q.get()
        q.close()
        with guard as block:
            print("first row:", block[0].tolist(), "rows:", len(block), "sum:", float(block.sum()))
        print("then:", q.get() is multitables.QueueClosed)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.splitlines() == [f"first row: {rows[0].tolist()} rows: 256 sum: {float(rows[:256].sum())}",
                                        "then: True"], done.stdout


# -- readers that stay alive and deliver nothing (NOTE [stalled readers]) ----------------------------------------------


def slow_in_readers(seconds: float, calls: int):
    """A transform that sleeps ``seconds`` on its first ``calls`` calls in each reader (forked: a closure will do) and
    appends the pid that ran it as a column."""
    consumer, made = os.getpid(), [0]

    def transform(rows: np.ndarray) -> np.ndarray:
        if os.getpid() != consumer and made[0] < calls:  # not the consumer's call that learns the output's type
            made[0] += 1
            time.sleep(seconds)
        return np.column_stack([rows, np.full(len(rows), os.getpid(), rows.dtype)])

    return transform


def stall_warnings(record: "list[warnings.WarningMessage]") -> "list[warnings.WarningMessage]":
    return [w for w in record if issubclass(w.category, RuntimeWarning) and "has come for" in str(w.message)]


def test_readers_that_deliver_nothing_for_long_are_named_once_and_every_row_still_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks
) -> None:
    """Two stalls of 0.3 s (the reader's first two blocks), one warning at the caller's line; the stream goes on."""
    monkeypatch.setattr(backends, "STALL_WARNING", 0.1)
    data = np.arange(600.0).reshape(300, 2)
    h5 = write(tmp_path / "d.h5", data, chunk_rows=50)
    batches = multitables.Streamer(h5, start_method="fork").get_batches(
        "/data", batch_size=50, shuffle=False, block_size=100, n_procs=1, transform=slow_in_readers(0.3, 2)
    )
    try:
        with pytest.warns(RuntimeWarning, match="has come for") as record:
            got = np.concatenate(list(batches))  # the caller's line
    finally:
        batches.close()
    np.testing.assert_array_equal(got[:, :2], data)  # every row, once, in order
    (stall,) = stall_warnings(record.list)
    text, pid = str(stall.message), int(got[0, 2])
    assert text.startswith(f"no block of '/data' in {str(h5)!r} has come for ")
    assert "(rows 0:100 awaited)" in text and f"its reader (pid {pid}) still runs" in text
    for words in ["JAX, TensorFlow", 'start_method="forkserver"', "numpy", "file system that stopped answering",
                  f"py-spy dump --pid {pid}", "Still waiting"]:
        assert words in text
    assert stall.filename == __file__ and "np.concatenate(list(batches))" in linecache.getline(__file__, stall.lineno)


def test_no_warning_while_blocks_come_or_while_the_consumer_does_not_ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks
) -> None:
    """Each block 30 ms apart, the whole stream longer than the limit, and a loop body longer than it: no wait is."""
    monkeypatch.setattr(backends, "STALL_WARNING", 0.2)
    data = np.arange(600.0).reshape(300, 2)
    batches = multitables.Streamer(write(tmp_path / "d.h5", data, chunk_rows=50), start_method="fork").get_batches(
        "/data", batch_size=50, shuffle=False, block_size=50, n_procs=1, transform=slow_in_readers(0.03, 6)
    )
    got = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        try:
            for i, x in enumerate(batches):
                got.append(x)
                if i == 0:
                    time.sleep(0.3)  # the readers fill the ring and wait for the consumer
        finally:
            batches.close()
    np.testing.assert_array_equal(np.concatenate(got)[:, :2], data)
    assert stall_warnings(record) == []
