"""Reader: random access that gives what numpy (and PyTables) give, and that ends cleanly whatever happens."""

from __future__ import annotations

import os
import pickle
import re
import signal
import threading
import textwrap
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import psutil
import pytest
import tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables
from multitables.reader import DataProxy, Future, Reader

from _guards import hang_guard, wait_until

#: Guards against a hang only (how soon is measured by benchmarks/failure_latency.py).
GONE_WITHIN = 30.0

ARRAYS = {
    # name: (shape, dtype, filters, chunk rows or None for contiguous)
    "zlib3d": ((300, 4, 3), "<f4", tables.Filters(3, "zlib", shuffle=True), 16),
    "blosc1d": ((500,), "<i8", tables.Filters(3, "blosc"), 64),
    "plain2d": ((200, 5), "<u2", None, None),
    "bigchunk": ((400, 2), "<i4", tables.Filters(1, "zlib"), 400),
}
TABLE_DTYPE = np.dtype([("a", "<i4"), ("b", "<f8"), ("v", "<f4", (3,))])


def _table_rows(n: int) -> np.ndarray:
    rows = np.zeros(n, TABLE_DTYPE)
    rows["a"] = np.arange(n)
    rows["b"] = np.arange(n) * 0.5
    rows["v"] = np.arange(3 * n).reshape(n, 3)
    return rows


class _Contents(dict):  # type: ignore[type-arg]
    """{node: data}, with a short repr for hypothesis' reports."""

    def __repr__(self) -> str:
        return f"<contents of {sorted(self)}>"


@pytest.fixture(scope="module")
def h5file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """One file with several arrays and a table; returns (path, {node: data})."""
    path = tmp_path_factory.mktemp("reader") / "data.h5"
    contents: dict[str, np.ndarray] = _Contents()
    rng = np.random.default_rng(0)
    with tables.open_file(path, "w") as f:
        for name, (shape, dtype, filters, chunk) in ARRAYS.items():
            data = (rng.standard_normal(shape) * 1000).astype(dtype)
            if chunk is None:
                f.create_array("/", name, data)
            else:
                f.create_carray("/", name, obj=data, filters=filters, chunkshape=(chunk,) + shape[1:])
            contents["/" + name] = data
        rows = _table_rows(700)
        f.create_table("/", "table", rows, filters=tables.Filters(5, "blosc"), chunkshape=(64,))
        contents["/table"] = rows
    return path, contents


@pytest.fixture(scope="module", params=["auto", "h5py", "tables", "inline"])
def shared_reader(request: pytest.FixtureRequest, h5file: tuple) -> "tuple[Reader, dict]":
    """A reader kept for the module (per engine; and one that reads in this process), with one stage per dataset."""
    path, contents = h5file
    inline = request.param == "inline"  # n_procs=0
    reader = Reader(path, n_procs=0 if inline else 2, engine="auto" if inline else request.param)
    stages = {}
    for node in contents:
        ds = reader.get_dataset(node)
        stages[node] = (ds, ds.create_stage(len(ds)))
    yield reader, stages
    reader.close(wait=True)


# -- keys ---------------------------------------------------------------------


@st.composite
def index_for(draw: st.DrawFn, shape: tuple[int, ...]) -> object:
    """A numpy-style index on ``shape``: ints, slices with steps, Ellipsis, None, index lists and masks on any axis."""
    entries: list[object] = []
    axis = 0
    n = draw(st.integers(0, len(shape)))
    used_ellipsis = False
    for _ in range(n):
        if axis >= len(shape):
            break
        dim = shape[axis]
        kind = draw(st.sampled_from(["int", "slice", "list", "sorted", "range", "mask", "ellipsis", "none"]))
        if kind == "ellipsis" and not used_ellipsis:
            entries.append(Ellipsis)
            used_ellipsis = True
            axis = len(shape) - (n - len(entries))
            axis = max(axis, len([e for e in entries if e is not None and e is not Ellipsis]))
            continue
        if kind == "none":
            entries.append(None)
            continue
        if kind == "int":
            entries.append(draw(st.integers(-dim, dim - 1)))
        elif kind == "slice":
            bound = st.one_of(st.none(), st.integers(-dim - 1, dim + 1))
            entries.append(slice(draw(bound), draw(bound), draw(st.sampled_from([None, 1, 2, 3, -1, -2, 7]))))
        elif kind == "range":  # numpy takes it as a list
            entries.append(range(draw(st.integers(-dim, dim)), draw(st.integers(-dim, dim + 1)), draw(st.sampled_from([1, 2, -1]))))
        elif kind in ("list", "sorted"):
            values = draw(st.lists(st.integers(-dim, dim - 1), max_size=8, unique=kind == "sorted"))
            if kind == "sorted":
                values = sorted({v % dim for v in values})
            entries.append(np.array(values, dtype=np.int64) if draw(st.booleans()) else values)
        else:
            entries.append(np.array(draw(st.lists(st.booleans(), min_size=dim, max_size=dim)), dtype=bool))
        axis += 1
    if len(entries) == 1 and draw(st.booleans()):
        return entries[0]
    return tuple(entries)


def _is_index_error(fn: "callable") -> bool:
    try:
        fn()
    except (IndexError, ValueError, TypeError):
        return True
    return False


