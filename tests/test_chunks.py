"""The chunk engine: byte-for-byte what h5py reads, on files written by PyTables and by h5py, or h5py reads instead."""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import h5py
import hdf5plugin
import numpy as np
import pytest
import tables
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import multitables
from multitables._io.chunks.decoded import DecodedChunks
from multitables._io.chunks.source import ChunkSource
from multitables._io.chunks.codecs.base import ChunkDecodeError
from multitables._io.engines import open_source, resolve_engine
from multitables._io.node import inspect_node
from multitables._io.chunks.hdf5lib import hdf5_library
from multitables._io.chunks.storage import Unsupported, chunks_problem
from multitables._plan.blocks import BlockPlan

from conftest import CHUNK_INDEXES, chunk_index


def _direct_io_works(directory: str) -> bool:
    fd, path = tempfile.mkstemp(dir=directory)
    try:
        os.write(fd, b"\0" * 4096)
        os.close(fd)
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        except OSError:
            return False
        return True
    finally:
        os.unlink(path)


DIRECT_IO = hasattr(os, "O_DIRECT") and _direct_io_works(tempfile.gettempdir())
CACHES = ["page", "direct"] if DIRECT_IO else ["page"]

# -- what the property test draws from ------------------------------------------

H5PY_DTYPES = ["<f4", ">f8", "<i2", "u1", ">u4", "?", "<c8", "S3", "<f2", ">c16", "enum", "compound", "nested"]
TABLES_DTYPES = ["<f4", ">f8", "<i2", "u1", ">u4", "?", "<c8", "S3"]
COMPOUND = np.dtype([("a", "<i4"), ("b", ">f4", (2,)), ("s", "S2")])
#: What C and Fortran programs write too: a compound in a compound, an array of arrays (numpy's (3, 2)), an enum.
NESTED = np.dtype([("id", ">i8"), ("pos", [("x", "<f4"), ("y", ">i2")]), ("m", ("<f4", (2,)), (3,))])
NAMED = {"compound": COMPOUND, "nested": NESTED, "enum": h5py.enum_dtype({"a": 0, "b": 1, "z": 99}, basetype="<i2")}
#: PyTables tables take one byte order.
TABLE_ROW = np.dtype([("a", "<i4"), ("b", "<f4", (2,)), ("s", "S2")])
H5PY_FILTERS: dict[str, dict[str, Any]] = {
    "none": {},
    "gzip": dict(compression="gzip", compression_opts=3),
    "gzip+shuffle": dict(compression="gzip", shuffle=True),
    "lzf": dict(compression="lzf"),
    "lz4": dict(hdf5plugin.LZ4()),
    "zstd": dict(hdf5plugin.Zstd()),
    "bitshuffle-lz4": dict(hdf5plugin.Bitshuffle()),
    "bitshuffle-zstd": dict(hdf5plugin.Bitshuffle(cname="zstd")),
    "blosc-lz4-bitshuffle": dict(hdf5plugin.Blosc("lz4", 5, hdf5plugin.Blosc.BITSHUFFLE)),
    "blosc-zstd-shuffle": dict(hdf5plugin.Blosc("zstd", 5, hdf5plugin.Blosc.SHUFFLE)),
    "blosc2-blosclz": dict(hdf5plugin.Blosc2("blosclz", 5)),
    "bzip2": dict(hdf5plugin.BZip2()),
}
TABLES_FILTERS = {
    "none": None,
    "zlib": ("zlib", False, False),
    "zlib+shuffle": ("zlib", True, False),
    "blosc": ("blosc", True, False),
    "blosc:lz4+bitshuffle": ("blosc:lz4", False, True),
    "blosc:zstd": ("blosc:zstd", True, False),
    "blosc:zlib": ("blosc:zlib", True, False),
    "blosc:lz4hc": ("blosc:lz4hc", False, False),
    "blosc2:lz4": ("blosc2:lz4", True, False),
    "blosc2:zstd": ("blosc2:zstd", False, True),
    "bzip2": ("bzip2", True, False),
}


