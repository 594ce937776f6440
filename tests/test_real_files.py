"""Real files (issue #15): what h5py and PyTables write, every engine reads as h5py does, or refuses up front.

Each test writes a small file with h5py or PyTables (or takes one PyTables
ships) and reads it with every engine ("auto", "chunks", "h5py", "tables"),
directly (the queue's blocks), as a generator (one reader process) and
through a Reader (all rows, then rows [n-1, 0]).
"""

from __future__ import annotations

import ctypes
import itertools
import re
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np
import pytest
import tables
from hypothesis import given, settings
from hypothesis import strategies as st

import multitables
from _guards import hang_guard
from _readall import ENGINES, MissingFilterError, h5py_reference, live_children, read_all

#: PyTables' own test files: real inputs written by others (never copied into this repository).
TABLES_TESTS = Path(tables.__file__).parent / "tests"
#: Guards against a hang only.
TEST_GUARD = 60.0


@pytest.fixture(autouse=True)
def _guard(request: pytest.FixtureRequest) -> Iterator[None]:
    with hang_guard(TEST_GUARD, request.node.name):
        yield


def assert_reads_as_h5py(path: Path, name: str, fields: "tuple[str, ...]" = (), may_refuse: "tuple[str, ...]" = ()) -> None:
    """Every engine, every mode: the rows h5py's ``ds[()]`` has (and each column, as ``ds.fields(col)[()]``).

    The engines in ``may_refuse`` may instead refuse up front (a MultitablesError naming the node).
    """
    tables_ = [read_all(path, name, h5py_reference(path, name))]
    tables_ += [read_all(path, name, h5py_reference(path, name, col), field=col) for col in fields]
    problems = [line for table in tables_ for line in table.not_read(may_refuse, naming=name)]
    assert not problems, "\n".join(problems)


def pytables_file(name: str) -> Path:
    path = TABLES_TESTS / name
    if not path.exists():
        pytest.skip(f"this tables wheel ships no {name}")
    return path


# -- 1. an extendable dimension that is not the first ---------------------------


def test_extendable_dimension_not_first(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "maxshape.h5"
    data = np.arange(100, dtype="<i8").reshape(10, 10)
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, maxshape=(10, None))  # PyTables' main dimension would be 1
    assert_reads_as_h5py(path, "/data")


# -- 2. storage never written ---------------------------------------------------


def test_contiguous_storage_never_written_reads_the_fill_value(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "unwritten.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", shape=(20, 3), dtype="<i4", fillvalue=7)
        assert ds.chunks is None and ds.id.get_storage_size() == 0
        assert (ds[()] == 7).all()
    assert_reads_as_h5py(path, "/data")


# -- 3. fixed-length strings that are not null-padded ---------------------------


def _string_dataset(path: Path, pad: int, stored: list[bytes]) -> None:
    """A dataset of 7-byte strings with ``pad``, holding exactly the bytes ``stored`` (written with no conversion)."""
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(7)
    tid.set_strpad(pad)
    raw = np.array(stored, "S7")
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", shape=raw.shape, dtype=h5py.Datatype(tid))
        ds.id.write(h5py.h5s.ALL, h5py.h5s.ALL, raw, mtype=tid)
        back = np.empty_like(raw)
        ds.id.read(h5py.h5s.ALL, h5py.h5s.ALL, back, mtype=tid)
        assert [bytes(b).ljust(7, b"\0") for b in back] == [s.ljust(7, b"\0") for s in stored]