def _pytables_numpy_like(key: object, ndim: int) -> bool:
    """Index forms PyTables reads with numpy's meaning (a bare list or array on an N-d array means coordinates to it)."""
    entries = key if isinstance(key, tuple) else (key,)
    if not entries or any(e is None for e in entries):
        return False
    if any(isinstance(e, slice) and (e.step or 1) < 0 or isinstance(e, range) for e in entries):
        return False
    arrays = [e for e in entries if isinstance(e, (list, np.ndarray))]
    if len(arrays) > 1 or (arrays and not isinstance(key, tuple) and ndim > 1):
        return False
    if arrays and any(isinstance(e, (int, np.integer)) for e in entries):
        return False  # numpy moves the broadcast axes of [0, ..., [0]] first; PyTables keeps them in place
    for a in arrays:
        a = np.asarray(a)
        if a.dtype == bool or len(a) == 0 or (np.diff(a) <= 0).any() or (a < 0).any():
            return False
    return True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_results_equal_numpy_and_pytables(shared_reader: tuple, h5file: tuple, data: st.DataObject) -> None:
    reader, stages = shared_reader
    path, contents = h5file
    node = data.draw(st.sampled_from(sorted(contents)))
    full = contents[node]
    ds, stage = stages[node]
    field = None
    if node == "/table":
        field = data.draw(st.sampled_from([None, "a", "v"]))
    target = full if field is None else full[field]
    key = data.draw(index_for(target.shape))
    if _is_index_error(lambda: target[key]):
        with pytest.raises((IndexError, ValueError, TypeError)):
            ds[key] if field is None else ds[field][key]
        return
    req = ds[key] if field is None else ds.col(field)[key]
    assert req.shape == np.shape(target[key])
    got = reader.request(req, stage).get()
    expected = target[key]
    np.testing.assert_array_equal(got, expected)
    assert np.shape(got) == np.shape(expected) and np.asarray(got).dtype == np.asarray(expected).dtype
    assert isinstance(got, np.ndarray) == isinstance(expected, np.ndarray), f"{key!r}: a scalar where numpy's is not"
    if field is None and _pytables_numpy_like(key, full.ndim):
        with tables.open_file(path) as f:
            try:
                want = f.get_node(node)[key]
            except Exception:  # noqa: BLE001 - a form PyTables does not read; numpy's answer was checked
                return
        np.testing.assert_array_equal(got, want)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_several_fields_select_as_numpy_does_before_or_after_any_key(shared_reader: tuple, h5file: tuple,
                                                                      data: st.DataObject) -> None:
    reader, stages = shared_reader
    rows = h5file[1]["/table"]
    ds, stage = stages["/table"]
    order = data.draw(st.permutations(TABLE_DTYPE.names))
    names = list(order[: data.draw(st.integers(1, len(order)))])
    key = data.draw(index_for(rows.shape))
    if _is_index_error(lambda: rows[key]):
        return
    req = ds[names][key] if data.draw(st.booleans()) else ds[key][names]
    expected = rows[names][key]
    if data.draw(st.booleans()):  # then one of those fields, as a column
        name = data.draw(st.sampled_from(names))
        req, expected = req[name], expected[name]
    assert req.shape == np.shape(expected) and req.dtype == np.asarray(expected).dtype
    got = reader.request(req, stage).get()
    assert np.shape(got) == np.shape(expected) and np.asarray(got).dtype == np.asarray(expected).dtype
    assert isinstance(got, np.ndarray) == isinstance(expected, np.ndarray), f"{key!r}: a scalar where numpy's is not"
    np.testing.assert_array_equal(got, expected)


def test_one_element_with_an_ellipsis_is_a_0d_array_as_numpys(shared_reader: tuple, h5file: tuple) -> None:
    """``d[i, ...]`` is a 0-d array in numpy, ``d[i]`` a scalar; so are requests, chained or of a column."""
    reader, stages = shared_reader
    contents = h5file[1]
    one_d = next(n for n in sorted(contents) if contents[n].ndim == 1 and contents[n].dtype.names is None)
    ds, stage = stages[one_d]
    rows = contents[one_d]
    table, tstage = stages["/table"]
    records = contents["/table"]
    cases = [(ds[3, ...], rows[3, ...], stage), (ds[3], rows[3], stage), (ds[3][...], rows[3][...], stage),
             (ds[..., -1], rows[..., -1], stage), (table[2, ...]["a"], records[2, ...]["a"], tstage),
             (table[2]["a"], records[2]["a"], tstage)]
    for req, expected, st_ in cases:
        got = reader.request(req, st_).get()
        assert type(got) is type(expected) and np.shape(got) == np.shape(expected) == req.shape, (req, type(got))
        np.testing.assert_array_equal(got, expected)


def test_torch_tensors_index_as_numpy_takes_them(shared_reader: tuple, h5file: tuple) -> None:
    """A sampler's indices come as tensors (``torch.randperm(n)[:k]``, a mask): numpy takes any array-like, so a
    request does too, whatever their dtype, 0-d or not, with duplicates, alone or in a tuple."""
    torch = pytest.importorskip("torch")
    reader, stages = shared_reader
    for node in ("/table", *[n for n in h5file[1] if n != "/table"][:2]):
        data, (ds, stage) = h5file[1][node], stages[node]
        n = len(data)
        for key in (torch.tensor([7, 2, 7, n - 1]), torch.tensor([3, 1], dtype=torch.int32), torch.tensor(5),
                    torch.tensor([2, 0], dtype=torch.uint8), torch.arange(n) % 3 == 0, torch.tensor([], dtype=torch.long),
                    (torch.tensor([4, -1]),)):
            expected = data[key]
            got = reader.request(ds[key], stage).get()
            assert np.shape(got) == np.shape(expected) and np.asarray(got).dtype == np.asarray(expected).dtype, (node, key)
            np.testing.assert_array_equal(got, expected)


