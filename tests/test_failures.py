"""Failure behaviour: readers killed or failing, consumers stopping early, interrupted or killed, leaks, collisions,
a full /dev/shm, files changing under the readers, and corrupted files.

Every test here starts real processes and sends real signals. Time limits are
guards against a hang only (``GONE_WITHIN``, ``GUARD``, ``TEST_GUARD``), far above
what the library takes: the tests assert *what* happens (which error, naming
whom; which processes are gone; what is left in ``/dev/shm``). How soon it
happens is measured by ``benchmarks/failure_latency.py``; the promises are in
``docs/failures.rst``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import psutil
import pytest

import multitables
from multitables import QueueClosed, ReaderError, ShmSpaceError, Streamer
from multitables._shm.segment import SHM_PREFIX, Segment
from multitables.errors import FileChangedError, MultitablesError

from _consumer import Consumer
from _guards import hang_guard, is_gone, wait_until

N_ROWS = 20_000
ROW = 16
CHUNK = 500  # rows per chunk and per block: 40 blocks of 32 KiB
#: Guards against a hang only: an error raised, a process gone, a loop or a subprocess, and any one test (the
#: slowest takes ~25 s on 2 busy cores).
GONE_WITHIN = 30.0
GUARD = 30.0
TEST_GUARD = 150.0

START_METHODS = [pytest.param(None, id="default"), pytest.param("spawn", id="spawn")]


# -- helpers -------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _hang_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that hangs (pytest-timeout is not a dependency); a guard, not a behavioural limit."""
    with hang_guard(TEST_GUARD, request.node.name):
        yield


@pytest.fixture
def data() -> np.ndarray:
    return np.arange(N_ROWS * ROW, dtype="<f4").reshape(N_ROWS, ROW)


@pytest.fixture
def h5file(make_array: Callable[..., Path], data: np.ndarray) -> Path:
    """A zlib-compressed CArray at /data, chunks of ``CHUNK`` rows."""
    return make_array(data, complib="zlib", complevel=3, chunkshape=(CHUNK, ROW))


def ring_of(queue: multitables.Queue) -> Any:
    """The ring under ``queue``'s blocks (those cut from larger blocks read included: NOTE [read plan])."""
    backend = queue._backend
    return getattr(backend, "_inner", backend)._pool.ring


def own_segments(pid: "int | None" = None) -> set[str]:
    """The names in /dev/shm of segments that process ``pid`` (default: this one) created.

    Every name is ``multitables_<owner pid>_<random>``; looking at one owner's
    names only keeps these tests blind to other programs (and other test runs)
    using the library on the same machine at the same time.
    """
    prefix = f"{SHM_PREFIX}{os.getpid() if pid is None else pid}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


def stream_readers() -> set[int]:
    """The reader pids of the one live queue with readers (a generator's is out of reach otherwise); earlier tests'
    queues read in their process may wait for a collection, and have none."""
    gc.collect()
    queues = [o for o in gc.get_objects() if type(o) is multitables.Queue and not o.closed and o.n_procs]
    assert len(queues) == 1, queues
    return set(queues[0].reader_pids)


