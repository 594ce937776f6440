"""The PyTables engine's check of a node: PyTables tried for real in a forked probe, its answer kept for settled files."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import tables

import multitables
from multitables._io import files, tables_engine


@pytest.fixture
def probes(monkeypatch) -> "list[str]":
    """The paths PyTables was tried on, one entry per probe forked."""
    tried: list[str] = []
    real = tables_engine._first_row_problem_apart

    def counted(node: Any, open_kwargs: "dict[str, Any]") -> "str | None":
        tried.append(node.path)
        return real(node, open_kwargs)

    monkeypatch.setattr(tables_engine, "_first_row_problem_apart", counted)
    return tried


def _rows(path: Any, **open_kwargs: Any) -> np.ndarray:
    blocks = []
    with multitables.Streamer(str(path), engine="tables", **open_kwargs).get_queue("/data", n_procs=0, remainder=True) as q:
        for guard in q.iter():
            with guard as block:
                blocks.append(block.copy())
    return np.concatenate(blocks)


def test_a_settled_files_answer_is_kept_per_open_options_and_a_rewrite_asks_again(make_array, monkeypatch, probes) -> None:
    monkeypatch.setattr(files, "SETTLED_S", -1.0)  # every file settled: its last change lies in the past
    data = np.arange(600, dtype="i4").reshape(200, 3)
    path = make_array(data)
    for _ in range(3):
        np.testing.assert_array_equal(_rows(path), data)
    assert probes == ["/data"]
    np.testing.assert_array_equal(_rows(path, driver="H5FD_SEC2"), data)  # other options: PyTables tried with them
    assert probes == ["/data"] * 2

    with tables.open_file(path, "a") as f:  # the same name, another file's bytes
        f.root.data[0] = [-1, -2, -3]
    data[0] = [-1, -2, -3]
    np.testing.assert_array_equal(_rows(path), data)
    assert probes == ["/data"] * 3


def test_a_file_just_written_is_tried_at_every_stream(make_array, probes) -> None:
    data = np.arange(60, dtype="f8").reshape(20, 3)
    path = make_array(data)
    for _ in range(2):
        np.testing.assert_array_equal(_rows(path), data)
    assert probes == ["/data"] * 2  # a write within the clock's tick could keep its identity


# -- many files and datasets: one probe a call ------------------------------------


@pytest.fixture
def forked(monkeypatch) -> "list[str]":
    """The names of the processes forked (the probe's: ``multitables-probe``)."""
    import multiprocessing.context

    names: list[str] = []
    start = multiprocessing.context.ForkProcess.start

    def counted(process: Any) -> None:
        names.append(process.name)
        start(process)

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", counted)
    return names


def _files(tmp_path: Any, n_files: int, n_datasets: int, odd: "tuple[int, int] | None" = None) -> "list[str]":
    """``n_files`` files of ``n_datasets`` int32 datasets ``/d0``, ``/d1``...: 50 rows, dataset ``d`` of file ``f`` holding
    ``1000 * f + 100 * d + row``; ``odd``: (file, dataset) written as an HDF5 16-bit bitfield, which PyTables reads as
    1-byte bools and so refuses (h5py delivers it as uint16)."""
    import h5py

    paths = []
    for f in range(n_files):
        paths.append(str(tmp_path / f"f{f}.h5"))
        with h5py.File(paths[-1], "w") as h5:
            for d in range(n_datasets):
                rows = np.arange(50, dtype="i4") + 1000 * f + 100 * d
                if (f, d) == odd:
                    h5py.h5d.create(h5.id, f"d{d}".encode(), h5py.h5t.STD_B16LE.copy(), h5py.h5s.create_simple((50,)))
                    h5[f"d{d}"][...] = rows.astype("u2")
                else:
                    h5.create_dataset(f"d{d}", data=rows if odd is None else rows.astype("u2"))
    return paths


def _expected(n_files: int, d: int) -> np.ndarray:
    return np.concatenate([np.arange(50) + 1000 * f + 100 * d for f in range(n_files)])


def test_batches_over_many_datasets_of_many_files_fork_one_probe(tmp_path, forked, no_leaks) -> None:
    files = _files(tmp_path, 4, 5)
    paths = [f"/d{d}" for d in range(5)]
    with multitables.Batches(multitables.Streamer(files, engine="tables"), paths, 40, shuffle=False, n_procs=0) as b:
        got = [np.concatenate(column) for column in zip(*b)]
    for d in range(5):
        np.testing.assert_array_equal(got[d], _expected(4, d))
    assert forked == ["multitables-probe"]  # was one a dataset and file: 20


def test_a_stream_and_a_reader_over_many_files_fork_one_probe(tmp_path, forked, no_leaks) -> None:
    files = _files(tmp_path, 6, 2)
    with multitables.Streamer(files, engine="tables").get_queue("/d1", n_procs=0, remainder=True) as q:
        got = []
        for guard in q.iter():
            with guard as block:
                got.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(got), _expected(6, 1))
    assert forked == ["multitables-probe"]  # was one a file: 6
    with multitables.Reader(files, engine="tables", n_procs=0) as reader:
        ds = reader.get_dataset("/d0")
        with ds.create_stage(300) as stage:
            np.testing.assert_array_equal(reader.request(ds[:], stage).get(), _expected(6, 0))
    assert forked == ["multitables-probe"] * 2