def test_a_readers_objects_are_neither_pickled_nor_copied_and_say_why(h5file: tuple, no_leaks: None) -> None:
    """A DataLoader started by spawn or forkserver pickles its dataset: "cannot pickle '_thread.lock' object" said
    nothing of why or what to do. Each object of a Reader refuses, naming itself; the Reader still works after."""
    import copy
    import pickle

    with Reader(h5file[0], n_procs=1) as reader:
        ds = reader.get_dataset("/table")
        stage, pool = ds.create_stage(4), ds.create_stage_pool(4, 2)
        future = reader.request(ds[:4], stage)
        for obj, name in ((reader, "a Reader"), (ds, "a Reader's Dataset"), (stage, "a Reader's Stage"),
                          (pool, "a Reader's StagePool"), (ds[1:3], "a Reader's Request"), (future, "a Reader's Future")):
            for how in (pickle.dumps, copy.copy, copy.deepcopy):
                with pytest.raises(TypeError, match=f"^{re.escape(name)} is tied to this process .*neither pickled "
                                                    "nor copied.*n_procs=0 in each worker"):
                    how(obj)
        np.testing.assert_array_equal(future.get(), h5file[1]["/table"][:4])


def test_zero_copy_views_are_writable_and_on_the_stage(shared_reader: tuple) -> None:
    reader, stages = shared_reader
    ds, stage = stages["/zlib3d"]
    for key in [np.s_[10:50], np.s_[[3, 17, 200]], np.s_[200:3:-5, ..., 1], 7]:
        req = ds[key]
        assert req.zero_copy
        with reader.request(req, stage).get_unsafe() as data:
            assert data.flags.writeable and not data.flags.owndata  # the stage is the caller's until the with ends
            base = data
            while isinstance(base.base, np.ndarray):
                base = base.base
            assert not isinstance(base.base, np.ndarray)  # the stage mapping, not a private copy
    req = ds[[17, 3, 3]]
    assert not req.zero_copy
    with reader.request(req, stage).get_unsafe() as data:
        assert data.flags.owndata or isinstance(data.base, np.ndarray) and data.base.flags.owndata  # gathered


def test_table_forms_of_the_established_api(h5file: tuple, no_leaks: None) -> None:
    path, contents = h5file
    rows = contents["/table"]
    with Reader(path, n_procs=2) as reader:
        ds = reader.get_dataset("/table")
        assert ds.shape == (700,) and ds.dtype == TABLE_DTYPE and len(ds) == 700 and ds.ndim == 1
        with ds.create_stage(64) as stage:
            np.testing.assert_array_equal(reader.request(ds["a"][30:35], stage).get(), rows["a"][30:35])
            np.testing.assert_array_equal(reader.request(ds.col("v")[30:35, ..., :2], stage).get(), rows["v"][30:35, ..., :2])
            np.testing.assert_array_equal(reader.request(ds[30:35]["v"], stage).get(), rows[30:35]["v"])
            np.testing.assert_array_equal(reader.request(ds[[5, 1, 9]]["b"], stage).get(), rows[[5, 1, 9]]["b"])
            np.testing.assert_array_equal(reader.request(ds[np.array([3, 17, 600])], stage).get(), rows[[3, 17, 600]])
            np.testing.assert_array_equal(reader.request(ds.read(10, 40, 3, field="a"), stage).get(), rows["a"][10:40:3])
            np.testing.assert_array_equal(reader.request(ds.read_coordinates([4, 2], field="b"), stage).get(), rows["b"][[4, 2]])
            record = reader.request(ds[5], stage).get()
            assert isinstance(record, np.void) and record == rows[5]
            assert reader.request(ds["a"][5], stage).get() == 5
            mask = rows["a"] % 13 == 0
            np.testing.assert_array_equal(reader.request(ds[mask], stage).get(), rows[mask])
            with tables.open_file(path) as f:
                np.testing.assert_array_equal(reader.request(ds[mask], stage).get(), f.root.table[mask])


# -- errors at request time ---------------------------------------------------------


def test_bad_requests_fail_before_any_reader_is_involved(h5file: tuple, no_leaks: None) -> None:
    path, _ = h5file
    with Reader(path, n_procs=1) as reader:
        table = reader.get_dataset("/table")
        arr = reader.get_dataset("/zlib3d")
        with pytest.raises(KeyError, match="no field 'nope'"):
            table["nope"]
        with pytest.raises(KeyError, match="no field 'nope'"):
            table.col("nope")
        with pytest.raises(KeyError):
            arr["a"]  # not a table
        with pytest.raises(KeyError, match="nope"):
            table[["a", "nope"]]
        with pytest.raises(ValueError, match="duplicate field"):
            table[["a", "a"]]
        with pytest.raises(IndexError, match="no fields"):
            arr[["a"]]
        with pytest.raises(IndexError, match="several in a list"):
            table["a", "b"]  # h5py's form; numpy's is a list
        with pytest.raises(ValueError, match="no field of name 'v'"):
            table[["a", "b"]]["v"]
        with pytest.raises(IndexError, match="out of bounds for axis 0 with size 300"):
            arr[300]
        with pytest.raises(IndexError, match="out of bounds for axis 2 with size 3"):
            arr[:, :, [0, 3]]
        with pytest.raises(IndexError, match="too many indices"):
            arr[1, 2, 0, 0]
        with pytest.raises(IndexError, match="out of bounds for axis 0 with size 4"):
            arr[1:5][4]  # indexes the result of arr[1:5]
        with pytest.raises(KeyError):
            reader.get_dataset("/missing")
        with arr.create_stage(10) as stage:
            with pytest.raises(multitables.SharedMemoryError, match="reads 11 rows .* the stage holds 480 bytes"):
                reader.request(arr[0:11], stage)
            with pytest.raises(ValueError, match="reads 11 rows"):
                reader.request(arr[[0, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23]], stage)
            assert reader.request(arr[::30], stage).get().shape == (10, 4, 3)  # 10 rows fit
            with pytest.raises(TypeError):
                reader.request(arr, stage)  # type: ignore[arg-type]
            fut = reader.request(arr[0:5], stage)
            with pytest.raises(RuntimeError, match="still holds the data of an earlier request"):
                reader.request(arr[0:5], stage)
            fut.release()
            reader.request(arr[0:5], stage).get()
            with Reader(path, n_procs=1) as other:
                with pytest.raises(ValueError, match="another Reader"):
                    other.request(arr[0:5], stage)
    with pytest.raises(FileNotFoundError):
        Reader(path.parent / "nope.h5")
    with pytest.raises(ValueError, match="engine"):
        Reader(path, engine="nope")