def _values(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Half repetitive (compresses), half random bytes (may not: blosc then stores chunks unfiltered)."""
    n = int(np.prod(shape, dtype=np.int64))
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    raw = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
    raw[: len(raw) // 2] = np.arange(len(raw) // 2) // 97 % 7
    return raw.view(dtype).reshape(shape)


@st.composite
def datasets(draw: st.DrawFn) -> dict[str, Any]:
    writer = draw(st.sampled_from(["h5py", "tables"]))
    dtype_name = draw(st.sampled_from(H5PY_DTYPES if writer == "h5py" else TABLES_DTYPES))
    dtype = NAMED.get(dtype_name) or np.dtype(dtype_name)
    n_rows = draw(st.integers(1, 150))
    row_shape = tuple(draw(st.lists(st.integers(1, 5), max_size=2)))
    shape = (n_rows,) + row_shape
    extendible = draw(st.booleans())
    # Chunk rows up to the dataset (and past it, where the dataset is extendible); trailing
    # chunk dimensions the whole row, or a cut of it (N-d chunking).
    c0 = draw(st.integers(1, n_rows + (20 if extendible else 0)))
    whole = draw(st.booleans())
    chunks = (c0,) + tuple(s if whole else draw(st.integers(1, s)) for s in row_shape)
    filters = draw(st.sampled_from(sorted(H5PY_FILTERS if writer == "h5py" else TABLES_FILTERS)))
    fletcher32 = draw(st.booleans())
    block_size = draw(st.integers(1, n_rows))
    cache = draw(st.sampled_from(CACHES))
    index = draw(st.sampled_from(CHUNK_INDEXES))
    seed = draw(st.integers(0, 2**16))
    return dict(
        writer=writer, dtype=dtype, shape=shape, chunks=chunks, extendible=extendible, filters=filters,
        fletcher32=fletcher32, block_size=block_size, cache=cache, index=index, seed=seed,
    )


def write_case(path: Path, case: dict[str, Any]) -> np.ndarray:
    data = _values(case["shape"], case["dtype"], np.random.default_rng(case["seed"]))
    if case["writer"] == "h5py":
        kwargs = dict(H5PY_FILTERS[case["filters"]])
        if case["fletcher32"]:
            kwargs["fletcher32"] = True
        maxshape = (None,) + data.shape[1:] if case["extendible"] else None
        with h5py.File(path, "w") as f:
            f.create_dataset("data", data=data, chunks=case["chunks"], maxshape=maxshape, **kwargs)
        return data
    spec = TABLES_FILTERS[case["filters"]]
    if spec is None:
        filters = tables.Filters(0, fletcher32=case["fletcher32"])
    else:
        complib, shuffle, bitshuffle = spec
        filters = tables.Filters(5, complib, shuffle=shuffle, bitshuffle=bitshuffle, fletcher32=case["fletcher32"])
    with tables.open_file(path, "w") as f:
        if case["extendible"]:
            atom = tables.Atom.from_dtype(data.dtype)
            arr = f.create_earray("/", "data", atom, (0,) + data.shape[1:], filters=filters, chunkshape=case["chunks"])
            arr.append(data)
        else:
            f.create_carray("/", "data", obj=data, filters=filters, chunkshape=case["chunks"])
    return data


def read_like_h5py(path: Path, node_path: str = "/data", field: "str | None" = None) -> Callable[[int, int], np.ndarray]:
    def read(a: int, b: int) -> np.ndarray:
        with h5py.File(path, "r") as f:
            ds = f[node_path]
            return ds.fields(field)[a:b] if field else ds[a:b]

    return read


@settings(max_examples=150, deadline=None)
@given(datasets())
def test_reads_byte_for_byte_what_h5py_reads(case: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.h5"
        write_case(path, case)
        node = inspect_node(path, "/data")
        assert chunks_problem(node) is None
        with h5py.File(path, "r") as f:
            expected = f["data"][:]
        with chunk_index(case["index"]) as index_limit:
            src = ChunkSource(node, case["cache"], index_limit=index_limit)
        try:
            plan = BlockPlan(node.n_rows, case["block_size"], remainder=True)
            for k in range(plan.n_blocks):
                a = plan.start(k)
                b = a + plan.rows(k)
                out = np.empty((b - a,) + node.row_shape, node.dtype)
                src.read_into(a, b, out)
                assert out.dtype == expected.dtype and out.shape == expected[a:b].shape
                assert out.tobytes() == expected[a:b].tobytes(), f"rows {a}:{b}"
            # And out of order: a block that cuts the chunks another read kept.
            a, b = node.n_rows // 3, node.n_rows - node.n_rows // 4
            out = np.empty((b - a,) + node.row_shape, node.dtype)
            src.read_into(a, b, out)
            assert out.tobytes() == expected[a:b].tobytes()
        finally:
            src.close()


# -- tables and fields -------------------------------------------------------------


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("field", [None, "a", "b", "s"])
def test_table_fields_and_null_terminated_strings(tmp_path: Path, cache: str, field: "str | None") -> None:
    rows = np.zeros(700, TABLE_ROW)
    rows["a"] = np.arange(700)
    rows["b"] = np.arange(1400).reshape(700, 2) / 3
    rows["s"] = np.frombuffer(np.random.default_rng(4).integers(0, 4, 1400, dtype=np.uint8).tobytes(), "S2")
    path = tmp_path / "t.h5"
    with tables.open_file(path, "w") as f:
        f.create_table("/", "t", rows, filters=tables.Filters(5, "zlib", shuffle=True), chunkshape=(64,))
    node = inspect_node(path, "/t", field)
    src = ChunkSource(node, cache)
    try:
        out = np.empty((250,) + node.row_shape, node.dtype)
        src.read_into(300, 550, out)
    finally:
        src.close()
    expected = read_like_h5py(path, "/t", field)(300, 550)
    # PyTables' strings are null-terminated: h5py (and so the engine) zeroes what follows the first NUL.
    assert out.tobytes() == expected.tobytes()


# -- what HDF5 fills in, and what goes wrong -------------------------------------


@pytest.mark.parametrize("index", CHUNK_INDEXES)
def test_chunks_never_written_read_as_the_fill_value(tmp_path: Path, index: str) -> None:
    path = tmp_path / "sparse.h5"
    data = np.arange(600 * 4, dtype="<i4").reshape(600, 4)
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", shape=(600, 4), dtype="<i4", chunks=(50, 2), compression="gzip", fillvalue=-7)
        ds[100:160] = data[100:160]
        ds[420:430, :2] = data[420:430, :2]
    node = inspect_node(path, "/data")
    with chunk_index(index) as index_limit:
        src = ChunkSource(node, index_limit=index_limit)
    try:
        out = np.empty((600, 4), "<i4")
        src.read_into(0, 600, out)
    finally:
        src.close()
    np.testing.assert_array_equal(out, read_like_h5py(path)(0, 600))
    assert (out[:100] == -7).all()


def _stored_chunk(path: Path, origin: tuple[int, ...]) -> tuple[int, int]:
    with h5py.File(path, "r") as f:
        info = f["data"].id.get_chunk_info_by_coord(origin)
        return info.byte_offset, info.size


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x55]))


@pytest.mark.parametrize("filters", [tables.Filters(0, fletcher32=True), tables.Filters(3, "zlib", shuffle=True)], ids=["fletcher32", "zlib"])
def test_a_corrupt_chunk_is_an_error_naming_it(make_array: Callable[..., Path], filters: tables.Filters) -> None:
    data = np.random.default_rng(0).standard_normal((1000, 16)).astype("<f4")
    path = make_array(data, complib=filters.complib if filters.complevel else None, fletcher32=filters.fletcher32, chunkshape=(64, 16))
    if not filters.complevel:  # make_array writes no filters without a complib: write the checksummed file here
        with tables.open_file(path, "w") as f:
            f.create_carray("/", "data", obj=data, filters=filters, chunkshape=(64, 16))
    offset, size = _stored_chunk(path, (192, 0))
    _flip_byte(path, offset + size // 2)
    node = inspect_node(path, "/data")
    src = ChunkSource(node)
    try:
        out = np.empty((64, 16), "<f4")
        src.read_into(0, 64, out)  # another chunk reads fine
        np.testing.assert_array_equal(out, data[:64])
        with pytest.raises(ChunkDecodeError, match=r"chunk at \(192, 0\) of '/data' in .*array") as info:
            src.read_into(150, 300, np.empty((150, 16), "<f4"))
        assert ("fletcher32 checksum mismatch" if filters.fletcher32 else "deflate") in str(info.value)
        assert isinstance(info.value, OSError) and isinstance(info.value, multitables.MultitablesError)
    finally:
        src.close()


@pytest.mark.parametrize("chunked", [True, False])
def test_a_truncated_file_is_an_error(make_array: Callable[..., Path], tmp_path: Path, chunked: bool) -> None:
    data = np.arange(4000 * 8, dtype="<f8").reshape(4000, 8)
    path = make_array(data, complib="zlib" if chunked else None, kind="carray" if chunked else "array")
    node = inspect_node(path, "/data")
    src = ChunkSource(node)
    try:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        with pytest.raises(ChunkDecodeError, match="ends"):
            src.read_into(3000, 4000, np.empty((1000, 8), "<f8"))
    finally:
        src.close()


# -- what the engine leaves to h5py -----------------------------------------------


def _create_with_type(path: Path, tid: Any, data: np.ndarray, dcpl: Any = None) -> None:
    with h5py.File(path, "w") as f:
        space = h5py.h5s.create_simple(data.shape)
        dsid = h5py.h5d.create(f.id, b"data", tid, space, dcpl=dcpl)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, data)


def _expect_h5py(path: Path, reason: str) -> None:
    node = inspect_node(path, "/data")
    problem = chunks_problem(node)
    assert problem is not None and reason in problem
    assert resolve_engine("chunks", node, {}) == "h5py"
    assert resolve_engine("auto", node, {}) == "h5py"
    with pytest.raises(Unsupported, match=reason):
        ChunkSource(node)
    src = open_source("chunks", node, {})
    try:
        assert src.engine == "h5py"
        out = np.empty((node.n_rows,) + node.row_shape, node.dtype)
        src.read_into(0, node.n_rows, out)
        assert out.tobytes() == read_like_h5py(path)(0, node.n_rows).tobytes()
    finally:
        src.close()


_STRING_BYTES = st.lists(st.binary(min_size=4, max_size=4).map(lambda b: b.replace(b"\x01", b" ").replace(b"\x02", b"\0")), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stored=_STRING_BYTES, pad=st.sampled_from(["STR_SPACEPAD", "STR_NULLTERM", "STR_NULLPAD"]), chunked=st.booleans())
def test_fixed_length_strings_read_as_h5py_converts_them(tmp_path: Path, stored: list, pad: str, chunked: bool) -> None:
    """Space-padded and null-terminated strings, spaces and NULs anywhere: the bytes h5py delivers."""
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(4)
    tid.set_strpad(getattr(h5py.h5t, pad))
    path = tmp_path / "strings.h5"
    dcpl = None
    if chunked:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((min(7, len(stored)),))
    _create_with_type(path, tid, np.array(stored, "S4"), dcpl)  # same file and memory type: stored as given
    node = inspect_node(path, "/data")
    assert resolve_engine("chunks", node, {}) == "chunks"
    src = ChunkSource(node)
    try:
        out = np.full(len(stored), b"\xff\xff\xff\xff", "S4")
        src.read_into(0, len(stored), out)
    finally:
        src.close()
    assert out.tobytes() == read_like_h5py(path)(0, len(stored)).tobytes()


def test_integers_of_fewer_bits_than_their_size_are_left_to_h5py(tmp_path: Path) -> None:
    tid = h5py.h5t.STD_I32LE.copy()
    tid.set_precision(20)
    path = tmp_path / "i20.h5"
    _create_with_type(path, tid, np.arange(-50, 50, dtype="<i4"))
    _expect_h5py(path, "precision 20")


def test_a_plugin_filter_it_lacks_is_left_to_h5py(tmp_path: Path) -> None:
    path = tmp_path / "zfp.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.linspace(0, 1, 4000).reshape(1000, 4), chunks=(100, 4), **hdf5plugin.Zfp(reversible=True))
    _expect_h5py(path, "filter 32013")


@pytest.mark.skipif(hdf5_library() is None, reason="h5py's HDF5 library not found for ctypes")
def test_partial_edge_chunks_stored_unfiltered_are_left_to_h5py(tmp_path: Path) -> None:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((64, 3))
    dcpl.set_shuffle()
    dcpl.set_deflate(4)
    lib = hdf5_library()
    set_opts = lib.H5Pset_chunk_opts
    set_opts.argtypes = [ctypes.c_int64, ctypes.c_uint]
    assert set_opts(dcpl.id, 0x0002) >= 0  # H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS
    path = tmp_path / "edge.h5"
    _create_with_type(path, h5py.h5t.IEEE_F32LE, np.arange(300, dtype="<f4").reshape(100, 3), dcpl)
    _expect_h5py(path, "H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS")


def test_what_it_cannot_read_needs_no_open_file(tmp_path: Path) -> None:
    path = tmp_path / "compact.h5"
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    _create_with_type(path, h5py.h5t.STD_I16LE, np.arange(100, dtype="<i2"), dcpl)
    _expect_h5py(path, "compact")


# -- reading whole chunks, keeping cut ones, past the page cache -----------------


def test_a_chunk_two_blocks_share_is_decoded_once(make_array: Callable[..., Path]) -> None:
    data = np.random.default_rng(1).standard_normal((1000, 5)).astype("<f4")
    node = inspect_node(make_array(data, chunkshape=(32, 5)), "/data")
    src = ChunkSource(node)
    decoded: list[int] = []
    inner = src._pipeline.decode
    src._pipeline.decode = lambda raw, mask, out: (decoded.append(1), inner(raw, mask, out))[1]  # type: ignore[method-assign]
    try:
        plan = BlockPlan(1000, 48, remainder=True)
        for k in range(plan.n_blocks):
            a, n = plan.start(k), plan.rows(k)
            out = np.empty((n, 5), "<f4")
            src.read_into(a, a + n, out)
            np.testing.assert_array_equal(out, data[a : a + n])
    finally:
        src.close()
    assert len(decoded) == 32  # every chunk once, though 20 of 21 block boundaries cut one


def _blosc_rows(tmp_path: Path) -> "tuple[Path, np.ndarray]":
    """1,000 rows of 64 floats in chunks of 64 rows (16 KiB: blosc blocks of a few KiB), blosc alone; chunk 4 (rows
    256-319) stored as it is (blosc skipped)."""
    data = np.cumsum(np.random.default_rng(3).standard_normal((1000, 64)), axis=1).astype("<f4")
    path = tmp_path / "blosc.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("data", data=data, chunks=(64, 64), **hdf5plugin.Blosc(cname="lz4", clevel=5))
        d.id.write_direct_chunk((256, 0), data[256:320].tobytes(), filter_mask=1)
    return path, data


def _counting(src: ChunkSource, seen: "list[str]") -> None:
    """Note on ``seen`` each whole chunk and each part of one that ``src``'s pipeline decodes."""
    pipeline = src._pipeline
    whole, part = pipeline.decode, pipeline.decode_part
    pipeline.decode = lambda raw, mask, out: (seen.append("whole"), whole(raw, mask, out))[1]  # type: ignore[method-assign]
    pipeline.decode_part = lambda raw, mask, first, dst: (seen.append("part"), part(raw, mask, first, dst))[1]  # type: ignore[method-assign]


def test_reads_that_do_not_follow_one_another_decode_only_their_part_of_a_blosc_chunk(tmp_path: Path) -> None:
    path, data = _blosc_rows(tmp_path)
    src = ChunkSource(inspect_node(path, "/data"))
    seen: "list[str]" = []
    _counting(src, seen)
    try:
        for a, b, expected in (
            (10, 20, ["whole"]),  # a first read goes on as a stream would: the chunk is kept for what follows
            (20, 40, []),  # which it is: rows 20-40 come from the kept chunk
            (300, 301, []),  # a row elsewhere, of chunk 4, stored as it is: its bytes read from the file, nothing decoded
            (130, 140, ["part"]),  # one of chunk 2: blosc decodes the blocks that hold it
            (640, 700, ["part"]),  # rows 640-700 after 300-301: chunk 10's part
            (700, 710, ["part", "whole"]),  # going on from there: the rest of chunk 10; chunk 11 whole, kept for 710 on
            (990, 1000, ["part"]),  # the last chunk (rows 960-999 of 960-1023), elsewhere
        ):
            before = len(seen)
            out = np.empty((b - a, 64), "<f4")
            src.read_into(a, b, out)
            np.testing.assert_array_equal(out, data[a:b])
            assert seen[before:] == expected, (a, b)
    finally:
        src.close()


def test_a_chunk_of_other_filters_is_decoded_whole_wherever_the_read_starts(tmp_path: Path) -> None:
    data = np.arange(1000 * 8, dtype="<f4").reshape(1000, 8)
    path = tmp_path / "zlib.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, chunks=(64, 8), compression="gzip", shuffle=True)
    src = ChunkSource(inspect_node(path, "/data"))
    seen: "list[str]" = []
    _counting(src, seen)
    try:
        for a, b in ((10, 20), (300, 301), (990, 1000)):
            out = np.empty((b - a, 8), "<f4")
            src.read_into(a, b, out)
            np.testing.assert_array_equal(out, data[a:b])
    finally:
        src.close()
    assert seen == ["whole"] * 3


def _zlib_rows(tmp_path: Path) -> "tuple[Path, np.ndarray]":
    """1,000 rows of 8 floats in zlib chunks of 64 rows (2 KiB decoded each)."""
    data = np.arange(1000 * 8, dtype="<f4").reshape(1000, 8)
    path = tmp_path / "zlib.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, chunks=(64, 8), compression="gzip", shuffle=True)
    return path, data


def test_a_request_reader_decodes_a_chunk_once_while_its_decoded_chunks_fit(tmp_path: Path) -> None:
    path, data = _zlib_rows(tmp_path)
    src = ChunkSource(inspect_node(path, "/data"), decoded_bytes=1 << 20)
    seen: "list[str]" = []
    _counting(src, seen)
    rows = np.random.default_rng(5).integers(0, 1000, 400)
    try:
        for r in rows.tolist():
            out = np.empty((1, 8), "<f4")
            src.read_into(r, r + 1, out)
            np.testing.assert_array_equal(out, data[r : r + 1])
    finally:
        src.close()
    assert len(seen) == len(np.unique(rows // 64))  # every chunk read once, however often its rows were asked for


def test_the_least_recently_read_chunk_is_decoded_again_once_the_others_fill_the_bytes_kept(tmp_path: Path) -> None:
    path, data = _zlib_rows(tmp_path)
    src = ChunkSource(inspect_node(path, "/data"), decoded_bytes=2 * 64 * 8 * 4)  # two chunks
    seen: "list[int]" = []
    inner = src._pipeline.decode
    src._pipeline.decode = lambda raw, mask, out: (seen.append(1), inner(raw, mask, out))[1]  # type: ignore[method-assign]
    try:
        for row, decodes in ((5, 1), (70, 1), (6, 0), (130, 1), (7, 0), (71, 1), (8, 0), (72, 0), (131, 1)):
            before = len(seen)
            out = np.empty((1, 8), "<f4")
            src.read_into(row, row + 1, out)
            np.testing.assert_array_equal(out, data[row : row + 1])
            assert len(seen) - before == decodes, row
    finally:
        src.close()


def test_decoded_chunks_keep_none_larger_than_their_bytes() -> None:
    kept = DecodedChunks(100)
    assert kept.takes(100) and not kept.takes(101) and not kept.takes(0)
    a, b, c = (np.zeros(40, np.uint8) for _ in range(3))
    assert kept.put((0,), a) == [] and kept.put((1,), b) == []
    assert kept.get((0,)) is a  # now the most recently used: (1,) goes first
    assert kept.put((2,), c) == [b]
    assert kept.get((1,)) is None and kept.get((0,)) is a and kept.get((2,)) is c
    assert kept.put((0,), np.zeros(40, np.uint8)) == [a]  # a chunk kept anew gives its old array back
    assert len(kept) == 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reads=st.lists(st.tuples(st.integers(0, 999), st.integers(1, 150)), min_size=1, max_size=12),
       decoded=st.sampled_from([0, 2 * 64 * 64 * 4, 1 << 20]))
def test_any_reads_in_any_order_give_h5pys_rows(tmp_path: Path, reads: "list[tuple[int, int]]", decoded: int) -> None:
    path = tmp_path / "blosc.h5"
    if not path.exists():
        _blosc_rows(tmp_path)
    with h5py.File(path, "r") as f:
        data = f["data"][()]
    src = ChunkSource(inspect_node(path, "/data"), decoded_bytes=decoded)
    try:
        for a, n in reads:
            b = min(1000, a + n)
            out = np.full((b - a, 64), np.nan, "<f4")
            src.read_into(a, b, out)
            np.testing.assert_array_equal(out, data[a:b])
    finally:
        src.close()


@pytest.mark.skipif(not DIRECT_IO, reason="the temporary directory's filesystem refuses O_DIRECT")
@pytest.mark.parametrize("kind", ["carray", "array"])
def test_direct_reads_leave_the_page_cache_cold(make_array: Callable[..., Path], kind: str) -> None:
    from multitables_bench.cache import evict, resident_fraction

    data = np.random.default_rng(2).standard_normal((20_000, 64)).astype("<f4")
    path = make_array(data, complib="zlib" if kind == "carray" else None, kind=kind)
    node = inspect_node(path, "/data")
    evict(path)
    before = resident_fraction(path)
    if before > 0.05:
        pytest.skip("this filesystem keeps the file cached (tmpfs?)")
    src = ChunkSource(node, "direct")
    try:
        out = np.empty((20_000, 64), "<f4")
        for a in range(0, 20_000, 3000):
            b = min(a + 3000, 20_000)
            src.read_into(a, b, out[a:b])
    finally:
        src.close()
    np.testing.assert_array_equal(out, data)
    assert resident_fraction(path) < 0.05 + before


def _cold(path: Path) -> float:
    """Evict ``path``; skip where this filesystem keeps it cached anyway (tmpfs)."""
    from multitables_bench.cache import evict, resident_fraction

    evict(path)
    before = resident_fraction(path)
    if before > 0.05:
        pytest.skip("this filesystem keeps the file cached (tmpfs?)")
    return before


def _resident_after(path: Path, at_least: float, within: float = 5.0) -> float:
    """The file's resident fraction once it reaches ``at_least`` (prefetching runs in the background), or after ``within`` s."""
    import time

    from multitables_bench.cache import resident_fraction

    deadline = time.monotonic() + within
    while True:
        frac = resident_fraction(path)
        if frac >= at_least or time.monotonic() > deadline:
            return frac
        time.sleep(0.01)


@pytest.mark.parametrize("engine", ["chunks", "h5py"])
@pytest.mark.parametrize("kind", ["carray", "array"])
def test_prefetch_brings_exactly_those_rows_into_the_page_cache(make_array: Callable[..., Path], kind: str, engine: str) -> None:
    # The h5py engine hints too: HDF5 reads a block chunk by chunk, and two readers' reads would interleave.
    data = np.random.default_rng(3).standard_normal((20_000, 64)).astype("<f4")  # noise: chunks stay full size
    path = make_array(data, complib="zlib" if kind == "carray" else None, kind=kind, chunkshape=(500, 64) if kind == "carray" else None)
    node = inspect_node(path, "/data")
    src = open_source(engine, node, {})
    assert src.engine == engine
    try:
        before = _cold(path)
        src.prefetch(10_000, 12_000)  # four whole chunks: a tenth of the rows
        frac = _resident_after(path, before + 0.09)
        assert 0.09 <= frac - before <= 0.11
        out = np.empty((2000, 64), "<f4")
        src.read_into(10_000, 12_000, out)
        np.testing.assert_array_equal(out, data[10_000:12_000])
    finally:
        src.close()


@pytest.mark.skipif(not DIRECT_IO, reason="the temporary directory's filesystem refuses O_DIRECT")
def test_prefetch_does_nothing_past_the_page_cache(make_array: Callable[..., Path]) -> None:
    import time

    from multitables_bench.cache import resident_fraction

    data = np.random.default_rng(4).standard_normal((20_000, 64)).astype("<f4")
    path = make_array(data, complib="zlib")
    src = ChunkSource(inspect_node(path, "/data"), "direct")
    try:
        before = _cold(path)
        src.prefetch(0, 20_000)
        time.sleep(0.2)  # long enough for a 5 MB background read to show, had one started
        assert resident_fraction(path) < before + 0.05
    finally:
        src.close()


def test_reading_in_process_prefetches_each_next_block(
    make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, blocks_as_asked: None
) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(ChunkSource, "prefetch", lambda self, a, b: calls.append((a, b)))
    data = np.arange(1000 * 8, dtype="<f4").reshape(1000, 8)
    path = make_array(data, chunkshape=(100, 8))
    with multitables.Streamer(str(path), engine="chunks").get_queue("/data", n_procs=None, block_size=300) as q:
        assert q.n_procs == 0  # a small file: read in the consumer
        blocks = []
        for guard in q.iter():
            with guard as block:
                blocks.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(blocks), data[:900])
    assert calls == [(0, 300), (300, 600), (600, 900)]  # the first block hints itself too (NOTE [prefetch])


@pytest.mark.parametrize("n_procs", [None, 1], ids=["in-process", "one-reader"])
def test_stored_bytes_read_by_one_process_are_never_hinted(
    make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, n_procs: "int | None"
) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(ChunkSource, "prefetch", lambda self, a, b: calls.append((a, b)))  # forked readers inherit it
    data = np.arange(1000 * 8, dtype="<f4").reshape(1000, 8)
    path = make_array(data, complib=None, chunkshape=(100, 8))
    got = []
    with multitables.Streamer(str(path), engine="chunks").get_queue("/data", n_procs=n_procs, block_size=300, ordered=True) as q:
        for guard in q.iter():
            with guard as block:
                got.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(got), data[:900])
    assert calls == []  # the kernel reads ahead of one reader by itself (NOTE [read plan])


