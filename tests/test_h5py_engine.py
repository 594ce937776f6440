"""The h5py engine takes blosc chunks as stored and decodes them, whole or the part a read needs, itself (NOTE [blosc
chunks as stored])."""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path
from typing import Any, Iterator

import h5py
import hdf5plugin
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import multitables
from multitables._io import h5py_engine
from multitables._io.chunks.hdf5lib import hdf5_library
from multitables._io.engines import open_source
from multitables._io.node import inspect_node
from multitables._io.strings import deliver_strings

CHUNK, WIDTH, N_ROWS = 64, 32, 64 * 6 + 20  # the last chunk is partial


def _write(path: Path, dtype: str = "<f4", fill: "float | None" = None) -> np.ndarray:
    """A blosc dataset '/d' of N_ROWS rows in chunks of CHUNK rows: chunk 2 stored unfiltered (blosc skipped), chunk 4
    never written; the rows h5py reads from it."""
    rng = np.random.default_rng(7)
    data = rng.standard_normal((N_ROWS, WIDTH)).astype(dtype)
    with h5py.File(path, "w") as f:
        kwargs = {} if fill is None else {"fillvalue": fill}
        d = f.create_dataset("d", shape=data.shape, dtype=dtype, chunks=(CHUNK, WIDTH), **hdf5plugin.Blosc(), **kwargs)
        for k in range(0, N_ROWS, CHUNK):
            if k // CHUNK not in (2, 4):
                d[k : k + CHUNK] = data[k : k + CHUNK]
        d.id.write_direct_chunk((2 * CHUNK, 0), data[2 * CHUNK : 3 * CHUNK].tobytes(), filter_mask=1)
    with h5py.File(path, "r") as f:
        return f["d"][()]


def _read(node: Any, start: int, stop: int, dtype: Any) -> np.ndarray:
    """Rows ``[start, stop)`` of ``node`` read by an h5py engine source of its own, into an array of ``dtype``."""
    source = open_source("h5py", node, {})
    try:
        out = np.empty((stop - start, WIDTH), dtype)
        if out.dtype.kind == "f":
            out.fill(np.nan)  # a row left unread shows
        source.read_into(start, stop, out)
    finally:
        source.close()
    return out


