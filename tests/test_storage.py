"""What a process remembers of a dataset's layout, and when it must not (NOTE [layout cache] in ``_io.chunks.storage``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import h5py
import numpy as np
import pytest
import tables

import multitables
from multitables._io.chunks import source as chunks_module
from multitables._io.chunks import storage
from multitables._io.chunks.source import ChunkSource
from multitables._io.engines import resolve_engine
from multitables._io.fileset import inspect_files
from multitables._io.node import inspect_node


@pytest.fixture(autouse=True)
def no_layouts() -> Iterator[None]:
    """Each test starts with nothing learned, and leaves nothing behind."""
    storage.forget_layouts()
    yield
    storage.forget_layouts()


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files just written count as settled (the tests write them a moment before reading)."""
    monkeypatch.setattr(storage, "SETTLED_S", -1.0)


def read_all(node: Any, **kwargs: Any) -> np.ndarray:
    source = ChunkSource(node, **kwargs)
    try:
        out = np.empty((node.n_rows,) + node.row_shape, node.dtype)
        source.read_into(0, node.n_rows, out)
        return out
    finally:
        source.close()


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


def test_a_layout_learned_is_used_again_without_opening_hdf5(
    make_array: Callable[..., Path], settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = rows(100, 0)
    node = inspect_node(make_array(data, chunkshape=(16, 8)), "/data")
    assert storage.known_layout(node) is None
    assert np.array_equal(read_all(node), data)
    assert storage.known_layout(node) is not None

    def no_open(node: Any) -> Any:
        raise AssertionError("the layout was known: no HDF5 open")

    monkeypatch.setattr(chunks_module, "reopen_dataset", no_open)
    assert np.array_equal(read_all(node), data)
    assert np.array_equal(read_all(node, cache="page"), data)


def test_a_file_just_written_is_not_remembered(make_array: Callable[..., Path]) -> None:
    # A rewrite of the same size within one tick of the filesystem's clock would keep its identity.
    data = rows(50, 1)
    node = inspect_node(make_array(data, chunkshape=(8, 8)), "/data")
    assert np.array_equal(read_all(node), data)
    assert storage.known_layout(node) is None


def test_a_file_rewritten_is_read_as_it_is_now(tmp_path: Path, settled: None) -> None:
    path = tmp_path / "f.h5"
    first, second = rows(64, 2), rows(70, 3)
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=first, chunks=(8, 8), compression="gzip")
    assert np.array_equal(read_all(inspect_node(path, "/data")), first)
    with h5py.File(path, "w") as f:  # the same path and inode; other rows, chunks and offsets
        f.create_dataset("data", data=second, chunks=(5, 8), compression="gzip", shuffle=True)
    node = inspect_node(path, "/data")
    assert np.array_equal(read_all(node), second)
    assert storage.known_layout(node).storage.chunks == (5, 8)


def test_an_index_too_long_to_list_is_not_remembered(
    make_array: Callable[..., Path], settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "READ_BTREE", False)  # HDF5's listing, whose lookups need the file open
    data = rows(100, 4)
    node = inspect_node(make_array(data, chunkshape=(10, 8)), "/data")
    assert np.array_equal(read_all(node, index_limit=3), data)
    assert storage.known_layout(node) is None
    assert np.array_equal(read_all(node), data)
    assert storage.known_layout(node) is not None
    # A caller that asks for lookups one by one still gets them, the layout known or not.
    assert np.array_equal(read_all(node, index_limit=3), data)


def test_layouts_kept_are_bounded_least_recent_forgotten(
    make_array: Callable[..., Path], settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "LAYOUT_ENTRIES_KEPT", 10)
    nodes = [inspect_node(make_array(rows(16, k), chunkshape=(4, 8)), "/data") for k in range(4)]  # 4 chunks each
    for k, node in enumerate(nodes):
        assert np.array_equal(read_all(node), rows(16, k))
    assert storage._layout_entries <= 10
    assert [storage.known_layout(n) is not None for n in nodes] == [False, False, True, True]


def test_the_check_before_readers_start_leaves_every_files_layout(tmp_path: Path, settled: None) -> None:
    files = []
    for k in range(3):
        files.append(str(tmp_path / f"s-{k}.h5"))
        with tables.open_file(files[-1], "w") as f:
            f.create_carray("/", "data", obj=rows(40, k), filters=tables.Filters(3, "zlib"), chunkshape=(8, 8))
    node = inspect_files(tuple(files), "/data")
    assert resolve_engine("chunks", node, {}) == "chunks"
    assert all(storage.known_layout(part.node) is not None for part in node.parts)


@pytest.mark.parametrize("n_procs", [0, 2])
def test_shuffled_epochs_over_shards_with_layouts_known_deliver_every_row_once(
    tmp_path: Path, settled: None, no_leaks: None, n_procs: int
) -> None:
    files, parts = [], []
    for k, (n, codec) in enumerate([(37, "zlib"), (64, "blosc:lz4"), (5, None), (100, "zlib"), (1, "zlib")]):
        files.append(str(tmp_path / f"s-{k}.h5"))
        parts.append(rows(n, 10 + k))
        with tables.open_file(files[-1], "w") as f:
            filters = tables.Filters(3, codec) if codec else None
            f.create_carray("/", "data", obj=parts[-1], filters=filters, chunkshape=(6, 8))
    data = np.concatenate(parts)
    batches = multitables.Streamer(files, engine="chunks").get_batches(
        "/data", batch_size=16, shuffle=True, seed=3, n_procs=n_procs, drop_last=False)
    for _ in range(2):  # the second epoch reads through the layouts the first learned
        got = np.concatenate(list(batches))
        assert sorted(map(bytes, got)) == sorted(map(bytes, data))


@pytest.mark.parametrize("cache", ["page", "direct"])
def test_a_sets_files_share_one_read_buffer_page_cache_or_past_it(tmp_path: Path, no_leaks: None, cache: str) -> None:
    # Files of unequal sizes and codecs, read in blocks that cross files: the shared buffer only grows.
    files, parts = [], []
    for k, (n, codec) in enumerate([(300, "zlib"), (7, None), (1000, "blosc:lz4"), (64, "zlib")]):
        files.append(str(tmp_path / f"s-{k}.h5"))
        parts.append(rows(n, 20 + k))
        with tables.open_file(files[-1], "w") as f:
            filters = tables.Filters(3, codec) if codec else None
            f.create_carray("/", "data", obj=parts[-1], filters=filters, chunkshape=(50, 8))
    stream = multitables.Streamer(files, engine="chunks", cache=cache)
    try:
        queue = stream.get_queue("/data", n_procs=2, block_size=97, ordered=True, remainder=True)
    except OSError as exc:
        if "refuses O_DIRECT" in str(exc):
            pytest.skip(str(exc))
        raise
    got = []
    with queue:
        for guard in queue.iter():
            with guard as block:
                got.append(block.copy())
    assert np.array_equal(np.concatenate(got), np.concatenate(parts))
