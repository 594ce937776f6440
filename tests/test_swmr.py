"""A file that an h5py SWMR writer appends to and flushes while it is read with ``swmr=True``.

The rows looked at are read exactly while the writer goes on; new rows come with a new look (a new stream, a new
``get_dataset``); a file replaced, cut short or opened for writing without SWMR still stops the reads
(NOTE [file identity] in ``multitables._io.files``, NOTE [swmr extent] in ``multitables._io.handles``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
from _guards import hang_guard

import multitables
from multitables import FileChangedError

GUARD = 60.0
N0 = 1000  # rows when the file is looked at
ADD = 300  # rows each "grow" appends

# A writer that holds the file in SWMR mode and obeys lines on stdin: "grow" (append ADD rows, flush), "close";
# row i is i in every column. It answers each line with one once done.
_WRITER = f"""
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w", libver="latest") as f:
    d = f.create_dataset("X", data=np.repeat(np.arange({N0}), 4).reshape(-1, 4), maxshape=(None, 4), chunks=(25, 4),
                         compression="gzip")
    f.swmr_mode = True
    print("open", flush=True)
    for line in sys.stdin:
        if line.strip() == "close":
            break
        n = len(d)
        d.resize(n + {ADD}, axis=0); d[n:] = np.repeat(np.arange(n, n + {ADD}), 4).reshape(-1, 4); d.flush()
        print("grown", flush=True)
print("closed", flush=True)
"""


class Writer:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.expect("open")

    def expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == word

    def say(self, line: str, answer: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        self.expect(answer)

    def grow(self) -> None:
        self.say("grow", "grown")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.say("close", "closed")
        self.proc.wait(timeout=GUARD)


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[Path, Writer]]:
    path = tmp_path / "swmr.h5"
    w = Writer(path)
    try:
        yield path, w
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait(timeout=GUARD)
        for pipe in (w.proc.stdin, w.proc.stdout):
            if pipe is not None:
                pipe.close()


def rows(a: int, b: int) -> np.ndarray:
    return np.repeat(np.arange(a, b), 4).reshape(-1, 4)


def test_a_stream_reads_the_rows_it_looked_at_while_the_writer_appends(writer: tuple[Path, Writer],
                                                                       no_leaks: None) -> None:
    """Each flush moved the file's size and times: the stream stopped with FileChangedError at the writer's next
    flush. Its rows are the N0 it planned with, exactly; a new stream reads the rows appended since."""
    path, w = writer
    stream = multitables.Streamer(str(path), swmr=True)
    got = []
    with hang_guard(GUARD, "a stream of a growing SWMR file"):
        with stream.get_queue("/X", n_procs=1, block_size=100, read_ahead=2, ordered=True) as queue:
            for k, guard in enumerate(queue.iter()):
                with guard as block:
                    got.append(block.copy())
                if k < 3:  # the readers read the blocks after this one after the flush
                    w.grow()
        np.testing.assert_array_equal(np.concatenate(got), rows(0, N0))
        grown = np.stack([r.copy() for r in stream.get_generator("/X", n_procs=1, ordered=True)])
    np.testing.assert_array_equal(grown, rows(0, N0 + 3 * ADD))


def test_batches_read_the_rows_they_looked_at_while_the_writer_appends(writer: tuple[Path, Writer],
                                                                      no_leaks: None) -> None:
    """Batches over a growing file: each epoch gives every row looked at when they were made, once, in the order the
    seed gives for those rows (a flush stopped the epoch); new batches take the rows flushed since."""
    path, w = writer
    stream = multitables.Streamer(str(path), swmr=True)
    options = dict(seed=3, n_procs=1, block_size=100, window=1, read_ahead=2)
    with hang_guard(GUARD, "batches of a growing SWMR file"):
        batches = stream.get_batches("/X", 50, **options)
        epochs = []
        for epoch in range(2):
            batches.set_epoch(epoch)
            got = []
            for k, batch in enumerate(batches):
                got.append(batch)
                if k < 3:  # the readers read the blocks after these after the flush
                    w.grow()
            epochs.append(np.concatenate(got))
        batches.close()
        w.close()
        before = stream.get_batches("/X", 50, indices=np.arange(N0), **options)
        expected = []
        for epoch in range(2):
            before.set_epoch(epoch)
            expected.append(np.concatenate(list(before)))
        before.close()
        grown = stream.get_batches("/X", 50, **options)
        assert len(np.concatenate(list(grown))) == N0 + 6 * ADD
        grown.close()
    for got, want in zip(epochs, expected):
        np.testing.assert_array_equal(np.sort(got[:, 0]), np.arange(N0))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n_procs", [0, 1])
def test_a_readers_requests_read_known_rows_and_a_new_get_dataset_the_new_ones(writer: tuple[Path, Writer],
                                                                               n_procs: int, no_leaks: None) -> None:
    """A Reader over a growing file: a dataset's requests read its rows exactly after any flush (they failed with
    FileChangedError); ``get_dataset`` again gives the rows flushed since (it raised), and its requests read them,
    the first dataset's too, after the writer closed as well."""
    path, w = writer
    with hang_guard(GUARD, "a Reader of a growing SWMR file"):
        with multitables.Reader(str(path), n_procs=n_procs, swmr=True) as reader:
            ds = reader.get_dataset("/X")
            assert len(ds) == N0
            stage = ds.create_stage(N0 + 2 * ADD)
            np.testing.assert_array_equal(reader.request(ds[:], stage).get(), rows(0, N0))
            w.grow()
            np.testing.assert_array_equal(reader.request(ds[N0 - 10 :], stage).get(), rows(N0 - 10, N0))
            newer = reader.get_dataset("/X")
            assert len(newer) == N0 + ADD
            np.testing.assert_array_equal(reader.request(newer[N0 - 5 :], stage).get(), rows(N0 - 5, N0 + ADD))
            np.testing.assert_array_equal(reader.request(ds[[7, 999, 3]], stage).get(), rows(0, N0)[[7, 999, 3]])
            w.grow()
            w.close()
            newest = reader.get_dataset("/X")
            assert len(newest) == N0 + 2 * ADD
            np.testing.assert_array_equal(reader.request(newest[:], stage).get(), rows(0, N0 + 2 * ADD))
            np.testing.assert_array_equal(reader.request(newer[::7], stage).get(), rows(0, N0 + ADD)[::7])