def test_a_file_pytables_refuses_among_many_is_named_with_its_dataset(tmp_path, forked, no_leaks) -> None:
    files = _files(tmp_path, 4, 3, odd=(2, 1))
    paths = [f"/d{d}" for d in range(3)]
    with pytest.raises(multitables.NodeTypeError) as raised:
        multitables.Batches(multitables.Streamer(files, engine="tables"), paths, 40, n_procs=0)
    assert str(raised.value) == (
        f"engine='tables' cannot read '/d1' in {files[2]!r} (tables: PyTables fails on it (TypeError: PyTables reads "
        f"the 2-byte elements (h5py: uint16) as 1-byte bools)); engine='chunks' (or 'auto') reads it")
    assert forked == ["multitables-probe"]
    with pytest.raises(multitables.NodeTypeError) as alone:  # the set of /d1 alone: the same refusal
        multitables.Streamer(files, engine="tables").get_queue("/d1", n_procs=0)
    assert str(alone.value) == str(raised.value)


def test_a_crash_of_pytables_on_one_file_is_that_files_refusal(tmp_path, forked, monkeypatch, no_leaks) -> None:
    """A probe killed by SIGSEGV while on one dataset of one file refuses that one, named; the files after it are
    tried in another probe, the one crashed on first (its crash its own, not what came before it)."""
    import os
    import signal

    files = _files(tmp_path, 4, 2)
    read_into = tables_engine.TablesSource.read_into

    def crashing(self: Any, start: int, stop: int, out: np.ndarray) -> None:
        if self._file.filename == files[2] and self._node._v_pathname == "/d1":
            signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # no faulthandler dump
            os.kill(os.getpid(), signal.SIGSEGV)
        read_into(self, start, stop, out)

    monkeypatch.setattr(tables_engine.TablesSource, "read_into", crashing)
    with pytest.raises(multitables.NodeTypeError) as raised:
        multitables.Batches(multitables.Streamer(files, engine="tables"), ["/d0", "/d1"], 40, n_procs=0)
    assert str(raised.value) == (f"engine='tables' cannot read '/d1' in {files[2]!r} (tables: PyTables crashed on it "
                                 f"(signal SIGSEGV)); engine='chunks' (or 'auto') reads it")
    # Tried in one probe; it crashed on /d1 of the third file after six others, which alone crashed it again; the last
    # file's /d1 was tried in a third.
    assert forked == ["multitables-probe"] * 3


