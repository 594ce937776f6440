"""Files open for writing (``multitables._io.handles``, NOTE [files written here]): a file this process writes is
refused before anything is read or started, with what to do; one another program writes is a
:class:`FileBusyError` saying so (not "damaged"); read-only handles, SWMR writers and other files written here are
left alone."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import pytest
import tables

import multitables
from multitables import FileBusyError, FileChangedError

ROWS = 2000
DATA = np.arange(ROWS * 4, dtype="<f4").reshape(ROWS, 4)


def _write(path: Path, **kwargs: Any) -> Path:
    with h5py.File(path, "w", **kwargs) as f:
        f.create_dataset("data", data=DATA, chunks=(100, 4), maxshape=(None, 4), compression="gzip")
    return path


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    return _write(tmp_path / "data.h5")


def _queue(path: Path, n_procs: int) -> np.ndarray:
    with multitables.Streamer(str(path)).get_queue("/data", n_procs=n_procs, block_size=500, ordered=True) as queue:
        blocks = []
        for guard in queue.iter():
            with guard as block:
                blocks.append(block.copy())
    return np.concatenate(blocks + [multitables.Streamer(str(path)).get_remainder("/data", 500)])


def _generator(path: Path, n_procs: int) -> np.ndarray:
    return np.stack([r.copy() for r in multitables.Streamer(str(path)).get_generator("/data", n_procs=n_procs, ordered=True)])


def _batches(path: Path, n_procs: int) -> np.ndarray:
    batches = multitables.Streamer(str(path)).get_batches("/data", 500, shuffle=False, n_procs=n_procs)
    try:
        return np.concatenate([b.copy() for b in batches])
    finally:
        batches.close()


def _reader(path: Path, n_procs: int) -> np.ndarray:
    reader = multitables.Reader(str(path), n_procs=max(n_procs, 1))
    try:
        dataset = reader.get_dataset("/data")
        stage = dataset.create_stage(ROWS)
        with reader.request(dataset[0:ROWS], stage).get_unsafe() as rows:
            return rows.copy()
    finally:
        reader.close(wait=True)


FRONTS: dict[str, Callable[[Path, int], np.ndarray]] = {
    "queue": _queue, "generator": _generator, "batches": _batches, "reader": _reader,
}


# -- a file this process writes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n_procs", [0, 2])
@pytest.mark.parametrize("front", sorted(FRONTS))
@pytest.mark.parametrize("mode", ["a", "r+"])
def test_a_file_held_open_for_writing_here_is_refused_before_anything_starts(
    data_file: Path, front: str, n_procs: int, mode: str, no_leaks: None
) -> None:
    """An h5py handle with unwritten changes: readers forked from here would have written its metadata into the
    file (and an in-process read would have seen the file change under it, FileChangedError); refused instead,
    saying what holds it and what to do."""
    with h5py.File(data_file, mode) as f:
        f["data"][5] = 99.0  # not flushed
        with pytest.raises(FileBusyError, match=r"open for writing in this process \(an h5py.File.*Close it"):
            FRONTS[front](data_file, n_procs)
        assert isinstance(FileBusyError("x"), BlockingIOError)
    assert FRONTS[front](data_file, n_procs)[5].tolist() == [99.0] * 4  # closed: read as written


def test_a_handle_opened_after_the_stream_was_made_is_refused_before_the_readers_fork(data_file: Path, no_leaks: None) -> None:
    """A generator forks its readers at the first row: a writable handle opened in between is found there, before
    any reader inherits it."""
    rows = multitables.Streamer(str(data_file)).get_generator("/data", n_procs=2, block_size=500)
    with h5py.File(data_file, "a") as f:
        f.attrs["touched"] = 1
        with pytest.raises(FileBusyError, match="open for writing in this process"):
            next(rows)
        assert not multiprocessing.active_children()


def test_a_pytables_handle_open_for_writing_is_named(data_file: Path, no_leaks: None) -> None:
    """PyTables' handles are another copy of HDF5's: HDF5's lock (same process, another open) is said as this
    process's PyTables file, not as a damaged file."""
    with tables.open_file(str(data_file), "a"):
        with pytest.raises(FileBusyError, match=r"in this process \(a PyTables file in mode 'a'\)"):
            _generator(data_file, 2)


@pytest.mark.parametrize("front", sorted(FRONTS))
def test_read_only_handles_held_here_are_no_obstacle(data_file: Path, front: str, no_leaks: None) -> None:
    with h5py.File(data_file, "r"), tables.open_file(str(data_file), "r"):
        np.testing.assert_array_equal(FRONTS[front](data_file, 2), DATA)


def test_another_file_written_here_is_left_alone(data_file: Path, tmp_path: Path, no_leaks: None) -> None:
    """A training script writes its results to a file of its own while it reads its data: allowed."""
    with h5py.File(tmp_path / "results.h5", "w") as out:
        out["loss"] = np.zeros(3)
        np.testing.assert_array_equal(_generator(data_file, 2), DATA)
        np.testing.assert_array_equal(_batches(data_file, 2), DATA)