@contextlib.contextmanager
def _counting_decodes() -> "Iterator[list[tuple[str, int]]]":
    """Every chunk size counts as large enough; the list gets ``("whole", bytes)`` for each chunk blosc decodes for the
    engine and ``("part", bytes)`` for each part of one."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(h5py_engine, "STORED_CHUNK_MIN_BYTES", 0)
        seen: "list[tuple[str, int]]" = []
        _count_decodes(patch.setattr, seen)
        yield seen


@pytest.fixture
def decoded() -> "Iterator[list[tuple[str, int]]]":
    with _counting_decodes() as seen:
        yield seen


def _count_decodes(set_attr: Any, seen: "list[tuple[str, int]]") -> None:
    decode, decode_part = h5py_engine.Blosc.decode, h5py_engine.Blosc.decode_part

    def whole(self, src, size, dst):  # type: ignore[no-untyped-def]
        seen.append(("whole", size))
        return decode(self, src, size, dst)

    def part(self, src, size, first, dst):  # type: ignore[no-untyped-def]
        seen.append(("part", len(dst)))
        return decode_part(self, src, size, first, dst)

    set_attr(h5py_engine.Blosc, "decode", whole)
    set_attr(h5py_engine.Blosc, "decode_part", part)


def _blosc_decodes(start: int, stop: int) -> "list[tuple[str, int]]":
    """What blosc decodes for rows ``[start, stop)``: each chunk they touch, whole or the part of it they need, up to
    chunk 4, never written, from which HDF5 reads the rest (its fill value); chunk 2, stored unfiltered, is copied.
    The last chunk (rows 384-447, of which 20 exist) is decoded like the others."""
    seen = []
    a = start
    while a < stop:
        first = a - a % CHUNK
        b = min(first + CHUNK, stop)
        if first // CHUNK == 4:
            break
        if first // CHUNK != 2:
            seen.append(("whole", CHUNK * WIDTH * 4) if b - a == CHUNK else ("part", (b - a) * WIDTH * 4))
        a = b
    return seen


@pytest.mark.parametrize("dtype", ["<f4", ">i8"])
def test_whole_blosc_chunks_read_as_stored_give_h5pys_rows(tmp_path: Path, decoded: list, dtype: str) -> None:
    path = tmp_path / "blosc.h5"
    expected = _write(path, dtype)
    node = inspect_node(path, "/d")
    assert h5py_engine.stored_chunk_bytes(node) == CHUNK * WIDTH * np.dtype(dtype).itemsize
    out = _read(node, 0, N_ROWS, expected.dtype)
    np.testing.assert_array_equal(out, expected)
    assert out.dtype == expected.dtype
    size = CHUNK * WIDTH * np.dtype(dtype).itemsize
    assert decoded == [("whole", size)] * 3  # chunks 0, 1 and 3 (2 is copied); HDF5 reads on from 4


@settings(max_examples=60, deadline=None)
@given(bounds=st.tuples(st.integers(0, N_ROWS), st.integers(0, N_ROWS)).map(sorted).filter(lambda b: b[0] < b[1]))
def test_any_rows_read_give_h5pys_whichever_chunks_they_cover(tmp_path_factory, bounds: "list[int]") -> None:
    start, stop = bounds
    path = tmp_path_factory.getbasetemp() / "blosc-any.h5"
    if not path.exists():
        _write(path, fill=-1.0)
    with h5py.File(path, "r") as f:
        expected = f["d"][start:stop]
    with _counting_decodes() as seen:
        out = _read(inspect_node(path, "/d"), start, stop, np.float32)
    np.testing.assert_array_equal(out, expected)
    assert seen == _blosc_decodes(start, stop)


def test_a_stream_in_this_process_gives_every_row_at_every_block_size(tmp_path: Path, decoded: list) -> None:
    path = tmp_path / "blosc.h5"
    expected = _write(path)
    for block_size in (CHUNK // 2, CHUNK, CHUNK + 7, 3 * CHUNK, N_ROWS):
        rows = list(multitables.Streamer(str(path), engine="h5py").get_generator("/d", n_procs=0, block_size=block_size))
        np.testing.assert_array_equal(np.stack(rows), expected)
    assert decoded, "no chunk was read as stored"


def test_a_damaged_chunk_is_read_by_hdf5_which_refuses_it(tmp_path: Path, decoded: list) -> None:
    path = tmp_path / "damaged.h5"
    _write(path)
    with h5py.File(path, "r+") as f:
        f["d"].id.write_direct_chunk((0, 0), b"\x02\x01\x21\x04" + b"\xff" * 60, filter_mask=0)
    with h5py.File(path, "r") as f, pytest.raises(OSError) as by_h5py:
        f["d"][0:CHUNK]
    source = open_source("h5py", inspect_node(path, "/d"), {})
    try:
        with pytest.raises(OSError) as by_engine:
            source.read_into(0, CHUNK, np.empty((CHUNK, WIDTH), np.float32))
    finally:
        source.close()
    assert type(by_engine.value) is type(by_h5py.value)
    assert decoded == [("whole", CHUNK * WIDTH * 4)]  # asked once, it refused the chunk; HDF5 read it, and raised


def test_only_blosc_alone_on_whole_rows_of_plain_numbers_in_large_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kinds.h5"
    rows = np.zeros((256, 16), np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("blosc", data=rows, chunks=(128, 16), **hdf5plugin.Blosc())
        f.create_dataset("zlib", data=rows, chunks=(128, 16), compression="gzip")
        f.create_dataset("checksummed", data=rows, chunks=(128, 16), fletcher32=True, **hdf5plugin.Blosc())
        f.create_dataset("split_rows", data=rows, chunks=(128, 8), **hdf5plugin.Blosc())
        table = np.zeros(256, [("a", "<f4"), ("b", "<i4")])
        f.create_dataset("table", data=table, chunks=(128,), **hdf5plugin.Blosc())
        f.create_dataset("contiguous", data=rows)
    node = lambda name, field=None: inspect_node(path, "/" + name, field)  # noqa: E731
    assert h5py_engine.stored_chunk_bytes(node("blosc")) == 0  # 8 KiB: below the smallest
    monkeypatch.setattr(h5py_engine, "STORED_CHUNK_MIN_BYTES", 0)
    assert h5py_engine.stored_chunk_bytes(node("blosc")) == 128 * 16 * 4
    for name in ("zlib", "checksummed", "split_rows", "table", "contiguous"):
        assert h5py_engine.stored_chunk_bytes(node(name)) == 0, name
    assert h5py_engine.stored_chunk_bytes(node("table", "a")) == 0


def test_numbers_stored_in_a_type_of_their_own_are_converted_by_hdf5(tmp_path: Path, decoded: list) -> None:
    """16-bit integers kept in 32 (precision 16): h5py reads them as int32, HDF5 sign-extends them, so their stored
    bytes are not the rows."""
    path = tmp_path / "precision.h5"
    values = np.arange(-CHUNK * WIDTH // 2, CHUNK * WIDTH // 2, dtype="<i4").reshape(CHUNK, WIDTH)
    narrow = h5py.h5t.STD_I32LE.copy()
    narrow.set_precision(16)
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((CHUNK, WIDTH))
        dcpl.set_filter(32001, h5py.h5z.FLAG_OPTIONAL, (2, 2, 4, 0, 5, 1, 1))
        space = h5py.h5s.create_simple(values.shape)
        h5py.Dataset(h5py.h5d.create(f.id, b"d", narrow, space, dcpl=dcpl))[()] = values
    with h5py.File(path, "r") as f:
        expected = f["d"][()]
        assert f["d"].dtype == np.dtype("<i4")
    np.testing.assert_array_equal(expected, values)
    node = inspect_node(path, "/d")
    assert h5py_engine.stored_chunk_bytes(node) > 0  # by the node alone it would qualify
    np.testing.assert_array_equal(_read(node, 0, CHUNK, expected.dtype), expected)
    assert decoded == []


def test_a_last_chunk_left_unfiltered_is_read_by_hdf5(tmp_path: Path, decoded: list) -> None:
    """Written with ``H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS``, the partial last chunk is stored as it is, and its filter
    mask does not say so: the engine must not hand it to blosc."""
    lib = hdf5_library()
    if lib is None:  # pragma: no cover
        pytest.skip("h5py's HDF5 library not found for ctypes")
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((CHUNK, WIDTH))
    dcpl.set_filter(32001, h5py.h5z.FLAG_OPTIONAL, (2, 2, 4, 0, 5, 1, 1))
    set_opts = lib.H5Pset_chunk_opts
    set_opts.argtypes = [ctypes.c_int64, ctypes.c_uint]
    assert set_opts(dcpl.id, 0x0002) >= 0  # H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS
    values = np.arange((CHUNK + 10) * WIDTH, dtype="<f4").reshape(CHUNK + 10, WIDTH)
    path = tmp_path / "edge.h5"
    with h5py.File(path, "w") as f:
        space = h5py.h5s.create_simple(values.shape)
        h5py.Dataset(h5py.h5d.create(f.id, b"d", h5py.h5t.IEEE_F32LE, space, dcpl=dcpl))[()] = values
    source = open_source("h5py", inspect_node(path, "/d"), {})
    try:
        out = np.empty_like(values)
        source.read_into(0, CHUNK + 10, out)
        tail = np.empty((6, WIDTH), np.float32)
        source.read_into(CHUNK + 2, CHUNK + 8, tail)
    finally:
        source.close()
    np.testing.assert_array_equal(out, values)
    np.testing.assert_array_equal(tail, values[CHUNK + 2 : CHUNK + 8])
    assert decoded == [("whole", CHUNK * WIDTH * 4)]  # the first chunk only


@settings(max_examples=80, deadline=None)
@given(picked=st.lists(st.integers(0, N_ROWS - 1), min_size=1, max_size=40, unique=True).map(sorted))
@example(picked=[3, 70, 200, 390])  # a part of chunks 0, 1, 3 and of the partial last one
@example(picked=[3, 5, 300])  # two runs in chunk 0: HDF5 reads them all
def test_scattered_rows_give_h5pys_and_runs_apart_read_their_own_chunks(tmp_path_factory, picked: "list[int]") -> None:
    """Random access (``H5pyRows``): runs that share no chunk are each read from their stored chunks, decoding only what
    they need; runs that share one are left to HDF5, which decodes each chunk once for all of them."""
    path = tmp_path_factory.getbasetemp() / "blosc-rows.h5"
    if not path.exists():
        _write(path, fill=-1.0)
    rows = np.array(picked, np.int64)
    with h5py.File(path, "r") as f:
        expected = f["d"][rows]
    with _counting_decodes() as seen:
        reader = h5py_engine.ENGINE.open_rows(inspect_node(path, "/d"), {})
        try:
            out = np.full((len(rows), WIDTH), np.nan, np.float32)
            reader.read(rows, out, lambda: False)
        finally:
            reader.close()
    np.testing.assert_array_equal(out, expected)
    runs = np.split(rows, np.flatnonzero(np.diff(rows) != 1) + 1)
    chunks = [(int(run[0]) // CHUNK, int(run[-1]) // CHUNK) for run in runs]
    if all(b[0] > a[1] for a, b in zip(chunks, chunks[1:])):
        assert seen == [decode for run in runs for decode in _blosc_decodes(int(run[0]), int(run[-1]) + 1)]
    else:
        assert seen == []  # HDF5 read them


@pytest.mark.parametrize("rows", [range(3, 40), range(3, 300, CHUNK + 5), range(1, N_ROWS, 2), range(390, 391, 9)])
def test_a_range_of_rows_gives_h5pys_and_decodes_as_its_array(tmp_path_factory, rows: range) -> None:
    """A slice's rows reach ``H5pyRows`` as a range (never made into an array where HDF5 decodes): where blosc chunks are
    decoded by the engine, a range decodes what the same rows as an array do."""
    path = tmp_path_factory.getbasetemp() / "blosc-rows.h5"
    if not path.exists():
        _write(path, fill=-1.0)
    got = {}
    for how in (rows, np.array(rows, np.int64)):
        with _counting_decodes() as seen:
            reader = h5py_engine.ENGINE.open_rows(inspect_node(path, "/d"), {})
            try:
                out = np.full((len(rows), WIDTH), np.nan, np.float32)
                reader.read(how, out, lambda: False)
            finally:
                reader.close()
        got[type(how)] = (out, list(seen))
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(got[range][0], f["d"][rows.start : rows.stop : rows.step])
    np.testing.assert_array_equal(got[range][0], got[np.ndarray][0])
    assert got[range][1] == got[np.ndarray][1]


@pytest.mark.parametrize("engine", ["h5py", "auto"])
@pytest.mark.parametrize("n_procs", [0, 1])
def test_swmr_reading_as_h5py_opens_it(tmp_path: Path, n_procs: int, engine: str, no_leaks: None) -> None:
    """``swmr=True`` is h5py's option for a file an SWMR writer may hold: HDF5 refuses to open a file twice with the
    SWMR flag and without, so the library's own look at the file takes it too (it failed for any file); ``auto``
    takes h5py for it (PyTables, which takes the established API's options, has no such option)."""
    path = tmp_path / "swmr.h5"
    rows = np.arange(4000 * 4, dtype="<f4").reshape(4000, 4)
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset("data", data=rows, maxshape=(None, 4), chunks=(500, 4), compression="gzip")
    stream = multitables.Streamer(path, engine=engine, swmr=True)
    got = []
    with h5py.File(path, "a", libver="latest") as writer:
        writer.swmr_mode = True  # a writer holds it as it would while appending
        with stream.get_queue("/data", n_procs=n_procs, block_size=500, ordered=True) as queue:
            assert queue.engine == "h5py"
            for guard in queue.iter():
                with guard as block:
                    got.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(got), rows)
    with multitables.Reader(path, engine=engine, swmr=True, n_procs=1) as reader:
        ds = reader.get_dataset("/data")
        np.testing.assert_array_equal(reader.request(ds[[7, 3]], ds.create_stage(2)).get(), rows[[7, 3]])