def own_mappings(pid: "int | str" = "self") -> list[str]:
    """This library's shared-memory mappings in a process (deleted names included)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return [line.split(None, 5)[5].strip() for line in f if f"/dev/shm/{SHM_PREFIX}" in line]
    except (FileNotFoundError, ProcessLookupError):
        return []


def drain(queue: Any, deadline: float = GUARD) -> list[np.ndarray]:
    """Copies of every block until QueueClosed (the deadline is a guard against a hang)."""
    out = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline:
        guard = queue.get()
        if guard is QueueClosed:
            return out
        with guard as block:
            out.append(block.copy())
    raise AssertionError("the stream did not end")


def corrupt_chunk(src: Path, dst: Path, chunk_index: int) -> tuple[int, int]:
    """Copy ``src`` to ``dst`` with chunk ``chunk_index`` of /data overwritten; return its row range."""
    import h5py

    shutil.copy(src, dst)
    with h5py.File(src, "r") as f:
        ds = f["data"]
        info = ds.id.get_chunk_info(chunk_index)
        chunk_rows = ds.chunks[0]
    with open(dst, "r+b") as f:
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    start = info.chunk_offset[0]
    return start, start + chunk_rows


# A small program for the tests that interrupt or kill the consumer itself.
SCRIPT = textwrap.dedent(
    """
    import gc, json, os, sys, time
    import numpy as np
    import psutil
    import multitables
    from multitables._shm.segment import SHM_PREFIX

    def say(**kw):
        print(json.dumps(kw), flush=True)

    def readers():
        return sorted(c.pid for c in psutil.Process().children()
                      if "resource_tracker" not in " ".join(c.cmdline()))

    def mappings():
        with open("/proc/self/maps") as f:
            return [l.split(None, 5)[5].strip() for l in f if "/dev/shm/" + SHM_PREFIX in l]

    CONSUMER = os.getpid()

    def stuck(rows):  # a transform that never returns in a reader, as a read from a server that stopped answering
        if os.getpid() != CONSUMER:
            time.sleep(3600)
        return rows

    def main():
        path, mode, start_method = sys.argv[1:4]
        s = multitables.Streamer(path, start_method=None if start_method == "default" else start_method)
        kw = dict(n_procs=2, block_size=500, read_ahead=4)
        if mode == "attaching":
            # Stay inside get_queue after the readers attached but before the
            # consumer unlinks the name, with the resource tracker's safety net
            # off: only the readers' own clean-up can remove the segment.
            import multiprocessing.resource_tracker as rt
            from multitables._procs import stream as _stream
            rt.register = lambda name, rtype: None
            def hold(self, what, check):
                while sum(mapped.get_value() for mapped in self.attached) < self.n_readers:
                    time.sleep(0.01)
                mine = f"{SHM_PREFIX}{os.getpid()}_"
                say(readers=self.pids, segment=[n for n in os.listdir("/dev/shm") if n.startswith(mine)][0])
                time.sleep(3600)
            _stream.ReaderPool.wait_attached = hold
        try:
            if mode == "generator":
                for i, row in enumerate(s.get_generator("/data", cyclic=True, **kw)):
                    if i == 0:
                        say(readers=readers())
            elif mode in ("queue", "attaching"):
                with s.get_queue("/data", cyclic=True, **kw) as q:
                    say(readers=q.reader_pids)
                    while True:
                        with q.get() as block:
                            block.sum()
            elif mode == "idle":
                q = s.get_queue("/data", cyclic=True, **kw)
                say(readers=q.reader_pids)
                time.sleep(3600)
            elif mode in ("batches", "batches-idle"):
                # Readers that live across epochs (NOTE [readers across epochs]): busy in an endless run,
                # or idle after a break, waiting for the next iteration.
                b = s.get_batches("/data", 64, epochs=None, n_procs=2, block_size=500, read_ahead=4)
                for i, x in enumerate(b):
                    if i == 400:  # past the first epoch (313 batches): the same readers go on
                        say(readers=readers())
                        if mode == "batches-idle":
                            break
                time.sleep(3600)
            elif mode == "stuck":
                import threading
                b = s.get_batches("/data", 64, n_procs=2, block_size=500, read_ahead=4, transform=stuck)
                threading.Thread(target=lambda: next(iter(b)), daemon=True).start()
                while len(readers()) < 2:
                    time.sleep(0.01)
                time.sleep(0.5)  # into their first block
                say(readers=readers())
                time.sleep(3600)
            elif mode == "full":
                rows = 0
                with s.get_queue("/data", ordered=True, **kw) as q:
                    say(readers=q.reader_pids)
                    for guard in q:
                        with guard as block:
                            assert np.array_equal(block[:, 0], np.arange(rows, rows + len(block)) * 16.0)
                            rows += len(block)
                say(rows=rows)
                return
        except KeyboardInterrupt:
            if mode.startswith("batches"):
                # Readers belong to their batches: stopped if Ctrl-C came while the library had the loop, else idle
                # (as after a break) until the batches go, here at once.
                b = None
        # A block kept past its queue (here, or in the library's frame the Ctrl-C landed in, which the traceback may
        # hold in a cycle) keeps its slot mapped until it goes (NOTE [segment lifetime]).
        block = None
        gc.collect()
        say(interrupted=True, readers=readers(), mappings=mappings())
        sys.exit(3)

    if __name__ == "__main__":
        main()
    """
)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "consumer.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    """Started helper programs, killed at the end whatever happened."""
    started: list[Consumer] = []
    yield started
    for c in started:
        c.kill()


# -- a reader killed -----------------------------------------------------------


@pytest.mark.parametrize("start_method", START_METHODS)
def test_reader_killed_mid_stream_raises_naming_it(no_leaks: None, h5file: Path, start_method: "str | None") -> None:
    s = Streamer(h5file, start_method=start_method)
    with s.get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True) as q:
        q.get().release()
        pids = q.reader_pids
        victim = pids[1]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ReaderError) as info:
            while time.monotonic() - t0 < GUARD:
                q.get().release()
        err = info.value
        assert (err.reader_index, err.pid, err.exitcode) == (1, victim, -signal.SIGKILL)
        assert err.path == "/data" and err.filename == str(h5file)
        assert f"Reader 1 (pid {victim})" in str(err) and "SIGKILL" in str(err) and "exit code -9" in str(err)
        # The error is kept, not a one-off: the stream cannot go on without the lost block.
        with pytest.raises(ReaderError):
            q.get()
        # The surviving reader, told to stop when the death was seen, ends by itself (not joined first).
        wait_until(lambda: all(is_gone(p) for p in pids), GONE_WITHIN, "the survivor ends")


def test_reader_killed_while_consumer_waits(no_leaks: None, h5file: Path) -> None:
    """The consumer is blocked in get() (its only reader stopped) when the reader dies."""
    s = Streamer(h5file)
    with s.get_queue("/data", n_procs=1, block_size=CHUNK, read_ahead=2, cyclic=True) as q:
        (victim,) = q.reader_pids
        os.kill(victim, signal.SIGSTOP)
        killed_at: list[float] = []

        def kill() -> None:
            time.sleep(0.3)
            killed_at.append(time.monotonic())
            os.kill(victim, signal.SIGKILL)

        killer = threading.Thread(target=kill)
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(ReaderError, match="SIGKILL"):
            while time.monotonic() - t0 < GUARD:
                q.get().release()
        raised_at = time.monotonic()
        killer.join()
        assert raised_at - killed_at[0] < GONE_WITHIN  # seen while blocked, not at the test's guard


def test_a_readers_death_is_raised_before_the_others_are_ended(no_leaks: None, h5file: Path) -> None:
    """Raise first, then clean up: the error does not wait for the surviving reader; close() ends it."""
    q = Streamer(h5file).get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True)
    victim, survivor = q.reader_pids
    for pid in (victim, survivor):
        os.kill(pid, signal.SIGSTOP)  # the survivor cannot end by itself while stopped
    killer = threading.Timer(0.3, os.kill, (victim, signal.SIGKILL))  # while the consumer waits in get()
    killer.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(ReaderError, match="SIGKILL"):
            while time.monotonic() - t0 < GUARD:
                q.get().release()
        # Neither joined, terminated nor killed before the error reached us.
        assert not is_gone(survivor) and psutil.Process(survivor).status() == psutil.STATUS_STOPPED
    finally:
        killer.join()
        if not is_gone(survivor):
            os.kill(survivor, signal.SIGCONT)
    q.close()  # told to stop when the death was seen, the survivor ends now; no_leaks checks the rest
    assert is_gone(survivor)


def test_a_lock_held_by_a_dead_process_does_not_block_the_end(no_leaks: None, h5file: Path) -> None:
    """The ring lock is a plain semaphore: whoever dies holding it holds it forever; nobody may wait on it then."""
    s = Streamer(h5file)
    with s.get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True) as q:
        q.get().release()
        pids = q.reader_pids
        lock = ring_of(q).sync.lock
        held = []  # taken by another thread, as a reader killed inside the lock would leave it: held, not ours
        taker = threading.Thread(target=lambda: held.append(lock.acquire(timeout=GUARD)))
        taker.start()
        taker.join()
        assert held == [True]
        try:
            time.sleep(0.2)  # the readers now wait for the lock
            os.kill(pids[0], signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(ReaderError, match="SIGKILL"):
                while time.monotonic() - t0 < GUARD:
                    q.get().release()  # the release waits for the lock, and sees the death
            # The survivor gives up waiting for the lock.
            wait_until(lambda: all(is_gone(p) for p in pids), GONE_WITHIN, "the survivor ends")
        finally:
            lock.release()


def test_a_stuck_reader_is_terminated_by_close(no_leaks: None, h5file: Path) -> None:
    """A reader that cannot see the stop flag (here: stopped by SIGSTOP) is ended by SIGTERM, then SIGKILL."""
    q = Streamer(h5file).get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True)
    pids = q.reader_pids
    os.kill(pids[0], signal.SIGSTOP)
    q.close()  # returns (the test's guard fails a close that waits for ever)
    assert all(is_gone(p) for p in pids)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_reader_killed_under_the_generator(no_leaks: None, h5file: Path, start_method: "str | None") -> None:
    s = Streamer(h5file, start_method=start_method)
    gen = s.get_generator("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True)
    next(gen)
    pids = stream_readers()
    assert len(pids) == 2
    os.kill(min(pids), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(ReaderError, match="died unexpectedly"):
        while time.monotonic() - t0 < GUARD:
            next(gen)
    assert all(is_gone(p) for p in pids)
    assert not own_mappings()


# -- an exception in a reader --------------------------------------------------


@pytest.mark.parametrize(
    "start_method, engine",
    [
        pytest.param(None, "h5py", id="default-h5py"),
        pytest.param(None, "tables", id="default-tables"),
        pytest.param("spawn", "auto", id="spawn-auto"),
    ],
)
def test_corrupt_chunk_reraised_with_traceback_path_and_rows(
    no_leaks: None, h5file: Path, tmp_path: Path, data: np.ndarray, start_method: "str | None", engine: str
) -> None:
    broken = tmp_path / "broken.h5"
    rows = corrupt_chunk(h5file, broken, 7)
    assert rows == (3500, 4000)
    s = Streamer(broken, start_method=start_method, engine=engine)
    q = None
    with pytest.raises(ReaderError) as info:
        # A reader may read the broken block before its siblings have started (spawn): the start says so then.
        q = s.get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, ordered=True)
        drain(q)
    err = info.value
    if q is not None:
        with q:  # raised again on the next get, never a hang or a silent end
            with pytest.raises(ReaderError):
                q.get()
    assert err.rows == rows and err.path == "/data" and err.filename == str(broken)
    assert "rows 3500:4000 of '/data'" in str(err) and str(broken) in str(err)
    assert "Original traceback in the reader" in str(err)
    assert "read_into" in err.remote_traceback and err.remote_traceback in str(err)
    # Also the original exception type: h5py raises OSError, PyTables HDF5ExtError (a RuntimeError).
    if engine == "tables":
        import tables

        assert isinstance(err, tables.HDF5ExtError)
    else:
        assert isinstance(err, OSError)


@pytest.mark.parametrize("engine", ["h5py", "chunks", "tables"])
def test_a_failure_in_this_process_takes_a_readers_form(no_leaks: None, h5file: Path, tmp_path: Path, engine: str) -> None:
    # A stream too small for readers (or n_procs=0) is read here: its errors carry the same context, and
    # `except ReaderError` catches them, as docs/failures.rst says of every read.
    broken = tmp_path / "broken.h5"
    rows = corrupt_chunk(h5file, broken, 7)
    with Streamer(broken, engine=engine).get_queue("/data", n_procs=0, block_size=CHUNK, ordered=True) as q:
        with pytest.raises(ReaderError) as info:
            drain(q)
    err = info.value
    assert (err.rows, err.path, err.filename, err.pid) == (rows, "/data", str(broken), os.getpid())
    assert f"Caught {type(err.__cause__).__name__} in this process (pid {os.getpid()})" in str(err)
    assert isinstance(err, type(err.__cause__)) and "read_into" in err.remote_traceback  # the original type, its cause
    changed = tmp_path / "changed.h5"
    shutil.copyfile(h5file, changed)
    with Streamer(changed).get_queue("/data", n_procs=0, block_size=CHUNK) as q, pytest.raises(ReaderError) as info:
        with q.get():
            os.utime(changed, ns=(0, 0))  # a change is a ReaderError here too (and an OSError)
        drain(q)
    assert isinstance(info.value, FileChangedError) and isinstance(info.value, OSError)


def test_a_failure_read_here_by_pytables_leads_with_its_context(no_leaks: None, h5file: Path, tmp_path: Path) -> None:
    """PyTables' HDF5ExtError prints the HDF5 error stack of the process that makes it before its message: read in
    this process, the error rebuilt here showed that stack twice, the context ("Caught ... rows ...") in between."""
    broken = tmp_path / "broken.h5"
    rows = corrupt_chunk(h5file, broken, 7)
    with Streamer(broken, engine="tables").get_queue("/data", n_procs=0, block_size=CHUNK, ordered=True) as q:
        with pytest.raises(ReaderError) as info:
            drain(q)
    text = str(info.value)
    assert text.startswith(f"Caught HDF5ExtError in this process (pid {os.getpid()}), which reads without reader processes, "
                           f"while reading rows {rows[0]}:{rows[1]} of '/data'"), text[:300]
    assert text.count("End of HDF5 error back trace") == 1, text


def test_blocks_before_a_corrupt_chunk_are_right(no_leaks: None, h5file: Path, tmp_path: Path, data: np.ndarray) -> None:
    broken = tmp_path / "broken.h5"
    corrupt_chunk(h5file, broken, 7)
    got = []
    # The queue's start too: it waits for the second reader to start, and raises a failure seen meanwhile (the first
    # reader may have read on to the corrupt chunk by then, on a loaded machine).
    with pytest.raises(OSError, match="rows 3500:4000"):
        with Streamer(broken).get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, ordered=True) as q:
            while True:
                guard = q.get()
                assert guard is not QueueClosed
                with guard as block:
                    got.append(block.copy())
    assert len(got) <= 7
    for k, block in enumerate(got):
        np.testing.assert_array_equal(block, data[k * CHUNK : (k + 1) * CHUNK])


@pytest.mark.parametrize("start_method", START_METHODS)
def test_corrupt_chunk_under_the_generator(
    no_leaks: None, h5file: Path, tmp_path: Path, start_method: "str | None"
) -> None:
    broken = tmp_path / "broken.h5"
    corrupt_chunk(h5file, broken, 30)
    gen = Streamer(broken, start_method=start_method).get_generator("/data", n_procs=2, block_size=CHUNK)
    next(gen)
    pids = stream_readers()
    with pytest.raises(ReaderError, match="rows 15000:15500 of '/data'"):
        for _ in gen:
            pass
    assert all(is_gone(p) for p in pids)


class InjectedError(Exception):
    """Raised inside a reader by a patched engine (fork start method only: the patch is inherited)."""


def test_any_exception_type_travels(no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the patched engine reaches the readers only under fork")
    from multitables._io import h5py_engine as _h5py_source

    original = _h5py_source.H5pySource.read_into

    def read_into(self: Any, start: int, stop: int, out: np.ndarray) -> None:
        if start <= 2 * CHUNK < stop:  # blocks read together are read again one at a time to name the one failing
            raise InjectedError(f"injected at {start}")
        original(self, start, stop, out)

    monkeypatch.setattr(_h5py_source.H5pySource, "read_into", read_into)
    with Streamer(h5file, engine="h5py").get_queue("/data", n_procs=1, block_size=CHUNK) as q:
        with pytest.raises(InjectedError) as info:
            drain(q)
    err = info.value
    assert isinstance(err, ReaderError) and err.rows == (1000, 1500)
    assert "Caught InjectedError in reader 0" in str(err) and "injected at 1000" in str(err)
    assert "InjectedError: injected at 1000" in err.remote_traceback


def test_unpicklable_exception_type_still_reported(no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the patched engine reaches the readers only under fork")
    from multitables._io import h5py_engine as _h5py_source

    class LocalError(Exception):  # not importable by name: travels as a plain ReaderError
        pass

    def read_into(self: Any, start: int, stop: int, out: np.ndarray) -> None:
        raise LocalError("local")

    monkeypatch.setattr(_h5py_source.H5pySource, "read_into", read_into)
    with Streamer(h5file, engine="h5py").get_queue("/data", n_procs=1, block_size=CHUNK) as q:
        with pytest.raises(ReaderError, match="Caught LocalError in reader 0") as info:
            drain(q)
    assert "LocalError: local" in info.value.remote_traceback


def test_reader_crash_in_c_is_reported(no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A segfault inside a decoder kills the reader, not the consumer, which names the signal."""
    import multiprocessing

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the patched engine reaches the readers only under fork")
    from multitables._io import h5py_engine as _h5py_source

    def read_into(self: Any, start: int, stop: int, out: np.ndarray) -> None:
        signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # no faulthandler dump in the test output
        os.kill(os.getpid(), signal.SIGSEGV)

    monkeypatch.setattr(_h5py_source.H5pySource, "read_into", read_into)
    with hang_guard(GUARD, "a reader's SIGSEGV reaches the consumer"):
        # The queue's start too: a reader may crash on its first block before the other reader started.
        with pytest.raises(ReaderError, match=r"exit code -11 \(SIGSEGV\)") as info:
            with Streamer(h5file, engine="h5py").get_queue("/data", n_procs=2, block_size=CHUNK) as q:
                drain(q)
    assert info.value.exitcode == -signal.SIGSEGV and info.value.remote_traceback == ""