def test_space_padded_strings(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "spacepad.h5"
    _string_dataset(path, h5py.h5t.STR_SPACEPAD, [b"sweet  ", b"ab     ", b"sevench", b"  lead "])
    assert list(h5py_reference(path, "/data")) == [b"sweet", b"ab", b"sevench", b"  lead"]
    assert_reads_as_h5py(path, "/data")


def test_null_terminated_strings_end_at_the_first_nul(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "nullterm.h5"
    _string_dataset(path, h5py.h5t.STR_NULLTERM, [b"ab\0xyz\0", b"sweet\0\0", b"sevench", b"\0abcdef"])
    assert list(h5py_reference(path, "/data")) == [b"ab", b"sweet", b"sevench", b""]
    assert_reads_as_h5py(path, "/data")


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 30), st.integers(1, 4), st.integers(1, 20), st.integers(0, 3), st.data())
def test_null_terminated_strings_in_place_are_every_byte_zeroed_from_the_first_nul(
        n: int, count: int, size: int, offset: int, data: st.DataObject) -> None:
    """``deliver_strings`` on elements holding ``count`` strings of ``size`` bytes after ``offset`` other bytes:
    what HDF5 delivers (each string zeroed from its first NUL), the other bytes untouched; with NULs and letters
    drawn so that most strings are clean and some hold bytes after a NUL."""
    from multitables._io.strings import deliver_strings

    width = offset + count * size
    raw = np.array(data.draw(st.lists(st.sampled_from([0, 0, 0, 97, 98]), min_size=n * width, max_size=n * width)),
                   np.uint8).reshape(n, width)
    want = raw.copy()
    for row in want:
        for k in range(count):
            string = row[offset + k * size : offset + (k + 1) * size]
            nul = np.flatnonzero(string == 0)
            if len(nul):
                string[nul[0]:] = 0
    got = raw.copy()
    deliver_strings(got.view(f"V{width}").reshape(n), ((offset, size, count, "nullterm"),))
    np.testing.assert_array_equal(got, want)


# -- 4. an undefined fill value -------------------------------------------------


def _h5py_hdf5() -> ctypes.CDLL:
    """The HDF5 library h5py itself loaded (ids from h5py are valid there)."""
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if "/libhdf5" in line and "_hl" not in line})
    h5py_dir = Path(h5py.__file__).resolve().parent
    mine = [lib for lib in libs if Path(lib).parent.name == "h5py.libs" and Path(lib).parent.parent == h5py_dir.parent]
    if len(mine) != 1:
        pytest.skip(f"cannot tell which of the loaded HDF5 libraries is h5py's: {libs}")
    lib = ctypes.CDLL(mine[0])
    lib.H5Pset_fill_value.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.H5Pset_fill_value.restype = ctypes.c_int
    return lib


@pytest.mark.parametrize("chunks", [None, (4, 3)], ids=["contiguous", "chunked"])
def test_undefined_fill_value(tmp_path: Path, no_leaks: None, chunks: "tuple[int, ...] | None") -> None:
    # H5Pset_fill_value(dcpl, type, NULL) leaves the fill value undefined
    # (H5D_FILL_VALUE_UNDEFINED); h5py cannot say it (PropDCID.set_fill_value
    # takes an array, never None), so it is called in h5py's own HDF5 library.
    path = tmp_path / "undefined-fill.h5"
    data = np.arange(30, dtype="<i4").reshape(10, 3)
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        if chunks:
            dcpl.set_chunk(chunks)
        assert _h5py_hdf5().H5Pset_fill_value(dcpl.id, h5py.h5t.NATIVE_INT32.id, None) >= 0
        dsid = h5py.h5d.create(f.id, b"data", h5py.h5t.STD_I32LE, h5py.h5s.create_simple(data.shape), dcpl=dcpl)
        h5py.Dataset(dsid)[...] = data
    with h5py.File(path, "r") as f:
        assert f["data"].id.get_create_plist().fill_value_defined() == h5py.h5d.FILL_VALUE_UNDEFINED
    assert_reads_as_h5py(path, "/data")


@pytest.mark.parametrize(
    "name, node",
    [
        ("ex-noattr.h5", "/columns/TDC"),
        ("ex-noattr.h5", "/detector/table"),
        ("attr-u16.h5", "/wfm_group0/axes/axis1/data_vector/data"),
    ],
    ids=["contiguous", "chunked-table", "chunked-deflate"],
)
def test_undefined_fill_value_in_pytables_files(no_leaks: None, name: str, node: str) -> None:
    path = pytables_file(name)
    with h5py.File(path, "r") as f:
        assert f[node].id.get_create_plist().fill_value_defined() == h5py.h5d.FILL_VALUE_UNDEFINED
    assert_reads_as_h5py(path, node)


# -- 5. array element types -----------------------------------------------------