def test_direct_reads_need_a_filesystem_that_allows_them(make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    node = inspect_node(make_array(np.zeros((100, 4))), "/data")
    real_open = os.open

    def refuse(path: Any, flags: int, *args: Any) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(OSError, match="refuses O_DIRECT"):
        ChunkSource(node, "direct")


# -- through the Streamer -------------------------------------------------------------


@pytest.mark.parametrize("n_procs", [None, 2], ids=["in-process", "readers"])
def test_the_streamer_reads_with_chunks_and_says_so(make_array: Callable[..., Path], n_procs: "int | None") -> None:
    data = np.random.default_rng(3).standard_normal((3000, 16)).astype("<f4")
    path = make_array(data, chunkshape=(64, 16))
    with multitables.Streamer(path).get_queue("/data", n_procs=n_procs, block_size=200, ordered=True, remainder=True) as q:
        assert q.engine == "chunks" and q.n_procs == (0 if n_procs is None else 2)
        got = []
        for guard in q.iter():
            with guard as block:
                got.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(got), data)


def test_the_streamer_says_h5py_where_chunks_cannot_read(tmp_path: Path) -> None:
    data = np.linspace(0, 1, 8000).reshape(2000, 4)
    path = tmp_path / "zfp.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, chunks=(100, 4), **hdf5plugin.Zfp(reversible=True))
    for engine in ("auto", "chunks"):
        with multitables.Streamer(path, engine=engine).get_queue("/data", n_procs=2, block_size=300, ordered=True, remainder=True) as q:
            assert q.engine == "h5py"
            got = []
            for guard in q.iter():
                with guard as block:
                    got.append(block.copy())
        np.testing.assert_array_equal(np.concatenate(got), data)


