"""Random index batches (a replay buffer's, a retrieval service's draws): the rows h5py gives, in the caller's order,
repeats included, whichever way the file is stored and whoever reads (this process or reader processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import h5py
import hdf5plugin
import numpy as np
import pytest
import tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables
from multitables._io.chunks.pread import PreadFile
from multitables._io.chunks.source import ChunkSource

N_ROWS, WIDTH, MAX_BATCH = 3000, 64, 300
#: h5py, which reads the rows expected, reads blosc through hdf5plugin once imported.
BLOSC = hdf5plugin.Blosc

#: As a user's file is made: h5py's own chunking (or none), PyTables' defaults.
LAYOUTS = ("h5py_plain", "h5py_gzip", "tables_blosc", "tables_plain")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> "dict[str, tuple[Path, np.ndarray]]":
    rng = np.random.default_rng(0)
    data = rng.standard_normal((N_ROWS, WIDTH)).astype(np.float32)
    out = {}
    for layout in LAYOUTS:
        path = tmp_path_factory.mktemp("batches") / f"{layout}.h5"
        if layout.startswith("h5py"):
            with h5py.File(path, "w") as f:
                f.create_dataset("X", data=data, **({"compression": "gzip"} if layout == "h5py_gzip" else {}))
        else:
            filters = tables.Filters(5, "blosc") if layout == "tables_blosc" else None
            with tables.open_file(path, "w") as f:
                f.create_earray("/", "X", tables.Float32Atom(), (0, WIDTH), filters=filters).append(data)
        out[layout] = (path, data)
    return out


@pytest.fixture(scope="module", params=[0, 2], ids=["in_process", "readers"])
def readers(request: pytest.FixtureRequest, files: dict) -> "Iterator[dict[str, tuple[Any, Any, Any, np.ndarray, Path]]]":
    """For each layout: (reader, dataset, stage, data, path), a Reader kept for the module."""
    opened, out = [], {}
    for layout, (path, data) in files.items():
        reader = multitables.Reader(str(path), n_procs=request.param)
        opened.append(reader)
        ds = reader.get_dataset("/X")
        out[layout] = (reader, ds, ds.create_stage(MAX_BATCH), data, path)
    yield out
    for reader in opened:
        reader.close(wait=True)


batches = st.one_of(
    st.lists(st.integers(0, N_ROWS - 1), min_size=1, max_size=MAX_BATCH),  # draws: unsorted, repeats
    st.lists(st.integers(0, N_ROWS - 1), min_size=1, max_size=MAX_BATCH, unique=True).map(sorted),
    # runs of neighbours (a sequence sampled from a replay buffer), and negative positions
    st.tuples(st.integers(0, N_ROWS - 40), st.integers(1, 40), st.integers(1, 7)).map(
        lambda t: [t[0] + i // t[2] for i in range(t[1] * t[2])]),
    st.lists(st.integers(-N_ROWS, N_ROWS - 1), min_size=1, max_size=50),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(layout=st.sampled_from(LAYOUTS), idx=batches, as_list=st.booleans())
def test_a_batch_of_indices_gives_h5pys_rows_in_the_callers_order(readers: dict, layout: str, idx: "list[int]",
                                                                    as_list: bool) -> None:
    reader, ds, stage, data, path = readers[layout]
    got = reader.request(ds[idx if as_list else np.array(idx)], stage).get()
    positions = np.array(idx) % N_ROWS
    unique, inverse = np.unique(positions, return_inverse=True)
    with h5py.File(path, "r") as f:
        expected = f["X"][unique][inverse]
    assert got.shape == (len(idx), WIDTH) and got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, data[idx])


def test_random_rows_of_a_contiguous_dataset_are_read_in_one_call(files: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of scattered rows of contiguous data is one ``read_ranges`` of the file (a ``pread`` a run), not a
    read through every layer per row, which took half of a 4 KiB row's time."""
    path, data = files["h5py_plain"]
    calls: "list[int]" = []
    real = PreadFile.read_ranges

    def counted(self: PreadFile, offsets: Any, outs: Any) -> "list[int]":
        calls.append(len(offsets))
        return real(self, offsets, outs)

    monkeypatch.setattr(PreadFile, "read_ranges", counted)
    monkeypatch.setattr(ChunkSource, "read_into", lambda *a: pytest.fail("a row read on its own"))
    idx = np.random.default_rng(1).integers(0, N_ROWS, 200)
    with multitables.Reader(str(path), n_procs=0) as reader:
        ds = reader.get_dataset("/X")
        got = reader.request(ds[idx], ds.create_stage(len(idx))).get()
    np.testing.assert_array_equal(got, data[idx])
    assert calls == [len(np.unique(idx)) - int((np.diff(np.unique(idx)) == 1).sum())]  # one range a run


def test_ranges_past_the_end_of_the_file_give_what_is_there(tmp_path: Path) -> None:
    path = tmp_path / "bytes"
    path.write_bytes(bytes(range(100)))
    file = PreadFile(str(path))
    try:
        outs = [np.zeros(10, np.uint8), np.zeros(10, np.uint8), np.zeros(10, np.uint8)]
        assert file.read_ranges([0, 95, 200], outs) == [10, 5, 0]
        assert outs[0].tolist() == list(range(10)) and outs[1].tolist() == [95, 96, 97, 98, 99, 0, 0, 0, 0, 0]
    finally:
        file.close()


@pytest.mark.parametrize("n_rows_a_batch", [1, 64])
def test_random_rows_of_unfiltered_chunks_read_only_their_bytes(files: dict, monkeypatch: pytest.MonkeyPatch,
                                                                 n_rows_a_batch: int) -> None:
    """PyTables' chunks of an uncompressed array hold whole rows as stored: a request reads its rows' bytes, not each
    row's whole chunk."""
    path, data = files["tables_plain"]
    read: "list[int]" = []
    real_into, real_ranges = PreadFile.read_into, PreadFile.read_ranges

    def into(self: PreadFile, offset: int, buf: Any) -> int:
        read.append(memoryview(buf).nbytes)
        return real_into(self, offset, buf)

    def ranges(self: PreadFile, offsets: Any, outs: Any) -> "list[int]":
        read.extend(memoryview(o).nbytes for o in outs)
        return real_ranges(self, offsets, outs)

    monkeypatch.setattr(PreadFile, "read_into", into)
    monkeypatch.setattr(PreadFile, "read_ranges", ranges)
    rng = np.random.default_rng(n_rows_a_batch)
    with h5py.File(path, "r") as f:
        chunk = f["X"].chunks[0]
    assert chunk < N_ROWS // 8  # as PyTables makes them
    with multitables.Reader(str(path), n_procs=0) as reader:
        ds = reader.get_dataset("/X")
        stage = ds.create_stage(n_rows_a_batch)
        reader.request(ds[[0]], stage).get()  # the file opened, its chunk index read
        for _ in range(5):
            idx = rng.integers(0, N_ROWS, n_rows_a_batch)
            read.clear()
            np.testing.assert_array_equal(reader.request(ds[idx], stage).get(), data[idx])
            # Rows of one chunk are read as the span they cover, then picked (a filtered chunk's is decoded once so)
            rows = np.unique(idx)
            spans = sum(int(g.max() - g.min() + 1) for g in np.split(rows, np.flatnonzero(np.diff(rows // chunk)) + 1))
            assert sum(read) == spans * WIDTH * 4