# -- the consumer stops early --------------------------------------------------


def _stop_break(s: Streamer, seen: dict[str, Any]) -> None:
    for i, _row in enumerate(s.get_generator("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True)):
        if i == 0:
            seen["pids"] = stream_readers()
            break


def _stop_exception_in_generator_loop(s: Streamer, seen: dict[str, Any]) -> None:
    with pytest.raises(LookupError, match="the loop body failed"):
        for _row in s.get_generator("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True):
            seen["pids"] = stream_readers()
            raise LookupError("the loop body failed")


def _stop_drop_generator(s: Streamer, seen: dict[str, Any]) -> None:
    gen = s.get_generator("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True)
    next(gen)
    seen["pids"] = stream_readers()
    del gen


def _stop_exception_in_queue_with(s: Streamer, seen: dict[str, Any]) -> None:
    with pytest.raises(LookupError, match="the loop body failed"):
        with s.get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True) as q:
            with q.get() as block:
                seen["pids"] = set(q.reader_pids)
                raise LookupError(f"the loop body failed on a block of {len(block)} rows")


def _stop_drop_queue(s: Streamer, seen: dict[str, Any]) -> None:
    q = s.get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True)
    q.get().release()
    guard = q.get()  # a guard still held keeps the queue alive; dropping both ends it
    seen["pids"] = set(q.reader_pids)
    del q, guard


def _stop_drop_queue_keep_released_guard(s: Streamer, seen: dict[str, Any]) -> None:
    q = s.get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True)
    for guard in q.iter():
        with guard:
            break
    seen["guard"] = guard  # released, and still referenced while the test waits: it must not hold the queue
    seen["pids"] = set(q.reader_pids)
    del q
    gc.collect()


def _stop_collect_queue_cycle(s: Streamer, seen: dict[str, Any]) -> None:
    q = s.get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True)
    q.get().release()
    q.myself = q  # type: ignore[attr-defined]  # only the cycle collector can free it
    seen["pids"] = set(q.reader_pids)
    del q
    gc.collect()


STOPS = [
    _stop_break,
    _stop_exception_in_generator_loop,
    _stop_drop_generator,
    _stop_exception_in_queue_with,
    _stop_drop_queue,
    _stop_drop_queue_keep_released_guard,
    _stop_collect_queue_cycle,
]


@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize("stop", STOPS, ids=lambda f: f.__name__[len("_stop_") :])
def test_early_stop_ends_readers_and_frees_memory(
    no_leaks: None, h5file: Path, start_method: "str | None", stop: Callable[..., None]
) -> None:
    segments = own_segments()
    seen: dict[str, Any] = {}
    stop(Streamer(h5file, start_method=start_method), seen)
    pids = seen["pids"]
    assert len(pids) == 2
    wait_until(lambda: all(is_gone(p) for p in pids) and not own_mappings(), GONE_WITHIN, "readers exit, ring unmapped")
    assert own_segments() == segments