def test_data_is_taken_once_and_proxies_raise_after_release(h5file: tuple, no_leaks: None) -> None:
    path, contents = h5file
    data = contents["/blosc1d"]
    with Reader(path, n_procs=2) as reader:
        ds = reader.get_dataset("/blosc1d")
        with ds.create_stage(100) as stage:
            fut = reader.request(ds[10:20], stage)
            with fut.get_proxy() as proxy:
                assert len(proxy) == 10 and proxy.shape == (10,)
                np.testing.assert_array_equal(np.asarray(proxy), data[10:20])
                assert proxy[3] == data[13]
                np.testing.assert_array_equal(proxy + 1, data[10:20] + 1)
                np.testing.assert_array_equal(np.sqrt(np.abs(proxy)), np.sqrt(np.abs(data[10:20])))
                part = proxy[2:5]
                assert isinstance(part, DataProxy) and isinstance(part, np.ndarray) and isinstance(proxy, np.ndarray)
                assert bytes(proxy) == data[10:20].tobytes()  # as 2.x's proxy (a wrapt ObjectProxy) passed
                assert proxy.sum() == data[10:20].sum()
            assert not isinstance(proxy, np.ndarray) and isinstance(proxy, DataProxy)
            from multitables.resource_wrapper import ReleasedResourceError  # 2.x's name
            for use in (lambda: proxy[0], lambda: proxy.sum(), lambda: proxy + 1, lambda: np.asarray(proxy), lambda: part[0],
                        lambda: len(proxy), lambda: bytes(proxy)):
                with pytest.raises(ReleasedResourceError, match="released") as info:
                    use()
                assert isinstance(info.value, multitables.StreamClosedError)
            assert "released" in repr(proxy)
            with pytest.raises(multitables.StreamClosedError, match="already released"):
                fut.get()
            fut = reader.request(ds[[4, 2]], stage)
            assert fut.get_direct(lambda d: d.tolist()) == data[[4, 2]].tolist()
            got = reader.request(ds[0:10], stage).get()
            assert got.flags.writeable and got.flags.owndata
            fut = reader.request(ds[0:10], stage)
            assert fut.wait(5) and fut.done()
            np.testing.assert_array_equal(fut.get(), data[0:10])
            # Taken again inside its with: refused, the stage still held, the view still the request's rows.
            fut = reader.request(ds[30:40], stage)
            with fut.get_unsafe() as rows:
                for take in (fut.get, lambda: fut.get_direct(len), lambda: fut.get_proxy().__enter__()):
                    with pytest.raises(RuntimeError, match="is lent to a with still open: it is taken once"):
                        take()
                with pytest.raises(RuntimeError, match="the stage still holds the data of an earlier request"):
                    reader.request(ds[50:60], stage)
                np.testing.assert_array_equal(rows, data[30:40])
            with pytest.raises(multitables.StreamClosedError, match="already released"):
                fut.get()


def test_many_requests_in_flight_over_stage_pools_and_datasets(h5file: tuple, no_leaks: None) -> None:
    path, contents = h5file
    rng = np.random.default_rng(5)
    with Reader(path, n_procs=2) as reader:
        names = ["/zlib3d", "/blosc1d", "/plain2d", "/table"]
        sets = {n: reader.get_dataset(n) for n in names}
        pools = {n: ds.create_stage_pool(32, 3) for n, ds in sets.items()}
        futures = []
        for i in range(40):
            name = names[i % len(names)]
            n = len(sets[name])
            idx = rng.choice(n, size=rng.integers(0, 33), replace=True)
            if i % 3 == 0:
                idx = np.sort(np.unique(idx))
            # More requests than stages: the pool waits for a stage, so take some data as we go.
            if len(futures) >= 8:
                old_name, old_idx, old = futures.pop(0)
                np.testing.assert_array_equal(old.get(), contents[old_name][old_idx])
            futures.append((name, idx, reader.request(sets[name][idx], pools[name])))
        for name, idx, fut in reversed(futures):  # out of order
            np.testing.assert_array_equal(fut.get(), contents[name][idx])
        for pool in pools.values():
            pool.close()


def test_requests_one_at_a_time_go_to_the_reader_that_answered_the_last_and_leave_no_wake_ups(
    h5file: tuple, no_leaks: None
) -> None:
    """NOTE [waiting awake]: a request of one share made once the last is done goes to the last one's reader (the
    one awake); requests in flight go round the readers; wake-ups of shares seen done without them are spent."""
    path, contents = h5file
    with Reader(path, n_procs=3) as reader:
        ds = reader.get_dataset("/blosc1d")
        stage = ds.create_stage(4)
        futures = []
        for i in range(60):
            futures.append(reader.request(ds[i : i + 2], stage))
            np.testing.assert_array_equal(futures[-1].get(), contents["/blosc1d"][i : i + 2])
        assert {tuple(f._readers) for f in futures} == {tuple(futures[0]._readers)}
        channel = reader._core.pool.channels[stage._stage_id]
        assert channel.get_value() <= 1  # at most the last share's, if it came after its status
        stages = [ds.create_stage(4) for _ in range(3)]
        in_flight = [reader.request(ds[i], s) for i, s in enumerate(stages)]
        assert sorted(f._readers[0] for f in in_flight) == [0, 1, 2]
        assert [f.get() for f in in_flight] == list(contents["/blosc1d"][:3])


