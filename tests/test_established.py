"""Code written for multitables 2.x runs unchanged: its names, keywords, close semantics, queries and chains.

Each test is one behaviour the established API documents or its users rely
on (docs/coming_from_2x.rst), checked against numpy and PyTables on a file
written here. The streaming side (waiting ``get()``, writable blocks) is
specified in ``test_streamer``.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest
import tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables
from _guards import hang_guard

ROW = np.dtype([("col_A", "u1", (20, 8)), ("col_B", "<f8", (3,)), ("col_C", "<f4")])
N = 400


@pytest.fixture(scope="module")
def h5file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """A file with an array ``/arr`` (N, 6, 5) and a table ``/tab`` of ROW with a sorted index on col_C."""
    path = tmp_path_factory.mktemp("established") / "data.h5"
    rng = np.random.default_rng(16)
    arr = np.arange(N * 30, dtype=np.int64).reshape(N, 6, 5)
    tab = np.zeros(N, ROW)
    tab["col_A"] = rng.integers(0, 256, tab["col_A"].shape)
    tab["col_B"] = rng.random((N, 3))
    tab["col_C"] = rng.random(N).astype(np.float32)
    with tables.open_file(path, "w") as f:
        f.create_carray("/", "arr", obj=arr, filters=tables.Filters(3, "zlib"), chunkshape=(32, 6, 5))
        t = f.create_table("/", "tab", tab, filters=tables.Filters(3, "blosc"), chunkshape=(50,))
        t.cols.col_C.create_csindex()
        f.create_vlarray("/", "vl", tables.Int32Atom()).append([1, 2, 3])
        f.create_earray("/", "empty", tables.Float32Atom(), shape=(0, 4))
        f.create_group("/", "grp")
    return path, arr, tab


@pytest.fixture(scope="module", params=[2, 0], ids=["n_procs=2", "inline"])
def reader(h5file: tuple, request: pytest.FixtureRequest) -> "multitables.Reader":
    """A Reader of 2 readers, and one that reads in this process (``n_procs=0``): the same API, the same rows."""
    path, _, _ = h5file
    r = multitables.Reader(path, request.param)
    yield r
    r.close(wait=True)


def _readers_gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


# -- names -------------------------------------------------------------------------------------------------------


def test_the_established_errors_are_this_projects(reader: multitables.Reader) -> None:
    assert multitables.QueueClosedException is multitables.StreamClosedError
    assert multitables.SubprocessException is multitables.ReaderError
    assert issubclass(multitables.SharedMemoryError, ValueError)
    tab = reader.get_dataset("/tab")
    with tab.create_stage(10) as stage:
        with pytest.raises(NameError) as info:
            reader.request(tab.where("nope > 1"), stage).get()
    # A failure in a reader is both the original type and a SubprocessException, with the reader's traceback.
    assert isinstance(info.value, multitables.SubprocessException)
    assert "read_where" in info.value.remote_traceback


def _sent_back(queue: "multiprocessing.Queue[object]") -> None:
    queue.put(multitables.QueueClosed)


def test_queue_closed_is_one_false_object_however_it_travels() -> None:
    """2.x compared with ``is``, and code tests ``if not guard``: a pickle, a copy, another process's, one object."""
    import copy

    import multitables.signals as signals

    closed = multitables.QueueClosed
    assert isinstance(closed, signals.QueueClosedType) and not closed
    assert repr(closed) == str(closed) == f"{closed}" == "multitables.QueueClosed"
    assert pickle.loads(pickle.dumps(closed)) is closed and copy.copy(closed) is copy.deepcopy(closed) is closed
    queue: "multiprocessing.Queue[object]" = multiprocessing.get_context("spawn").Queue()
    child = multiprocessing.get_context("spawn").Process(target=_sent_back, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=60) is closed
    finally:
        child.join(60)
        queue.close()
        queue.join_thread()


