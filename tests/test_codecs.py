"""The reverse filter pipeline: every chunk decodes to the bytes h5py reads, for every filter and sub-codec."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Iterator

import h5py
import hdf5plugin
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multitables._io.chunks.codecs import libraries
from multitables._io.chunks.codecs.base import (
    BITSHUFFLE,
    BLOSC,
    DEFLATE,
    FLETCHER32,
    LZ4,
    SHUFFLE,
    ChunkDecodeError,
    FilterSpec,
    UnsupportedFilter,
    filters_of,
)
from multitables._io.chunks.codecs.fletcher32 import fletcher32_numpy
from multitables._io.chunks.codecs.registry import build_pipeline
from multitables._io.chunks.codecs.shuffle import Shuffle, unshuffle_numpy

imagecodecs = pytest.importorskip("imagecodecs")


def _data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Half smooth (compressible), half noise (which blosc fails to compress: those chunks get a filter mask)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    smooth = np.repeat(np.arange(n * dt.itemsize // 64 + 1, dtype=np.uint8), 64)[: n * dt.itemsize // 2]
    raw[: len(smooth)] = smooth
    return raw.view(dt).reshape(shape)


def _shuffle_bytes(raw: bytes, itemsize: int) -> bytes:
    """HDF5's shuffle: byte j of element i goes to j * n + i; a tail shorter than an element stays at the end."""
    b = np.frombuffer(raw, np.uint8)
    n = len(b) // itemsize
    if itemsize <= 1 or n <= 1:
        return raw
    return b[: n * itemsize].reshape(n, itemsize).T.tobytes() + b[n * itemsize :].tobytes()


def _shuffled(data: np.ndarray) -> bytes:
    return _shuffle_bytes(data.tobytes(), data.dtype.itemsize)


def check_every_chunk(ds: Any) -> int:
    """Decode each stored chunk of h5py dataset ``ds`` with the pipeline; compare with h5py's read. Returns masked chunks."""
    specs = filters_of(ds.id.get_create_plist())
    chunks, dt = ds.chunks, ds.dtype
    pipeline = build_pipeline(specs, int(np.prod(chunks)) * dt.itemsize, dt.itemsize)
    out = np.empty(int(np.prod(chunks)) * dt.itemsize, np.uint8)
    infos: list[Any] = []
    ds.id.chunk_iter(infos.append)
    masked = 0
    for info in infos:
        mask, raw = ds.id.read_direct_chunk(info.chunk_offset)
        masked += mask != 0
        pipeline.decode(raw, mask, out)
        region = tuple(slice(o, min(o + c, s)) for o, c, s in zip(info.chunk_offset, chunks, ds.shape))
        local = tuple(slice(0, r.stop - r.start) for r in region)
        got = out.view(dt).reshape(chunks)[local]
        assert got.tobytes() == ds[region].tobytes(), f"chunk {info.chunk_offset} with {pipeline.names}"
    return masked


def _h5py_cases() -> Iterator[Any]:
    yield pytest.param(dict(compression="gzip", compression_opts=1), id="gzip1")
    yield pytest.param(dict(compression="gzip", compression_opts=9, shuffle=True), id="gzip9+shuffle")
    yield pytest.param(dict(shuffle=True), id="shuffle")
    yield pytest.param(dict(fletcher32=True), id="fletcher32")
    yield pytest.param(dict(compression="gzip", shuffle=True, fletcher32=True), id="gzip+shuffle+fletcher32")
    yield pytest.param(dict(compression="lzf", shuffle=True), id="lzf+shuffle")
    yield pytest.param(dict(hdf5plugin.LZ4()), id="lz4")
    yield pytest.param(dict(hdf5plugin.LZ4(nbytes=1024), fletcher32=True), id="lz4-1KiB-blocks+fletcher32")
    yield pytest.param(dict(hdf5plugin.Zstd(clevel=5)), id="zstd")
    yield pytest.param(dict(hdf5plugin.BZip2(blocksize=5)), id="bzip2")
    for cname in ("none", "lz4", "zstd"):
        yield pytest.param(dict(hdf5plugin.Bitshuffle(cname=cname)), id=f"bitshuffle-{cname}")
    yield pytest.param(dict(hdf5plugin.Bitshuffle(nelems=256, cname="lz4")), id="bitshuffle-lz4-256")
    for cname in ("blosclz", "lz4", "lz4hc", "zlib", "zstd"):
        for shuffle in (hdf5plugin.Blosc.NOSHUFFLE, hdf5plugin.Blosc.SHUFFLE, hdf5plugin.Blosc.BITSHUFFLE):
            yield pytest.param(dict(hdf5plugin.Blosc(cname=cname, clevel=5, shuffle=shuffle)), id=f"blosc-{cname}-{shuffle}")
    for cname in ("blosclz", "lz4", "lz4hc", "zlib", "zstd"):
        for filt in (hdf5plugin.Blosc2.NOFILTER, hdf5plugin.Blosc2.SHUFFLE, hdf5plugin.Blosc2.BITSHUFFLE):
            yield pytest.param(dict(hdf5plugin.Blosc2(cname=cname, clevel=5, filters=filt)), id=f"blosc2-{cname}-{filt}")