def test_stage_pool_from_threads_and_timeout(h5file: tuple, no_leaks: None) -> None:
    path, contents = h5file
    data = contents["/zlib3d"]
    with Reader(path, n_procs=2) as reader:
        ds = reader.get_dataset("/zlib3d")
        with ds.create_stage_pool(4, 3) as pool:
            results: dict[int, np.ndarray] = {}
            futures: "list[tuple[int, Future]]" = []
            lock = threading.Condition()

            def loader() -> None:
                for i in range(60):
                    fut = reader.request(ds[i : i + 4], pool)
                    with lock:
                        futures.append((i, fut))
                        lock.notify()

            t = threading.Thread(target=loader)
            t.start()
            for _ in range(60):
                with lock:
                    while not futures:
                        lock.wait()
                    i, fut = futures.pop(0)
                results[i] = fut.get()
            t.join()
            for i, got in results.items():
                np.testing.assert_array_equal(got, data[i : i + 4])
            held = [reader.request(ds[0:4], pool) for _ in range(3)]
            with pytest.raises(TimeoutError, match="no stage of the pool came free"):
                reader.request(ds[0:4], pool, timeout=0.2)
            del held  # dropped futures give their stages back
            reader.request(ds[0:4], pool, timeout=5).get()


# -- failures --------------------------------------------------------------------------


def _corrupt_chunk(path: Path, node: str, chunk_index: int) -> None:
    with h5py.File(path, "r") as f:
        info = f[node].id.get_chunk_info(chunk_index)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 2)
        fh.write(b"\xff" * max(1, info.size - 4))


def test_a_read_error_fails_its_future_and_the_others_carry_on(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "bad.h5"
    data = np.arange(4000, dtype=np.float64).reshape(1000, 4)
    with tables.open_file(path, "w") as f:
        f.create_carray("/", "data", obj=data, filters=tables.Filters(5, "zlib"), chunkshape=(100, 4))
    _corrupt_chunk(path, "/data", 3)  # rows 300..399
    for engine in ("h5py", "tables"):
        with Reader(path, n_procs=2, engine=engine) as reader:
            ds = reader.get_dataset("/data")
            pool = ds.create_stage_pool(200, 4)
            good1 = reader.request(ds[[5, 150, 990]], pool)
            bad = reader.request(ds[250:450], pool)
            good2 = reader.request(ds[[0, 100, 200, 500, 900]], pool)
            with pytest.raises(multitables.ReaderError) as info:
                bad.get()
            err = info.value
            assert isinstance(err, Exception) and err.path == "/data" and err.filename == str(path)
            assert "Original traceback" in str(err) and err.rows is not None
            with pytest.raises(multitables.ReaderError):
                bad.get()  # the same error again, not a hang
            bad.release()
            np.testing.assert_array_equal(good1.get(), data[[5, 150, 990]])
            np.testing.assert_array_equal(good2.get(), data[[0, 100, 200, 500, 900]])
            np.testing.assert_array_equal(reader.request(ds[400:600], pool).get(), data[400:600])
            pool.close()


def _children_of(reader: Reader) -> list[psutil.Process]:
    return [psutil.Process(pid) for pid in reader.reader_pids]


def test_a_reader_killed_mid_request_fails_its_futures_only_then_the_reader(h5file: tuple, no_leaks: None) -> None:
    path, contents = h5file
    data = contents["/blosc1d"]
    with Reader(path, n_procs=2) as reader:
        ds = reader.get_dataset("/blosc1d")
        pool = ds.create_stage_pool(10, 8)
        victim = reader.reader_pids[0]
        os.kill(victim, signal.SIGSTOP)  # its shares wait in its inbox
        futures = [reader.request(ds[i * 10 : i * 10 + 1], pool) for i in range(6)]  # one share each: both readers
        os.kill(victim, signal.SIGKILL)
        outcomes = []
        for i, fut in enumerate(futures):
            try:
                np.testing.assert_array_equal(fut.get(timeout=30), data[i * 10 : i * 10 + 1])
                outcomes.append("ok")
            except multitables.ReaderError as exc:
                assert exc.pid == victim and exc.exitcode == -signal.SIGKILL
                assert "SIGKILL" in str(exc)
                outcomes.append("died")
        assert "ok" in outcomes and "died" in outcomes
        with pytest.raises(multitables.ReaderError, match="cannot take more requests"):
            reader.request(ds[0:1], pool)
        pool.close()


@pytest.mark.parametrize("take", ["get", "get_unsafe", "get_proxy", "get_direct"])
@pytest.mark.parametrize("pooled", [False, True], ids=["stage", "pool"])
def test_a_future_whose_data_came_before_stop_raises_stream_closed_not_a_freed_map_error(
    h5file: tuple, no_leaks: None, take: str, pooled: bool
) -> None:
    path, _ = h5file
    reader = Reader(path, n_procs=2)
    ds = reader.get_dataset("/zlib3d")
    stage = ds.create_stage_pool(10, 2) if pooled else ds.create_stage(10)
    fut = reader.request(ds[:10], stage)
    assert fut.wait(30) and fut.done()
    reader.stop()  # frees every stage, this one's data with it (documented)
    assert fut.done()
    with pytest.raises(multitables.StreamClosedError, match="stopped .* before this future's data was got"):
        if take == "get":
            fut.get()
        elif take == "get_direct":
            fut.get_direct(np.sum)
        else:
            with getattr(fut, take)():
                pass
    fut.release()


def test_get_times_out_and_stop_ends_pending_futures(h5file: tuple, no_leaks: None) -> None:
    path, _ = h5file
    reader = Reader(path, n_procs=1)
    ds = reader.get_dataset("/zlib3d")
    stage = ds.create_stage(300)
    (pid,) = reader.reader_pids
    os.kill(pid, signal.SIGSTOP)
    try:
        fut = reader.request(ds[:], stage)
        with hang_guard(GONE_WITHIN, "get(timeout=0.3) of a stopped reader"), pytest.raises(TimeoutError):
            fut.get(timeout=0.3)
        assert not fut.done() and not fut.wait(0.1)
    finally:
        os.kill(pid, signal.SIGCONT)
    fut.get()  # read once the reader goes on
    waiter_error: list[BaseException] = []
    os.kill(pid, signal.SIGSTOP)
    pending = reader.request(ds[:], stage)  # made while the reader is stopped: it cannot be read before stop()

    def waiter() -> None:
        try:
            pending.get()
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            waiter_error.append(exc)

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    time.sleep(0.2)
    reader.stop()  # terminates the stopped pid, ends the waiting future
    t.join(10)
    assert not t.is_alive()
    assert waiter_error and isinstance(waiter_error[0], multitables.QueueClosedException)
    assert "stopped" in str(waiter_error[0])
    assert reader.closed and stage.closed
    with pytest.raises(multitables.StreamClosedError):
        reader.get_dataset("/zlib3d")
    reader.stop()  # idempotent
    reader.close()


def test_readers_end_and_leave_nothing_when_the_consumer_is_killed(h5file: tuple, tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import own_segments

    path, _ = h5file
    script = tmp_path / "consumer.py"
    script.write_text(
        "import sys, time\n"
        "from multitables.reader import Reader\n"
        f"reader = Reader({str(path)!r}, n_procs=2)\n"
        "ds = reader.get_dataset('/zlib3d')\n"
        "pool = ds.create_stage_pool(300, 2)\n"
        "future = reader.request(ds[::2], pool)\n"
        "print(' '.join(map(str, reader.reader_pids)), flush=True)\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(multitables.__file__).parent.parent))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(pids) == 2
        mine = {s for s in own_segments() if s.startswith(f"multitables_{proc.pid}_")}
        assert not mine, "every segment is unlinked as soon as the readers have it mapped"
        proc.kill()
        proc.wait(10)
        alive = lambda: any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)  # noqa: E731
        wait_until(lambda: not alive(), GONE_WITHIN, "the readers end after their consumer")
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert not {s for s in own_segments() if s.startswith(f"multitables_{proc.pid}_")}


def test_dropping_everything_shuts_down(h5file: tuple, no_leaks: None) -> None:
    import gc

    path, contents = h5file
    reader = Reader(path, n_procs=2)
    ds = reader.get_dataset("/plain2d")
    stage = ds.create_stage(20)
    fut = reader.request(ds[[1, 2, 3]], stage)
    pids = reader.reader_pids
    del reader, ds, stage, fut
    gc.collect()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_dropping_a_reader_with_notify_shuts_it_down_and_notifies_the_end(h5file: tuple, no_leaks: None) -> None:
    import gc

    path, contents = h5file
    ended = threading.Event()
    seen: list = []

    def notify(item: object) -> None:  # keeps no future
        seen.append(item is multitables.QueueClosed)
        if item is multitables.QueueClosed:
            ended.set()

    reader = Reader(path, n_procs=2, notify=notify)
    ds = reader.get_dataset("/plain2d")
    stage = ds.create_stage(20)
    np.testing.assert_array_equal(reader.request(ds[[1, 2, 3]], stage).get(), contents["/plain2d"][[1, 2, 3]])
    pids = reader.reader_pids
    del reader, ds, stage
    gc.collect()
    assert ended.wait(30), "a dropped reader's notify hears of its end"
    assert seen == [False, True]
    wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids),
               GONE_WITHIN, "the readers of a dropped reader end")
    wait_until(lambda: not any(t.name == "multitables-notify" for t in threading.enumerate()), GONE_WITHIN,
               "its notify thread ends")