def test_h5py_array_element_type(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "vectors.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", shape=(5, 5), dtype=np.dtype(("<f8", (3,))))
        ds[...] = np.arange(75.0).reshape(5, 5, 3)
    ref = h5py_reference(path, "/data")
    assert ref.shape == (5, 5, 3) and ref.dtype == np.float64
    assert_reads_as_h5py(path, "/data")


@pytest.mark.parametrize("kind", ["earray", "carray"])
def test_pytables_multidimensional_atom(tmp_path: Path, no_leaks: None, kind: str) -> None:
    path = tmp_path / "mdatom.h5"
    data = np.arange(75.0).reshape(5, 5, 3)
    with tables.open_file(path, "w") as f:
        atom = tables.Float64Atom(shape=(3,))
        if kind == "earray":
            f.create_earray("/", "data", atom=atom, shape=(0, 5)).append(data)
        else:
            f.create_carray("/", "data", atom=atom, shape=(5, 5))[:] = data
    np.testing.assert_array_equal(h5py_reference(path, "/data"), data)
    assert_reads_as_h5py(path, "/data")


# -- 6. compounds ---------------------------------------------------------------


def _compound_file(path: Path, dtype: np.dtype, n: int = 50) -> np.ndarray:
    rows = np.zeros(n, dtype)
    for i, name in enumerate(dtype.names):
        _fill(rows[name], i)
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=rows, chunks=(16,))
    return rows


def _fill(column: np.ndarray, seed: int) -> None:
    if column.dtype.names:
        for i, name in enumerate(column.dtype.names):
            _fill(column[name], 10 * seed + i)
    else:
        column[...] = (np.arange(column.size).reshape(column.shape) * (seed + 1.5)).astype(column.dtype)