@pytest.mark.parametrize("kwargs", list(_h5py_cases()))
@pytest.mark.parametrize(
    "shape,chunks,dtype",
    [((1000,), (128,), "<f4"), ((203, 7), (32, 7), ">i2"), ((61, 5, 6), (8, 3, 4), "<f8"), ((70, 3), (16, 3), "u1")],
    ids=["1d-f4", "2d-i2be-edge", "3d-f8-nd-chunks", "2d-u1"],
)
def test_every_chunk_decodes_as_h5py_reads_it(tmp_path: Path, kwargs: dict, shape: tuple, chunks: tuple, dtype: str) -> None:
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=_data(shape, dtype), chunks=chunks, **kwargs)
    with h5py.File(path, "r") as f:
        check_every_chunk(f["d"])


def test_blosc_on_noise_leaves_chunks_unfiltered_and_their_mask_is_honoured(tmp_path: Path) -> None:
    data = np.random.default_rng(5).integers(0, 2**32, (4000, 16), dtype=np.uint32)
    data[:1000] = 7  # compressible chunks beside incompressible ones
    path = tmp_path / "noise.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=data, chunks=(100, 16), **hdf5plugin.Blosc(cname="lz4", clevel=9, shuffle=0))
    with h5py.File(path, "r") as f:
        assert check_every_chunk(f["d"]) > 0  # some chunks were stored as they are


def test_any_filter_mask_is_honoured(tmp_path: Path) -> None:
    """Chunks written by hand with every combination of skipped filters read as h5py reads them."""
    data = _data((4, 50, 3), "<f4", seed=3)
    path = tmp_path / "masks.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("d", shape=(200, 3), dtype="<f4", chunks=(50, 3), compression="gzip", shuffle=True)
        # Filters in order: shuffle (bit 0), deflate (bit 1).
        ds.id.write_direct_chunk((0, 0), zlib.compress(_shuffled(data[0])), filter_mask=0)
        ds.id.write_direct_chunk((50, 0), zlib.compress(data[1].tobytes()), filter_mask=0b01)
        ds.id.write_direct_chunk((100, 0), _shuffled(data[2]), filter_mask=0b10)
        ds.id.write_direct_chunk((150, 0), data[3].tobytes(), filter_mask=0b11)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["d"][:], data.reshape(200, 3))
        assert check_every_chunk(f["d"]) == 3


def test_a_wrong_checksum_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "f32.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=np.arange(1000, dtype="<i4"), chunks=(100,), fletcher32=True)
    with h5py.File(path, "r") as f:
        mask, raw = f["d"].id.read_direct_chunk((200,))
    pipeline = build_pipeline((FilterSpec(FLETCHER32, 0, ()),), 400, 4)
    out = np.empty(400, np.uint8)
    pipeline.decode(raw, mask, out)
    bad = bytearray(raw)
    bad[17] ^= 0x10
    with pytest.raises(ChunkDecodeError, match="fletcher32 checksum mismatch"):
        pipeline.decode(bytes(bad), mask, out)
    # HDF5 before 1.6.3 wrote the sum with the bytes of each half swapped; both are accepted.
    s = int.from_bytes(raw[-4:], "little")
    swapped = ((s & 0x00FF00FF) << 8) | ((s >> 8) & 0x00FF00FF)
    pipeline.decode(raw[:-4] + swapped.to_bytes(4, "little"), mask, out)


def test_corrupt_or_wrong_sized_chunks_are_errors() -> None:
    data = np.arange(256, dtype="<i4")
    deflate = build_pipeline((FilterSpec(SHUFFLE, 0, (4,)), FilterSpec(DEFLATE, 0, (5,))), 1024, 4)
    out = np.empty(1024, np.uint8)
    good = zlib.compress(_shuffled(data))
    deflate.decode(good, 0, out)
    np.testing.assert_array_equal(out.view("<i4"), data)
    with pytest.raises(ChunkDecodeError, match="deflate"):
        deflate.decode(good[:-9], 0, out)
    with pytest.raises(ChunkDecodeError, match="deflate"):
        deflate.decode(zlib.compress(_shuffled(data[:100])), 0, out)  # decodes to fewer bytes than a chunk
    with pytest.raises(ChunkDecodeError, match="chunk decoded to"):
        deflate.decode(b"\0" * 100, 0b11, out)  # stored unfiltered, but not a chunk's size
    blosc = build_pipeline((FilterSpec(BLOSC, 1, (2, 2, 4, 1024, 5, 1, 0)),), 1024, 4)
    with pytest.raises(ChunkDecodeError, match="blosc"):
        blosc.decode(b"\x02\x01" + b"\0" * 30, 0, out)