def test_a_stage_released_early_is_reused_only_once_its_readers_are_done(h5file: tuple, no_leaks: None) -> None:
    path, contents = h5file
    data = contents["/zlib3d"]
    with Reader(path, n_procs=2) as reader:
        ds = reader.get_dataset("/zlib3d")
        with ds.create_stage(300) as stage:
            for _ in range(5):
                reader.request(ds[::-1], stage).release()  # dropped while both readers write the stage
                np.testing.assert_array_equal(reader.request(ds[[0, 299]], stage).get(), data[[0, 299]])


def test_stages_can_be_closed_and_reopened_many_times(h5file: tuple, no_leaks: None) -> None:
    path, contents = h5file
    with Reader(path, n_procs=2, max_stages=2) as reader:
        ds = reader.get_dataset("/blosc1d")
        for i in range(6):
            with ds.create_stage(8) as stage:
                np.testing.assert_array_equal(reader.request(ds[i : i + 8], stage).get(), contents["/blosc1d"][i : i + 8])
        keep = [ds.create_stage(1), ds.create_stage(1)]
        with pytest.raises(RuntimeError, match="max_stages"):
            ds.create_stage(1)
        keep.pop().close()
        ds.create_stage(1).close()


def test_spawn(h5file: tuple, no_leaks: None) -> None:
    path, contents = h5file
    with Reader(path, n_procs=2, start_method="spawn") as reader:
        ds = reader.get_dataset("/table")
        with ds.create_stage_pool(50, 5) as pool:
            futs = [reader.request(ds.col("v")[[i, i + 40, i + 7]], pool) for i in range(5)]
            for i, fut in enumerate(futs):
                np.testing.assert_array_equal(fut.get(), contents["/table"]["v"][[i, i + 40, i + 7]])


