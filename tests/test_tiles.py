"""Chunks narrower than a row (tiles): rows exact by both engines whatever the blocks, and which engine ``auto`` takes.

The chunk engine copies a tile's chunk-row at a time (``_io.chunks.tiles``); ``auto`` leaves readers' streams of small
blosc tiles to h5py (``READER_CHUNK_BYTES``).
"""

from __future__ import annotations

from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import multitables
from multitables._io.chunks.engine import READER_CHUNK_BYTES
from multitables._io.chunks.grid import ChunkGrid, chunk_parts
from multitables._io.chunks.tiles import TileRows
from multitables._io.engines import resolve_engine
from multitables._io.node import inspect_node


def _images(shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(sum(shape))
    return (np.cumsum(rng.integers(-3, 4, size=shape), axis=-1) % 4096).astype(np.uint16)


def _write(path: Path, data: np.ndarray, chunks: tuple[int, ...], codec: str) -> None:
    kw = dict(hdf5plugin.Blosc()) if codec == "blosc" else dict(compression="gzip", compression_opts=3, shuffle=True)
    with h5py.File(path, "w") as f:
        f.create_dataset("d", data=data, chunks=chunks, **kw)


def _stream(path: Path, engine: str, n_procs: int, block_size: int) -> "tuple[np.ndarray, str]":
    with multitables.Streamer(path, engine=engine).get_queue(
        "/d", n_procs=n_procs, ordered=True, remainder=True, block_size=block_size
    ) as q:
        rows = np.concatenate([g.__enter__().copy() for g in q.iter()])
        return rows, q.engine


@pytest.mark.parametrize("codec", ["blosc", "zlib"])
@pytest.mark.parametrize("chunks", [(1, 16, 16), (1, 32, 32), (1, 64, 64), (4, 32, 32), (3, 24, 40)])
def test_tiles_are_read_exactly_by_both_engines(tmp_path: Path, codec: str, chunks: tuple[int, ...]) -> None:
    """Images of 64 x 64 in tiles, the last (3, 24, 40) cut at the edges; blocks that cut the chunks' rows (3 rows of
    4-row chunks: a chunk-row kept for the next block, or read again by a reader that skips it)."""
    data = _images((22, 64, 64))
    path = tmp_path / "tiles.h5"
    _write(path, data, chunks, codec)
    for engine in ("chunks", "h5py"):
        for block_size in (1, 3, 8):
            rows, used = _stream(path, engine, 0, block_size)
            assert used == engine
            np.testing.assert_array_equal(rows, data, err_msg=f"{engine}, blocks of {block_size}")
    rows, used = _stream(path, "chunks", 2, 3)
    assert used == "chunks"
    np.testing.assert_array_equal(rows, data)


def test_tiles_never_written_read_as_the_fill_value(tmp_path: Path) -> None:
    """Tiles of a chunk-row that were never written: the fill value, the others' elements where they land."""
    path = tmp_path / "holes.h5"
    data = np.full((6, 32, 32), 7, np.uint16)
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("d", shape=data.shape, dtype=np.uint16, chunks=(1, 16, 16), fillvalue=7,
                              compression="gzip")
        for i in range(6):
            ds[i, i % 2 * 16 : i % 2 * 16 + 16, :16] = data[i, i % 2 * 16 :i % 2 * 16 + 16, :16] = i
    np.testing.assert_array_equal(_stream(path, "chunks", 0, 4)[0], data)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_chunk_row_decoded_into_tile_rows_lands_as_its_chunks_would(draw: st.DataObject) -> None:
    """Pure: each chunk decoded into :meth:`TileRows.into`, in any order, and the block is its rows of the dataset."""
    rank = draw.draw(st.integers(2, 3))
    shape = tuple(draw.draw(st.integers(1, 9)) for _ in range(rank))
    chunks = tuple(draw.draw(st.integers(1, s)) for s in shape)
    start = draw.draw(st.integers(0, shape[0] - 1))
    stop = draw.draw(st.integers(start + 1, shape[0]))
    grid = ChunkGrid(shape, chunks)
    data = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    padded = np.zeros(tuple(k * c for k, c in zip(grid.counts, chunks)), np.int32)
    padded[tuple(slice(0, s) for s in shape)] = data
    tiles = TileRows(grid, np.dtype(np.int32), int(np.prod(chunks)) * 4)
    parts = draw.draw(st.permutations(chunk_parts(grid, start, stop)))
    tiles.expect(parts, -1)
    out = np.full((stop - start,) + shape[1:], -1, np.int32)
    for part in parts:
        chunk = padded[tuple(slice(i * c, i * c + c) for i, c in zip(part.index, chunks))]
        tiles.into(part)[:] = np.ascontiguousarray(chunk).view(np.uint8).reshape(-1)
        tiles.decoded(part, out)
    np.testing.assert_array_equal(out, data[start:stop])


@pytest.mark.parametrize("tile, expected", [(64, "h5py"), (256, "chunks")])
def test_auto_leaves_readers_stream_of_small_blosc_tiles_to_h5py(tmp_path: Path, no_leaks: None, tile: int,
                                                                 expected: str) -> None:
    """uint16 images of 512 x 512 in blosc (hdf5plugin's default) tiles of (1, 64, 64): 8 KiB chunks, whose Python
    around each chunk cost the chunk engine more than blosc's equal decode saved (1.3x h5py's CPU a pass); readers took
    the chunk engine all the same. From ``READER_CHUNK_BYTES`` (tiles of 256 x 256: 128 KiB) they still do; in the
    consumer h5py reads both; zlib tiles stay the chunk engine's (it decodes deflate faster)."""
    data = _images((8, 512, 512))
    path = tmp_path / "images.h5"
    _write(path, data, (1, tile, tile), "blosc")
    node = inspect_node(path, "/d")
    assert (tile * tile * 2 >= READER_CHUNK_BYTES) == (expected == "chunks")
    assert resolve_engine("auto", node, {}, readers=True) == expected
    assert resolve_engine("auto", node, {}) == "h5py"
    assert resolve_engine("auto", node, {}, readers=True, requests=True) == "chunks"  # a Reader's, measured apart
    rows, used = _stream(path, "auto", 2, 3)
    assert used == expected
    np.testing.assert_array_equal(rows, data)
    zlib = tmp_path / "zlib.h5"
    _write(zlib, data, (1, tile, tile), "zlib")
    assert resolve_engine("auto", inspect_node(zlib, "/d"), {}, readers=True) == "chunks"
