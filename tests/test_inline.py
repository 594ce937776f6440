"""Requests read in this process (``Reader(..., n_procs=0)``, NOTE [requests in this process]): every request form
gives the rows reader processes give, with no process, no segment and no semaphore; in a daemonic process (a
DataLoader's worker) too, where it is the default; a forked copy opens its files anew and keeps its own stages."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import multitables
from multitables import Reader, ReaderError, StreamClosedError

from _guards import hang_guard, wait_until
from conftest import own_segments


@pytest.fixture
def data() -> np.ndarray:
    return np.arange(400 * 3, dtype="<f4").reshape(400, 3)


@pytest.fixture
def h5file(make_array: Callable[..., Path], data: np.ndarray) -> Path:
    return make_array(data, complib="zlib", chunkshape=(32, 3))


def test_every_request_form_reads_here_with_nothing_shared(
    h5file: Path, data: np.ndarray, table_file: tuple, no_leaks: None, shm_mappings: Callable[[], list[str]]
) -> None:
    notified: list[Any] = []
    threads = threading.active_count()
    with Reader(h5file, n_procs=0) as reader:
        assert reader.n_procs == 0 and reader.reader_pids == [] and "read in this process" in repr(reader)
        ds = reader.get_dataset("/data")
        stage, pool = ds.create_stage(64), ds.create_stage_pool((16, None), 2)
        natoms = ds.create_stage_natoms(30)
        assert not own_segments() and not shm_mappings() and threading.active_count() == threads
        rows = np.array([399, 3, 3, 200])
        future = reader.request(ds[rows], stage)
        assert future.done()  # read before request returned
        np.testing.assert_array_equal(future.get(), data[rows])
        with reader.request(ds[10:20, 1:], stage).get_unsafe() as got:
            np.testing.assert_array_equal(got, data[10:20, 1:])
        with reader.request(ds[::-50], stage).get_proxy() as got:
            np.testing.assert_array_equal(got[:], data[::-50])
        assert reader.request(ds[5:9], natoms).get_direct(np.sum) == data[5:9].sum()
        assert reader.request(ds.read_coordinates([7, 1]), stage).get().tolist() == data[[7, 1]].tolist()
        pooled = [reader.request(ds[i : i + 16], pool) for i in (0, 100)]
        assert [f.get().tolist() for f in pooled] == [data[:16].tolist(), data[100:116].tolist()]
        assert not own_segments() and not shm_mappings()  # still nothing shared
    path, records = table_file
    with Reader(path, n_procs=0, notify=notified.append) as reader:
        table = reader.get_dataset("/table")
        stage = table.create_stage(len(table))
        future = reader.request(table.where("(a > 10) & (a < 15)"), stage)
        np.testing.assert_array_equal(future.get(), records[(records["a"] > 10) & (records["a"] < 15)])
        second = reader.request(table[["b", "a"]][::97], stage)
        np.testing.assert_array_equal(second.get(), records[["b", "a"]][::97])
    assert notified == [future, second, multitables.QueueClosed]


def test_a_failed_read_fails_its_future_only_in_the_form_a_readers_does(
    h5file: Path, data: np.ndarray, no_leaks: None
) -> None:
    import h5py

    with h5py.File(h5file, "r") as f:
        info = f["data"].id.get_chunk_info(3)  # rows 96:128
    with open(h5file, "r+b") as f:
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    with Reader(h5file, n_procs=0) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(400)
        future = reader.request(ds[90:130], stage)  # raises at get, as with readers, not at request
        for _ in range(2):
            with pytest.raises(ReaderError) as info_:
                future.get()
        err = info_.value
        assert isinstance(err, OSError) and err.reader_index == -1 and err.pid == os.getpid()
        assert err.path == "/data" and err.rows == (90, 130) and err.filename == str(h5file)
        assert str(err).startswith("Caught ") and "which reads without reader processes" in str(err)
        assert isinstance(err.__cause__, OSError) and "Traceback" in err.remote_traceback
        assert_travels_home_from_a_dataloader_worker(err, "rows 90:130 of '/data'")
        with pytest.raises(KeyError) as missing:
            reader.get_dataset("/nope")
        assert_travels_home_from_a_dataloader_worker(missing.value, "/nope")
        np.testing.assert_array_equal(reader.request(ds[:96], stage).get(), data[:96])  # the Reader goes on
        came = reader.request(ds[:2], stage)
        assert came.wait(0)
        reader.stop()  # frees the stages, this future's data with them, as with readers
        with pytest.raises(StreamClosedError, match="stopped .* before this future's data was got"):
            came.get()
    with pytest.raises(StreamClosedError, match="closed"):
        reader.request(ds[:1], stage)


def assert_travels_home_from_a_dataloader_worker(err: BaseException, context: str) -> None:
    """PyTorch's worker pickles the error's class and its formatted traceback (``ExceptionWrapper``); the main process
    raises that class again: a class made at run time that does not pickle is lost there, and the loader waits for
    ever for the batch."""
    from torch._utils import ExceptionWrapper

    wrapper = ExceptionWrapper((type(err), err, err.__traceback__), where="in DataLoader worker process 1")
    with pytest.raises(type(err)) as home:
        pickle.loads(pickle.dumps(wrapper)).reraise()
    assert f"Caught {type(err).__name__} in DataLoader worker process 1" in str(home.value) and context in str(home.value)


def _in_a_daemonic_child(path: str, inherited: Any, out: Any) -> None:
    try:
        got: dict[str, Any] = {}
        with Reader(path) as reader:  # the default in a daemonic process: no process to start
            ds = reader.get_dataset("/data")
            got["default"] = (reader.n_procs, reader.request(ds[[5, 1]], ds.create_stage(2)).get().tolist())
        try:
            Reader(path, n_procs=1)
        except RuntimeError as exc:
            got["n_procs=1"] = str(exc)
        parent, ds, stage, future = inherited  # the parent's Reader, forked: it opens the file anew here
        future.release()
        got["inherited"] = parent.request(ds[300:302], stage).get().tolist()
        out.put(got)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        out.put(repr(exc))


def test_a_daemonic_process_reads_in_itself_and_a_forked_copy_keeps_to_its_own(
    h5file: Path, data: np.ndarray, no_leaks: None
) -> None:
    ctx = multiprocessing.get_context("fork")
    with Reader(h5file, n_procs=0) as parent:
        ds = parent.get_dataset("/data")
        stage = ds.create_stage(2)
        future = parent.request(ds[:2], stage)  # its rows in the stage, not yet got
        out = ctx.Queue()
        child = ctx.Process(target=_in_a_daemonic_child, args=(str(h5file), (parent, ds, stage, future), out), daemon=True)
        child.start()
        try:
            got = out.get(timeout=30)
        finally:
            child.join(30)
            out.close()
            out.join_thread()
        assert isinstance(got, dict), got
        assert got["default"] == (0, data[[5, 1]].tolist())
        assert "this process is daemonic" in got["n_procs=1"] and "n_procs=0 in each worker" in got["n_procs=1"]
        assert got["inherited"] == data[300:302].tolist()
        np.testing.assert_array_equal(future.get(), data[:2])  # the child's rows stayed in the child's copy
        np.testing.assert_array_equal(parent.request(ds[-2:], stage).get(), data[-2:])
        # the chunk the parent decoded before the fork, kept: the child decoded into its copy, not into it
        np.testing.assert_array_equal(parent.request(ds[2:4], stage).get(), data[2:4])


@contextlib.contextmanager
def _before_each_read(reader: Reader, act: Callable[[], Any]) -> Iterator[None]:
    """Run ``act()`` in the reading thread just before each request's read, which then goes on as it would."""
    shares = reader._core.pool._shares  # type: ignore[union-attr]
    read = shares.read

    def read_after(*args: Any) -> Any:
        act()
        return read(*args)

    shares.read = read_after
    try:
        yield
    finally:
        shares.read = read


