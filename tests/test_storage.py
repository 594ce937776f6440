"""What a process remembers of a dataset's layout, and when it must not (NOTE [layout cache] in ``_io.chunks.storage``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

import h5py
import numpy as np
import pytest
import tables
from _diskmodel import run_under

import multitables
from multitables._io import files
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
    monkeypatch.setattr(files, "SETTLED_S", -1.0)


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


def test_a_few_chunks_are_listed_by_hdf5_more_are_found_in_the_btree(make_array: Callable[..., Path], settled: None) -> None:
    """Reading the B-tree costs more at open than HDF5's listing of a few chunks (``LIST_CHUNKS_UP_TO``)."""
    from multitables._io.chunks.btree import BTreeIndex

    few, many = rows(10 * storage.LIST_CHUNKS_UP_TO, 5), rows(10 * storage.LIST_CHUNKS_UP_TO + 1, 6)
    for data, kind in [(few, storage.ChunkIndex), (many, BTreeIndex)]:
        node = inspect_node(make_array(data, chunkshape=(10, 8)), "/data")
        assert np.array_equal(read_all(node), data)
        assert type(storage.known_layout(node).index) is kind


def test_a_file_changed_while_its_chunks_are_listed_is_a_file_changed_error(
    make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HDF5 lists chunks past the extent it gave where a writer rewrites the file meanwhile (an IndexError here): the
    change is the error, as for every read of a file that changed."""
    path = make_array(rows(100, 7), chunkshape=(10, 8))
    node = inspect_node(path, "/data")

    def rewritten_meanwhile(*args: Any) -> Any:
        os.utime(path, ns=(0, 0))
        raise IndexError("list assignment index out of range")

    monkeypatch.setattr(storage, "ChunkIndex", rewritten_meanwhile)
    with pytest.raises(multitables.FileChangedError, match="changed while the chunk index of '/data' was listed"):
        read_all(node)
    monkeypatch.setattr(storage, "ChunkIndex", lambda *args: (_ for _ in ()).throw(IndexError("a bug of ours")))
    with pytest.raises(IndexError, match="a bug of ours"):  # the file unchanged: the error is what it is
        read_all(inspect_node(path, "/data"))


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


@pytest.mark.parametrize("index_limit", [storage.INDEX_ALL_LIMIT, 0], ids=["listed", "looked-up"])
def test_a_file_with_a_userblock_is_read_from_its_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         index_limit: int) -> None:
    """HDF5 before 1.14.4 (h5py 3.10-3.11's wheels) lists chunk addresses without the userblock: read there, the
    rows were another chunk's bytes, or a decode error where the chunks are compressed."""
    monkeypatch.setattr(storage, "READ_BTREE", False)  # HDF5's listing and lookups
    path = tmp_path / "ub.h5"
    data = rows(100, 8)
    with h5py.File(path, "w", userblock_size=512) as f:
        f.create_dataset("plain", data=data, chunks=(10, 8))
        f.create_dataset("gzip", data=data, chunks=(10, 8), compression="gzip")
    for name in ("/plain", "/gzip"):
        assert np.array_equal(read_all(inspect_node(path, name), index_limit=index_limit), data), name


def test_layouts_kept_are_bounded_least_recent_forgotten(
    make_array: Callable[..., Path], settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "LAYOUT_ENTRIES_KEPT", 10)
    monkeypatch.setattr(storage, "LAYOUT_MIN_ENTRIES", 1)  # a layout counts its chunks only
    nodes = [inspect_node(make_array(rows(16, k), chunkshape=(4, 8)), "/data") for k in range(4)]  # 4 chunks each
    for k, node in enumerate(nodes):
        assert np.array_equal(read_all(node), rows(16, k))
    assert storage._layout_entries <= 10
    assert [storage.known_layout(n) is not None for n in nodes] == [False, False, True, True]


def test_layouts_of_few_chunks_are_bounded_too(tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A contiguous dataset's layout counted as one entry: a loop over 40,000 small files kept all 40,000 layouts
    (90 MB), where the descriptions stopped at 4,096. Each counts as LAYOUT_MIN_ENTRIES at least."""
    monkeypatch.setattr(storage, "LAYOUT_ENTRIES_KEPT", 4 * storage.LAYOUT_MIN_ENTRIES)
    nodes = []
    for k in range(6):
        with h5py.File(tmp_path / f"c{k}.h5", "w") as f:
            f["data"] = rows(3, k)  # contiguous
        nodes.append(inspect_node(tmp_path / f"c{k}.h5", "/data"))
        assert np.array_equal(read_all(nodes[-1]), rows(3, k))
    assert [storage.known_layout(n) is not None for n in nodes] == [False, False, True, True, True, True]


def test_the_check_before_readers_start_leaves_every_files_layout(tmp_path: Path, settled: None) -> None:
    files = []
    for k in range(3):
        files.append(str(tmp_path / f"s-{k}.h5"))
        with tables.open_file(files[-1], "w") as f:
            f.create_carray("/", "data", obj=rows(40, k), filters=tables.Filters(3, "zlib"), chunkshape=(8, 8))
    node = inspect_files(tuple(files), "/data")
    assert resolve_engine("chunks", node, {}) == "chunks"
    assert all(storage.known_layout(part.node) is not None for part in node.parts)


def test_a_second_stream_of_a_known_file_checks_it_without_learning_it_again(
    make_array: Callable[..., Path], settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = rows(40, 5)
    path = make_array(data, chunkshape=(32, 8), complib="zlib", complevel=3)  # 1 KiB chunks: auto takes the chunk engine
    learned: list[str] = []
    learn = storage.learn_layout

    def counted(ds: Any, node: Any, *args: Any) -> Any:
        learned.append(node.path)
        return learn(ds, node, *args)

    monkeypatch.setattr(storage, "learn_layout", counted)
    monkeypatch.setattr(chunks_module, "learn_layout", counted)
    for _ in range(3):
        got = np.stack(list(multitables.Streamer(str(path)).get_generator("/data")))
        assert np.array_equal(got, data)
    assert learned == ["/data"]


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


# -- hints on cached bytes (NOTE [hints on cached bytes] in _io.chunks.pread) ---------------------------


def chunked_file(path: Path, n: int = 2000, chunk_rows: int = 50) -> np.ndarray:
    data = rows(n, 5)
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, chunks=(chunk_rows, 8), compression="gzip")
    return data


def learned(path: Path) -> "storage.Layout":
    node = inspect_node(path, "/data")
    with h5py.File(path) as f:
        return storage.learn_layout(f["data"], node)


def test_a_hint_asks_first_whether_the_rows_first_and_last_stored_bytes_are_cached(tmp_path: Path) -> None:
    path = tmp_path / "f.h5"
    chunked_file(path)
    layout = learned(path)
    index = layout.index
    first, last = index.lookup((2, 0)), index.lookup((5, 0))  # rows 100..299: chunks 2..5
    asked: list[tuple[int, int]] = []
    hinted: list[list[Any]] = []

    def cached(answer: bool) -> Callable[[int, int], bool]:
        return lambda a, b: asked.append((a, b)) or answer

    layout.hint(100, 300, 32, hinted.append, resident=cached(True))
    assert asked == [(first[0], last[0] + last[1])]
    assert hinted == []  # cached: nothing to hint
    layout.hint(100, 300, 32, hinted.append, resident=cached(False))
    without: list[list[Any]] = []
    layout.hint(100, 300, 32, without.append)
    assert hinted == without and [(e.offset, e.size) for e in hinted[0]] == [
        (c[0], c[1]) for c in map(index.lookup, [(2, 0), (3, 0), (4, 0), (5, 0)])]


def test_a_contiguous_datasets_hint_asks_about_its_rows_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=rows(100, 6))  # contiguous: 32 bytes a row
    layout = learned(path)
    base = layout.storage.offset
    asked: list[tuple[int, int]] = []
    hinted: list[list[Any]] = []
    layout.hint(10, 20, 32, hinted.append, resident=lambda a, b: asked.append((a, b)) or False)
    assert asked == [(base + 320, base + 640)]
    assert [(e.offset, e.size) for e in hinted[0]] == [(base + 320, 320)]


def test_a_files_bytes_read_once_are_known_to_be_cached(tmp_path: Path) -> None:
    from multitables._io.chunks import pread
    from multitables._io.chunks.pread import PreadFile, resident

    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 64)  # 16 KiB
    transport = PreadFile(str(path))
    try:
        transport.read_into(0, bytearray(16384))  # whatever the filesystem, pages just read are cached
        asked = [transport.resident(0, 16384), resident(transport.fd, 4000, 12300), transport.resident(100, 200)]
        past_the_end = transport.resident(0, 20480)  # no such pages
    finally:
        transport.close()
    if pread._can_ask:
        assert asked == [True, True, True] and not past_the_end
    else:  # a kernel that cannot tell (before 6.5, or a sandbox that refuses cachestat): every hint goes
        assert asked == [False, False, False] and not past_the_end


@pytest.fixture
def cold_disk(tmp_path: Path, shim: Path) -> Iterator[Any]:
    """A fast disk model whose page cache starts empty, charging reads of files under ``tmp_path / "disk"``."""
    from multitables_bench.diskmodel import DiskModel

    (tmp_path / "state").mkdir()
    (tmp_path / "disk").mkdir()
    with DiskModel.create(tmp_path / "state", "hdd", shim=shim, seek_ms=0.001, mbps=100_000.0) as model:
        with model.charging(tmp_path / "disk"):
            yield model


def test_a_range_is_cached_only_where_every_page_of_it_is(tmp_path: Path, cold_disk: Any) -> None:
    """Pages 0 and 3 read (the blocks either side, say), 1 and 2 not: the range from inside page 0 to inside page 3
    is not cached, though both its ends are (NOTE [hints on cached bytes]). Under the disk model, whose page cache
    starts empty."""
    path = tmp_path / "disk" / "f.bin"
    path.write_bytes(bytes(8 * 4096))
    script = """
import os, sys
from multitables._io.chunks.pread import resident
fd = os.open(sys.argv[1], os.O_RDONLY)
os.pread(fd, 10, 0)
os.pread(fd, 10, 3 * 4096)
print(resident(fd, 100, 3 * 4096 + 100), resident(fd, 0, 4096), resident(fd, 3 * 4096, 4 * 4096), end=" ")
os.pread(fd, 2 * 4096, 4096)
print(resident(fd, 100, 3 * 4096 + 100), resident(fd, 0, 5 * 4096))
"""
    assert run_under(cold_disk, script, str(path)).split() == ["False", "True", "True", "True", "False"]


@pytest.mark.parametrize("engine", ["h5py", "chunks"])
def test_readers_hint_a_cold_file_and_not_a_cached_one(tmp_path: Path, cold_disk: Any, engine: str) -> None:
    """Under the disk model, whose page cache starts empty: the first pass hints, the second finds it all cached."""
    path = tmp_path / "disk" / "f.h5"
    data = chunked_file(path, 20_000, 500)  # 40 chunks, all listed at open; blocks of about 60 KiB stored
    script = """
import sys, numpy as np, multitables
got = []
with multitables.Streamer(sys.argv[1], engine=sys.argv[2]).get_queue("/data", n_procs=2, block_size=2000, ordered=True) as q:
    for guard in q.iter():
        with guard as block:
            got.append(block.copy())
np.save(sys.argv[3], np.concatenate(got))
"""
    hints = []
    for n in range(2):
        out = tmp_path / f"rows-{n}.npy"
        run_under(cold_disk, script, str(path), engine, str(out))
        assert np.array_equal(np.load(out), data)
        hints.append(cold_disk.stats().hints)
    assert hints[0] >= 8  # ten blocks of 2,000 rows: each reader hints the blocks ahead of it
    assert hints[1] == hints[0]  # the second pass: every byte cached, nothing hinted


def test_a_hint_over_many_small_chunks_looks_at_them_as_it_goes(tmp_path: Path) -> None:
    """A block of small chunks is hinted again at each leaf of the chunk index read in it, the rest of the block each
    time (NOTE [chunk index in file order]): listing all the rest's chunks first made a pass over 256-byte chunks
    quadratic in a block's chunks (2.2x the CPU time of the whole pass). A hint looks at the chunks it needs."""
    import tracemalloc

    path = tmp_path / "f.h5"
    n_chunks = 200_000  # listed: 200,000 index tuples, ~16 MB
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.arange(4 * n_chunks, dtype=np.uint32).astype(np.uint8), chunks=(4,))
    layout = learned(path)
    for cached in (True, False):
        hinted: list[list[Any]] = []
        tracemalloc.start()
        try:
            layout.hint(0, 4 * n_chunks, 1, hinted.append, resident=lambda a, b: cached)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, f"a hint over {n_chunks} chunks took {peak} bytes at its peak"
        assert hinted == [] if cached else len(hinted) == 1 and hinted[0]