def test_big_endian_compound(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "be.h5"
    _compound_file(path, np.dtype([("a", ">i4"), ("b", ">f8")]))
    assert_reads_as_h5py(path, "/data", fields=("a", "b"))


def test_compound_with_padding(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "padded.h5"
    dtype = np.dtype({"names": ["a", "b", "c"], "formats": ["<u2", "<f8", "S3"], "offsets": [2, 8, 20], "itemsize": 32})
    _compound_file(path, dtype)
    assert h5py_reference(path, "/data").dtype.itemsize == 32
    assert_reads_as_h5py(path, "/data", fields=("a", "b", "c"))


def test_nested_compound_with_gaps(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "nested.h5"
    inner = np.dtype({"names": ["char", "double"], "formats": ["i1", "<f8"], "offsets": [2, 4], "itemsize": 12})
    dtype = np.dtype(
        {"names": ["float", "compound", "v"], "formats": ["<f4", inner, ("<i2", (2,))], "offsets": [1, 7, 21], "itemsize": 28}
    )
    _compound_file(path, dtype)
    # PyTables itself misreads these (a Table's read() gives garbage): the tables
    # engine may refuse up front instead, as the issue allows; every other engine reads.
    assert_reads_as_h5py(path, "/data", fields=("float", "compound", "v", "compound/char", "compound/double"),
                         may_refuse=("tables",))


def _nested_table(path: Path) -> np.ndarray:
    """A PyTables Table at /t whose column 'inner' is nested ('inner/p', 'inner/q' of two values, and 'inner/deep'
    nested again: 'inner/deep/r', 'inner/deep/s'), its column 'x' a 2 x 3 sub-array; its rows."""
    class Deep(tables.IsDescription):
        r = tables.Int32Col(pos=0)
        s = tables.StringCol(3, pos=1)

    class Inner(tables.IsDescription):
        p = tables.UInt8Col(pos=0)
        q = tables.Float32Col(shape=(2,), pos=1)
        deep = Deep()

    class Row(tables.IsDescription):
        x = tables.Int16Col(shape=(2, 3), pos=0)
        inner = Inner()

    with tables.open_file(path, "w") as f:
        table = f.create_table("/", "t", Row, filters=tables.Filters(3, "zlib"), chunkshape=(16,))
        rows = np.zeros(100, table.dtype)
        _fill(rows, 3)
        table.append(rows)
    return rows


def test_what_pytables_misreads_its_engine_refuses_and_the_others_read(tmp_path: Path, no_leaks: None) -> None:
    """Two layouts a fuzz found PyTables 3.11 misreading: a compound with a gap that holds a nested one (a double
    free, the process killed), and big-endian complex sub-arrays in a table (wrong values, PyTables' own read()
    too). The tables engine refuses both up front; every other engine reads them."""
    inner = np.dtype([("a", "<f8"), ("z", "<f4")])
    gap = np.dtype({"names": ["inner", "outer"], "formats": [inner, "<u2"], "offsets": [0, 16], "itemsize": 18})
    rows = np.zeros(83, gap)
    rows["inner"]["a"], rows["outer"] = np.arange(83) / 3, np.arange(83)
    with h5py.File(tmp_path / "gap.h5", "w") as f:
        f.create_dataset("data", data=rows, chunks=(16,))
    assert_reads_as_h5py(tmp_path / "gap.h5", "/data", fields=("inner", "outer", "inner/a"), may_refuse=("tables",))
    cplx = np.dtype([("v", "<c8", (2,)), ("o", [("w", "<c8", (2,)), ("i", "<i4")])])
    rows = np.zeros(40, cplx)
    rows["v"] = (np.arange(80).reshape(40, 2) + 1) * (1 + 2j)
    rows["o"]["w"] = rows["v"] * 3
    with tables.open_file(tmp_path / "cplx.h5", "w") as f:
        f.create_table("/", "t", description=cplx, byteorder="big").append(rows)
    assert_reads_as_h5py(tmp_path / "cplx.h5", "/t", fields=("v", "o", "o/w"), may_refuse=("tables",))
    for path, node in ((tmp_path / "gap.h5", "/data"), (tmp_path / "cplx.h5", "/t")):
        with pytest.raises(multitables.NodeTypeError, match="PyTables misreads"):
            multitables.Streamer(path, engine="tables").get_queue(node, n_procs=0)


def test_nested_column_of_a_pytables_table(tmp_path: Path, no_leaks: None) -> None:
    # PyTables names only the innermost columns ('inner/q') in coldtypes, and sizes read(out=) of a
    # nested column by the whole row: the tables engine reads the column 'inner' all the same.
    path = tmp_path / "nested_pytables.h5"
    rows = _nested_table(path)
    assert_reads_as_h5py(path, "/t", fields=("x", "inner", "inner/p", "inner/q"))
    with multitables.Reader(path, n_procs=1, engine="tables") as reader:
        ds = reader.get_dataset("/t")
        with ds.create_stage(100) as stage:
            np.testing.assert_array_equal(reader.request(ds["inner"][3:60:7], stage).get(), rows["inner"][3:60:7])


@pytest.mark.parametrize("engine", ["auto", "h5py", "chunks", "tables"])
def test_a_column_of_a_nested_column_by_pytables_path_as_2x_asks(tmp_path: Path, engine: str, no_leaks: None) -> None:
    """2.x handed ``col('outer/inner')`` to PyTables, which takes a path to a column of a nested one: the Reader's
    ways of naming a column, and a stream's ``field=``, take it too, and give what PyTables gives."""
    path = tmp_path / "nested_paths.h5"
    rows = _nested_table(path)
    with tables.open_file(path) as f:
        want = {col: f.root.t.col(col) for col in ("inner/p", "inner/q", "inner/deep/s")}
    want["inner/deep"] = rows["inner"]["deep"]  # one PyTables' col() does not take: between 'inner' and its columns
    with multitables.Reader(path, n_procs=1, engine=engine) as reader:
        ds = reader.get_dataset("/t")
        with ds.create_stage(100) as stage:
            for col, rows_of in want.items():
                np.testing.assert_array_equal(reader.request(ds.col(col)[3:60:7], stage).get(), rows_of[3:60:7])
                np.testing.assert_array_equal(reader.request(ds[col][[5, 1, 9]], stage).get(), rows_of[[5, 1, 9]])
                np.testing.assert_array_equal(reader.request(ds.read(10, 20, field=col), stage).get(), rows_of[10:20])
    streamer = multitables.Streamer(path, engine=engine)
    got = np.concatenate(list(streamer.get_generator("/t", n_procs=2, block_size=16, ordered=True, field="inner/q")))
    np.testing.assert_array_equal(got.reshape(want["inner/q"].shape), want["inner/q"])
    for bad, says in (("inner/r", "the fields of 'inner' are ['p', 'q', 'deep']"), ("x/b", "'x' has no fields"),
                      ("b/p", "its fields are ['x', 'inner']")):
        with pytest.raises(KeyError, match=re.escape(says)):
            streamer.get_queue("/t", n_procs=2, field=bad)


def test_records_requested_first_take_a_path_into_nested_fields_after(tmp_path: Path, no_leaks: None) -> None:
    """``ds[rows]['outer/inner']`` is ``ds['outer/inner'][rows]``, as for a plain column, also where the rows are
    themselves arrays of records (2-D), whose fields are taken in the consumer; a path into an array of records
    is refused saying so."""
    inner = np.dtype([("val", "<i4"), ("k", "S3")])
    dtype = np.dtype([("y", "<f4"), ("id", [("val", inner), ("a", "<u2")]), ("arr", [("c", "<i2")], (2,))])
    rows = np.zeros((30, 2), dtype)
    rows["y"] = np.arange(60).reshape(30, 2)
    rows["id"]["val"]["val"] = np.arange(60).reshape(30, 2) * 3
    rows["id"]["val"]["k"] = [[b"ab", b"c"]] * 30
    rows["id"]["a"] = np.arange(60).reshape(30, 2) % 7
    path = tmp_path / "records.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=rows, chunks=(5, 2), compression="gzip")
    with multitables.Reader(path, n_procs=1) as reader:
        ds = reader.get_dataset("/data")
        with ds.create_stage(30) as stage:
            for request, want in ((ds[14:17]["id/val"], rows[14:17]["id"]["val"]),
                                  (ds[14:17]["id/val/val"], rows[14:17]["id"]["val"]["val"]),
                                  (ds[[3, 1]]["id/a"], rows[[3, 1]]["id"]["a"]),
                                  (ds.col("id/val/k")[2:5], rows["id"]["val"]["k"][2:5])):
                got = reader.request(request, stage).get()
                assert got.shape == want.shape and request.shape == want.shape
                np.testing.assert_array_equal(got, want)
        with pytest.raises(KeyError, match=re.escape("the fields of 'id' are ['val', 'a']")):
            ds[1:3]["id/nope"]
        with pytest.raises(KeyError, match=re.escape("'arr' is an array of records (shape (2,)): read 'arr', then take")):
            ds.col("arr/c")[0:2]
        for bad in ("id/", "id//a", "/y"):
            with pytest.raises(KeyError, match=re.escape(f"no field {bad!r}: a path names a column at each step")):
                ds.col(bad)[0:2]
        # A list of fields is numpy's: top-level columns, a KeyError that says so where one is a path.
        with ds.create_stage(2) as stage:
            np.testing.assert_array_equal(reader.request(ds[["y", "arr"]][4:6], stage).get(), rows[["y", "arr"]][4:6])
        with pytest.raises(KeyError, match=re.escape("top-level columns only, as numpy's does: 'id/a' is a path into 'id'; "
                                                     "read it on its own (dataset['id/a']) or take 'id' in the list")):
            ds[["y", "id/a"]]
        with ds.create_stage(2) as stage:  # what the message advises reads the column
            np.testing.assert_array_equal(reader.request(ds["id/a"][4:6], stage).get(), rows["id"]["a"][4:6])
        with pytest.raises(KeyError, match=re.escape("no field 'z' in the list ['y', 'z']; the fields are ['y', 'id', 'arr']")):
            ds[2:5][["y", "z"]]


def test_a_column_named_with_a_slash_is_that_column_not_a_path(tmp_path: Path, no_leaks: None) -> None:
    """h5py may name a column 'a/b' beside a nested 'a' holding 'b': 'a/b' is the column of that name (PyTables,
    whose paths these are, refuses such a file)."""
    dtype = np.dtype([("a/b", "<i4"), ("a", [("b", "<f8")])])
    rows = np.zeros(50, dtype)
    rows["a/b"] = np.arange(50)
    rows["a"]["b"] = -np.arange(50) / 2
    path = tmp_path / "slash.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=rows, chunks=(10,))
    for engine in ("auto", "h5py", "chunks"):
        stream = multitables.Streamer(path, engine=engine)
        np.testing.assert_array_equal(list(stream.get_generator("/d", n_procs=0, field="a/b")), rows["a/b"])
        b = stream.get_batches("/d", 50, fields=["a/b", "a"], shuffle=False, n_procs=0)
        batch = next(iter(b))
        b.close()
        np.testing.assert_array_equal(batch["a/b"], rows["a/b"])
        np.testing.assert_array_equal(batch["a"]["b"], rows["a"]["b"])


# -- 7. an old PyTables flavor --------------------------------------------------


def _bitfield_dataset(f: h5py.File, name: str, tid: "h5py.h5t.TypeID", data: np.ndarray) -> None:
    h5py.h5d.create(f.id, name.encode(), tid, h5py.h5s.create_simple(data.shape))
    f[name][...] = data


def test_hdf5_bitfields_read_as_their_bytes_or_are_refused(tmp_path: Path, no_leaks: None) -> None:
    # PyTables reads an HDF5 bitfield of any size as 1-byte bools: a 16-bit one filled twice its buffer (heap
    # corruption, "corrupted size vs. prev_size"), an 8-bit one came out as truth values (2 read as 1).
    path = tmp_path / "bitfields.h5"
    with h5py.File(path, "w") as f:
        _bitfield_dataset(f, "b8", h5py.h5t.STD_B8LE.copy(), np.arange(300, dtype="u2").astype("u1"))
        _bitfield_dataset(f, "b16", h5py.h5t.STD_B16LE.copy(), np.arange(0, 3000, 10, dtype="u2"))
        member = h5py.h5t.create(h5py.h5t.COMPOUND, 4)
        member.insert(b"a", 0, h5py.h5t.STD_I16LE)
        member.insert(b"bits", 2, h5py.h5t.STD_B16LE)
        records = np.zeros(300, [("a", "<i2"), ("bits", "<u2")])
        records["a"], records["bits"] = np.arange(300), np.arange(300) * 7
        _bitfield_dataset(f, "records", member, records)
    assert_reads_as_h5py(path, "/b8")
    assert_reads_as_h5py(path, "/b16", may_refuse=("tables",))
    assert_reads_as_h5py(path, "/records", fields=("a",), may_refuse=("tables",))


def test_python_flavor_array(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "flavor.h5"
    with tables.open_file(path, "w") as f:
        f.create_array("/", "a", obj=[[1, 2], [3, 4]])
    with tables.open_file(path, "r") as f:
        assert f.root.a.flavor == "python"
    assert_reads_as_h5py(path, "/a")


# -- 8. a filter nothing installed decodes --------------------------------------

#: A PyTables table compressed with LZO (filter 305): neither h5py (with hdf5plugin) nor the PyTables wheel decodes it.
LZO_NODE = "/group0/group1/tuple2"


def _check_missing_filter(exc: BaseException) -> None:
    text = str(exc)
    assert isinstance(exc, OSError), f"{type(exc).__name__} is no OSError"
    assert "lzo" in text.lower() and "305" in text and LZO_NODE in text and "HDF5_PLUGIN_PATH" in text, text


@pytest.mark.parametrize("engine", ENGINES)
def test_a_filter_nothing_decodes_is_refused_before_any_process_starts(no_leaks: None, engine: str) -> None:
    import hdf5plugin  # noqa: F401  (what h5py can decode, as the library sees it)

    path = pytables_file("Tables_lzo1.h5")
    assert not h5py.h5z.filter_avail(305), "h5py decodes LZO here: this test needs a filter nothing decodes"
    before = live_children()
    with pytest.raises(MissingFilterError) as direct:
        multitables.Streamer(path, engine=engine).get_queue(LZO_NODE, n_procs=1)
    assert live_children() == before
    with pytest.raises(MissingFilterError) as generated:
        next(multitables.Streamer(path, engine=engine).get_generator(LZO_NODE, n_procs=1))
    assert live_children() == before
    with pytest.raises(MissingFilterError) as column:
        multitables.Streamer(path, engine=engine).get_queue(LZO_NODE, n_procs=1, field="var1")
    assert live_children() == before
    with multitables.Reader(path, n_procs=1, engine=engine) as reader:
        with pytest.raises(MissingFilterError) as random:
            reader.get_dataset(LZO_NODE)
    for exc in (direct.value, generated.value, column.value, random.value):
        _check_missing_filter(exc)


# -- 9. a type h5py cannot map --------------------------------------------------


@pytest.mark.parametrize(
    "name, node", [("float.h5", "/quadprecision"), ("times-nested-be.h5", "/earr32")], ids=["quad-float", "time32-be"]
)
def test_a_type_h5py_cannot_map(no_leaks: None, name: str, node: str) -> None:
    path = pytables_file(name)
    with h5py.File(path, "r") as f, pytest.raises((TypeError, ValueError)):
        f[node][()]  # the premise: h5py has no numpy type for it
    with tables.open_file(path, "r") as f:
        ref = np.asarray(f.get_node(node)[:])
    table = read_all(path, node, ref, strict=False, label=f"{name}:{node}")
    # auto and tables read it as PyTables does; h5py and chunks may refuse, naming the node
    problems = table.not_read(may_refuse=("h5py", "chunks"), naming=node)
    assert not problems, "\n".join(problems)


# -- 10. what PyTables cannot open or decode, h5py reads ------------------------


def _refused_by_tables_read_by_auto(path: Path, node: str, why: str) -> None:
    with pytest.raises(multitables.NodeTypeError, match=why) as refused:
        multitables.Streamer(path, engine="tables").get_queue(node)
    assert node in str(refused.value) and "(or 'auto') reads it" in str(refused.value)
    assert_reads_as_h5py(path, node, may_refuse=("tables",))


def test_dimension_scales_pytables_cannot_load(tmp_path: Path, no_leaks: None) -> None:
    """h5py's dimension scales carry object references, which PyTables cannot load (KeyError: 'Reference')."""
    path = tmp_path / "scales.h5"
    with h5py.File(path, "w") as f:
        x = f.create_dataset("x", data=np.arange(10.0))
        y = f.create_dataset("y", data=np.arange(20.0).reshape(10, 2))
        x.make_scale("x")
        y.dims[0].attach_scale(x)
    _refused_by_tables_read_by_auto(path, "/x", "Reference")


def test_a_plugin_filter_pytables_lacks(tmp_path: Path, no_leaks: None) -> None:
    import hdf5plugin

    path = tmp_path / "lz4.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.arange(4000, dtype="<i4").reshape(1000, 4), chunks=(100, 4), **hdf5plugin.LZ4())
    _refused_by_tables_read_by_auto(path, "/data", "lz4")


def test_a_filter_pytables_lacks_behind_a_first_chunk_stored_unfiltered(tmp_path: Path, no_leaks: None) -> None:
    # lzf may skip a chunk that does not shrink: a first row read from there hid that PyTables lacks it.
    path = tmp_path / "lzf.h5"
    data = np.zeros((3000, 4), "u1")
    data[:256] = np.random.default_rng(0).integers(0, 256, (256, 4))  # the first chunk does not shrink
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(256, 4), compression="lzf")
        assert f["x"].id.get_chunk_info(0).filter_mask != 0 and f["x"].id.get_chunk_info(1).filter_mask == 0
    _refused_by_tables_read_by_auto(path, "/x", "lzf")


def test_a_filter_pytables_lacks_behind_many_chunks_unfiltered_or_never_written(tmp_path: Path, no_leaks: None) -> None:
    """However many chunks lead unfiltered (data that did not shrink) or unwritten (a dataset written in parts), the
    first filtered one is what PyTables is tried on: else it was taken, and failed mid-stream."""
    import hdf5plugin

    path = tmp_path / "late.h5"
    data = np.zeros((1000, 4), "u1")
    data[:700] = np.random.default_rng(0).integers(0, 256, (700, 4))  # 70 chunks that do not shrink
    with h5py.File(path, "w") as f:
        f.create_dataset("skipped", data=data, chunks=(10, 4), compression="lzf")
        assert [f["skipped"].id.get_chunk_info(i).filter_mask for i in (0, 69, 70)] == [1, 1, 0]
        late = f.create_dataset("late", shape=(200, 4), dtype="<f8", chunks=(1, 4), **hdf5plugin.LZ4())
        late[150:160] = np.arange(40.0).reshape(10, 4)  # the first 150 chunks never written
    _refused_by_tables_read_by_auto(path, "/skipped", "lzf")
    _refused_by_tables_read_by_auto(path, "/late", "lz4")


def test_a_filter_pytables_lacks_behind_a_first_column_of_chunks_stored_unfiltered(tmp_path: Path, no_leaks: None) -> None:
    """The probe reads one element (one row lay in every chunk of chunks one column wide): of the first chunk
    filtered, wherever along the other axes it begins."""
    path = tmp_path / "columns.h5"
    data = np.zeros((256, 8), "u1")
    data[:, 0] = np.random.default_rng(0).integers(0, 256, 256)  # the first column's chunk does not shrink
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, chunks=(256, 1), compression="lzf")
        assert [f["x"].id.get_chunk_info(i).filter_mask for i in (0, 1)] == [1, 0]
    _refused_by_tables_read_by_auto(path, "/x", "lzf")


# -- 11. an external link into another file -------------------------------------


def _linked_files(tmp_path: Path) -> np.ndarray:
    """``main.h5``'s ``/zlib``, ``/plain`` and ``/chunked`` link to ``data/target.h5``; main holds decoys laid out alike, first."""
    rows = np.arange(3000, dtype="<f4").reshape(1000, 3)
    (tmp_path / "data").mkdir()
    with h5py.File(tmp_path / "main.h5", "w") as main, h5py.File(tmp_path / "data" / "target.h5", "w") as target:
        for f, data in [(main, -rows), (target, rows)]:  # the same offsets in both files
            f.create_dataset("stored/zlib", data=data, chunks=(64, 3), compression="gzip", shuffle=True)
            f.create_dataset("stored/plain", data=data)
            f.create_dataset("stored/chunked", data=data, chunks=(64, 3))
        for name in ("zlib", "plain", "chunked"):  # other names than in the target
            main[name] = h5py.ExternalLink("data/target.h5", f"/stored/{name}")
    return rows


def test_an_external_link_reads_the_file_it_leads_to(tmp_path: Path, no_leaks: None) -> None:
    # The chunk engine reads chunks at their addresses: in the named file they were a decoy's bytes.
    rows = _linked_files(tmp_path)
    main = tmp_path / "main.h5"
    for name in ("/zlib", "/plain", "/chunked"):
        np.testing.assert_array_equal(h5py_reference(main, name), rows)
        # PyTables opens a link, not a leaf: the tables engine refuses it, naming the node.
        assert_reads_as_h5py(main, name, may_refuse=("tables",))
        for engine in ("chunks", "h5py"):  # in this process too, with HDF5's chunk cache (the h5py engine)
            for options in ({"n_procs": 0, "block_size": 7}, {"n_procs": 2, "block_size": 100}):
                stream = multitables.Streamer(main, engine=engine)
                got = []
                with stream.get_queue(name, ordered=True, remainder=True, **options) as queue:
                    for guard in queue.iter():
                        with guard as block:
                            got.append(block.copy())
                np.testing.assert_array_equal(np.concatenate(got), rows, err_msg=f"{engine} {options}")
                laps = itertools.islice(stream.get_generator(name, cyclic=True, ordered=True, **options), 2 * len(rows))
                np.testing.assert_array_equal(np.stack(list(laps)), np.concatenate([rows, rows]), err_msg=f"{engine} cyclic")
    with multitables.Streamer(main).get_queue("/zlib") as queue:  # a first look at a dataset this small: h5py reads
        assert queue.engine == "h5py"  # it through the open that described it (FIRST_LOOK_BYTES)
    with h5py.File(main, "a") as f:
        f["gone"] = h5py.ExternalLink("data/missing.h5", "/stored/zlib")
    with pytest.raises(KeyError) as missing:
        multitables.Streamer(main).get_queue("/gone")
    assert "is an external link to '/stored/zlib' in 'data/missing.h5', which HDF5 cannot open" in missing.value.args[0]
