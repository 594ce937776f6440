"""Failure behaviour of the random-access front end (``multitables.Reader``): readers killed or failing, readers
closed, stopped or dropped early, a consumer interrupted or killed, and many readers opened and closed.

The counterpart of ``test_failures.py`` (the streaming front end). Every test starts real reader processes and
sends real signals. Time limits are guards against a hang only (``GONE_WITHIN``, ``GUARD``, ``TEST_GUARD``), far
above what the library takes; the promises themselves are in ``docs/random_access.rst`` ("When something fails").
"""

from __future__ import annotations

import gc
import os
import signal
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import psutil
import pytest

import multitables
from multitables import FileChangedError, QueueClosed, QueueClosedException, Reader, ReaderError, StreamClosedError

import _consumer
from _guards import hang_guard, is_gone, wait_until
from conftest import SHM_PREFIX, own_segments

N_ROWS = 4000
ROW = 8
CHUNK = 100  # rows per chunk: 40 chunks
#: Guards against a hang, not speed limits: a reader gone, an error raised, a subprocess message.
GONE_WITHIN = 30.0
GUARD = 30.0
TEST_GUARD = 120.0
#: Open/close cycles of the leak test: a leak of one of anything per cycle shows after a few; the default run
#: takes 60 (each of its ten ways to end six times), ``pytest -m slow`` the thousand that docs/failures.rst reports.
CYCLES = [60, pytest.param(1000, marks=pytest.mark.slow)]


@pytest.fixture(autouse=True)
def _hang_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that hangs rather than block the run (a guard, not a speed limit)."""
    with hang_guard(TEST_GUARD, request.node.name):
        yield


@pytest.fixture
def data() -> np.ndarray:
    return np.arange(N_ROWS * ROW, dtype="<f4").reshape(N_ROWS, ROW)


@pytest.fixture
def h5file(make_array: Callable[..., Path], data: np.ndarray) -> Path:
    """A zlib-compressed CArray at /data, chunks of ``CHUNK`` rows."""
    return make_array(data, complib="zlib", complevel=3, chunkshape=(CHUNK, ROW))


# -- helpers -------------------------------------------------------------------


def all_gone(pids: "list[int]") -> bool:
    return all(is_gone(p) for p in pids)


def own_mappings(pid: "int | str" = "self") -> list[str]:
    """The library's shared-memory mappings in a process (names already unlinked included)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return [line.split(None, 5)[5].strip() for line in f if f"/dev/shm/{SHM_PREFIX}" in line]
    except (FileNotFoundError, ProcessLookupError):
        return []