def test_the_established_module_names_resolve(reader: multitables.Reader, h5file: tuple) -> None:
    import multitables.dataset as dataset
    import multitables.dataset_ops as ops
    import multitables.request as request
    import multitables.shared_mem as shared_mem
    import multitables.signals as signals
    import multitables.stage as stage_module

    arr, tab = reader.get_dataset("/arr"), reader.get_dataset("/tab")
    assert isinstance(tab, dataset.TableDataset) and not isinstance(tab, dataset.ArrayDataset)
    assert isinstance(arr, dataset.ArrayDataset) and isinstance(arr, dataset.DatasetBase)
    assert dataset.Dataset is multitables.Dataset
    assert signals.QueueClosed is multitables.QueueClosed
    assert shared_mem.SharedMemoryError is multitables.SharedMemoryError
    assert stage_module.StagePool is multitables.StagePool and request.RequestPool is multitables.RequestPool
    mask = np.arange(6) > 2
    # Each request is an instance of the class 2.x would have made it with (and of that class's bases).
    expected = [
        (tab["col_A"], "ColOp"),
        (tab["col_A"][30:35], "ReadOpTable"),
        (tab[30:35]["col_A"], "ReadOpTable"),
        (tab.col("col_A")[30:35, ..., :4], "ColOp"),
        (tab[:]["col_A"][30:35, np.arange(20) > 12], "ReadOpTable"),
        (tab["col_A"][[1, 2, 3]], "CoordOp"),
        (tab[[1, 2, 3]]["col_A"], "CoordOp"),
        (tab["col_A"][0], "ReadScalarOpTable"),
        (tab[0]["col_A"], "ReadScalarOpTable"),
        (arr[4:16:2, ...], "ReadOpArray"),
        (arr[..., :3], "IndexOp"),
        (arr[:][:, mask], "ReadOpArray"),
        (arr[7], "ReadScalarOpArray"),
        (tab.where("col_C > 0.5"), "WhereOp"),
        (tab.read_sorted("col_C", checkCSI=True), "SortOp"),
    ]
    for req, name in expected:
        assert isinstance(req, getattr(ops, name)), (req, name)
        assert isinstance(req, ops.OpBase)
    assert isinstance(tab["col_A"][0], ops.ReadOpTable) and isinstance(tab["col_A"][0], ops.ReadScalarOpBase)
    assert not isinstance(tab["col_A"][30:35], ops.CoordOp) and not isinstance(arr[7], ops.ReadOpTable)
    assert tab[30:35]["col_A"]._col == "col_A"
    with tab.create_stage(1) as st_:
        assert isinstance(reader.request(tab[0:1], st_), request.Request)  # 2.x's name for a future


def test_the_established_keyword_names(reader: multitables.Reader, h5file: tuple) -> None:
    _, arr, _ = h5file
    ds = reader.get_dataset(path="/arr")
    with ds.create_stage(shape=10) as stage:
        np.testing.assert_array_equal(reader.request(key=ds[3:13], stage=stage).get(), arr[3:13])
    with ds.create_stage_pool(shape=2, num_stages=3) as pool:
        assert len(pool) == 3
        np.testing.assert_array_equal(reader.request(key=ds[5:7], stage=pool).get(), arr[5:7])


def test_a_missing_node_is_pytables_error_as_in_2x_and_a_key_error(reader: multitables.Reader, h5file: tuple) -> None:
    path, _, _ = h5file
    for ask in (lambda: multitables.Streamer(path).get_queue("/nope"), lambda: reader.get_dataset("/nope")):
        with pytest.raises(tables.NoSuchNodeError, match="no node '/nope'") as info:
            ask()
        assert isinstance(info.value, (KeyError, multitables.NoSuchNodeError))
        again = pickle.loads(pickle.dumps(info.value))
        assert type(again) is type(info.value) and again.args == info.value.args


def test_a_missing_column_is_what_2x_raised_for_it_and_a_key_error(reader: multitables.Reader, h5file: tuple) -> None:
    """2.x raised numpy's ValueError for a stream's field= missing from a table (``example[field]``), IndexError
    for a field= of an array, and NameError for a request's missing column: each ``except`` still holds, with the
    KeyError every missing name here is."""
    path, _, _ = h5file
    dataset = reader.get_dataset("/tab")
    asks = [(ValueError, lambda: multitables.Streamer(path).get_queue("/tab", field="nope")),
            (IndexError, lambda: multitables.Streamer(path).get_generator("/arr", field="x")),
            (NameError, lambda: dataset["nope"][0:5]),
            (NameError, lambda: dataset.col("nope"))]
    for established, ask in asks:
        with pytest.raises(established) as info:
            ask()
        assert isinstance(info.value, (KeyError, multitables.NoSuchFieldError)), info.value
        again = pickle.loads(pickle.dumps(info.value))
        assert type(again) is type(info.value) and again.args == info.value.args