def test_a_stop_from_another_thread_waits_for_the_read_in_flight(h5file: Path, data: np.ndarray, no_leaks: None) -> None:
    """A thread's request reads in that thread; ``stop()`` in another (a shutdown, the collector) closes the files and
    frees the stages once that read is done, not under it, and the request's future says the Reader was stopped."""
    reader = Reader(h5file, n_procs=0)
    ds = reader.get_dataset("/data")
    stage = ds.create_stage(64)
    stopper = threading.Thread(target=reader.stop)
    # stop() in another thread: as long as it takes, unless it waits for this read
    with _before_each_read(reader, lambda: (stopper.start(), stopper.join(0.1))):
        future = reader.request(ds[10:20], stage)
    stopper.join(10)
    with pytest.raises(StreamClosedError, match="was stopped"):
        future.get()
    with pytest.raises(StreamClosedError, match="closed"):
        reader.request(ds[:1], stage)


def test_a_stage_closed_under_its_read_in_another_thread_fails_only_its_future(
    h5file: Path, data: np.ndarray, no_leaks: None
) -> None:
    """Closed in another thread (or by its finalizer at exit, under a daemon thread's read), the stage's request
    says so at ``get``, and the Reader goes on."""
    with Reader(h5file, n_procs=0) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(64)
        closer = threading.Thread(target=stage.close)

        def close_the_stage() -> None:
            closer.start()
            wait_until(lambda: stage._map.words is None, 10, "the stage's map closed")  # the rest waits for this request

        with _before_each_read(reader, close_the_stage):
            future = reader.request(ds[10:20], stage)
        closer.join(10)
        with pytest.raises(StreamClosedError, match="stage of this future was closed"):
            future.get()
        np.testing.assert_array_equal(reader.request(ds[:5], ds.create_stage(5)).get(), data[:5])


def test_a_forked_copy_does_not_wait_for_a_lock_a_thread_held_at_the_fork(h5file: Path, data: np.ndarray, no_leaks: None) -> None:
    """A DataLoader forks its workers while another thread of the main process may be inside a request on the same
    Reader (holding its lock): the worker's copy of the lock is held by no thread there, and must not be waited for."""
    with Reader(h5file, n_procs=0) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(2)
        with hang_guard(30, "a forked child's request"):
            with reader._core.lock:  # type: ignore[union-attr]  # as another thread inside a request would hold it
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child, the lock not let go
                    signal.signal(signal.SIGALRM, signal.SIG_DFL)
                    signal.alarm(10)  # ended, not left waiting, if it waits for the lock
                    ok = reader.request(ds[[7, 300]], stage).get().tolist() == data[[7, 300]].tolist()
                    os._exit(0 if ok else 1)
            _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        np.testing.assert_array_equal(reader.request(ds[1:3], stage).get(), data[1:3])