@pytest.mark.parametrize(
    "spec",
    [
        FilterSpec(4, 1, (), "szip"),
        FilterSpec(5, 1, (), "nbit"),
        FilterSpec(6, 1, (), "scaleoffset"),
        FilterSpec(32017, 1, (), "SZ"),
        FilterSpec(BITSHUFFLE, 1, (0, 4, 4, 0, 7), "bitshuffle"),
    ],
    ids=lambda s: s.name,
)
def test_unknown_filters_are_refused_with_a_reason(spec: FilterSpec) -> None:
    with pytest.raises(UnsupportedFilter, match=f"filter {spec.id}"):
        build_pipeline((spec,), 400, 4)


def test_two_compressors_in_a_row_are_refused() -> None:
    with pytest.raises(UnsupportedFilter, match="after another compressor"):
        build_pipeline((FilterSpec(DEFLATE, 0, (1,)), FilterSpec(DEFLATE, 0, (1,))), 400, 4)


def test_a_checksum_before_and_a_shuffle_after_compression_are_undone() -> None:
    data = np.arange(300, dtype="<u2")
    payload = data.tobytes()
    with_sum = payload + fletcher32_numpy(payload).to_bytes(4, "little")
    compressed = zlib.compress(with_sum)
    stored = _shuffle_bytes(compressed, 4)  # shuffling compressed bytes: odd, but HDF5 allows it
    specs = (FilterSpec(FLETCHER32, 0, ()), FilterSpec(DEFLATE, 0, (4,)), FilterSpec(SHUFFLE, 0, (4,)))
    out = np.empty(600, np.uint8)
    build_pipeline(specs, 600, 2).decode(stored, 0, out)
    np.testing.assert_array_equal(out.view("<u2"), data)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=3000))
def test_numpy_fletcher32_is_hdf5s(data: bytes) -> None:
    assert fletcher32_numpy(data) == imagecodecs.h5checksum_fletcher32(data)


@pytest.mark.parametrize("n", [0, 1, 2, 719, 720, 721, 4096, 100_001])
def test_numpy_fletcher32_on_saturated_sums(n: int) -> None:
    # All-0xff words push the 32-bit sums to their limits between folds.
    data = b"\xff" * n
    assert fletcher32_numpy(data) == imagecodecs.h5checksum_fletcher32(data)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.integers(0, 3000))
def test_unshuffle_undoes_hdf5s_shuffle(itemsize: int, nbytes: int) -> None:
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    stored = np.frombuffer(_shuffle_bytes(data.tobytes(), itemsize), np.uint8)
    out = np.empty(nbytes, np.uint8)
    stage = Shuffle(itemsize)
    stage.decode(stored, nbytes, out)
    np.testing.assert_array_equal(out, data)
    if nbytes // itemsize > 1:  # HDF5 leaves buffers of one element as they are
        fallback = np.empty(nbytes, np.uint8)
        unshuffle_numpy(stored, itemsize, fallback)
        np.testing.assert_array_equal(fallback, data)