def _hold_without_swmr(path: Path) -> subprocess.Popen:
    """Another program opens ``path`` for writing without SWMR, and writes a row in place: HDF5's lock, which the
    readers hold, stops it unless it goes without (``locking=False``, as where the file system has no locks)."""
    code = ("import sys, h5py\nf = h5py.File(sys.argv[1], 'a', locking=False)\nf['X'][0] = -1\nf.flush()\n"
            "print('held', flush=True)\nsys.stdin.readline()\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def _let_go(holder: "subprocess.Popen | None") -> None:
    if holder is not None:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(timeout=GUARD)
        holder.stdout.close()


@pytest.mark.parametrize("change", ["replaced", "cut short", "opened for writing without SWMR", "deleted"])
def test_a_swmr_file_changed_other_than_by_growing_is_refused(writer: tuple[Path, Writer], tmp_path: Path,
                                                              change: str, no_leaks: None) -> None:
    """Growth is let through (it was refused); a file replaced, cut short, deleted or opened for writing without
    SWMR is still refused, by the requests of a dataset looked at before and by the Reader's datasets, saying so."""
    path, w = writer
    with hang_guard(GUARD, "a Reader of a changed SWMR file"):
        size = os.path.getsize(path)  # when the Reader and its dataset look at it
        with multitables.Reader(str(path), n_procs=1, swmr=True) as reader:
            ds = reader.get_dataset("/X")
            stage = ds.create_stage(N0)
            w.grow()
            w.close()
            np.testing.assert_array_equal(reader.request(ds[:], stage).get(), rows(0, N0))
            holder = None
            if change == "replaced":
                other = tmp_path / "other.h5"
                with h5py.File(other, "w", libver="latest") as f:
                    f.create_dataset("X", data=rows(0, 2 * N0), maxshape=(None, 4), chunks=(64, 4))
                os.replace(other, path)
            elif change == "cut short":
                os.truncate(path, size // 2)
            elif change == "deleted":
                os.unlink(path)
            else:
                holder = _hold_without_swmr(path)
            try:
                with pytest.raises(FileChangedError, match=f"{change}.*since the Reader was made") as caught:
                    reader.request(ds[:], stage).get()
                assert str(path) in str(caught.value)
                if change == "opened for writing without SWMR":  # which HDF5 refuses to open for SWMR reading
                    with pytest.raises(multitables.FileBusyError, match="open for writing without SWMR"):
                        reader.get_dataset("/X")
                elif change != "deleted":
                    with pytest.raises(FileChangedError, match=change):
                        reader.get_dataset("/X")
            finally:
                _let_go(holder)


def test_a_stream_of_a_swmr_file_opened_for_writing_without_swmr_stops(writer: tuple[Path, Writer],
                                                                       no_leaks: None) -> None:
    """A stream goes on through the writer's flushes and its close, and stops where a writer without SWMR opens
    the file (it may rewrite rows in place): the blocks handed over are the file's rows before."""
    path, w = writer
    got = []
    holder = None
    try:
        with hang_guard(GUARD, "a stream of a SWMR file opened for writing"):
            stream = multitables.Streamer(str(path), swmr=True)
            with stream.get_queue("/X", n_procs=1, block_size=100, read_ahead=2, ordered=True) as queue:
                with pytest.raises(FileChangedError, match="for writing without SWMR while it was being streamed"):
                    for k, guard in enumerate(queue.iter()):
                        with guard as block:
                            got.append(block.copy())
                        if k == 0:
                            w.grow()
                            w.close()
                        elif k == 2:
                            holder = _hold_without_swmr(path)
    finally:
        _let_go(holder)
    assert 3 <= len(got) < N0 // 100
    np.testing.assert_array_equal(np.concatenate(got), rows(0, 100 * len(got)))


def _plain(path: Path, n: int) -> None:
    """A file of ``rows(0, n)`` that no writer holds, to make a set with the writer's file."""
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset("X", data=rows(0, n), maxshape=(None, 4), chunks=(25, 4))


@pytest.mark.parametrize("n_procs", [0, 1])
def test_a_readers_requests_of_a_set_with_a_growing_file_read_the_rows_looked_at(writer: tuple[Path, Writer],
                                                                                 tmp_path: Path, n_procs: int,
                                                                                 no_leaks: None) -> None:
    """A set whose first file an SWMR writer holds: the readers inspected the set again without swmr=True (HDF5
    refused: FileBusyError), and a file grown since ``get_dataset`` failed the set's check (FileChangedError). The
    rows read are each file's as ``get_dataset`` saw them, at the offsets it gave; a new ``get_dataset`` gives the
    rows flushed since, and the dataset got before keeps its rows."""
    path, w = writer
    other = tmp_path / "other.h5"
    _plain(other, 200)
    with hang_guard(GUARD, "a Reader of a set with a growing SWMR file"):
        with multitables.Reader([str(path), str(other)], n_procs=n_procs, swmr=True) as reader:
            ds = reader.get_dataset("/X")
            assert len(ds) == N0 + 200
            stage = ds.create_stage(N0 + ADD + 200)
            w.grow()
            np.testing.assert_array_equal(reader.request(ds[:], stage).get(), np.concatenate([rows(0, N0), rows(0, 200)]))
            newer = reader.get_dataset("/X")
            assert len(newer) == N0 + ADD + 200
            w.grow()
            want = np.concatenate([rows(0, N0 + ADD), rows(0, 200)])
            np.testing.assert_array_equal(reader.request(newer[N0 - 5 :], stage).get(), want[N0 - 5 :])
            np.testing.assert_array_equal(reader.request(ds[[N0 + 1, 3, N0 - 1]], stage).get(),
                                          np.concatenate([rows(0, N0), rows(0, 200)])[[N0 + 1, 3, N0 - 1]])
            w.close()
            np.testing.assert_array_equal(reader.request(newer[::7], stage).get(), want[::7])


def test_streams_and_batches_of_a_set_with_a_growing_file_read_the_rows_looked_at(writer: tuple[Path, Writer],
                                                                                 tmp_path: Path,
                                                                                 no_leaks: None) -> None:
    """A stream and an epoch of batches over a set whose first file an SWMR writer appends to read every row of
    each file as they looked at it, once, while the writer flushes."""
    path, w = writer
    other = tmp_path / "other.h5"
    _plain(other, 200)
    stream = multitables.Streamer([str(path), str(other)], swmr=True)
    want = np.concatenate([rows(0, N0), rows(0, 200)])
    with hang_guard(GUARD, "a stream and batches of a set with a growing SWMR file"):
        got = []
        with stream.get_queue("/X", n_procs=1, block_size=100, read_ahead=2, ordered=True) as queue:
            for k, guard in enumerate(queue.iter()):
                with guard as block:
                    got.append(block.copy())
                if k < 2:
                    w.grow()
        np.testing.assert_array_equal(np.concatenate(got), want)
        want = np.concatenate([rows(0, N0 + 2 * ADD), rows(0, 200)])
        with stream.get_batches("/X", 50, seed=1, n_procs=1, block_size=100, window=1, read_ahead=2) as batches:
            got = []
            for k, batch in enumerate(batches):
                got.append(batch)
                if k < 2:
                    w.grow()
        got = np.concatenate(got)
        np.testing.assert_array_equal(got[np.lexsort(got.T[::-1])], want[np.lexsort(want.T[::-1])])


@pytest.mark.parametrize("n_procs", [0, 1])
def test_a_file_cut_short_below_a_later_look_fails_the_requests(writer: tuple[Path, Writer], n_procs: int,
                                                                no_leaks: None) -> None:
    """A file grown, looked at again by ``get_dataset``, then cut short but still larger than when the Reader was
    made: it was checked against its size then, and passed (the rows past its new end read as HDF5 read them). Cut
    short is measured against the latest look at it that the requests' dataset came from."""
    path, w = writer
    with hang_guard(GUARD, "a Reader of a SWMR file cut short"):
        first = os.path.getsize(path)
        with multitables.Reader(str(path), n_procs=n_procs, swmr=True) as reader:
            ds = reader.get_dataset("/X")
            w.grow()
            w.grow()
            newer = reader.get_dataset("/X")
            looked = os.path.getsize(path)
            stage = newer.create_stage(len(newer))
            np.testing.assert_array_equal(reader.request(newer[:], stage).get(), rows(0, N0 + 2 * ADD))
            w.close()
            cut = looked - 1
            assert first < cut
            os.truncate(path, cut)
            for request in (newer[:], ds[:]):  # ds's too: these readers know the later look
                with pytest.raises(FileChangedError, match=f"cut short from {looked} to {cut} bytes since the Reader"):
                    reader.request(request, stage).get()
            with pytest.raises(FileChangedError, match=f"cut short from {looked} to {cut} bytes"):
                reader.get_dataset("/X")


@pytest.mark.parametrize("n_procs", [0, 1])
def test_a_set_file_cut_short_below_the_readers_look_fails_the_requests(writer: tuple[Path, Writer], tmp_path: Path,
                                                                       n_procs: int, no_leaks: None) -> None:
    """A set's file cut short after ``get_dataset`` looked at it (and after it grew): the readers' own look at the
    set refuses it, saying how much smaller it is."""
    path, w = writer
    other = tmp_path / "other.h5"
    _plain(other, 200)
    with hang_guard(GUARD, "a Reader of a set with a SWMR file cut short"):
        with multitables.Reader([str(path), str(other)], n_procs=n_procs, swmr=True) as reader:
            w.grow()
            ds = reader.get_dataset("/X")
            looked = os.path.getsize(path)
            w.close()
            os.truncate(path, looked - 1)
            with pytest.raises(FileChangedError, match=f"cut short from {looked} to {looked - 1} bytes"):
                reader.request(ds[:], ds.create_stage(len(ds))).get()


def test_a_growing_set_too_large_to_describe_to_the_readers_is_refused_saying_so(tmp_path: Path) -> None:
    """Each file's rows and size go to the readers in a stage's header: a set of more files than it holds is refused
    at ``get_dataset``, before any request, saying what to do."""
    from dataclasses import replace

    from multitables._io.files import GrowingFile
    from multitables._io.fileset import inspect_files, set_node
    from multitables._io.node import Part
    from multitables._shm.stagemap import describe

    _plain(tmp_path / "one.h5", 10)
    node = inspect_files(str(tmp_path / "one.h5"), "/X", swmr=True)
    assert isinstance(node.identity, GrowingFile)
    files = tuple(f"f{i}.h5" for i in range(4000))
    sizes = np.random.default_rng(0).integers(10**8, 2 * 10**8, len(files))
    parts = [Part(replace(node, filename=name), 10 * i, GrowingFile(node.identity.signature[:2] + (int(size), 0, 0)))
             for i, (name, size) in enumerate(zip(files, sizes))]
    with pytest.raises(ValueError, match="swmr=True is too many files.*read fewer files per Reader"):
        describe("h5py", set_node("4000 files", node, parts, 10 * len(files)), files)
    assert len(describe("h5py", set_node("40 files", node, parts[:40], 400), files[:40])) < 1000


def test_a_handles_chunk_index_leaves_out_the_chunks_flushed_past_its_extent(writer: tuple[Path, Writer]) -> None:
    """HDF5 lists the chunks a SWMR writer flushed after a handle's look: a reader that opened the file before the
    writer's flush failed with FileChangedError ("changed while the chunk index was listed"), the file only grown."""
    from multitables._io.chunks.grid import ChunkGrid
    from multitables._io.chunks.storage import ChunkIndex

    path, w = writer
    with h5py.File(path, "r", libver="latest", swmr=True) as f:
        ds = f["X"]
        w.grow()
        w.grow()
        listed: list = []
        ds.id.chunk_iter(listed.append)
        assert len(listed) > N0 // 25  # what HDF5 lists: the chunks flushed since too
        index = ChunkIndex(ds.id, ChunkGrid(ds.shape, ds.chunks))
        assert index.n_listed == N0 // 25
        for k in range(N0 // 25):
            assert index.lookup((k, 0)) is not None
    w.close()


@pytest.mark.parametrize("n_procs", [0, 1])
def test_a_look_while_this_process_reads_the_dataset_sees_the_rows_flushed_since(writer: tuple[Path, Writer],
                                                                                n_procs: int, no_leaks: None) -> None:
    """A stream, batches and a Reader reading here (``n_procs=0``) hold an open of the dataset, which HDF5 shares
    with every later open in the process: a stream, batches or ``get_dataset`` made after a flush saw only the rows
    there were at the first open (their readers, forked from here, too). They see the rows flushed by then, and the
    first ones go on reading exactly their own rows (NOTE [swmr extent] in ``multitables._io.handles``)."""
    path, w = writer
    stream = multitables.Streamer(str(path), swmr=True)
    with hang_guard(GUARD, "looks at a growing SWMR file while this process reads it"):
        first = stream.get_generator("/X", n_procs=0, block_size=100, ordered=True)
        batches = stream.get_batches("/X", 100, shuffle=False, n_procs=0, block_size=100)
        mine = multitables.Reader(str(path), n_procs=0, swmr=True)
        ds = mine.get_dataset("/X")
        stage = ds.create_stage(N0)
        np.testing.assert_array_equal(mine.request(ds[:3], stage).get(), rows(0, 3))
        got = [next(first).copy() for _ in range(10)]
        held = iter(batches)
        taken = [next(held)]
        n = N0
        for look in ("stream", "batches", "get_dataset"):
            w.grow()
            n += ADD
            if look == "stream":
                new = [r.copy() for r in stream.get_generator("/X", n_procs=n_procs, block_size=100, ordered=True)]
                np.testing.assert_array_equal(np.stack(new), rows(0, n))
            elif look == "batches":
                with stream.get_batches("/X", 100, shuffle=False, n_procs=n_procs, block_size=100) as later:
                    np.testing.assert_array_equal(np.concatenate(list(later)), rows(0, n))
            else:
                with multitables.Reader(str(path), n_procs=n_procs, swmr=True) as reader:
                    newer = reader.get_dataset("/X")
                    assert len(newer) == n
                    np.testing.assert_array_equal(reader.request(newer[n - 5 :], newer.create_stage(5)).get(),
                                                  rows(n - 5, n))
            got += [next(first).copy() for _ in range(10)]
            taken.append(next(held))
        got += [r.copy() for r in first]
        taken += list(held)
        np.testing.assert_array_equal(mine.request(ds[N0 - 7 :], stage).get(), rows(N0 - 7, N0))
        newest = mine.get_dataset("/X")
        assert len(newest) == n
        mine.close()
        batches.close()
    np.testing.assert_array_equal(np.stack(got), rows(0, N0))
    np.testing.assert_array_equal(np.concatenate(taken), rows(0, N0))


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_dataset_got_before_the_file_grew_keeps_its_rows_as_h5py_without_refresh(writer: tuple[Path, Writer],
                                                                                   n_procs: int,
                                                                                   no_leaks: None) -> None:
    """A dataset of ``get_dataset`` keeps the rows it was given, as an h5py dataset not refreshed: a request past them
    is refused as numpy refuses it (IndexError; a slice stops at them), though the file has more rows and a later
    ``get_dataset`` of the same Reader serves them; its own rows are read as they were."""
    path, w = writer
    with hang_guard(GUARD, "an older dataset of a growing SWMR file"):
        with multitables.Reader(str(path), n_procs=n_procs, swmr=True) as reader:
            ds = reader.get_dataset("/X")
            w.grow()
            newer = reader.get_dataset("/X")
            stage = newer.create_stage(len(newer))
            np.testing.assert_array_equal(reader.request(newer[N0 + 1], stage).get(), rows(N0 + 1, N0 + 2)[0])
            assert len(ds) == N0 and ds.shape == (N0, 4) and len(newer) == N0 + ADD
            for key in (N0 + 1, [N0 - 1, N0], -N0 - 1):
                with pytest.raises(IndexError, match=f"size {N0}"):
                    ds[key]
            np.testing.assert_array_equal(reader.request(ds[N0 - 2 : N0 + 5], stage).get(), rows(N0 - 2, N0))
            assert len(reader.request(ds[N0:], stage).get()) == 0
            np.testing.assert_array_equal(reader.request(ds[::-97], stage).get(), rows(0, N0)[::-97])
            np.testing.assert_array_equal(reader.request(newer[-1], stage).get(), rows(N0 + ADD - 1, N0 + ADD)[0])


def test_looks_on_one_thread_while_others_read_the_dataset_here_read_exact_rows(writer: tuple[Path, Writer],
                                                                                no_leaks: None) -> None:
    """Threads stream a growing file in this process (``n_procs=0``) while another makes new looks after each flush:
    a refresh made while another thread opened the dataset failed reads with "can't insert duplicate key". Each
    stream reads exactly the rows 0..n of its look, n never fewer than a look before it saw."""
    path, w = writer
    stream = multitables.Streamer(str(path), swmr=True)
    failures: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                got = np.stack([r.copy() for r in stream.get_generator("/X", n_procs=0, block_size=25, ordered=True)])
                np.testing.assert_array_equal(got, rows(0, len(got)))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=read) for _ in range(2)]
    with hang_guard(GUARD, "looks at a growing SWMR file while threads read it here"):
        for t in threads:
            t.start()
        try:
            seen = N0
            for _ in range(20):
                w.grow()
                got = np.stack([r.copy() for r in stream.get_generator("/X", n_procs=0, block_size=200, ordered=True)])
                assert len(got) >= seen
                seen = len(got)
                np.testing.assert_array_equal(got, rows(0, seen))
        finally:
            done.set()
            for t in threads:
                t.join(GUARD)
    assert not failures, failures