def segments_of(pid: int) -> set[str]:
    """Names in /dev/shm of the segments process ``pid`` created (nothing else is looked at)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"{SHM_PREFIX}{pid}_")}


def stop_all(pids: "list[int]") -> None:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)


def cont_all(pids: "list[int]") -> None:
    for pid in pids:
        if not is_gone(pid):
            os.kill(pid, signal.SIGCONT)


# -- a reader killed -----------------------------------------------------------


def test_a_reader_killed_while_get_waits_fails_the_future_naming_the_reader(
    no_leaks: None, h5file: Path
) -> None:
    with Reader(h5file, n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(N_ROWS)
        victim = reader.reader_pids[1]
        os.kill(victim, signal.SIGSTOP)  # its share of the request waits in its inbox
        future = reader.request(ds[:], stage)  # split between both readers
        killer = threading.Timer(0.3, os.kill, (victim, signal.SIGKILL))  # while get() waits
        killer.start()
        try:
            with pytest.raises(ReaderError) as info:
                future.get(timeout=GONE_WITHIN)  # a TimeoutError would mean the death went unseen
        finally:
            killer.join()
        err = info.value
        assert (err.reader_index, err.pid, err.exitcode) == (1, victim, -signal.SIGKILL)
        assert err.filename == str(h5file) and err.path == "/data"
        text = str(err)
        assert f"Reader 1 (pid {victim})" in text and "exit code -9 (SIGKILL)" in text and str(h5file) in text
        # The error is kept: asked again, the same error at once, not a wait.
        with pytest.raises(ReaderError, match="SIGKILL"):
            future.get(timeout=GONE_WITHIN)


def test_after_a_reader_died_the_reader_takes_no_more_requests(no_leaks: None, h5file: Path) -> None:
    with Reader(h5file, n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(N_ROWS)
        other = ds.create_stage(10)
        victim = reader.reader_pids[0]
        os.kill(victim, signal.SIGSTOP)
        future = reader.request(ds[:], stage)
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(ReaderError):
            future.get(timeout=GONE_WITHIN)
        # A clear error at once, saying what to do; the death is its cause.
        for attempt in (
            lambda: reader.request(ds[0:10], other),
            lambda: reader.get_dataset("/data"),
            lambda: ds.create_stage(10),
        ):
            with pytest.raises(ReaderError, match="cannot take more requests; close it") as info:
                attempt()
            assert isinstance(info.value.__cause__, ReaderError) and info.value.__cause__.pid == victim
            text = str(info.value)
            assert f"(pid {victim})" in text and "SIGKILL" in text and str(h5file) in text


def test_the_error_of_a_broken_reader_names_no_empty_dataset(no_leaks: None, h5file: Path) -> None:
    with Reader(h5file, n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(N_ROWS)
        victim = reader.reader_pids[1]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: is_gone(victim), GONE_WITHIN, "the reader dies")
        with pytest.raises(ReaderError, match="cannot take more requests") as info:
            reader.request(ds[:], stage)
        assert "''" not in str(info.value)


def test_a_reader_killed_while_idle_is_refused_at_the_next_request(no_leaks: None, h5file: Path) -> None:
    # docs/random_access.rst: after a reader died "the reader then takes no more requests: request raises".
    with Reader(h5file, n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(N_ROWS)
        reader.request(ds[:], stage).get(timeout=GONE_WITHIN)
        victim = reader.reader_pids[1]
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: is_gone(victim), GONE_WITHIN, "the reader dies")
        with pytest.raises(ReaderError, match="cannot take more requests"):
            reader.request(ds[0:10], stage).release()


def test_futures_already_served_still_deliver_after_a_reader_died(
    no_leaks: None, h5file: Path, data: np.ndarray
) -> None:
    with Reader(h5file, n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        pool = ds.create_stage_pool(CHUNK, 4)
        victim = reader.reader_pids[1]
        os.kill(victim, signal.SIGSTOP)
        # One share each, handed to the readers in turn: 0, 1, 0.
        served = reader.request(ds[0:CHUNK], pool)
        lost = reader.request(ds[CHUNK : 2 * CHUNK], pool)
        served_too = reader.request(ds[2 * CHUNK : 3 * CHUNK], pool)
        assert served.wait(GONE_WITHIN) and served_too.wait(GONE_WITHIN)
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(ReaderError, match="SIGKILL"):
            lost.get(timeout=GONE_WITHIN)
        np.testing.assert_array_equal(served.get(timeout=GONE_WITHIN), data[0:CHUNK])
        np.testing.assert_array_equal(served_too.get(timeout=GONE_WITHIN), data[2 * CHUNK : 3 * CHUNK])


def test_a_future_the_surviving_reader_is_still_reading_delivers_after_the_other_died(
    no_leaks: None, h5file: Path, data: np.ndarray
) -> None:
    # docs/random_access.rst: "futures already served, or served by the other readers, still deliver".
    with Reader(h5file, n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        pool = ds.create_stage_pool(CHUNK, 4)
        pids = reader.reader_pids
        stop_all(pids)
        try:
            survivor_serves = reader.request(ds[0:CHUNK], pool)  # reader 0
            lost = reader.request(ds[CHUNK : 2 * CHUNK], pool)  # reader 1
            os.kill(pids[1], signal.SIGKILL)
            with pytest.raises(ReaderError, match="SIGKILL"):
                lost.get(timeout=GONE_WITHIN)
            resume = threading.Timer(0.3, cont_all, ([pids[0]],))  # while get() waits for it
            resume.start()
            try:
                got = survivor_serves.get(timeout=GONE_WITHIN)
            finally:
                resume.join()
        finally:
            cont_all(pids)
        np.testing.assert_array_equal(got, data[0:CHUNK])


def test_a_request_waiting_for_a_free_stage_raises_when_a_reader_dies(no_leaks: None, h5file: Path) -> None:
    with Reader(h5file, n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        pool = ds.create_stage_pool(CHUNK, 1)
        held = reader.request(ds[0:CHUNK], pool)  # the pool's only stage, not given back
        held.wait(GONE_WITHIN)
        victim = reader.reader_pids[0]
        killer = threading.Timer(0.3, os.kill, (victim, signal.SIGKILL))  # while request() waits for a stage
        killer.start()
        try:
            # A TimeoutError would mean request() kept waiting although the pool cannot serve it any more.
            with pytest.raises(ReaderError, match="cannot take more requests"):
                reader.request(ds[0:CHUNK], pool, timeout=GONE_WITHIN)
        finally:
            killer.join()
        held.release()


def test_notify_hears_of_a_future_whose_reader_died_then_of_the_end(no_leaks: None, h5file: Path) -> None:
    # docs/random_access.rst: notify is called "with each future once its data is there (or its read failed)".
    heard: list[Any] = []
    ended = threading.Event()

    def notify(item: Any) -> None:
        heard.append(item)
        if item is QueueClosed:
            ended.set()

    reader = Reader(h5file, n_procs=2, notify=notify)
    ds = reader.get_dataset("/data")
    stage = ds.create_stage(N_ROWS)
    victim = reader.reader_pids[1]
    os.kill(victim, signal.SIGSTOP)
    future = reader.request(ds[:], stage)
    os.kill(victim, signal.SIGKILL)
    try:
        wait_until(lambda: future in heard, GONE_WITHIN, "notify hears of the failed future")
        reader.close(wait=True)
        assert ended.wait(GONE_WITHIN), "notify hears of the end"
        with pytest.raises(ReaderError, match="SIGKILL"):
            future.get(timeout=GONE_WITHIN)
    finally:
        reader.stop()


def _end_close(reader: Reader) -> None:
    reader.close()


def _end_close_wait(reader: Reader) -> None:
    reader.close(wait=True)


def _end_stop(reader: Reader) -> None:
    reader.stop()


def _end_drop(reader: Reader) -> None:
    del reader  # the caller's references are gone too


ENDS = [_end_close, _end_close_wait, _end_stop, _end_drop]


@pytest.mark.parametrize("end", ENDS, ids=lambda f: f.__name__[len("_end_") :])
def test_a_reader_with_a_dead_reader_ends_cleanly(no_leaks: None, h5file: Path, end: Callable[[Reader], None]) -> None:
    reader = Reader(h5file, n_procs=2)
    ds = reader.get_dataset("/data")
    stage = ds.create_stage(N_ROWS)
    pids = reader.reader_pids
    os.kill(pids[1], signal.SIGSTOP)
    future = reader.request(ds[:], stage)
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(ReaderError):
        future.get(timeout=GONE_WITHIN)
    del ds, stage, future
    end(reader)
    del reader
    gc.collect()
    wait_until(lambda: all_gone(pids) and not own_mappings(), GONE_WITHIN, "readers end, stages unmapped")


# -- an exception in a reader --------------------------------------------------


def _corrupt_chunk(path: Path, chunk_index: int) -> tuple[int, int]:
    """Overwrite chunk ``chunk_index`` of /data in place; return its row range."""
    import h5py

    with h5py.File(path, "r") as f:
        info = f["data"].id.get_chunk_info(chunk_index)
    with open(path, "r+b") as f:
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    start = info.chunk_offset[0]
    return start, start + CHUNK


@pytest.mark.parametrize("engine", ["h5py", "tables"])
def test_a_corrupt_chunk_fails_its_future_with_the_readers_traceback(
    no_leaks: None, h5file: Path, engine: str
) -> None:
    assert _corrupt_chunk(h5file, 7) == (700, 800)
    with Reader(h5file, n_procs=2, engine=engine) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(N_ROWS)
        future = reader.request(ds[650:900], stage)
        with pytest.raises(ReaderError) as info:
            future.get(timeout=GONE_WITHIN)
        err = info.value
        # Also the original type: h5py raises OSError, PyTables HDF5ExtError.
        if engine == "tables":
            import tables

            assert isinstance(err, tables.HDF5ExtError)
        else:
            assert isinstance(err, OSError)
        assert err.pid in reader.reader_pids and err.reader_index in (0, 1)
        assert err.filename == str(h5file) and err.path == "/data"
        assert err.rows is not None and err.rows[0] <= 700 and err.rows[1] >= 800  # the rows of the share read
        text = str(err)
        assert f"in reader {err.reader_index} (pid {err.pid})" in text and str(h5file) in text
        assert "Original traceback in the reader" in text and err.remote_traceback in text
        original = "HDF5ExtError" if engine == "tables" else "OSError"
        assert "Traceback (most recent call last)" in err.remote_traceback and original in err.remote_traceback
        with pytest.raises(ReaderError):
            future.get(timeout=GONE_WITHIN)  # the same error again, not a wait


@pytest.mark.parametrize("engine", ["h5py", "tables"])
def test_after_a_read_error_the_same_readers_go_on_serving(
    no_leaks: None, h5file: Path, data: np.ndarray, engine: str
) -> None:
    _corrupt_chunk(h5file, 7)
    with Reader(h5file, n_procs=2, engine=engine) as reader:
        ds = reader.get_dataset("/data")
        pool = ds.create_stage_pool(N_ROWS, 2)
        pids = reader.reader_pids
        for _ in range(3):
            with pytest.raises(ReaderError):
                reader.request(ds[:], pool).get(timeout=GONE_WITHIN)
            np.testing.assert_array_equal(reader.request(ds[:700], pool).get(timeout=GONE_WITHIN), data[:700])
            rows = np.array([3, 699, 800, 3999])
            np.testing.assert_array_equal(reader.request(ds[rows], pool).get(timeout=GONE_WITHIN), data[rows])
        assert reader.reader_pids == pids and not any(is_gone(p) for p in pids)
    assert all_gone(pids)


def test_a_failing_query_fails_its_future_with_the_original_type(
    no_leaks: None, table_file: tuple[Path, np.ndarray]
) -> None:
    path, rows = table_file
    with Reader(path, n_procs=2) as reader:
        ds = reader.get_dataset("/table")
        stage = ds.create_stage(len(ds))
        future = reader.request(ds.where("no_such_column > 0"), stage)  # PyTables raises in the reader
        with pytest.raises(ReaderError) as info:
            future.get(timeout=GONE_WITHIN)
        err = info.value
        assert isinstance(err, NameError) and "no_such_column" in str(err)
        assert err.filename == str(path) and "Original traceback in the reader" in str(err)
        np.testing.assert_array_equal(
            reader.request(ds.where("a < 5"), stage).get(timeout=GONE_WITHIN), rows[rows["a"] < 5]
        )


def test_a_failing_querys_error_names_the_dataset(no_leaks: None, table_file: tuple[Path, np.ndarray]) -> None:
    # docs/random_access.rst: a failed read carries "the file, the dataset and the rows".
    path, _rows = table_file
    with Reader(path, n_procs=1) as reader:
        ds = reader.get_dataset("/table")
        future = reader.request(ds.where("no_such_column > 0"), ds.create_stage(len(ds)))
        with pytest.raises(NameError) as info:
            future.get(timeout=GONE_WITHIN)
        assert info.value.path == "/table" and "'/table'" in str(info.value)


def _rewrite(path: Path, other: Path) -> None:
    with open(path, "r+b") as f:
        f.write(other.read_bytes())


def _truncate(path: Path, other: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _delete(path: Path, other: Path) -> None:
    path.unlink()


def _replace(path: Path, other: Path) -> None:
    os.replace(other, path)


def _chmod(path: Path, other: Path) -> None:
    path.chmod(0o400)  # only the change time moves


CHANGES = [
    pytest.param(_rewrite, id="rewrite"),
    pytest.param(_truncate, id="truncate"),  # a read past the new end fails first: the change explains it
    pytest.param(_delete, id="delete"),
    pytest.param(_replace, id="replace"),
    pytest.param(_chmod, id="chmod"),
]


@pytest.mark.parametrize("change", CHANGES)
def test_a_file_changed_after_open_fails_requests_with_file_changed_error(
    no_leaks: None, make_array: Callable[..., Path], data: np.ndarray, change: Callable[[Path, Path], None]
) -> None:
    # Contiguous and uncompressed: a read after the change would give the new bytes without complaint.
    path = make_array(data, complib=None, kind="array")
    other = make_array(-data - 1, complib=None, kind="array")
    assert path.stat().st_size == other.stat().st_size
    time.sleep(0.05)  # the change lands on a later tick of the filesystem clock than the writing
    with Reader(path, n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(N_ROWS)
        pids = reader.reader_pids
        np.testing.assert_array_equal(reader.request(ds[:], stage).get(timeout=GONE_WITHIN), data)
        change(path, other)
        for _ in range(2):  # every later request fails the same way; the readers stay
            with pytest.raises(FileChangedError) as info:
                reader.request(ds[3000::3], stage).get(timeout=GONE_WITHIN)  # rows past half the file
            err = info.value
            assert isinstance(err, ReaderError) and isinstance(err, OSError)
            assert str(path) in str(err) and "since the Reader was made" in str(err) and "streamed" not in str(err)
        assert not any(is_gone(p) for p in pids)


def test_a_file_changed_before_the_first_request_names_its_dataset_and_rows(
    no_leaks: None, make_array: Callable[..., Path], data: np.ndarray
) -> None:
    """The readers open a dataset at its first request: an open that fails (here: the file was replaced since
    get_dataset) names the dataset and the rows, as a failed read does, not just the file being served."""
    path = make_array(data, complib=None, kind="array")
    other = make_array(-data - 1, complib=None, kind="array")
    time.sleep(0.05)  # the change lands on a later tick of the filesystem clock than the writing
    with Reader(path, n_procs=1) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(100)
        _replace(path, other)
        with pytest.raises(FileChangedError) as info:
            reader.request(ds[10:20], stage).get(timeout=GONE_WITHIN)
        err = info.value
        assert (err.path, err.rows) == ("/data", (10, 20))
        assert f"while reading rows 10:20 of '/data' in '{path}'" in str(err)


# -- stopping early -------------------------------------------------------------


@pytest.mark.parametrize("wait", [False, True], ids=["close", "close_wait"])
def test_close_with_futures_pending_still_delivers_them(
    no_leaks: None, h5file: Path, data: np.ndarray, wait: bool
) -> None:
    reader = Reader(h5file, n_procs=2)
    ds = reader.get_dataset("/data")
    pool = ds.create_stage_pool(500, 6)
    pids = reader.reader_pids
    stop_all(pids)  # nothing is read before close()
    resume = threading.Timer(0.3, cont_all, (pids,))
    try:
        futures = [reader.request(ds[k * 500 : (k + 1) * 500], pool) for k in range(6)]
        resume.start()  # close(wait=True) waits for the reads: they resume meanwhile
        reader.close(wait=wait)
    finally:
        resume.join()
        cont_all(pids)
    assert reader.closed
    with pytest.raises(StreamClosedError):
        reader.request(ds[0:10], pool)
    for k, future in enumerate(futures):
        np.testing.assert_array_equal(future.get(timeout=GONE_WITHIN), data[k * 500 : (k + 1) * 500])
    wait_until(lambda: all_gone(pids), GONE_WITHIN, "the readers stop once every request is read")


def test_stop_with_futures_pending_fails_them_with_queue_closed_exception(no_leaks: None, h5file: Path) -> None:
    assert QueueClosedException is StreamClosedError
    reader = Reader(h5file, n_procs=2)
    ds = reader.get_dataset("/data")
    pool = ds.create_stage_pool(500, 4)
    pids = reader.reader_pids
    stop_all(pids)
    futures = [reader.request(ds[k * 500 : (k + 1) * 500], pool) for k in range(4)]
    errors: list[BaseException] = []

    def waiter(future: multitables.Future) -> None:
        try:
            future.get(timeout=GONE_WITHIN)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertions
            errors.append(exc)

    waiters = [threading.Thread(target=waiter, args=(f,)) for f in futures[:2]]
    for t in waiters:
        t.start()
    time.sleep(0.2)  # both wait in get()
    resume = threading.Timer(0.3, cont_all, (pids,))  # let the stopped readers see the stop flag
    resume.start()
    try:
        reader.stop()
    finally:
        resume.join()
        cont_all(pids)
    for t in waiters:
        t.join(GONE_WITHIN)
        assert not t.is_alive()
    assert len(errors) == 2 and all(isinstance(e, QueueClosedException) and "stopped" in str(e) for e in errors)
    for future in futures[2:]:  # not waited for yet: the same
        with pytest.raises(QueueClosedException, match="stopped"):
            future.get(timeout=GONE_WITHIN)
    assert all_gone(pids) and not own_mappings()  # stop() returns once the readers are gone
    with pytest.raises(StreamClosedError):
        reader.request(ds[0:10], pool)


def test_leaving_a_with_block_by_an_exception_stops_the_readers(no_leaks: None, h5file: Path) -> None:
    with pytest.raises(LookupError, match="the consumer failed"):
        with Reader(h5file, n_procs=2) as reader:
            ds = reader.get_dataset("/data")
            pool = ds.create_stage_pool(500, 4)
            pids = reader.reader_pids
            futures = [reader.request(ds[k * 500 : (k + 1) * 500], pool) for k in range(4)]
            with futures[0].get_unsafe(timeout=GONE_WITHIN) as block:  # a stage lent out, too
                raise LookupError(f"the consumer failed on {len(block)} rows")
    # stop(), not close(): nothing more is read, the readers are gone when the with ends.
    assert reader.closed and all_gone(pids) and not own_mappings()
    with pytest.raises(QueueClosedException):
        futures[1].get(timeout=GONE_WITHIN)


def _drop_refcount(reader: Reader, held: list[Any]) -> None:
    held.clear()


def _drop_cycle(reader: Reader, held: list[Any]) -> None:
    reader.myself = reader  # type: ignore[attr-defined]  # only the cycle collector can free it
    held.clear()


@pytest.mark.parametrize("drop", [_drop_refcount, _drop_cycle], ids=["refcount", "cycle"])
def test_a_reader_nobody_closed_is_stopped_when_collected(
    no_leaks: None, h5file: Path, drop: Callable[[Reader, list[Any]], None]
) -> None:
    reader = Reader(h5file, n_procs=2)
    ds = reader.get_dataset("/data")
    pool = ds.create_stage_pool(500, 4)
    pids = reader.reader_pids
    held: list[Any] = [ds, pool] + [reader.request(ds[k * 500 : (k + 1) * 500], pool) for k in range(4)]
    drop(reader, held)
    del reader, ds, pool
    gc.collect()
    wait_until(lambda: all_gone(pids) and not own_mappings(), GONE_WITHIN, "readers end, stages unmapped")


def test_a_reader_dropped_with_its_stage_pool_is_stopped_by_reference_counting_alone(
    no_leaks: None, h5file: Path, data: np.ndarray
) -> None:
    # A pool's stages pointed back at the pool: a cycle that kept the Reader and its reader processes alive until
    # the cycle collector ran (Readers made and dropped in a loop piled up their processes meanwhile).
    enabled = gc.isenabled()
    gc.disable()
    try:
        reader = Reader(h5file, n_procs=2)
        ds = reader.get_dataset("/data")
        pool = ds.create_stage_pool(500, 2)
        pids = reader.reader_pids
        np.testing.assert_array_equal(reader.request(ds[:500], pool).get(timeout=GONE_WITHIN), data[:500])
        future = reader.request(ds[500:1000], pool)
        del reader, ds, pool
        np.testing.assert_array_equal(future.get(timeout=GONE_WITHIN), data[500:1000])  # its stage outlives the pool
        del future
        wait_until(lambda: all_gone(pids) and not own_mappings(), GONE_WITHIN, "readers end, stages unmapped")
    finally:
        if enabled:
            gc.enable()


def test_a_future_keeps_its_reader_alive_until_it_is_dropped(no_leaks: None, h5file: Path, data: np.ndarray) -> None:
    reader = Reader(h5file, n_procs=2)
    ds = reader.get_dataset("/data")
    pids = reader.reader_pids
    future = reader.request(ds[::7], ds.create_stage(N_ROWS))
    del reader, ds
    gc.collect()
    np.testing.assert_array_equal(future.get(timeout=GONE_WITHIN), data[::7])
    assert not any(is_gone(p) for p in pids)
    del future
    gc.collect()
    wait_until(lambda: all_gone(pids) and not own_mappings(), GONE_WITHIN, "readers end, stages unmapped")


# -- Ctrl-C and a killed consumer ------------------------------------------------

# A consumer program, for the tests that interrupt or kill the consumer itself.
SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import numpy as np
    import psutil
    import multitables

    path, mode, start_method, prefix = sys.argv[1:5]
    kw = dict(n_procs=2, start_method=None if start_method == "default" else start_method)

    def say(**kw):
        print(json.dumps(kw), flush=True)

    def readers():
        return sorted(c.pid for c in psutil.Process().children()
                      if c.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(c.cmdline()))

    def mappings():
        with open("/proc/self/maps") as f:
            return [l.split(None, 5)[5].strip() for l in f if "/dev/shm/" + prefix in l]

    def wait_on_a_stopped_reader(reader):
        # get() waits for ever: the second share is a stopped reader's (the test resumes it after the signal)
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(len(ds))
        stopped = reader.reader_pids[-1]
        os.kill(stopped, signal.SIGSTOP)
        future = reader.request(ds[:], stage)
        say(readers=reader.reader_pids, stopped=stopped)
        future.get()
        say(error="get() returned")

    def busy(reader):
        # requests in flight all the time, through a stage pool
        ds = reader.get_dataset("/data")
        pool = ds.create_stage_pool(500, 4)
        rng = np.random.default_rng(0)
        futures, n = [], 0
        while True:
            while len(futures) < 4:
                futures.append(reader.request(ds[np.sort(rng.choice(len(ds), 300, replace=False))], pool))
            futures.pop(0).get()
            n += 1
            if n == 20:
                say(readers=reader.reader_pids)

    def main():
        held = []
        if mode == "attaching":
            # Stay inside create_stage after every reader mapped the stage, where the consumer unlinks its name,
            # with the resource tracker's safety net off: only the readers' own clean-up can remove it.
            import multiprocessing.resource_tracker as rt
            from multitables._shm.segment import Segment
            rt.register = lambda name, rtype: None
            unlink = Segment.unlink
            def hold(self):
                if held:  # not the Reader's own inboxes: the stage's
                    say(readers=held[0].reader_pids, segment=self.name)
                    time.sleep(3600)
                unlink(self)
            Segment.unlink = hold

        if mode == "bare":
            # No with, no except: the KeyboardInterrupt ends the program, the Reader is stopped at exit.
            wait_on_a_stopped_reader(multitables.Reader(path, **kw))
        try:
            with multitables.Reader(path, **kw) as reader:
                if mode == "waiting":
                    wait_on_a_stopped_reader(reader)
                elif mode == "busy":
                    busy(reader)
                elif mode == "pending":
                    ds = reader.get_dataset("/data")
                    pool = ds.create_stage_pool(500, 4)
                    futures = [reader.request(ds[k * 500 : (k + 1) * 500], pool) for k in range(4)]
                    futures[-1].wait()
                    say(readers=reader.reader_pids)
                    time.sleep(3600)
                elif mode == "attaching":
                    ds = reader.get_dataset("/data")
                    held.append(reader)
                    ds.create_stage(500)
        except KeyboardInterrupt:
            say(interrupted=True, readers=readers(), mappings=mappings())
            sys.exit(3)

    if __name__ == "__main__":  # spawned readers import this file too
        main()
    """
)