def test_random_access_takes_an_empty_dataset_as_2x_did(reader: multitables.Reader, h5file: tuple) -> None:
    """A stream of 0 rows is refused; 2.x's get_dataset took an empty EArray, its slices are empty, a row is out of
    range, and the next stream of that file is still refused (what was described is kept across both)."""
    path, _, _ = h5file
    ds = reader.get_dataset("/empty")
    assert len(ds) == 0 and ds.shape == (0, 4)
    stage = ds.create_stage(3)
    for key in (slice(0, 3), slice(None), [], (Ellipsis, 2)):
        got = reader.request(ds[key], stage).get()
        assert got.shape == np.zeros((0, 4))[key].shape and got.dtype == np.float32
    with pytest.raises(IndexError, match="out of bounds"):
        ds[0]
    with pytest.raises(multitables.EmptyDatasetError):
        multitables.Streamer(path).get_queue("/empty")


def test_what_2x_raised_as_runtime_error_is_still_one(reader: multitables.Reader, h5file: tuple) -> None:
    path, _, _ = h5file
    with pytest.raises(RuntimeError, match="Group"):
        reader.get_dataset("/grp")  # 2.x: "Selected dataset is not an array or table."
    with pytest.raises(RuntimeError, match="empty"):
        multitables.Streamer(path).get_queue("/empty")  # 2.x: "Cannot read from empty dataset."
    for bad in (0, -1):  # 2.x: "The read_ahead parameter should be a strictly positive number or None."
        with pytest.raises(RuntimeError, match="read_ahead must be at least 1"):
            multitables.Streamer(path).get_queue("/arr", read_ahead=bad)
    a = reader.get_dataset("/arr")
    stage = a.create_stage(1)
    fut = reader.request(a[0], stage)
    with pytest.raises(RuntimeError):
        reader.request(a[1], stage)  # 2.x: "Stage already fielding another request."
    fut.release()
    stage.close()
    with pytest.raises(RuntimeError):
        reader.request(a[1], stage)  # 2.x: "Stage has already been closed."


# -- stages ------------------------------------------------------------------------------------------------------


def test_a_stage_holds_any_result_that_fits_its_bytes(reader: multitables.Reader, h5file: tuple) -> None:
    _, arr, tab = h5file
    t, a = reader.get_dataset("/tab"), reader.get_dataset("/arr")
    with t.create_stage(10) as stage:  # 10 records
        assert stage.nbytes == 10 * ROW.itemsize
        # Every value of one column: far more than 10 rows, far fewer bytes than 10 records.
        np.testing.assert_array_equal(reader.request(t["col_C"][:], stage).get(), tab["col_C"])
        np.testing.assert_array_equal(reader.request(t["col_C"][np.arange(0, N, 3)], stage).get(), tab["col_C"][::3])
        with pytest.raises(multitables.SharedMemoryError, match=r"reads 11 rows \(\d+ bytes\)"):
            reader.request(t[0:11], stage)
    # A shape whose missing axes are the dataset's (2.x), and a size in elements.
    assert a.create_stage((4, 3)).nbytes == 4 * 3 * 5 * 8
    assert a.create_stage((4, None, 2)).nbytes == 4 * 6 * 2 * 8
    assert a.create_stage_natoms(7).nbytes == 7 * 8
    with a.create_stage((10, 3)) as half:
        with pytest.raises(multitables.SharedMemoryError):
            reader.request(a[0:10], half)
        np.testing.assert_array_equal(reader.request(a[0:5], half).get(), arr[0:5])


def test_a_result_too_large_for_its_stage_is_a_shared_memory_error_that_is_a_value_error(
    reader: multitables.Reader,
) -> None:
    a = reader.get_dataset("/arr")
    with a.create_stage(10) as stage:
        with pytest.raises(multitables.SharedMemoryError):
            reader.request(a[:], stage)
        with pytest.raises(ValueError):  # code that caught the old error keeps working
            reader.request(a[:11], stage)