@pytest.mark.parametrize("chunks, cached", [((1000, 8), False), ((1000, 1), True), ((250, 2), True)])
def test_chunks_narrower_than_a_row_keep_a_chunk_cache(tmp_path: Path, chunks: tuple, cached: bool) -> None:
    """Without a chunk cache HDF5 moves a chunk narrower than a row (a column's) into the caller's rows an element at
    a time: a column-chunked 64 MB took 30 s against h5py's 0.08 s. Only chunks that span whole rows go without."""
    from multitables._plan.blocks import BlockPlan

    data = np.arange(1000 * 8, dtype="<f4").reshape(1000, 8)
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, chunks=chunks)
    node = inspect_node(str(path), "/data")
    assert (h5py_engine._chunk_cache_bytes(node, BlockPlan(1000, 1000)) > 0) == cached  # one block: no chunk shared
    with multitables.Streamer(str(path), engine="h5py").get_queue("/data", n_procs=0, ordered=True, remainder=True) as q:
        rows = []
        for guard in q.iter():
            with guard as block:
                rows.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(rows), data)


def _string_table(path: Path, raw: np.ndarray, pad: int, chunked: bool) -> None:
    """'/t': rows of 16 bytes stored as ``raw`` gives them: an int32, a 6-byte string and two 3-byte strings, padded
    as ``pad`` says (HDF5 converts such strings on read, member by member)."""
    h5t = h5py.h5t

    def string(size: int) -> Any:
        tid = h5t.C_S1.copy()
        tid.set_size(size)
        tid.set_strpad(pad)
        return tid

    tid = h5t.create(h5t.COMPOUND, 16)
    tid.insert(b"n", 0, h5t.STD_I32LE)
    tid.insert(b"s", 4, string(6))
    tid.insert(b"a", 10, h5t.array_create(string(3), (2,)))
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    if chunked:
        dcpl.set_chunk((max(1, len(raw) // 3),))
    with h5py.File(path, "w") as f:
        dsid = h5py.h5d.create(f.id, b"t", tid, h5py.h5s.create_simple((len(raw),)), dcpl=dcpl)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, raw, mtype=tid)  # the file's own type: stored as given


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.sampled_from(["STR_NULLTERM", "STR_SPACEPAD"]), st.booleans(), st.sampled_from([None, "s", "a"]),
       st.data())
def test_strings_in_a_compound_read_as_stored_and_converted_give_h5pys_bytes(
    tmp_path_factory, n: int, pad: str, chunked: bool, field: "str | None", data: st.DataObject
) -> None:
    """Where the file's type differs from h5py's only in how its strings are padded, the engine reads the rows as
    stored and converts the strings itself (HDF5 converts a compound member by member, 4x slower): every read gives
    the bytes h5py gives, with NULs, spaces and letters anywhere in the strings. A column too (a string, an array of
    strings), read through a one-member compound that HDF5 converts alike (a PyTables table's S64 column: 2.4x)."""
    raw = np.array(data.draw(st.lists(st.sampled_from([0, 0, 32, 97, 98]), min_size=16 * n, max_size=16 * n)),
                   np.uint8).view("V16")
    path = tmp_path_factory.mktemp("strings") / "t.h5"
    _string_table(path, raw, getattr(h5py.h5t, pad), chunked)
    with h5py.File(path, "r") as f:
        expected = f["t"][()] if field is None else f["t"].fields(field)[()]
    node = inspect_node(path, "/t", field)
    converted: list[int] = []

    def counted(rows: np.ndarray, pads: Any) -> None:
        converted.append(len(rows))
        deliver_strings(rows, pads)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(h5py_engine, "deliver_strings", counted)
        source = open_source("h5py", node, {})
        try:
            whole, runs, strided = (np.empty((k,) + expected.shape[1:], expected.dtype)
                                    for k in (n, (n + 1) // 2, len(range(0, n, 3))))
            source.read_into(0, n, whole)
            source.read_runs(list(range(0, n, 2)), list(range(0, n, 2)), runs)
            source.read_strided(range(0, n, 3), strided)
        finally:
            source.close()
    assert whole.tobytes() == expected.tobytes()
    assert runs.tobytes() == expected[::2].tobytes() and strided.tobytes() == expected[::3].tobytes()
    assert converted == [n, len(runs), len(strided)]  # read as stored, converted here