@pytest.mark.parametrize(
    "shape,chunks,maxshape",
    [
        ((300, 4), (300, 4), None),  # one chunk: HDF5's "single chunk" index
        ((300, 4), (32, 4), None),  # fixed array index
        ((300, 4), (32, 4), (None, 4)),  # extensible array index
        ((300, 4), (32, 3), (None, None)),  # version 2 B-tree index
    ],
    ids=["single", "fixed-array", "extensible-array", "btree2"],
)
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_every_chunk_index_of_the_latest_file_format(tmp_path: Path, shape: tuple, chunks: tuple, maxshape: "tuple | None", compression: "str | None") -> None:
    data = _values(shape, np.dtype("<f8"), np.random.default_rng(6))
    path = tmp_path / "latest.h5"
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset("data", data=data, chunks=chunks, maxshape=maxshape, compression=compression, shuffle=compression is not None)
    node = inspect_node(path, "/data")
    for index_limit in (0, 1 << 17):
        src = ChunkSource(node, index_limit=index_limit)
        try:
            out = np.empty(shape, "<f8")
            src.read_into(0, 100, out[:100])
            src.read_into(100, 300, out[100:])
        finally:
            src.close()
        assert out.tobytes() == data.tobytes()


def test_a_learned_layout_is_sent_whole_to_readers_that_do_not_inherit_it(tmp_path, monkeypatch) -> None:
    """NOTE [layout cache]: spawned and forkserver readers adopt the consumer's layout rather than learn it again."""
    import pickle

    import h5py

    from multitables._io import files
    from multitables._io.chunks.source import ChunkSource
    from multitables._io.chunks.storage import adopt_layout, chunks_problem, forget_layouts, known_layout, learned_layouts
    from multitables._io.node import close_dataset, open_node

    path = tmp_path / "settled.h5"
    rows = np.arange(64 * 64, dtype="<f4").reshape(64, 64)
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=rows, chunks=(8, 64), compression="gzip", shuffle=True)
    monkeypatch.setattr(files, "SETTLED_S", -1.0)  # layouts are kept only for files that have not changed lately
    node, ds = open_node(str(path), "/data")
    try:
        assert chunks_problem(node, ds) is None
    finally:
        close_dataset(ds)
    assert len(learned_layouts(node)) == 1
    sent = pickle.dumps(learned_layouts(node))
    forget_layouts()
    assert known_layout(node) is None and learned_layouts(node) == ()
    for key, layout in pickle.loads(sent):
        adopt_layout(key, layout)
    assert known_layout(node) is not None
    out = np.empty_like(rows)
    source = ChunkSource(node)
    try:
        source.read_into(0, 64, out)
    finally:
        source.close()
    np.testing.assert_array_equal(out, rows)
    forget_layouts()


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 6 << 20), min_size=1, max_size=30))
@example(sizes=[(1 << 20) + k * 100_000 for k in range(1, 30)])  # each read a little larger than the last
def test_the_scratch_for_stored_bytes_is_aligned_and_grows_by_doubling(sizes: list[int]) -> None:
    """Stored bytes vary from block to block: each read larger than any before took fresh memory, a page fault
    a page (issue 29's counters: 330 a block of blosc). Growth doubles, so n reads take at most log2 of their range
    new buffers; every get is aligned for O_DIRECT and as long as asked."""
    from multitables._io.chunks.transport import DIRECT_ALIGN, ScratchBuffer

    scratch = ScratchBuffer()
    buffers, largest = 0, 0
    last = None
    for n in sizes:
        got = scratch.get(n)
        assert len(got) == n and got.ctypes.data % DIRECT_ALIGN == 0
        if got.ctypes.data != last:
            buffers += 1
            last = got.ctypes.data
        largest = max(largest, n)
    assert buffers <= 1 + max(0, (largest - 1).bit_length() - 20)  # 1 MiB first, then each at least twice the last