def test_data_lent_by_get_unsafe_is_writable_and_reaches_nothing_else(reader: multitables.Reader, h5file: tuple) -> None:
    path, arr, _ = h5file
    a = reader.get_dataset("/arr")
    with a.create_stage(8) as stage:
        with reader.request(a[0:8], stage).get_unsafe() as data:
            data -= data.mean(axis=0).astype(np.int64)  # normalise in place, as 2.x code does
        for k in range(1, 4):
            np.testing.assert_array_equal(reader.request(a[8 * k : 8 * k + 8], stage).get(), arr[8 * k : 8 * k + 8])
        np.testing.assert_array_equal(reader.request(a[0:8], stage).get(), arr[0:8])
    with tables.open_file(path) as f:
        np.testing.assert_array_equal(f.root.arr[:], arr)


def test_get_proxy_keeps_the_records_dtype(reader: multitables.Reader, h5file: tuple) -> None:
    _, _, tab = h5file
    t = reader.get_dataset("/tab")
    with t.create_stage(5) as stage:
        with reader.request(t[0:5], stage).get_proxy() as proxy:
            got = np.array(proxy[...])
            assert got.dtype == ROW and np.asarray(proxy).dtype == ROW
            np.testing.assert_array_equal(got, tab[0:5])


# -- chained indexing --------------------------------------------------------------------------------------------


def _key(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple:
    """A numpy key on ``shape``: per axis an int, a slice or an index list, sometimes an Ellipsis or a new axis."""
    key: list = []
    for d in shape[: draw(st.integers(1, len(shape)))]:
        kind = draw(st.sampled_from(["int", "slice", "list"]))
        if kind == "int":
            key.append(draw(st.integers(-d, d - 1)))
        elif kind == "slice":
            key.append(slice(draw(st.integers(-d, d) | st.none()), draw(st.integers(-d, d) | st.none()),
                             draw(st.sampled_from([None, 1, 2, -1, -3]))))
        else:
            key.append(draw(st.lists(st.integers(-d, d - 1), min_size=1, max_size=5)))
    if draw(st.booleans()):
        key.insert(draw(st.integers(0, len(key))), None)
    return tuple(key)


@st.composite
def _chain(draw: st.DrawFn) -> tuple:
    shape = (N, 6, 5)
    first = draw(st.sampled_from([np.s_[:], np.s_[10:300:3], np.s_[::-7], np.s_[[5, 3, 99, 250]], np.s_[17]]))
    inner = np.empty(shape, np.int8)[first].shape
    if not inner:
        return first, ()
    return first, _key(draw, inner)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chain=_chain())
def test_each_indexing_step_applies_to_the_result_of_the_one_before(reader: multitables.Reader, h5file: tuple, chain: tuple) -> None:
    _, arr, _ = h5file
    first, second = chain
    a = reader.get_dataset("/arr")
    try:
        expected = arr[first][second]
    except IndexError:  # e.g. index lists that do not broadcast: numpy's error, at once
        with pytest.raises(IndexError):
            a[first][second]
        return
    req = a[first][second]
    assert req.shape == expected.shape and req.dtype == expected.dtype
    with a.create_stage(N) as stage:
        got = reader.request(req, stage).get()
    np.testing.assert_array_equal(got, expected)
    assert np.shape(got) == expected.shape


def test_chains_read_only_the_rows_they_keep_and_index_tables_like_numpy(reader: multitables.Reader, h5file: tuple) -> None:
    _, arr, tab = h5file
    a, t = reader.get_dataset("/arr"), reader.get_dataset("/tab")
    assert a[:][5:10].n_rows_read == 5 and a[100:][::-50][1].n_rows_read == 1
    mask = np.arange(20) > 12
    cases = [
        (a[:][:, arr[0, :, 0] > 40], arr[:, arr[0, :, 0] > 40]),
        (a[:][np.array([1, 2, 3])[:, np.newaxis], [1, 2, 3], [1, 2, 3]], arr[np.array([1, 2, 3])[:, np.newaxis], [1, 2, 3], [1, 2, 3]]),
        (a[...][:5], arr[:5]),
        (t[:]["col_A"][30:35, mask], tab["col_A"][30:35, mask]),
        (t["col_A"][30:35, mask], tab["col_A"][30:35, mask]),
        (t[30:35]["col_B"][::-1, 2], tab[30:35]["col_B"][::-1, 2]),
        (t[[7, 1, 7]]["col_C"], tab[[7, 1, 7]]["col_C"]),
        (t[3]["col_A"][4], tab[3]["col_A"][4]),
    ]
    with t.create_stage(10) as small, a.create_stage(N) as big:
        for req, expected in cases:
            got = reader.request(req, big if req.dataset is a else small).get()
            np.testing.assert_array_equal(got, expected)
            assert np.shape(got) == expected.shape