@pytest.fixture
def without_optional_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on an install without imagecodecs, c-blosc2's unshuffle or hdf5plugin's bitshuffle library."""
    monkeypatch.setattr(libraries, "_cache", {"imagecodecs": None, "libblosc2": None, "libbshuf": None})


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param(dict(compression="gzip", shuffle=True, fletcher32=True), id="gzip+shuffle+fletcher32"),
        pytest.param(dict(hdf5plugin.Blosc(cname="zstd")), id="blosc"),
        pytest.param(dict(hdf5plugin.BZip2()), id="bzip2"),
    ],
)
def test_fallbacks_without_imagecodecs_read_the_same(tmp_path: Path, without_optional_codecs: None, kwargs: dict) -> None:
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=_data((203, 7), "<f4"), chunks=(32, 7), **kwargs)
    with h5py.File(path, "r") as f:
        check_every_chunk(f["d"])


@pytest.mark.parametrize("kwargs", [dict(cname="none"), dict(cname="lz4"), dict(cname="zstd", nelems=256)], ids=str)
def test_bitshuffle_block_by_block_without_hdf5plugins_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict) -> None:
    monkeypatch.setattr(libraries, "_cache", {"libbshuf": None})
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=_data((1203, 7), "<f4"), chunks=(301, 7), **hdf5plugin.Bitshuffle(**kwargs))
    with h5py.File(path, "r") as f:
        check_every_chunk(f["d"])
    assert libraries._cache["libbshuf"] is None


def test_codecs_only_imagecodecs_has_are_refused_without_it(without_optional_codecs: None) -> None:
    for fid in (LZ4, 32015, 32000, BITSHUFFLE):
        with pytest.raises(UnsupportedFilter, match="needs imagecodecs"):
            build_pipeline((FilterSpec(fid, 1, (0, 4, 4, 0, 2)),), 400, 4)


def test_blosc2_frames_cut_in_blocks_of_any_shape(tmp_path: Path) -> None:
    """A b2nd frame's bytes are in block order: in C order only when its blocks are whole trailing slabs."""
    import blosc2

    data = _data((96, 10, 12), "<f4", seed=9)
    path = tmp_path / "b2nd.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("d", shape=data.shape, dtype="<f4", chunks=(32, 10, 12), **hdf5plugin.Blosc2(cname="lz4"))
        for k, blocks in enumerate([(8, 5, 4), (8, 10, 12), (5, 10, 12)]):
            part = np.ascontiguousarray(data[32 * k : 32 * k + 32])
            frame = blosc2.asarray(part, chunks=part.shape, blocks=blocks).to_cframe()
            ds.id.write_direct_chunk((32 * k, 0, 0), frame)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["d"][:], data)
        check_every_chunk(f["d"])


def _blosc_buffer(values: np.ndarray, blocksize: int, shuffle: bool) -> bytes:
    """``values`` as one blosc 1 buffer (c-blosc through imagecodecs), in blocks of ``blocksize`` bytes."""
    return imagecodecs.blosc_encode(values, level=5, shuffle=1 if shuffle else 0, typesize=values.itemsize,
                                    blocksize=blocksize, numthreads=1)


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 6000),
    dtype=st.sampled_from(["<f4", ">i8", "<u2", "|u1"]),
    blocksize=st.sampled_from([0, 512, 4096]),
    shuffle=st.booleans(),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)).map(sorted),
)
def test_blosc_decodes_any_part_of_a_buffer_as_the_whole_has_it(n: int, dtype: str, blocksize: int, shuffle: bool, cut: "list[float]") -> None:
    from multitables._io.chunks.codecs.blosc import Blosc

    values = np.arange(n, dtype=dtype) * 3 + (np.arange(n) % 7).astype(dtype)
    buf = _blosc_buffer(values, blocksize, shuffle)
    lo, hi = int(cut[0] * n), int(cut[1] * n)
    item = values.itemsize
    dst = np.full((hi - lo) * item, 0xAB, np.uint8)
    assert Blosc().decode_part(buf, values.nbytes, lo * item, dst)
    np.testing.assert_array_equal(dst, values[lo:hi].view(np.uint8))


def test_blosc_decodes_no_part_that_cuts_an_item_or_without_c_blosc2(monkeypatch: pytest.MonkeyPatch) -> None:
    from multitables._io.chunks.codecs.blosc import Blosc

    values = np.arange(1000, dtype="<f4")
    buf = _blosc_buffer(values, 0, True)
    assert not Blosc().decode_part(buf, values.nbytes, 2, np.empty(8, np.uint8))  # from inside an item
    assert not Blosc().decode_part(buf, values.nbytes, 4, np.empty(6, np.uint8))  # to inside one
    with pytest.raises(ChunkDecodeError, match="expected 8000"):
        Blosc().decode_part(buf, 8000, 0, np.empty(8, np.uint8))  # the header says 4,000 bytes
    with pytest.raises(ChunkDecodeError, match="shorter than a blosc header"):
        Blosc().decode_part(buf[:10], values.nbytes, 0, np.empty(8, np.uint8))
    monkeypatch.setitem(libraries._cache, "libblosc2", None)
    assert not Blosc().decode_part(buf, values.nbytes, 0, np.empty(8, np.uint8))


def test_every_codec_function_is_among_those_loaded_before_readers_fork() -> None:
    """A reader forked while another thread had imagecodecs load a codec waited for ever on its lock, so the consumer
    loads each function a codec takes before it forks (NOTE [forking among threads] in ``_sys.forks``)."""
    import re

    named: set[str] = set()
    for module in Path(libraries.__file__).parent.glob("*.py"):
        named |= set(re.findall(r'(?:imagecodecs_function|need)\("(\w+)"\)', module.read_text()))
    assert len(named) >= 8
    assert named <= set(libraries.IMAGECODECS_FUNCTIONS), named - set(libraries.IMAGECODECS_FUNCTIONS)