def test_a_stage_too_large_for_shm_gets_advice_that_fits_a_stage(
    h5file: tuple, no_leaks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from multitables._shm import space as _shm

    path, contents = h5file
    with Reader(path, n_procs=1) as reader:
        ds = reader.get_dataset("/zlib3d")
        monkeypatch.setattr(_shm, "shm_free_bytes", lambda: 4096)
        with pytest.raises(multitables.ShmSpaceError) as info:
            ds.create_stage(300)
    text = str(info.value)
    assert "The stage needs" in text and "smaller stage" in text and "--shm-size" in text
    assert "read_ahead" not in text and "block_size" not in text  # the Reader has neither


def test_a_stage_takes_of_shm_its_data_and_row_positions_only_as_requests_need_them(
    h5file: tuple, no_leaks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage has room for as many scattered rows' positions as 8-byte rows would fill its data: for most datasets
    as much again as the data. Reserved with it, a stage of one 4 MiB row needed 8 MiB of /dev/shm, refused in an
    8 MiB one. The positions' pages now come when a request first needs them (NOTE [stage room]); where /dev/shm
    has none left, that request is a ShmSpaceError before any reader is involved, and the stage serves on."""
    import errno

    from multitables._shm import segment as _seg
    from multitables._shm.stagemap import StageLayout

    if not _seg.can_populate():
        pytest.skip("the kernel lacks MADV_POPULATE_WRITE: a stage is reserved whole")
    path, contents = h5file
    data, scattered = contents["/zlib3d"], [5, 77, 3, 200]
    layout = StageLayout(300 * 48 // 8, 300 * 48)  # 300 rows of 48 bytes: the positions take as much as the data
    positions = layout.data_offset - layout.rows_offset
    checked: list[int] = []
    real_check = _seg.check_space
    monkeypatch.setattr(_seg, "check_space", lambda n, what: (checked.append(n), real_check(n, what))[1])
    real_madvise = _seg._madvise

    def full(buf: object, advice: int, offset: int, nbytes: int) -> None:
        raise OSError(errno.EFAULT, "Bad address")  # what MADV_POPULATE_WRITE says of a full tmpfs

    with Reader(path, n_procs=1) as reader:
        ds = reader.get_dataset("/zlib3d")
        checked.clear()
        with ds.create_stage(300) as stage:
            assert checked == [layout.nbytes - positions] and positions >= 300 * 48  # the header and the data
            monkeypatch.setattr(_seg, "_madvise", full)
            with pytest.raises(multitables.ShmSpaceError) as info:
                reader.request(ds[scattered], stage)
            text = str(info.value)
            assert text.startswith("The stage's row positions need 0.0 MiB (4,096 bytes) of shared memory")
            assert "fewer scattered rows a request (a slice needs none)" in text and "--shm-size" in text
            np.testing.assert_array_equal(reader.request(ds[10:20], stage).get(), data[10:20])  # no positions
            monkeypatch.setattr(_seg, "_madvise", real_madvise)
            np.testing.assert_array_equal(reader.request(ds[scattered], stage).get(), data[scattered])


def test_n_procs_is_capped_at_four_readers_per_usable_cpu(
    h5file: tuple, no_leaks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, contents = h5file
    monkeypatch.setattr("multitables._plan.readers.available_cpus", lambda: 1)
    with Reader(path, n_procs=40) as reader:
        assert reader.n_procs == len(reader.reader_pids) == 4
        assert reader.reader_pids == reader.reader_pids  # the older name still answers
        ds = reader.get_dataset("/zlib3d")
        np.testing.assert_array_equal(reader.request(ds[::7], ds.create_stage(300)).get(), contents["/zlib3d"][::7])


def test_keys_at_numpys_edges_and_a_stopped_readers_pids(tmp_path: Path, no_leaks: None) -> None:
    """An empty float index array is refused and an empty list taken, as numpy does; a step past every axis selects
    one row, as numpy's; a reader stopped still names its readers' pids."""
    path = tmp_path / "a.h5"
    data = np.arange(20, dtype=np.int32)
    with h5py.File(path, "w") as f:
        f["a"] = data
    reader = Reader(path, n_procs=1)
    pids = reader.reader_pids
    with reader:
        ds = reader.get_dataset("a")
        with ds.create_stage(20) as stage:
            with pytest.raises(IndexError, match="integer \\(or boolean\\) type"):
                ds[np.array([], dtype=float)]
            assert reader.request(ds[[]], stage).get().shape == data[[]].shape == (0,)
            for key in (slice(None, None, 2**64), slice(None, None, -(2**70))):
                np.testing.assert_array_equal(reader.request(ds[key], stage).get(), data[key])
    assert reader.reader_pids == pids and len(pids) == 1


def test_a_table_pytables_alone_reads_is_found_by_a_relative_path_and_a_query_on_an_open_column_says_why_not(
    tmp_path: Path, no_leaks: None
) -> None:
    path = tmp_path / "t.h5"

    class Row(tables.IsDescription):
        t = tables.Time64Col()  # h5py has no numpy type for it: PyTables maps it
        k = tables.Int32Col()

    with tables.open_file(path, "w") as f:
        table = f.create_table("/", "tt", Row)
        table.append([(float(i), i) for i in range(100)])
    with Reader(path, n_procs=1) as reader, tables.open_file(path) as f:
        for name in ("/tt", "tt"):
            ds = reader.get_dataset(name)
            with ds.create_stage(100) as stage:
                np.testing.assert_array_equal(reader.request(ds["k"][5:9], stage).get(), np.arange(5, 9))
        with pytest.raises(TypeError, match="condvars must be plain values or arrays"):
            reader.get_dataset("/tt").where("x > 3", condvars={"x": f.root.tt.cols.k})


def test_read_sorted_gives_pytables_rows_and_shapes_for_any_range(tmp_path: Path, no_leaks: None) -> None:
    """PyTables' ranges of a sorted read are not Python's (negative steps, negative bounds): the shape is known
    before the read for the whole table only, and the future's shape is the result's."""
    path = tmp_path / "sorted.h5"
    with tables.open_file(path, "w") as f:
        table = f.create_table("/", "g", {"c": tables.Int32Col(), "v": tables.Float64Col()})
        table.append([(int(x), float(i)) for i, x in enumerate(np.random.default_rng(1).permutation(100))])
        table.cols.c.create_csindex()
    ranges = [{}, dict(start=5, stop=50, step=-1), dict(start=50, stop=5, step=-3), dict(stop=-90, step=2),
              dict(start=3, stop=40, step=4)]
    with Reader(path, n_procs=1) as reader, tables.open_file(path) as f:
        ds = reader.get_dataset("/g")
        with ds.create_stage(100) as stage:
            for kw in ranges:
                req = ds.read_sorted("c", **kw)
                want = f.root.g.read_sorted("c", **kw)
                assert req.shape == ((100,) if not kw else None)
                fut = reader.request(req, stage)
                got = fut.get()
                np.testing.assert_array_equal(got, want)
                assert fut.shape == got.shape == want.shape, kw


def test_a_reader_says_how_many_readers_it_has(h5file: tuple, no_leaks: None) -> None:
    path = h5file[0]
    for n, said in ((1, "1 reader"), (2, "2 readers")):
        with multitables.Reader(path, n_procs=n) as reader:
            assert repr(reader) == f"<multitables.Reader {str(path)!r} ({said})>"
        assert repr(reader) == f"<multitables.Reader {str(path)!r} (closed)>"


def _documented_rows_dataset() -> type:
    """The map-style Dataset that docs/random_access.rst shows, exactly as written there."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "random_access.rst").read_text()
    block = page.split("\nA PyTorch map-style Dataset\n", 1)[1].split(".. code-block:: python\n", 1)[1]
    space: dict = {}
    exec(textwrap.dedent(block.split("\n   if __name__ == ", 1)[0]), space)
    return space["RowsDataset"]


@pytest.fixture
def xy_file(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """/X: 300 compressed rows of 4 float32 in chunks of 16; /y: their row numbers."""
    path = tmp_path / "xy.h5"
    x, y = np.arange(1200, dtype="<f4").reshape(300, 4), np.arange(300, dtype="<i8")
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=x, chunks=(16, 4), compression="gzip")
        f.create_dataset("y", data=y, chunks=(64,))
    return path, x, y


def test_the_documented_map_style_dataset_loads_every_row_once_an_epoch(xy_file: tuple, no_leaks: None) -> None:
    """A DataLoader over the docs' Dataset, by two workers (forked: each makes its Reader, n_procs=0, at its first
    sample), shuffled, by a BatchSampler and by a DistributedSampler's ranks: each batch's rows are h5py's, dtype
    included, and an epoch has every row once."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler

    path, x, y = xy_file
    dataset = _documented_rows_dataset()(path)
    try:
        def epoch(loader: "DataLoader") -> list[int]:
            seen = []
            for xb, yb in loader:
                assert xb.dtype == torch.float32 and yb.dtype == torch.int64 and len(yb) <= 64
                np.testing.assert_array_equal(xb.numpy(), x[yb.numpy()])
                seen += yb.tolist()
            return seen

        workers = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2, multiprocessing_context="fork")
        assert sorted(epoch(workers)) == y.tolist() and dataset.reader is None  # the workers' Readers were theirs
        shuffled = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=0)
        orders = [epoch(shuffled) for _ in range(2)]
        assert all(sorted(order) == y.tolist() for order in orders) and orders[0] != orders[1]
        assert dataset.reader.n_procs == 0 and dataset.reader.reader_pids == []
        by_batches = DataLoader(dataset, batch_sampler=BatchSampler(RandomSampler(dataset), 50, drop_last=False))
        assert sorted(epoch(by_batches)) == y.tolist()
        ranks = [epoch(DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset, 2, rank)))
                 for rank in range(2)]
        assert sorted(ranks[0] + ranks[1]) == y.tolist()
        assert dataset[7][1] == 7 and np.array_equal(dataset[7][0], x[7])
    finally:
        if dataset.reader is not None:
            dataset.reader.close(wait=True)


def test_a_reader_pickled_for_spawned_workers_says_to_make_one_in_each(xy_file: tuple, no_leaks: None) -> None:
    """A Reader pickled for a DataLoader's spawned (or forkserver) workers (one made in a Dataset's ``__init__``)
    is refused, saying what works: a Reader with n_procs=0 made lazily in each worker, as the docs' Dataset does.
    Made in a worker with readers asked for, or forked into one with its readers: the same words, test_forks.py (a
    daemonic process as a worker is; a real worker that raised costs 5 s of torch's shutdown, for any Dataset)."""
    path, x, y = xy_file
    with Reader(path, n_procs=0) as reader:
        with pytest.raises(TypeError) as pickled:
            pickle.dumps(reader)  # what pickling the dataset for a spawned worker comes to
    message = str(pickled.value)
    assert "spawn or forkserver" in message and "stream" not in message, message
    assert "make a Reader with n_procs=0 in each worker (the default there), which reads in the worker itself: " \
           "lazily, in the Dataset's __getitem__ on first use or in worker_init_fn" in message, message


def test_a_request_waiting_for_a_stage_when_another_thread_stops_the_reader_is_told_it_was_stopped(
    h5file: tuple, no_leaks: None
) -> None:
    """A server's thread waiting in ``request`` for a pool's stage while another stops the Reader (at shut-down) is
    told the Reader was stopped, not that a stage it never closed is closed."""
    path, _ = h5file
    reader = Reader(path, n_procs=1)
    ds = reader.get_dataset("/zlib3d")
    pool = ds.create_stage_pool(10, 1)
    reader.request(ds[:10], pool).get()  # the stage is free again, its last request read

    class StopsWhileWaiting:
        """The pool's queue of free stages, on which ``request`` waits: the stop lands then."""

        def __init__(self, free: Any) -> None:
            self.free = free

        def get(self, timeout: float) -> Any:
            reader.stop()
            return self.free.get(timeout=timeout)

        def put(self, stage: Any) -> None:
            self.free.put(stage)

    pool._free = StopsWhileWaiting(pool._free)  # type: ignore[assignment]
    with pytest.raises(multitables.StreamClosedError, match=r"was stopped \(stop\(\), or it was garbage-collected\)"):
        reader.request(ds[:10], pool)