# -- queries -----------------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("error::RuntimeWarning")  # PyTables warns of a float32 index by itself: not passed on
def test_where_and_read_sorted_run_pytables_queries_in_a_reader(reader: multitables.Reader, h5file: tuple) -> None:
    path, _, tab = h5file
    t = reader.get_dataset("/tab")
    with tables.open_file(path) as f, warnings.catch_warnings():  # what PyTables itself gives, warning of its index
        warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
        where = f.root.tab.read_where("(col_C > x) & (col_C < 0.9)", {"x": np.float32(0.25)}, start=100, stop=300)
        where_c = f.root.tab.read_where("col_C < 0.5")["col_C"]
        in_order = f.root.tab.read_sorted("col_C", checkCSI=True, start=50, stop=150)
        column = f.root.tab.read_sorted("col_C", field="col_B", start=10, stop=40, step=3)
    with t.create_stage(N) as stage:
        req = t.where("(col_C > x) & (col_C < 0.9)", condvars={"x": np.float32(0.25)}, start=100, stop=300)
        assert req.shape is None  # known once read
        fut = reader.request(req, stage)
        np.testing.assert_array_equal(fut.get(), where)
        assert fut.shape == where.shape
        np.testing.assert_array_equal(reader.request(t.where("col_C < 0.5")["col_C"], stage).get(), where_c)
        np.testing.assert_array_equal(reader.request(t.read_sorted("col_C", checkCSI=True, start=50, stop=150), stage).get(), in_order)
        got = reader.request(t.read_sorted("col_C", field="col_B", start=10, stop=40, step=3), stage).get()
        np.testing.assert_array_equal(got, column)
    with t.create_stage(3) as small:
        with pytest.raises(multitables.SharedMemoryError, match="more than the stage holds"):
            reader.request(t.where("col_C >= 0"), small).get()
        # The stage is usable again after the failed query.
        np.testing.assert_array_equal(reader.request(t[0:3], small).get(), tab[0:3])
    with pytest.raises(TypeError, match="array"):
        reader.get_dataset("/arr").where("x > 0")
    with pytest.raises(KeyError, match="no column 'zz' to sort by"):
        t.read_sorted("zz")  # when the request is made, as a missing field= is
    with pytest.raises(KeyError, match="no column 'col_C/x' to sort by"):
        t.read_sorted("col_C/x")


# -- futures, pools, notify --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_procs", [2, 0])
def test_request_pool_hands_futures_from_a_loader_thread_over_in_order(h5file: tuple, no_leaks: None, n_procs: int) -> None:
    path, _, tab = h5file
    r = multitables.Reader(path, n_procs)
    t = r.get_dataset("/tab")
    pool = t.create_stage_pool(1, 6)
    futures = multitables.RequestPool()
    loader = threading.Thread(target=lambda: [futures.add(r.request(t[i : i + 1], pool)) for i in range(120)])
    with hang_guard(60, "the request pool"):
        loader.start()
        for i in range(120):
            np.testing.assert_array_equal(futures.next().get(), tab[i : i + 1])
        loader.join()
    with pytest.raises(TimeoutError):
        futures.next(timeout=0.05)
    r.close(wait=True)


def test_notify_is_called_with_each_future_then_queue_closed(h5file: tuple, no_leaks: None) -> None:
    path, arr, _ = h5file
    seen: list = []
    ended = threading.Event()

    def notify(item: object) -> None:
        seen.append(item)
        if item is multitables.QueueClosed:
            ended.set()

    r = multitables.Reader(path, 2, notify)
    a = r.get_dataset("/arr")
    stages = [a.create_stage(4) for _ in range(5)]
    futures = [r.request(a[4 * i : 4 * i + 4], s) for i, s in enumerate(stages)]
    r.close(wait=True)
    assert ended.wait(30)
    assert seen[-1] is multitables.QueueClosed and sorted(map(id, seen[:-1])) == sorted(map(id, futures))
    for i, fut in enumerate(futures):
        np.testing.assert_array_equal(fut.get(), arr[4 * i : 4 * i + 4])