def test_a_swmr_writer_here_may_stay_open(tmp_path: Path, no_leaks: None) -> None:
    """SWMR is HDF5's way to read a file while it is written: its readers neither write nor lock."""
    path = tmp_path / "swmr.h5"
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset("data", data=DATA, chunks=(100, 4), maxshape=(None, 4))
        f.swmr_mode = True
        f.flush()
        stream = multitables.Streamer(str(path), swmr=True)
        np.testing.assert_array_equal(np.stack([r.copy() for r in stream.get_generator("/data", n_procs=2, ordered=True)]), DATA)


def _grow_elsewhere(path: Path) -> None:
    """Another program appends rows to ``path`` without HDF5's lock (``locking=False``, as where the file system
    has none): a fresh interpreter, which shares no HDF5 state with this one."""
    code = ("import sys, h5py, numpy as np\n"
            "with h5py.File(sys.argv[1], 'a', locking=False) as f:\n"
            "    d = f['data']; d.resize((2 * len(d), 4)); d[len(d) // 2:] = -1\n")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)


@pytest.mark.parametrize("n_procs", [0, 2])
@pytest.mark.parametrize("front", sorted(FRONTS))
def test_a_read_only_handle_opened_before_the_file_grew_is_refused(data_file: Path, front: str, n_procs: int,
                                                                   no_leaks: None) -> None:
    """HDF5 shares a read-only handle held here, with the file as it was when it was opened: the describing open and
    the readers forked from here read the grown file through it (HDF5's "addr overflow", an IndexError of the
    chunk engine, or the old shape's rows, silently). Refused, saying to close the handle; closed, the file is
    read as it is now."""
    with h5py.File(data_file, "r") as held:
        assert held["data"].shape == (ROWS, 4)
        _grow_elsewhere(data_file)
        with pytest.raises(FileChangedError, match=r"grew from [\d,]+ to [\d,]+ bytes since this process opened it "
                                                   r"with h5py.*Close that handle"):
            FRONTS[front](data_file, n_procs)
    grown = np.concatenate([DATA, np.full_like(DATA, -1)])
    np.testing.assert_array_equal(FRONTS[front](data_file, n_procs), grown[:ROWS] if front == "reader" else grown)


# -- a file another program writes ------------------------------------------------------------------------------


def _hold(path: str, ready: Any, libver: "str | None") -> None:
    with h5py.File(path, "a", libver=libver) as f:
        if libver:
            f.swmr_mode = True
        f.flush()
        ready.set()
        signal.pause()


@pytest.fixture
def held_by_another_program(data_file: Path) -> Callable[..., Any]:
    """``held(libver=None)``: a child process holds ``data_file`` open for writing (``libver="latest"``: as a SWMR
    writer) until the test ends, when it is killed."""
    procs = []

    def held(libver: "str | None" = None) -> Path:
        if libver:
            _write(data_file, libver="latest")
        ctx = multiprocessing.get_context("fork")
        ready = ctx.Event()
        proc = ctx.Process(target=_hold, args=(str(data_file), ready, libver), daemon=True)
        proc.start()
        procs.append(proc)
        assert ready.wait(30)
        return data_file

    yield held
    for proc in procs:
        proc.kill()
        proc.join()


@pytest.mark.skipif(os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE", reason="HDF5's file locking is off")
@pytest.mark.parametrize("engine", ["auto", "tables"])
def test_another_programs_write_lock_is_said_as_such(held_by_another_program: Callable[..., Path], engine: str) -> None:
    """HDF5's "unable to lock file" was "the file may be damaged" (with engine='tables', "PyTables fails on it": a
    NodeTypeError); it is a FileBusyError that says how to read the file anyway."""
    path = held_by_another_program()
    with pytest.raises(FileBusyError, match=r"is locked: a program has it open for writing.*swmr=True") as caught:
        multitables.Streamer(str(path), engine=engine).get_generator("/data", n_procs=0)
    assert "damaged" not in str(caught.value)


@pytest.mark.skipif(os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE", reason="HDF5's file locking is off")
def test_locking_false_is_taken_by_the_librarys_own_open(held_by_another_program: Callable[..., Path]) -> None:
    """``locking=False`` (h5py's option) reached the readers' opens but not the open that describes the file."""
    path = held_by_another_program()
    stream = multitables.Streamer(str(path), engine="h5py", locking=False)
    np.testing.assert_array_equal(np.stack([r.copy() for r in stream.get_generator("/data", n_procs=0)]), DATA)


def test_a_swmr_writers_mark_points_to_swmr_reading(held_by_another_program: Callable[..., Path]) -> None:
    path = held_by_another_program(libver="latest")
    with pytest.raises(FileBusyError, match=r"marked as open for writing.*swmr=True.*h5clear"):
        multitables.Streamer(str(path)).get_generator("/data", n_procs=0)
    stream = multitables.Streamer(str(path), swmr=True)
    np.testing.assert_array_equal(np.stack([r.copy() for r in stream.get_generator("/data", n_procs=0)]), DATA)