class Consumer(_consumer.Consumer):
    """The consumer program, told the library's segment prefix (to look for its own segments)."""

    def __init__(self, script: Path, h5: Path, mode: str, start_method: "str | None" = None) -> None:
        super().__init__(script, h5, mode, start_method, SHM_PREFIX)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "consumer.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    """Started consumer programs, killed at the end whatever happened."""
    started: list[Consumer] = []
    yield started
    for c in started:
        c.kill()


@pytest.mark.parametrize(
    "mode, start_method",
    [
        pytest.param("waiting", None, id="waiting-in-get"),
        pytest.param("waiting", "spawn", id="waiting-in-get-spawn"),
        pytest.param("busy", None, id="busy"),
    ],
)
def test_ctrl_c_reaches_the_consumer_after_its_readers_ended(
    h5file: Path, script: Path, consumers: list[Consumer], mode: str, start_method: "str | None"
) -> None:
    c = Consumer(script, h5file, mode, start_method)
    consumers.append(c)
    msg = c.read()
    pids = msg["readers"]
    assert len(pids) == 2
    time.sleep(0.3)  # in get() (or in full swing)
    os.killpg(c.proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole foreground group
    if "stopped" in msg:
        time.sleep(0.2)
        cont_all([msg["stopped"]])  # the reader can see the stop flag now
    report = c.read()
    # KeyboardInterrupt came out of the library; by then the readers were gone and the stages unmapped.
    assert report == {"interrupted": True, "readers": [], "mappings": []}
    code, err = c.finish()
    assert code == 3, err
    assert "Traceback" not in err, err  # no reader complained
    assert all_gone(pids) and not segments_of(c.proc.pid)


def test_ctrl_c_uncaught_ends_the_program_and_its_readers(
    h5file: Path, script: Path, consumers: list[Consumer]
) -> None:
    c = Consumer(script, h5file, "bare")
    consumers.append(c)
    msg = c.read()
    time.sleep(0.3)
    os.killpg(c.proc.pid, signal.SIGINT)
    time.sleep(0.2)
    cont_all([msg["stopped"]])
    code, err = c.finish()
    assert code == -signal.SIGINT, err  # Python's exit by an uncaught KeyboardInterrupt
    assert "KeyboardInterrupt" in err and "Exception ignored" not in err, err
    assert err.count("Traceback") == 1, err  # the consumer's own, nothing from the clean-up at exit
    wait_until(lambda: all_gone(msg["readers"]), GONE_WITHIN, "the readers end")
    assert not segments_of(c.proc.pid)


@pytest.mark.parametrize(
    "mode, start_method",
    [
        pytest.param("busy", None, id="requests-in-flight"),
        pytest.param("busy", "spawn", id="requests-in-flight-spawn"),
        pytest.param("pending", None, id="futures-not-got"),
        pytest.param("waiting", None, id="waiting-in-get"),
        pytest.param("attaching", None, id="stage-not-yet-unlinked"),
    ],
)
def test_a_killed_consumers_readers_exit_and_its_segments_go(
    h5file: Path, script: Path, consumers: list[Consumer], mode: str, start_method: "str | None"
) -> None:
    c = Consumer(script, h5file, mode, start_method)
    consumers.append(c)
    msg = c.read()
    pids = msg["readers"]
    assert len(pids) == 2
    if mode == "attaching":
        assert segments_of(c.proc.pid) == {msg["segment"]}  # the consumer never got to unlink the stage's name
    time.sleep(0.2)
    c.proc.kill()
    c.proc.wait(GUARD)
    if "stopped" in msg:
        cont_all([msg["stopped"]])  # a stopped process cannot look; once resumed, it must notice by itself
    wait_until(lambda: all_gone(pids), GONE_WITHIN, "the orphaned readers exit")
    wait_until(lambda: not segments_of(c.proc.pid), GONE_WITHIN, "the segments are unlinked")


# -- many readers ----------------------------------------------------------------


def closing_threads() -> int:
    """Threads a ``close()`` left waiting for its readers to stop."""
    return sum(1 for t in threading.enumerate() if t.name == "multitables-reader-close")


@pytest.mark.parametrize("cycles", CYCLES)
def test_a_thousand_open_close_cycles_leave_nothing_behind(
    no_leaks: None, h5file: Path, data: np.ndarray, cycles: int
) -> None:
    me = psutil.Process()
    gc.collect()
    fds, threads = me.num_fds(), threading.active_count()
    segments, mappings = own_segments(), own_mappings()
    readers: set[int] = set()
    for i in range(cycles):
        reader = Reader(h5file, n_procs=1 + i % 2)
        readers.update(reader.reader_pids)
        ds = reader.get_dataset("/data")
        k = i % (N_ROWS // CHUNK)
        rows = slice(k * CHUNK, (k + 1) * CHUNK, 3)
        future = reader.request(ds[rows], ds.create_stage(CHUNK))
        end = i % 5
        if end == 0:
            with reader:
                np.testing.assert_array_equal(future.get(timeout=GONE_WITHIN), data[rows])
        else:
            np.testing.assert_array_equal(future.get(timeout=GONE_WITHIN), data[rows])
            if end == 1:
                reader.close()  # then dropped while its readers stop in the background
            elif end == 2:
                reader.close(wait=True)
            elif end == 3:
                reader.stop()
            # end == 4: never closed, stopped when reference counting drops it
        del reader, ds, future
    gc.collect()
    wait_until(
        lambda: not readers & {p.pid for p in me.children()} and threading.active_count() == threads,
        GONE_WITHIN,
        "every reader exits and is reaped",
    )
    assert me.num_fds() == fds
    assert own_segments() == segments and own_mappings() == mappings


def test_dropping_a_reader_right_after_close_leaves_nothing_behind(
    no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The common ending: `reader.close()`, then the reader goes out of scope, so the finalizer's stop() closes
    # the pool while close()'s thread still looks at it (a race that raised KeyError or "process object is
    # closed" in that thread within ~25 cycles, and left pipe fds open). The loop stops at the first sign.
    me = psutil.Process()
    gc.collect()
    fds = me.num_fds()
    thread_errors: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: thread_errors.append(repr(args.exc_value)))
    for _ in range(150):
        reader = Reader(h5file, n_procs=1)
        ds = reader.get_dataset("/data")
        reader.request(ds[0:10], ds.create_stage(10)).get(timeout=GONE_WITHIN)
        reader.close()
        del reader, ds  # the finalizer stops it while close()'s thread waits for the reader
        if thread_errors:
            break
    gc.collect()
    wait_until(lambda: not closing_threads(), GONE_WITHIN, "every closing thread ends")
    assert not thread_errors
    assert me.num_fds() == fds


_DAEMON_LOADER = textwrap.dedent(
    r"""
    import json, sys, threading, time
    import multitables

    reader = multitables.Reader(sys.argv[1], n_procs=2)
    dataset = reader.get_dataset("/data")
    pool = dataset.create_stage_pool(10, 2)
    futures = multitables.RequestPool()
    asking = threading.Event()

    def loader():  # as docs/random_access.rst has it: requests in a daemon thread, got in the main one
        for k in range(100):
            if k == 2:
                asking.set()  # every stage is held now: the next request waits for one
            futures.add(reader.request(dataset[k : k + 10], pool))

    threading.Thread(target=loader, daemon=True).start()
    futures.next().get()
    asking.wait()
    time.sleep(0.2)
    print(json.dumps(reader.reader_pids), flush=True)
    if sys.argv[2] == "raise":
        raise ValueError("the training step failed")
    """
)


@pytest.mark.parametrize("how", ["return", "raise"])
def test_a_daemon_thread_waiting_on_a_reader_at_exit_ends_quietly(tmp_path: Path, h5file: Path, how: str) -> None:
    """The interpreter's exit handlers close a Reader that a daemon loader thread still waits on (for a stage
    nobody gives back): the process ends, with the main thread's traceback only, and leaves nothing; the thread
    said "the stage is closed", or that a reader "died unexpectedly", though nothing died."""
    import json
    import subprocess
    import sys

    script = tmp_path / "daemon_loader.py"
    script.write_text(_DAEMON_LOADER)
    run = subprocess.run([sys.executable, str(script), str(h5file), how], capture_output=True, text=True, timeout=GUARD)
    assert run.returncode == (1 if how == "raise" else 0), run.stderr[-3000:]
    assert run.stderr.count("Traceback") == (how == "raise"), run.stderr[-3000:]
    assert "Exception in thread" not in run.stderr and "Exception ignored" not in run.stderr, run.stderr[-3000:]
    pids = json.loads(run.stdout.strip().splitlines()[-1])
    wait_until(lambda: all_gone(pids), GONE_WITHIN, "the readers end")