def test_the_probe_finds_pytables_imported(tmp_path) -> None:
    """The probe's child inherits PyTables from this process: imported in each child, it was most of a probe's time
    (0.27 s of 0.33 s), paid again at every stream, Reader dataset and set of files. In a fresh interpreter, where
    nothing imported PyTables yet."""
    import subprocess
    import sys

    files = _files(tmp_path, 2, 1)
    script = (
        "import multiprocessing.context, sys, multitables\n"
        "seen = []\n"
        "start = multiprocessing.context.ForkProcess.start\n"
        "multiprocessing.context.ForkProcess.start = lambda p: (seen.append('tables' in sys.modules), start(p))[1]\n"
        f"assert sum(1 for _ in multitables.Streamer({files!r}, engine='tables').get_generator('/d0', n_procs=0)) == 100\n"
        "print(seen)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[True]"]


# -- what the probe reads: an element, not a row -----------------------------------


def _read_chars() -> int:
    """Bytes this process read through system calls (page cache or not)."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="bytes read are counted by Linux's /proc/self/io")
def test_the_probe_reads_one_chunk_of_an_array_in_chunks_one_column_wide(tmp_path) -> None:
    """One row of an array in (rows, 1) chunks lies in every chunk: read by the probe, it decoded the whole dataset
    once more before the stream (1 M x 64 float32 zlib: 128 chunk decodes for 64 chunks, the stream 25.5 s where h5py
    took 13.8 s). The probe reads one element: one chunk of the 64."""
    import h5py

    from multitables._io.node import inspect_node

    path = tmp_path / "columns.h5"
    data = np.random.default_rng(0).integers(0, 16, (16384, 64)).astype("<i4")
    with h5py.File(path, "w") as f:
        stored = f.create_dataset("data", data=data, chunks=(16384, 1), compression="gzip").id.get_storage_size()
    node = inspect_node(path, "/data")
    assert tables_engine._first_row_problem(node, {}) is None  # what it imports at its first call, read
    before = _read_chars()
    assert tables_engine._first_row_problem(node, {}) is None
    read = _read_chars() - before
    assert read < stored / 8, (read, stored)  # was all of it: 64 chunks (read here: 24 kB of 868 kB)


def test_the_element_the_probe_reads_is_h5pys(tmp_path) -> None:
    """The element at an index of the leading axes (the rest 0), as h5py delivers it, whatever the layout: more axes,
    HDF5 array elements, an array PyTables extends along axis 1, strings, a table's row."""
    import h5py

    from multitables._io.node import inspect_node

    path = tmp_path / "layouts.h5"
    with tables.open_file(path, "w") as f:
        f.create_earray("/", "wide", tables.Float64Atom(), (4, 0), chunkshape=(4, 2)).append(np.arange(24.0).reshape(4, 6))
    with h5py.File(path, "a") as f:
        f.create_dataset("cube", data=np.arange(240, dtype="u2").reshape(10, 6, 4), chunks=(10, 1, 1), compression="gzip")
        atoms = f.create_dataset("atoms", shape=(10, 3), dtype=np.dtype(("<f4", (2, 2))), chunks=(5, 1))
        atoms[...] = np.arange(120, dtype="<f4").reshape(10, 3, 2, 2)
        f.create_dataset("text", data=np.array([[b"ab\0cd", b"x"], [b"yz", b"w"]] * 3, "S5"), chunks=(6, 1))
        f.create_dataset("table", data=np.array([(i, -i) for i in range(8)], [("a", "<i4"), ("b", "<f8")]))
    with h5py.File(path, "r") as f:
        for name, at in [("cube", (7, 5)), ("cube", (2,)), ("atoms", (9, 2)), ("wide", (3, 4)), ("text", (4, 0)),
                         ("table", (6,))]:
            ds = f[name]
            source = tables_engine.TablesSource(inspect_node(path, f"/{name}"), {})
            try:
                got = source.read_element(at)
            finally:
                source.close()
            full = at + (0,) * (ds.ndim - len(at))
            expected = ds[tuple(slice(i, i + 1) for i in full)]
            assert got.dtype == expected.dtype and got.shape == expected.shape, (name, got, expected)
            np.testing.assert_array_equal(got, expected)
