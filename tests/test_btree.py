"""The chunk index read from HDF5's version-1 B-tree ourselves (NOTE [chunk index in file order] in ``_io/btree``)."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import h5py
import numpy as np
import pytest
import tables
from hypothesis import given, settings
from hypothesis import strategies as st

from multitables import FileChangedError
from multitables._io.chunks import storage
from multitables._io.chunks.btree import UNREAD, BTreeIndex, IndexCorrupt, open_btree_index
from multitables._io.chunks.source import ChunkSource
from multitables._io.chunks.hdf5lib import header_address
from multitables._io.node import inspect_node
from multitables._io.chunks.grid import ChunkGrid


def btree_index(path: "str | Path", name: str) -> "BTreeIndex | None":
    with h5py.File(path, "r") as f:
        ds = f[name]
        header = header_address(ds.id)
        assert header is not None
        return open_btree_index(ds, ChunkGrid(tuple(ds.shape), tuple(ds.chunks)), str(path), header)


def hdf5_listing(ds: Any) -> dict[tuple[int, ...], tuple[int, int, int]]:
    """Every stored chunk as HDF5 lists it: grid index -> (file offset, stored size, filter mask).

    HDF5 before 1.14.4 (h5py 3.10-3.11's wheels) lists addresses without the userblock (HDF5 issue 3003): added here.
    """
    grid = ChunkGrid(tuple(ds.shape), tuple(ds.chunks))
    base = ds.file.userblock_size if h5py.version.hdf5_version_tuple < (1, 14, 4) else 0
    found: dict[tuple[int, ...], tuple[int, int, int]] = {}
    ds.id.chunk_iter(lambda i: found.__setitem__(grid.index_of(i.chunk_offset), (int(i.byte_offset) + base, int(i.size), int(i.filter_mask))))
    return found


def our_listing(index: BTreeIndex, ds: Any) -> dict[tuple[int, ...], tuple[int, int, int]]:
    grid = ChunkGrid(tuple(ds.shape), tuple(ds.chunks))
    found = {}
    for chunk in itertools.product(*(range(n) for n in grid.counts)):
        where = index.lookup(chunk)
        if where is not None:
            found[chunk] = where
    return found


def rows_file(path: Path, n_rows: int = 4000, chunk_rows: int = 4, width: int = 16) -> np.ndarray:
    """A dataset written in order, as appending writers do: many leaves, each among the chunks it indexes."""
    data = np.random.default_rng(1).standard_normal((n_rows, width)).astype("<f4")
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", shape=(0, width), maxshape=(None, width), dtype="<f4", chunks=(chunk_rows, width),
                              compression="gzip")
        for a in range(0, n_rows, 100):
            ds.resize(a + 100, axis=0)
            ds[a : a + 100] = data[a : a + 100]
    return data


# -- what it reads: the same as HDF5 ------------------------------------------------------------


@st.composite
def chunked_files(draw: st.DrawFn) -> dict[str, Any]:
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 40), min_size=rank, max_size=rank)))
    chunks = tuple(draw(st.integers(1, s + 3)) for s in shape)
    return dict(
        shape=shape,
        chunks=chunks,
        userblock=draw(st.sampled_from([0, 512, 4096])),
        compression=draw(st.sampled_from([None, "gzip"])),
        written=draw(st.sampled_from(["all", "some", "none"])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=60, deadline=None)
@given(chunked_files())
def test_finds_every_chunk_where_hdf5_lists_it(case: dict[str, Any]) -> None:
    rng = np.random.default_rng(case["seed"])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.h5"
        with h5py.File(path, "w", userblock_size=case["userblock"]) as f:
            ds = f.create_dataset("d", shape=case["shape"], dtype="<i4", chunks=case["chunks"], compression=case["compression"],
                                  maxshape=(None,) * len(case["shape"]))  # resizable: chunks may pass the extent
            if case["written"] == "all":
                ds[...] = rng.integers(0, 9, case["shape"])
            elif case["written"] == "some":  # a few scattered elements: chunks never written in between
                for _ in range(4):
                    ds[tuple(int(rng.integers(0, s)) for s in case["shape"])] = 7
        index = btree_index(path, "d")
        assert index is not None
        with h5py.File(path, "r") as f:
            assert our_listing(index, f["d"]) == hdf5_listing(f["d"])


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_chunks_written_out_of_order_are_found_and_read(tmp_path: Path, fresh_layouts: None, order: str) -> None:
    """Leaves split as chunks arrive in any order: the tree's keys, not the file's order, say where each chunk is."""
    path = tmp_path / "f.h5"
    data = np.random.default_rng(2).integers(0, 1000, (3000, 6)).astype("<i8")
    starts = list(range(0, 3000, 3))
    starts = starts[::-1] if order == "reversed" else list(np.random.default_rng(3).permutation(starts))
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", shape=data.shape, dtype="<i8", chunks=(3, 3), compression="gzip")
        for a in starts:
            ds[a : a + 3] = data[a : a + 3]
    index = btree_index(path, "data")
    assert index is not None and index.n_leaves > 10
    with h5py.File(path) as f:
        assert our_listing(index, f["data"]) == hdf5_listing(f["data"])
    src = ChunkSource(inspect_node(path, "/data"))
    try:
        out = np.empty((500, 6), "<i8")
        for a in range(0, 3000, 500):
            src.prefetch(min(a + 500, 2999), min(a + 1000, 3000))  # hints guessed for a file written in order: wrong here, and harmless
            src.read_into(a, a + 500, out)
            assert np.array_equal(out, data[a : a + 500])
    finally:
        src.close()


def test_a_dataset_shrunk_reads_as_hdf5_reads_it(tmp_path: Path, fresh_layouts: None) -> None:
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", data=np.arange(4000.0).reshape(400, 10), chunks=(7, 3), maxshape=(None, None))
        ds.resize((250, 8))
    with h5py.File(path) as f:
        expected = f["data"][:]
    src = ChunkSource(inspect_node(path, "/data"))
    try:
        out = np.empty((250, 8))
        src.read_into(0, 250, out)
    finally:
        src.close()
    assert np.array_equal(out, expected)


def _installed_hdf5_files() -> list[Path]:
    roots = [Path(tables.__file__).parent, Path(h5py.__file__).parent]
    return sorted(p for root in roots for p in root.rglob("*.h5"))


def test_finds_every_chunk_of_the_files_other_projects_ship() -> None:
    """PyTables' and h5py's own test files: where our reader takes a dataset, it lists what HDF5 lists."""
    taken = 0
    for path in _installed_hdf5_files():
        try:
            f = h5py.File(path, "r")
        except OSError:
            continue
        with f:
            datasets: list[h5py.Dataset] = []
            f.visititems(lambda _, obj: datasets.append(obj) if isinstance(obj, h5py.Dataset) and obj.chunks else None)
            for ds in datasets:
                if not all(ds.shape):
                    continue
                header = header_address(ds.id)
                index = None if header is None else open_btree_index(ds, ChunkGrid(tuple(ds.shape), tuple(ds.chunks)), str(path), header)
                if index is not None:
                    assert our_listing(index, ds) == hdf5_listing(ds), f"{path}: {ds.name}"
                    taken += 1
    assert taken >= 20  # PyTables ships dozens of files in HDF5's default format


def test_the_newest_format_is_left_to_hdf5(tmp_path: Path) -> None:
    path = tmp_path / "latest.h5"
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset("d", data=np.arange(100.0).reshape(50, 2), chunks=(5, 2), maxshape=(None, 2))
    assert btree_index(path, "d") is None
    node = inspect_node(path, "/d")
    with h5py.File(path) as f:
        layout = storage.learn_layout(f["d"], node)
    assert isinstance(layout.index, storage.ChunkIndex)


# -- when it reads: leaves as the rows reach them ---------------------------------------------------


class Recorder:
    """Every read of the file (offset, bytes) in the order made, by the chunk engine and by the index."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: list[tuple[int, int]] = []
        real_pread, real_preadv = os.pread, os.preadv

        def pread(fd: int, n: int, offset: int) -> bytes:
            self.reads.append((offset, n))
            return real_pread(fd, n, offset)

        def preadv(fd: int, buffers: Any, offset: int, *flags: int) -> int:
            self.reads.append((offset, sum(memoryview(b).nbytes for b in buffers)))
            return real_preadv(fd, buffers, offset, *flags)

        monkeypatch.setattr(os, "pread", pread)
        monkeypatch.setattr(os, "preadv", preadv)


@pytest.fixture
def fresh_layouts() -> Iterator[None]:
    storage.forget_layouts()
    yield
    storage.forget_layouts()


def test_opening_reads_the_tree_not_its_leaves(tmp_path: Path, fresh_layouts: None) -> None:
    rows_file(tmp_path / "f.h5")
    index = btree_index(tmp_path / "f.h5", "data")
    assert index is not None and index.n_leaves > 10
    assert index.n_listed <= 64  # the first leaf alone (checked against HDF5)


#: How far behind the furthest byte read a disk still reads without seeking (a drive's look-ahead; the disk model's).
LOOK_AHEAD = 1 << 20


def test_a_stream_reads_the_file_in_order_leaves_included(tmp_path: Path, fresh_layouts: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No read goes back further than a drive reads ahead: each leaf is read when the rows reach it, not at open."""
    path = tmp_path / "f.h5"
    data = rows_file(path, width=1024)  # 16 MiB: a leaf per ~0.9 MiB of chunks
    node = inspect_node(path, "/data")
    recorder = Recorder(monkeypatch)
    src = ChunkSource(node)  # opening included: its reads of the tree come first
    out = np.empty((256, 1024), "<f4")
    try:
        for a in range(0, len(data), 256):
            b = min(a + 256, len(data))
            src.read_into(a, b, out[: b - a])
            assert np.array_equal(out[: b - a], data[a:b])
    finally:
        src.close()
    furthest = 0
    for offset, n in recorder.reads:
        assert offset >= furthest - LOOK_AHEAD, f"a read at byte {offset} after reading up to {furthest}"
        furthest = max(furthest, offset + n)
    assert len(recorder.reads) > len(data) // 256  # leaves were read along the way


def test_a_hint_reads_no_leaf_and_goes_on_from_the_last_chunk_known(tmp_path: Path, fresh_layouts: None) -> None:
    path = tmp_path / "f.h5"
    rows_file(path)
    node = inspect_node(path, "/data")
    with h5py.File(path) as f:
        layout = storage.learn_layout(f["data"], node)
    index = layout.index
    assert isinstance(index, BTreeIndex)
    index.load_first()
    leaves_read = sum(index._loaded)
    first_unknown = next(i for i in range(1000) if index.peek((i, 0)) is UNREAD)  # 1000 chunks of 4 rows
    rows = 4 * first_unknown
    hinted: list[list[Any]] = []
    layout.hint(rows - 40, rows + 40, 16 * 4, hinted.append)
    assert sum(index._loaded) == leaves_read  # no leaf read for a hint
    (extents,) = hinted
    last_known = index.lookup((first_unknown - 1, 0))
    assert extents[-1].offset == last_known[0] + last_known[1]  # on from there, in file order
    # The 40 rows past it, 10 chunks of 4 rows, by the mean stored chunk: one more, and a quarter more.
    assert extents[-1].size == index.mean_size * 11 * 5 // 4


# -- what goes wrong -------------------------------------------------------------------------


def test_a_leaf_that_is_not_a_leaf_is_an_error_naming_the_file_and_byte(tmp_path: Path, fresh_layouts: None) -> None:
    path = tmp_path / "f.h5"
    data = rows_file(path)
    index = btree_index(path, "data")
    assert index is not None
    where = index._base + index._addrs[-1]
    with open(path, "r+b") as f:
        f.seek(where)
        f.write(b"XXXX")
    node = inspect_node(path, "/data")
    src = ChunkSource(node)
    try:
        out = np.empty((100, 16), "<f4")
        src.read_into(0, 100, out)  # the first leaves are whole
        assert np.array_equal(out, data[:100])
        with pytest.raises(IndexCorrupt, match=rf"f\.h5.*byte {where}"):
            src.read_into(len(data) - 100, len(data), out)
    finally:
        src.close()


@pytest.mark.parametrize("change", ["replaced", "appended"])
def test_a_file_changed_under_an_index_is_an_error_not_other_rows(tmp_path: Path, fresh_layouts: None, change: str) -> None:
    path = tmp_path / "f.h5"
    rows_file(path)
    index = btree_index(path, "data")
    assert index is not None
    if change == "replaced":
        shutil.copy(path, tmp_path / "copy.h5")
        os.replace(tmp_path / "copy.h5", path)  # the same bytes, another file
    else:
        with h5py.File(path, "a") as f:  # leaves split and move as rows are appended
            f["data"].resize(5000, axis=0)
            f["data"][4000:] = 1.0
    with pytest.raises(FileChangedError, match="changed since its chunk index was opened"):
        index.load_all()


def test_a_tree_that_does_not_parse_at_open_is_left_to_hdf5(tmp_path: Path, fresh_layouts: None) -> None:
    """At open nothing is read yet: HDF5 lists the index instead, and says what is wrong if something is."""
    path = tmp_path / "f.h5"
    rows_file(path)
    with h5py.File(path) as f:
        header = header_address(f["data"].id)
    index = btree_index(path, "data")
    assert index is not None
    first_leaf = index._base + index._addrs[0]
    with open(path, "r+b") as f:
        f.seek(first_leaf + 5)
        f.write(b"\x07")  # the first leaf claims level 7
    with h5py.File(path) as f:
        ds = f["data"]
        assert open_btree_index(ds, ChunkGrid(tuple(ds.shape), tuple(ds.chunks)), str(path), header) is None


def test_the_h5py_engine_learns_the_leaves_hdf5_read_for_its_next_hint(tmp_path: Path, fresh_layouts: None) -> None:
    """After HDF5 reads a block, the index knows its chunks, so the next hint goes on from there without a leaf read."""
    from multitables._io.engines import open_source

    path = tmp_path / "f.h5"
    data = rows_file(path)
    src = open_source("h5py", inspect_node(path, "/data"), {})
    try:
        src.prefetch(0, 400)
        layout = src._hints[1]
        index = layout.index
        assert isinstance(index, BTreeIndex)
        out = np.empty((400, 16), "<f4")
        src.read_into(0, 400, out)
        assert np.array_equal(out, data[:400])
        assert all(index.peek((i, 0)) is not UNREAD for i in range(100))  # rows 0..399: chunks 0..99
    finally:
        src.close()