def test_close_wait_returns_once_notify_has_had_every_future_and_queue_closed(h5file: tuple, no_leaks: None) -> None:
    """2.x's ``close(wait=True)`` joined its notify thread, which called ``notify`` with each future and then with
    ``QueueClosed``: code that counts its notifications after the close finds them all. Here it returned while the
    notify thread still had ``QueueClosed`` to deliver."""
    path, _, _ = h5file
    seen: list = []
    r = multitables.Reader(path, 2, seen.append)
    a = r.get_dataset("/arr")
    futures = [r.request(a[4 * i : 4 * i + 4], a.create_stage(4)) for i in range(5)]
    with hang_guard(60, "close(wait=True) with notify"):
        r.close(wait=True)
    assert seen[-1] is multitables.QueueClosed  # no waiting: the close waited
    assert sorted(map(id, seen[:-1])) == sorted(map(id, futures))
    for fut in futures:
        fut.release()

    closed_inside: list = []

    def close_from_notify(item: object) -> None:  # a notify that closes its reader does not wait for itself
        if item is not multitables.QueueClosed and not closed_inside:
            closed_inside.append(item)
            r2.close(wait=True)

    r2 = multitables.Reader(path, 2, close_from_notify)
    a2 = r2.get_dataset("/arr")
    fut = r2.request(a2[0:4], a2.create_stage(4))
    with hang_guard(60, "close(wait=True) inside notify"):
        fut.get()
        r2.close(wait=True)
    assert closed_inside == [fut]


def test_close_wait_fulfils_every_pending_request_then_stops_the_readers(h5file: tuple, no_leaks: None) -> None:
    path, arr, _ = h5file
    r = multitables.Reader(path, 2)
    pids = r.reader_pids
    a = r.get_dataset("/arr")
    futures = [(i, r.request(a[i], a.create_stage(1))) for i in range(0, N, 13)]
    r.close(wait=True)
    assert _readers_gone(pids)
    with pytest.raises(RuntimeError, match="closed"):  # 2.x raised RuntimeError here too
        r.request(a[0], a.create_stage(1))
    for i, fut in futures:  # got after the close: still fulfilled
        np.testing.assert_array_equal(fut.get(), arr[i])
    r.close(wait=True)  # idempotent


def test_close_without_wait_returns_at_once_and_the_requests_are_still_read(h5file: tuple, no_leaks: None) -> None:
    path, arr, _ = h5file
    r = multitables.Reader(path, 1)
    (reader,) = r.reader_pids
    a = r.get_dataset("/arr")
    stage = a.create_stage(50)
    os.kill(reader, signal.SIGSTOP)  # the request waits in its inbox
    try:
        fut = r.request(a[100:150], stage)
        with hang_guard(10, "close() without wait"):
            r.close()
        assert not fut.done()
    finally:
        os.kill(reader, signal.SIGCONT)
    with hang_guard(30, "a request pending at close()"):
        np.testing.assert_array_equal(fut.get(), arr[100:150])
        while not _readers_gone([reader]):
            time.sleep(0.05)


def test_a_reader_used_in_a_with_reads_what_was_asked_before_it_ends(h5file: tuple, no_leaks: None) -> None:
    path, arr, _ = h5file
    with multitables.Reader(path, 2) as r:
        a = r.get_dataset("/arr")
        fut = r.request(a[::40], a.create_stage(10))
    np.testing.assert_array_equal(fut.get(), arr[::40])


def test_a_vlarray_is_refused_saying_what_reads_it(reader: multitables.Reader) -> None:
    with pytest.raises(multitables.NodeTypeError, match=r"variable-length rows \(an h5py vlen dataset, a PyTables VLArray\).*"
                                                       r"the Reader do not read them.*get_batches.*h5py directly"):
        reader.get_dataset("/vl")