# -- Ctrl-C and a killed consumer ----------------------------------------------


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("how", ["held", "handled-at-once"])
def test_a_ctrl_c_while_a_reader_starts_stops_that_reader_too(
    h5file: Path, which: int, how: str, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """A Ctrl-C during a reader's start came before the reader was counted, so the stream's close missed it (a
    zombie reader and two pipes, until the next stream started a process). ``held``: sent from inside the start, as
    one pressed during the fork is held in this thread; ``handled-at-once``: another thread took the signal, and
    Python runs its handler in the main thread at its next instruction, mid-start (the full suite's threads)."""
    import multiprocessing.context as mpc

    real, started = mpc.ForkProcess.start, []

    def start(proc: Any) -> None:
        real(proc)
        if len(started) == which:
            if how == "held":  # to this thread: another one would take a signal sent to the process
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            else:
                signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        started.append(proc.pid)

    monkeypatch.setattr(mpc.ForkProcess, "start", start)
    with pytest.raises(KeyboardInterrupt):
        Streamer(str(h5file), start_method="fork").get_queue("/data", n_procs=2)
    assert len(started) == which + 1
    wait_until(lambda: all(is_gone(pid) for pid in started), GONE_WITHIN, "the started readers exit")


@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize("mode", ["generator", "queue", "batches", "batches-idle"])
def test_sigint_reaches_the_user_and_cleans_up(
    h5file: Path, script: Path, consumers: list[Consumer], mode: str, start_method: "str | None"
) -> None:
    c = Consumer(script, h5file, mode, start_method)
    consumers.append(c)
    pids = c.read()["readers"]
    assert len(pids) == 2
    time.sleep(0.2)  # streaming in full swing
    os.killpg(c.proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole foreground group
    if mode == "generator" and sys.version_info[:2] == (3, 13):
        out, err = c.proc.communicate(timeout=GUARD)
        if c.proc.returncode == -signal.SIGINT:
            # CPython 3.13 can raise the KeyboardInterrupt past the ``except`` around the consumer's own ``for``
            # loop (python/cpython#130279; a loop over a plain generator of ints loses it as often), so the
            # program ends with its traceback. What the library promises still holds: nothing is left.
            assert err.rstrip().endswith("KeyboardInterrupt"), err
            wait_until(lambda: all(is_gone(p) for p in pids), GONE_WITHIN, "every reader exits")
            assert not own_segments(c.proc.pid)
            return
        report, code = json.loads(out.splitlines()[0]), c.proc.returncode
    else:
        report = c.read()
        code, err = c.finish()
    # KeyboardInterrupt came out of the library; by then the readers were gone and the ring unmapped (the batches'
    # once the batches were dropped: idle readers, after a break or a Ctrl-C in the loop's body, belong to them).
    assert report["interrupted"] and report["readers"] == [] and report["mappings"] == []
    assert code == 3, err
    assert "Traceback" not in err, err  # no reader complained
    assert all(is_gone(p) for p in pids)
    assert not own_segments(c.proc.pid)


_DROPPED = """
import json, multiprocessing, signal, sys, threading, time
import multitables

signum = getattr(signal, sys.argv[2])
if signum == signal.SIGTERM:  # a program's own SIGTERM handler, as under docker stop or Kubernetes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
queue = multitables.Streamer(sys.argv[1]).get_queue("/data", n_procs=2)
with queue.get() as block:
    pass
pids = [p.pid for p in multiprocessing.active_children()]

def signal_mid_clean_up():  # as a Ctrl-C pressed (or a kill) while the dropped queue's finalizer runs
    signal.pthread_kill(threading.main_thread().ident, signum)
    time.sleep(0.05)  # Python runs its handler here, inside the finalizer

queue.at_close(signal_mid_clean_up)
try:
    del queue, block  # the last reference: the queue is closed by its finalizer
    for _ in range(500):  # the caller's own code goes on
        time.sleep(0.01)
    print(json.dumps({"interrupted": False, "pids": pids}))
except (KeyboardInterrupt, SystemExit):
    print(json.dumps({"interrupted": True, "pids": pids, "alive": [p.pid for p in multiprocessing.active_children()]}))
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_ctrl_c_during_a_dropped_queues_clean_up_reaches_the_caller(h5file: Path, tmp_path: Path, signame: str) -> None:
    """A Ctrl-C (or the SystemExit of a SIGTERM handler) that lands while a finalizer closes a dropped queue (or a
    generator left by ``break``) was raised inside the finalizer, where Python prints it as "Exception ignored" and
    goes on: the program ran on, and the clean-up was cut short. It is held until the clean-up is done, then raised
    in the caller's code."""
    path = tmp_path / "dropped.py"
    path.write_text(_DROPPED)
    run = subprocess.run([sys.executable, str(path), str(h5file), signame], capture_output=True, text=True,
                         timeout=GUARD * 2)
    report = json.loads(run.stdout.splitlines()[-1])
    assert report["interrupted"], run.stderr
    assert report["alive"] == [] and "Exception ignored" not in run.stderr, run.stderr
    assert all(is_gone(p) for p in report["pids"])


@pytest.mark.parametrize(
    "mode, start_method",
    [
        pytest.param("queue", None, id="busy-default"),
        pytest.param("queue", "spawn", id="busy-spawn"),
        pytest.param("idle", None, id="idle-default"),
        pytest.param("attaching", None, id="attaching-default"),
        pytest.param("batches", None, id="batches-across-epochs"),
        pytest.param("batches-idle", None, id="batches-idle-after-break"),
        pytest.param("stuck", None, id="stuck-in-a-read"),
    ],
)
def test_consumer_killed_orphans_exit_and_free_memory(
    h5file: Path, script: Path, consumers: list[Consumer], mode: str, start_method: "str | None"
) -> None:
    c = Consumer(script, h5file, mode, start_method)
    consumers.append(c)
    msg = c.read()
    pids = msg["readers"]
    assert len(pids) == 2
    if mode == "attaching":
        assert own_segments(c.proc.pid) == {msg["segment"]}  # still named: the consumer never got to unlink it
    time.sleep(0.2)
    c.proc.kill()
    c.proc.wait(GUARD)
    wait_until(lambda: all(is_gone(p) for p in pids), GONE_WITHIN, "the orphaned readers exit")
    wait_until(lambda: not own_segments(c.proc.pid), GONE_WITHIN, "the segment is unlinked")


# -- leaks over many queues ----------------------------------------------------


@pytest.mark.parametrize("cycles", [60, pytest.param(1000, marks=pytest.mark.slow)])
def test_a_thousand_queues_leave_nothing_behind(no_leaks: None, h5file: Path, data: np.ndarray, cycles: int) -> None:
    # A leak of one of anything per queue shows after a few; the default run opens 60, ``-m slow`` a thousand.
    s = Streamer(h5file)
    me = psutil.Process()
    fds, threads = me.num_fds(), threading.active_count()
    readers: set[int] = set()
    for i in range(cycles):
        q = s.get_queue("/data", n_procs=1, block_size=CHUNK, read_ahead=2, ordered=True)
        readers.update(q.reader_pids)
        if i % 100 == 0:
            assert len(drain(q)) == N_ROWS // CHUNK
        elif i % 3 == 0:
            with q.get() as block:
                assert block[0, 0] == 0
        if i % 2:
            q.close()
        else:
            del q  # freed by reference counting
    del block  # the last block taken keeps its slot mapped until it goes (NOTE [segment lifetime])
    gc.collect()
    wait_until(lambda: not readers & {c.pid for c in me.children()}, GONE_WITHIN, "every reader exits, reaped")
    assert me.num_fds() == fds and threading.active_count() == threads
    assert not own_mappings()


_TERM_AT_FORK = """
import os, signal, sys
import multitables

signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a program's own, as under docker stop or Kubernetes
sent = []

def kill_me_once():  # a SIGTERM that lands while Python runs the at-fork hooks around a reader's start
    if not sent:
        sent.append(os.kill(os.getpid(), signal.SIGTERM))

os.register_at_fork(after_in_parent=kill_me_once)
rows = sum(len(block) for block in multitables.Streamer(sys.argv[1]).get_generator("/data", n_procs=2))
print("went on after the SIGTERM, rows:", rows)
"""


def test_a_sigterm_handlers_exit_during_a_readers_start_reaches_the_caller(h5file: Path, tmp_path: Path) -> None:
    """A SIGTERM whose handler exits (``sys.exit``), landing while Python runs its at-fork hooks around a reader's
    start (logging's, say), raised its SystemExit inside the hook, where Python prints it as "Exception ignored"
    and drops it: the program ran on (1 stop in 8, in a loop of streams). It is held over the start and raised in
    the caller's code, which then exits with the handler's status, leaving nothing behind."""
    path = tmp_path / "term.py"
    path.write_text(_TERM_AT_FORK)
    run = subprocess.run([sys.executable, str(path), str(h5file)], capture_output=True, text=True, timeout=GUARD)
    assert run.returncode == 143, (run.returncode, run.stdout, run.stderr[-2000:])
    assert "went on" not in run.stdout and "Exception ignored" not in run.stderr, run.stderr[-2000:]

_DAEMON_AT_EXIT = r"""
import json, sys, threading, time
import multitables

path = sys.argv[1]
inside = threading.Barrier(3)
saying = threading.Lock()  # print writes a line's text and its newline apart: two threads' lines could mix

def say(pids):
    with saying:
        print(json.dumps(pids), flush=True)

def stream():
    with multitables.Streamer(path).get_queue("/data", n_procs=2, cyclic=True) as queue:
        say(queue.reader_pids)
        with queue.get() as block:
            inside.wait()
            while True:  # inside the block when the interpreter exits
                block.sum()

def request():
    reader = multitables.Reader(path, n_procs=1)
    ds = reader.get_dataset("/data")
    say(reader.reader_pids)
    with reader.request(ds[:100], ds.create_stage(100)).get_unsafe() as rows:
        inside.wait()
        while True:
            rows.sum()

threading.Thread(target=stream, daemon=True).start()
threading.Thread(target=request, daemon=True).start()
inside.wait()
time.sleep(0.2)
"""


def test_daemon_threads_inside_blocks_at_interpreter_exit_end_cleanly(h5file: Path) -> None:
    """The exit handler closes what is still open while daemon threads still read their blocks: nothing is unmapped
    under them (it was a SIGSEGV, every time), and nothing is left behind."""
    proc = subprocess.Popen([sys.executable, "-c", _DAEMON_AT_EXIT, str(h5file)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=GUARD)
    except subprocess.TimeoutExpired:
        proc.kill()  # its readers, orphaned, stop by themselves
        raise AssertionError(f"the program did not exit; stderr:\n{proc.communicate()[1][-3000:]}") from None
    assert proc.returncode == 0, err[-3000:]
    pids = [pid for line in out.splitlines() for pid in json.loads(line)]
    assert len(pids) == 3
    wait_until(lambda: all(is_gone(p) for p in pids), GONE_WITHIN, "every reader exits")
    assert not own_segments(proc.pid)


# -- no collisions -------------------------------------------------------------


def test_two_streams_of_one_file_in_one_process(no_leaks: None, h5file: Path, data: np.ndarray) -> None:
    s = Streamer(h5file)
    with s.get_queue("/data", n_procs=2, block_size=CHUNK, ordered=True) as a, Streamer(h5file).get_queue(
        "/data", n_procs=2, block_size=CHUNK, ordered=True
    ) as b:
        assert ring_of(a).segment.name != ring_of(b).segment.name
        got_a, got_b = [], []
        for _ in range(N_ROWS // CHUNK):
            for q, got in ((a, got_a), (b, got_b)):
                with q.get() as block:
                    got.append(block.copy())
        assert a.get() is QueueClosed and b.get() is QueueClosed
    np.testing.assert_array_equal(np.concatenate(got_a), data)
    np.testing.assert_array_equal(np.concatenate(got_b), data)


def test_streams_of_one_file_in_two_processes_and_a_rerun_after_a_crash(
    no_leaks: None, h5file: Path, script: Path, consumers: list[Consumer], data: np.ndarray
) -> None:
    # A run crashes mid-stream...
    crashed = Consumer(script, h5file, "idle")
    consumers.append(crashed)
    orphans = crashed.read()["readers"]
    crashed.proc.kill()
    crashed.proc.wait(GUARD)
    # ...and right away two other processes and this one stream the same file.
    others = [Consumer(script, h5file, "full"), Consumer(script, h5file, "full", "spawn")]
    consumers.extend(others)
    with Streamer(h5file).get_queue("/data", n_procs=2, block_size=CHUNK, ordered=True) as q:
        np.testing.assert_array_equal(np.concatenate(drain(q)), data)
    for other in others:
        assert other.read()["readers"]
        assert other.read() == {"rows": N_ROWS}
        code, err = other.finish()
        assert code == 0, err
    wait_until(lambda: all(is_gone(p) for p in orphans), GONE_WITHIN, "the orphaned readers exit")
    for c in [crashed, *others]:
        assert not own_segments(c.proc.pid)


def test_a_leftover_segment_is_never_touched(no_leaks: None, h5file: Path, data: np.ndarray) -> None:
    """What a crashed run left under our prefix stays as it is: no sweep, no reuse."""
    import _posixshmem

    name = f"{SHM_PREFIX}1_{'ab' * 8}"
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.write(fd, b"someone else's data")
        with Streamer(h5file).get_queue("/data", n_procs=2, block_size=CHUNK, ordered=True) as q:
            np.testing.assert_array_equal(np.concatenate(drain(q)), data)
        os.lseek(fd, 0, os.SEEK_SET)
        assert os.read(fd, 100) == b"someone else's data"
        assert name in own_segments(1)
    finally:
        os.close(fd)
        _posixshmem.shm_unlink("/" + name)


# -- the data stays the user's -------------------------------------------------


def test_segments_are_owner_only_whatever_the_umask(no_leaks: None) -> None:
    old = os.umask(0)
    try:
        seg = Segment.create(4096, "test")
    finally:
        os.umask(old)
    try:
        st = os.stat(f"/dev/shm/{seg.name}")
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.getuid()
    finally:
        seg.unlink()
        seg.close()


def test_queue_segments_are_created_exclusive_and_private(no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from multitables._shm import segment as _shm

    calls: list[tuple[str, int, int]] = []
    real = _shm._posixshmem

    class Spy:
        def shm_open(self, path: str, flags: int, mode: int = 0o777) -> int:
            calls.append((path, flags, mode))
            return real.shm_open(path, flags, mode=mode)

        def shm_unlink(self, path: str) -> None:
            real.shm_unlink(path)

    monkeypatch.setattr(_shm, "_posixshmem", Spy())
    with Streamer(h5file).get_queue("/data", n_procs=1, block_size=CHUNK) as q:
        q.get().release()
    created = [c for c in calls if c[1] & os.O_CREAT]
    assert len(created) == 1
    path, flags, mode = created[0]
    assert path.startswith("/" + SHM_PREFIX) and flags & os.O_EXCL and mode == 0o600


def test_an_existing_name_is_never_reused(no_leaks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import _posixshmem
    import secrets

    taken = f"{SHM_PREFIX}{os.getpid()}_{'00' * 8}"
    fd = _posixshmem.shm_open("/" + taken, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.write(fd, b"mine")
        tokens = iter(["00" * 8, "11" * 8])
        monkeypatch.setattr(secrets, "token_hex", lambda n: next(tokens))
        seg = Segment.create(4096, "test")
        try:
            assert seg.name == f"{SHM_PREFIX}{os.getpid()}_{'11' * 8}"
        finally:
            seg.unlink()
            seg.close()
        monkeypatch.setattr(secrets, "token_hex", lambda n: "00" * 8)
        with pytest.raises(FileExistsError):
            Segment.create(4096, "test")
        os.lseek(fd, 0, os.SEEK_SET)
        assert os.read(fd, 10) == b"mine"
    finally:
        os.close(fd)
        _posixshmem.shm_unlink("/" + taken)


# -- /dev/shm too small --------------------------------------------------------


@pytest.fixture
def process_starts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every multiprocessing process started in this process during the test."""
    import multiprocessing.process

    started: list[Any] = []
    real_start = multiprocessing.process.BaseProcess.start

    def start(self: Any) -> None:
        started.append(self)
        real_start(self)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    return started


def _assert_space_error(err: ShmSpaceError) -> None:
    text = str(err)
    assert isinstance(err, MemoryError) and isinstance(err, MultitablesError)
    for needed in ("needs", "MiB", "free", "/dev/shm", "read_ahead", "block_size", "--shm-size"):
        assert needed in text, (needed, text)


def test_ring_larger_than_free_shm_fails_before_any_process(
    no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch, process_starts: list[Any]
) -> None:
    from multitables._shm import space as _shm

    monkeypatch.setattr(_shm, "shm_free_bytes", lambda: 1 << 20)
    segments = own_segments()
    with pytest.raises(ShmSpaceError) as info:
        Streamer(h5file).get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=64)
    _assert_space_error(info.value)
    assert "has 1.0 MiB (1,048,576 bytes) free" in str(info.value) and "needs 2.0 MiB" in str(info.value)
    # What to change, to the slot: 64 slots of 32 KiB, each a page more for its meta; a page of header.
    assert str(info.value).startswith("The ring (64 slots of 500 rows, 31.2 KiB each) needs 2.0 MiB")
    assert "(read_ahead=31 fits now), n_procs=0 (the blocks read in this process" in str(info.value)
    assert not process_starts and own_segments() == segments
    # The same through the generator, at its first next().
    gen = Streamer(h5file).get_generator("/data", n_procs=2, block_size=CHUNK, read_ahead=64)
    with pytest.raises(ShmSpaceError):
        next(gen)
    assert not process_starts


def test_a_ring_a_page_too_large_says_exactly_how_much_is_missing(
    no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch, process_starts: list[Any]
) -> None:
    from multitables._shm import space as _shm
    from multitables._shm.layout import RingLayout

    need = RingLayout(4, CHUNK, (ROW,), np.dtype("<f4")).nbytes
    monkeypatch.setattr(_shm, "shm_free_bytes", lambda: need - 4096)  # rounded to 0.1 MiB, both read the same
    with pytest.raises(ShmSpaceError) as info:
        Streamer(h5file).get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4)
    _assert_space_error(info.value)
    text = str(info.value)
    assert f"({need:,} bytes)" in text and f"({need - 4096:,} bytes) free" in text and "4,096 bytes short" in text
    assert not process_starts


def test_shm_out_of_inodes_is_a_space_error_naming_them(
    no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch, process_starts: list[Any]
) -> None:
    """A tmpfs with space left but no inode left refuses to create a file (ENOSPC) whatever its size."""
    import errno

    from multitables._shm import segment as _shm

    def no_inode(name: str, flags: int, mode: int = 0o600) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_shm._posixshmem, "shm_open", no_inode)
    segments = own_segments()
    with pytest.raises(ShmSpaceError) as info:
        Streamer(h5file).get_queue("/data", n_procs=2, block_size=CHUNK)
    text = str(info.value)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert "The ring" in text and "/dev/shm" in text and "inodes" in text and "nr_inodes" in text
    assert not process_starts and own_segments() == segments


def _semaphores_fail(monkeypatch: pytest.MonkeyPatch, err: int, full: "str | None") -> None:
    """Every semaphore fails with ``err`` (glibc makes each a file in /dev/shm), and /dev/shm reports itself
    ``full`` of "inodes" or of "space" (none free), or neither."""
    import multiprocessing.synchronize

    from multitables._shm import space as _shm

    real = os.statvfs

    def statvfs(path: str) -> os.statvfs_result:
        st = real(path)
        if path != "/dev/shm" or full != "inodes":
            return st
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, st.f_bfree, st.f_bavail, st.f_files,
                                  0, 0, st.f_flag, st.f_namemax))

    def fail(self: object, *args: object, **kwargs: object) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "statvfs", statvfs)
    monkeypatch.setattr(multiprocessing.synchronize.SemLock, "__init__", fail)
    if full == "space":
        monkeypatch.setattr(_shm, "shm_free_bytes", lambda: 0)


@pytest.mark.parametrize("what, full", [("queue", "inodes"), ("Reader", "inodes"), ("Reader", "space")])
def test_shm_too_full_for_the_readers_semaphores_is_a_space_error(
    no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch, process_starts: list[Any], what: str, full: str
) -> None:
    """A /dev/shm full refuses the readers' semaphores too (a Reader makes one per stage): the same ShmSpaceError
    as for the ring, not a bare ENOSPC that reads like a full disk. (A queue out of space hears it of its ring.)"""
    import errno

    _semaphores_fail(monkeypatch, errno.ENOSPC, full)
    segments = own_segments()
    with pytest.raises(ShmSpaceError) as info:
        if what == "queue":
            Streamer(h5file).get_queue("/data", n_procs=2, block_size=CHUNK)
        else:
            multitables.Reader(h5file, n_procs=2)
    text = str(info.value)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    assert "semaphores" in text and "/dev/shm" in text and "semaphores needs" not in text
    assert ("nr_inodes" in text) == (full == "inodes") and ("max_stages" in text) == (what == "Reader")
    assert not process_starts and own_segments() == segments


def test_a_read_only_dev_shm_says_where_the_error_came_from(
    no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch, process_starts: list[Any]
) -> None:
    import errno

    _semaphores_fail(monkeypatch, errno.EROFS, None)
    with pytest.raises(OSError) as info:
        Streamer(h5file).get_queue("/data", n_procs=2, block_size=CHUNK)
    assert info.value.errno == errno.EROFS and not isinstance(info.value, ShmSpaceError)
    shown = "".join(traceback.format_exception(info.value))  # Python 3.11 on: a note; 3.10: in the message
    assert "(while making the readers' semaphores in /dev/shm)" in shown
    assert not process_starts


def test_huge_read_ahead_fails_clearly(no_leaks: None, h5file: Path, process_starts: list[Any]) -> None:
    # Refused, not tried: mapping 10**9 slots would not return.
    with hang_guard(GONE_WITHIN, "read_ahead=10**9 refused"), pytest.raises(ShmSpaceError) as info:
        Streamer(h5file).get_queue("/data", n_procs=1, block_size=CHUNK, read_ahead=10**9)
    _assert_space_error(info.value)
    assert not process_starts


def test_a_full_dev_shm_at_a_readers_populate_is_its_space_error_not_a_sigbus(
    no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """statvfs said yes, but the slots' pages cannot be had when a reader maps them (NOTE [slots and page tables])."""
    import errno

    from multitables._shm import segment as _shm

    if not _shm.can_populate():
        pytest.skip("the kernel lacks MADV_POPULATE_WRITE: the consumer reserves the ring (the next test)")

    def full(buf: Any, advice: int, offset: int, nbytes: int) -> None:
        if offset:  # the slots; the header, at 0, is the consumer's and is had
            (tmp_path / f"refused-{os.getpid()}").touch()
            raise OSError(errno.EFAULT, "Bad address")
        buf.madvise(advice, offset, nbytes)

    monkeypatch.setattr(_shm, "_madvise", full)  # the readers are forked: they see it too
    segments = own_segments()
    # Raised by the queue's start too: one reader may fail before the other started. The readers' pids are known
    # from where they failed, then.
    with hang_guard(GUARD, "a reader's populate fails"), pytest.raises(ShmSpaceError) as info:
        with Streamer(h5file, start_method="fork").get_queue("/data", n_procs=2, block_size=CHUNK) as q:
            q.get()
    refused = {int(p.name.split("-")[1]) for p in tmp_path.glob("refused-*")}
    assert isinstance(info.value, ReaderError) and info.value.pid in refused
    _assert_space_error(info.value)
    assert "map_own_slots" in info.value.remote_traceback
    assert ("--shm-size). (There was room when the stream started: another process, whose rings this one cannot "
            "count, took it since.)") in str(info.value)
    assert own_segments() == segments


def test_reservation_failure_is_a_space_error_not_a_sigbus(
    no_leaks: None, h5file: Path, monkeypatch: pytest.MonkeyPatch, process_starts: list[Any]
) -> None:
    """statvfs said yes, but the pages cannot be had (another process took them meanwhile); a kernel that
    cannot populate, so the consumer reserves the ring's pages."""
    import errno

    from multitables._shm import ring as _ring

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    monkeypatch.setattr(_ring, "can_populate", lambda: False)
    segments = own_segments()
    with pytest.raises(ShmSpaceError) as info:
        Streamer(h5file).get_queue("/data", n_procs=2, block_size=CHUNK)
    _assert_space_error(info.value)
    assert not process_starts and own_segments() == segments


def _in_a_small_dev_shm(mib: int, script: str, tmp_path: Path) -> list[str]:
    """Run ``script`` in a process whose /dev/shm is a tmpfs of ``mib`` MiB of its own (a private mount namespace:
    the machine's /dev/shm is untouched), then list that /dev/shm; the lines it printed. Skipped where this user
    may not make a mount namespace (root, or a kernel that lets users)."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-m", "--propagation", "private", "true"],
                                         capture_output=True).returncode != 0:
        pytest.skip("a private mount namespace (unshare -m) is not permitted here")
    (tmp_path / "script.py").write_text(textwrap.dedent(script))
    run = (f"mount -t tmpfs -o size={mib}m tmpfs /dev/shm && {sys.executable} script.py; code=$?; "
           f"echo left: $(ls /dev/shm); exit $code")
    done = subprocess.run([unshare, "-m", "--propagation", "private", "sh", "-c", run], cwd=tmp_path,
                          capture_output=True, text=True, timeout=GUARD,
                          env={**os.environ, "PYTHONPATH": str(Path(multitables.__file__).parents[1])})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "left:", lines  # nothing left in that /dev/shm
    return lines[:-1]


_TWO_RINGS = """
import multiprocessing
import h5py, numpy as np, multitables

data = np.arange(512 * 16384, dtype="<f4").reshape(512, 16384)  # 32 MiB: 64 KiB rows, 1 MiB chunks
with h5py.File("data.h5", "w") as f:
    f.create_dataset("data", data=data, chunks=(16, 16384), compression="gzip")
stream = multitables.Streamer("data.h5")
with stream.get_queue("/data", n_procs=2, read_ahead=8, block_size=64, ordered=True) as first:  # 32 MiB of 48
    try:
        stream.get_queue("/data", n_procs=2, read_ahead=8, block_size=64)
    except multitables.ShmSpaceError as exc:
        print("second:", exc)
    print("readers:", len(multiprocessing.active_children()))
    got = []
    for guard in first:  # the first, which fits, reads on
        with guard as block:
            got.append(block.copy())
    got = np.concatenate(got)
print("first:", np.array_equal(got, data))
print("after:", len(multiprocessing.active_children()))
"""


def test_a_ring_made_while_another_still_maps_its_slots_is_refused_up_front(tmp_path: Path) -> None:
    """A ring's slots are allocated by its readers once the stream has started (NOTE [slots and page tables]):
    statvfs then still shows them free, and a second ring made at once passed the check; one of the readers'
    mappings failed later (a ReaderError at a get of either stream), where the space was known short."""
    said = _in_a_small_dev_shm(48, _TWO_RINGS, tmp_path)
    assert said[0].startswith("second: The ring (8 slots of 64 rows, 4.0 MiB each) needs 32.0 MiB") and "free" in said[0] and "--shm-size" in said[0], said
    assert said[1:] == ["readers: 2", "first: True", "after: 0"], said


# -- the file changes under the readers ----------------------------------------


def _rewrite(path: Path, other: Path) -> None:
    with open(path, "r+b") as f:
        f.write(other.read_bytes())


def _truncate(path: Path, other: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _delete(path: Path, other: Path) -> None:
    path.unlink()


def _replace(path: Path, other: Path) -> None:
    os.replace(other, path)


def _changed_mid_stream(
    stream: Streamer, path: Path, other: Path, change: Callable[[Path, Path], None], data: np.ndarray, **kwargs: Any
) -> "tuple[FileChangedError, list[np.ndarray]]":
    """Take the first block of ``path``'s /data, ``change`` the file (``other``: its new bytes), take the rest: the
    error it ends with, and the blocks delivered, each checked to be the original file's."""
    time.sleep(0.05)  # the change must land on a later tick of the filesystem clock than the writing
    got = []
    with stream.get_queue("/data", block_size=CHUNK, ordered=True, **kwargs) as q:
        with q.get() as block:
            got.append(block.copy())
            change(path, other)
        with pytest.raises(FileChangedError) as info:
            got.extend(drain(q))
    for k, block in enumerate(got):  # whatever was delivered was the original file's
        np.testing.assert_array_equal(block, data[k * CHUNK : (k + 1) * CHUNK])
    return info.value, got


@pytest.mark.parametrize("change", [_rewrite, _truncate, _delete, _replace], ids=lambda f: f.__name__[1:])
def test_file_changed_mid_stream_is_an_error_not_garbage(
    no_leaks: None, make_array: Callable[..., Path], data: np.ndarray, change: Callable[[Path, Path], None]
) -> None:
    # Contiguous and uncompressed: a read after the change would return the new bytes without complaint.
    path = make_array(data, complib=None, kind="array")
    other = make_array(-data, complib=None, kind="array")
    assert path.stat().st_size == other.stat().st_size
    err, got = _changed_mid_stream(Streamer(path), path, other, change, data, n_procs=1, read_ahead=2)
    assert isinstance(err, ReaderError) and isinstance(err, OSError)
    assert str(path) in str(err) and "while it was being streamed" in str(err)
    assert len(got) < N_ROWS // CHUNK


@pytest.mark.parametrize("engine", ["chunks", "h5py", "tables"])
@pytest.mark.parametrize("change", [_rewrite, _truncate], ids=lambda f: f.__name__[1:])
def test_a_file_changed_under_a_read_in_this_process_is_a_file_changed_error(
    no_leaks: None, make_array: Callable[..., Path], data: np.ndarray, change: Callable[[Path, Path], None], engine: str
) -> None:
    """Read in the consumer (n_procs=0, the default for small files), compressed: the next read after the change
    fails in the engine (a decode error, HDF5's read error); the change explains it, as in a reader."""
    path = make_array(data, chunkshape=(CHUNK, ROW))
    other = make_array(np.random.default_rng(3).integers(-9, 9, data.shape).astype(data.dtype), chunkshape=(CHUNK // 2, ROW))
    err, _ = _changed_mid_stream(Streamer(path, engine=engine), path, other, change, data, n_procs=0)
    assert isinstance(err, ReaderError) and str(path) in str(err) and "this process" in str(err)


def _small_rows_file(path: Path) -> np.ndarray:
    """100,000 rows of 16 bytes, zlib, chunks of 1,000 rows: blocks of 256 rows are read many at a time (NOTE
    [read plan])."""
    import h5py

    rows = np.arange(400_000, dtype="<f4").reshape(100_000, 4)
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=rows, chunks=(1000, 4), compression="gzip")
    return rows


@pytest.mark.parametrize("n_procs", [0, 1])
def test_a_file_changed_under_a_read_of_several_blocks_names_one_of_the_callers(
    no_leaks: None, tmp_path: Path, n_procs: int
) -> None:
    path = tmp_path / "small-rows.h5"
    rows = _small_rows_file(path)
    time.sleep(0.05)  # the change must land on a later tick of the filesystem clock than the writing
    with Streamer(path).get_queue("/data", n_procs=n_procs, read_ahead=2, block_size=256, ordered=True) as q:
        with pytest.raises(FileChangedError) as info:
            for k, guard in enumerate(q):
                with guard as block:
                    np.testing.assert_array_equal(block, rows[k * 256 : (k + 1) * 256])
                if k == 2:
                    with open(path, "r+b") as f:  # the same size, other bytes
                        f.seek(5000)
                        f.write(bytes(100))
    start, stop = info.value.rows
    assert stop - start == 256 and start % 256 == 0, info.value.rows


@pytest.mark.parametrize("n_procs", [0, 1, 2])
def test_a_chunk_that_fails_inside_a_read_of_several_blocks_names_the_callers_block_it_is_in(
    no_leaks: None, tmp_path: Path, n_procs: int
) -> None:
    """However a reader times its reads (from a chunk's start, NOTE [orphans]), the error names the whole caller's
    block: chunk 37 (rows 37,000-38,000) first fails in the caller's block of rows 36,864-37,120."""
    good = tmp_path / "good.h5"
    rows = _small_rows_file(good)
    assert corrupt_chunk(good, tmp_path / "bad.h5", 37) == (37000, 38000)
    with Streamer(tmp_path / "bad.h5").get_queue("/data", n_procs=n_procs, block_size=256, ordered=True) as q:
        with pytest.raises(ReaderError) as info:
            for k, guard in enumerate(q):
                with guard as block:
                    np.testing.assert_array_equal(block, rows[k * 256 : (k + 1) * 256])
    assert info.value.rows == (36864, 37120)


@pytest.mark.parametrize("chunk", [37, 97], ids=["mid-pass", "in-the-last-read"])
@pytest.mark.parametrize("block_size", [256, 1000, 4096])
def test_a_stream_read_here_gives_every_block_before_a_failed_one_then_the_error_every_time(
    no_leaks: None, tmp_path: Path, block_size: int, chunk: int
) -> None:
    """In this process, blocks read several at a time (NOTE [read plan]) fail as blocks read one by one did: the
    blocks before the one that fails, in order, then its error; and the stream is over: later gets raise it again.
    In the pass's last read too, where the rows before the failure are the generator's last block (they ended it,
    silently, short of rows)."""
    good = tmp_path / "good.h5"
    rows = _small_rows_file(good)
    corrupt_chunk(good, tmp_path / "bad.h5", chunk)  # rows chunk * 1000 to the next 1,000
    first = chunk * 1000
    failed = (first // block_size * block_size, min(first // block_size * block_size + block_size, len(rows)))
    got = []
    with Streamer(tmp_path / "bad.h5").get_queue("/data", n_procs=0, block_size=block_size) as q:
        with pytest.raises(ReaderError) as info:
            for guard in q:
                with guard as block:
                    got.append(block.copy())
        assert info.value.rows == failed
        for _ in range(2):
            with pytest.raises(ReaderError) as again:
                q.get()
            assert again.value.rows == failed
    np.testing.assert_array_equal(np.concatenate(got), rows[: failed[0]])
    seen = []
    with pytest.raises(ReaderError) as info:
        for row in Streamer(tmp_path / "bad.h5").get_generator("/data", n_procs=0, block_size=block_size):
            seen.append(row.copy())
    assert info.value.rows == failed and len(seen) == failed[0]
    np.testing.assert_array_equal(np.array(seen), rows[: failed[0]])


# -- fuzz: corrupted copies of a real file -------------------------------------


def _fuzz_stream(path: str, engine: str, expected: np.ndarray, conn: Any) -> None:
    """Runs in a forked child: stream ``path``, send ("rows", right?) or ("error", clear?, text)."""
    try:
        got = []
        s = Streamer(path, engine=engine)
        with s.get_queue("/data", n_procs=2, block_size=1000, read_ahead=4, ordered=True, remainder=True) as q:
            for guard in q:
                with guard as block:
                    got.append(block.copy())
        rows = np.concatenate(got)
        conn.send(("rows", rows.shape == expected.shape and bool(np.array_equal(rows, expected)), ""))
    except Exception as exc:
        conn.send(("error", isinstance(exc, CLEAR_ERRORS), f"{type(exc).__name__}: {str(exc)[:300]}"))


def _write_fuzz_base(path: Path, writer: str) -> np.ndarray:
    rng = np.random.default_rng(7)
    values = rng.integers(0, 1000, size=(4000, 8)).astype("<i4")
    if writer == "h5py-latest":
        import h5py

        # The latest format checksums every piece of metadata, fletcher32 every chunk.
        with h5py.File(path, "w", libver="latest") as f:
            f.create_dataset("data", data=values, chunks=(250, 8), compression="gzip", shuffle=True, fletcher32=True)
    else:
        import tables

        with tables.open_file(path, "w") as f:
            f.create_carray("/", "data", obj=values, chunkshape=(250, 8), filters=tables.Filters(3, "zlib", fletcher32=True))
    return values


#: (writer, where the bytes are overwritten, engine, cases): every case must end in the right rows or a clear error.
FUZZ = [
    ("h5py-latest", "anywhere", "auto", 40),
    ("tables", "chunks", "auto", 15),
    ("tables", "chunks", "tables", 10),
    ("tables", "metadata", "auto", 15),
    ("tables", "metadata", "tables", 15),  # PyTables may segfault opening these: in a reader, that is a clear error
]
#: What a corrupted file may fail with: the library's errors, and the builtins HDF5's errors arrive as.
CLEAR_ERRORS = (MultitablesError, OSError, KeyError, ValueError, RuntimeError, TypeError)


@pytest.mark.parametrize("writer, where, engine, cases", FUZZ, ids=lambda v: str(v))
def test_fuzz_corrupted_files_end_in_right_rows_or_a_clear_error(
    no_leaks: None, tmp_path: Path, writer: str, where: str, engine: str, cases: int
) -> None:
    _fuzz(tmp_path, writer, where, engine, cases, seed=20240611)


@pytest.mark.slow
@pytest.mark.parametrize("writer, where, engine, cases", [(w, p, e, 10 * c) for w, p, e, c in FUZZ], ids=lambda v: str(v))
def test_fuzz_corrupted_files_end_in_right_rows_or_a_clear_error_long(
    no_leaks: None, tmp_path: Path, writer: str, where: str, engine: str, cases: int
) -> None:
    _fuzz(tmp_path, writer, where, engine, cases, seed=18)


def _fuzz(tmp_path: Path, writer: str, where: str, engine: str, cases: int, seed: int) -> None:
    import multiprocessing

    import h5py

    base = tmp_path / "base.h5"
    values = _write_fuzz_base(base, writer)
    raw = base.read_bytes()
    in_chunk = np.zeros(len(raw), bool)
    with h5py.File(base, "r") as f:
        ds = f["data"]
        for i in range(ds.id.get_num_chunks()):
            info = ds.id.get_chunk_info(i)
            in_chunk[info.byte_offset : info.byte_offset + info.size] = True
    pool = {"anywhere": np.arange(len(raw)), "chunks": np.flatnonzero(in_chunk), "metadata": np.flatnonzero(~in_chunk)}[where]
    rng = np.random.default_rng(seed)
    ctx = multiprocessing.get_context("fork")
    outcomes: dict[str, int] = {}
    failures = []
    for case in range(cases):
        offset, n = int(rng.choice(pool)), int(rng.integers(1, 9))
        noise = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        corrupted = bytearray(raw)
        corrupted[offset : offset + n] = noise
        changed = bytes(corrupted) != raw
        path = tmp_path / f"case{case}.h5"
        path.write_bytes(bytes(corrupted))
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_fuzz_stream, args=(str(path), engine, values, send))
        child.start()
        send.close()
        child.join(GUARD)  # a guard against a hang
        hit_chunk = bool(in_chunk[offset : offset + n].any())
        if child.exitcode is None:
            child.kill()
            child.join()
            outcome = "hang"
        else:
            try:
                kind, good, text = recv.recv() if recv.poll() else ("crash", False, "")
            except EOFError:  # poll() says yes at the end of the pipe too
                kind, good, text = "crash", False, ""
            if kind == "rows":
                outcome = "right rows" if good else "wrong rows"
            elif kind == "error":
                outcome = "clear error" if good else f"odd error {text}"
            else:
                outcome = f"consumer crashed ({child.exitcode})"
        recv.close()
        child.close()
        path.unlink()
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        # Wrong rows are acceptable only where nothing checksums the bytes hit: the metadata of the
        # earliest file format (PyTables' default), e.g. the v1 B-tree of chunk addresses.
        wrong_allowed = writer == "tables" and not hit_chunk
        if outcome not in ("right rows", "clear error") and not (outcome == "wrong rows" and wrong_allowed):
            failures.append((case, offset, n, hit_chunk, outcome))
        elif hit_chunk and changed and outcome != "clear error":  # fletcher32 sees every changed chunk byte
            failures.append((case, offset, n, hit_chunk, outcome))
    assert not failures, f"{failures} (all outcomes: {outcomes})"


# -- killed at any moment of start-up ------------------------------------------

_START_FOREVER = r"""
import sys, multitables
stream = multitables.Streamer(sys.argv[1])
print("ready", flush=True)
while True:  # start-up, one block, shut-down, again: a kill lands anywhere in them
    with stream.get_queue("/data", n_procs=2, block_size=500, read_ahead=64) as q:
        with q.get():
            pass
"""


def _kill_at_random_moments(h5file: Path, runs: int, seed: int) -> "tuple[list[int], list[psutil.Process]]":
    """Start a consumer that starts streams over and over, SIGKILL it after a random delay; ``runs`` times.

    Returns the consumers' pids and their readers at the moment of the kill.
    """
    rng = np.random.default_rng(seed)
    killed, readers = [], []
    for _ in range(runs):
        consumer = subprocess.Popen([sys.executable, "-c", _START_FOREVER, str(h5file)], stdout=subprocess.PIPE, text=True)
        try:
            assert consumer.stdout.readline().strip() == "ready"
            time.sleep(float(rng.uniform(0.0, 0.6)))
            try:
                readers += psutil.Process(consumer.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        finally:
            consumer.kill()
            consumer.wait(GUARD)
            consumer.stdout.close()
        killed.append(consumer.pid)
    return killed, readers


def _nothing_left_by(killed: list[int], readers: "list[psutil.Process]", monkeypatch: pytest.MonkeyPatch) -> None:
    import multitables._shm.segment as shm

    # Readers orphaned mid-start exit by themselves within about a second (the resource tracker, too).
    _, alive = psutil.wait_procs(readers, timeout=GONE_WITHIN)
    assert not alive, f"orphaned readers outlived their consumer: {alive}"
    # Names a consumer was killed holding go at the next start (made old enough for it, as after 5 minutes).
    monkeypatch.setattr(shm, "ORPHAN_AGE", 0.0)
    monkeypatch.setattr(shm, "_swept", False)
    Segment.create(1 << 16, "test").unlink()
    assert not set().union(*(own_segments(pid) for pid in killed))


def test_a_consumer_killed_at_random_moments_of_start_up_leaves_nothing(
    h5file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nothing_left_by(*_kill_at_random_moments(h5file, runs=6, seed=18), monkeypatch)


@pytest.mark.slow
def test_a_consumer_killed_at_random_moments_of_start_up_leaves_nothing_long(
    h5file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nothing_left_by(*_kill_at_random_moments(h5file, runs=150, seed=1818), monkeypatch)


def test_a_reader_report_names_the_dataset_and_rows_it_read_or_says_it_was_serving() -> None:
    """A Reader's request readers read no one dataset: a failure before any request (its segment not opened, under
    ``ulimit -n``) said it happened "while reading '' in" the file."""
    from multitables._procs.failure import FailureReport

    def text(path: str, rows: "tuple[int, int] | None") -> str:
        report = FailureReport("builtins.OSError", "[Errno 24] Too many open files", "tb", 1, 42, "f.h5", path, rows)
        return str(report.to_exception()).splitlines()[0]

    assert text("/data", (10, 20)) == "Caught OSError in reader 1 (pid 42) while reading rows 10:20 of '/data' in 'f.h5': " \
                                      "[Errno 24] Too many open files"
    assert text("/data", None) == "Caught OSError in reader 1 (pid 42) while reading '/data' in 'f.h5': [Errno 24] Too many open files"
    assert text("", None) == "Caught OSError in reader 1 (pid 42) while serving 'f.h5': [Errno 24] Too many open files"


def test_a_full_fd_table_in_a_reader_says_which_limit_it_reached() -> None:
    """Under a low ``ulimit -n`` a reader's open of a file (one of a set, a part opened late) failed with HDF5's words,
    "Too many open files", naming neither the limit nor how to raise it."""
    import errno
    import resource

    from multitables._procs.failure import FailureReport

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    exc = OSError(errno.EMFILE, "Unable to synchronously open file (Too many open files)")
    said = str(FailureReport.from_exception(exc, 1, 42, "f.h5", "/data", (0, 10)).to_exception()).splitlines()[0]
    assert f"its limit of {soft} open files" in said and "ulimit -n" in said, said
    other = str(FailureReport.from_exception(OSError(errno.EIO, "I/O error"), 1, 42, "f.h5", "/data", None).to_exception())
    assert "ulimit" not in other


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_removed_working_directory_is_named_where_readers_need_it(
        make_array: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start_method: str, no_leaks: None
) -> None:
    """multiprocessing's spawn and forkserver ask for the working directory to start a process: removed, it failed
    with a bare "No such file or directory" though the file was there. fork needs none; a relative name does."""
    path = make_array(np.arange(4000, dtype="<i8").reshape(1000, 4), chunkshape=(100, 4))
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(FileNotFoundError, match=f"working directory was removed, and readers started by {start_method}"):
        Streamer(str(path), start_method=start_method).get_queue("/data", n_procs=2)
    with pytest.raises(FileNotFoundError, match=f"working directory was removed, and readers started by {start_method}"):
        multitables.Reader(str(path), n_procs=1, start_method=start_method)
    got = []
    with Streamer(str(path), start_method="fork").get_queue("/data", n_procs=2, ordered=True) as queue:
        for guard in queue:
            with guard as block:
                got.append(block.copy())
    assert np.concatenate(got).ravel().tolist() == list(range(4000))
    with pytest.raises(FileNotFoundError, match="a relative name, and the working directory was removed") as info:
        Streamer("data.h5")
    assert info.value.filename == "data.h5"


_CTRL_C_IN_GET = r"""
import json, os, signal, sys, threading, traceback
import multitables

for attempt in range(5):  # an interrupt that lands outside get() (in release(), rarely) is tried again
    queue = multitables.Streamer(sys.argv[1]).get_queue("/data", n_procs=1, cyclic=True)
    pids = queue.reader_pids
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        while True:  # the established loop: no with, the queue closed by hand
            guard = queue.get()
            if guard is multitables.QueueClosed:
                break
            guard.release()
    except KeyboardInterrupt as exc:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"]
        closed, in_get = queue.closed, "get" in [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
        queue.close()
        if in_get:
            print(json.dumps({"alive": alive, "closed": closed}), flush=True)
            break
"""


def test_ctrl_c_in_the_established_loops_get_closes_the_queue_before_it_reaches_the_caller(
        make_array: Callable[..., Path]) -> None:
    """The 2.x loop has no with: Ctrl-C in ``queue.get()`` reached the caller's except with the readers still
    running (a cyclic stream's, for ever), until ``queue.close()``. The single reader decodes much longer than
    the loop's body takes, so the interrupt lands in ``get()`` (else the script tries again)."""
    rng = np.random.default_rng(0)
    path = make_array(rng.standard_normal((4000, 256)).astype("<f4"), complib="zlib", complevel=1, chunkshape=(1000, 256))
    run = subprocess.run([sys.executable, "-c", _CTRL_C_IN_GET, str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"alive": [], "closed": True}
