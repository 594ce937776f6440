"""Inside a reader process: it stops at a file changed under it (NOTE [file identity] in ``_io.files``), ignores Ctrl-C
from birth and stops when orphaned, even mid-block."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import multitables
from multitables._io.files import check_file_unchanged, file_signature
from multitables.errors import FileChangedError

from _guards import hang_guard

N_ROWS, BLOCK = 20_000, 500
GUARD = 60.0


def _rewrite_keeping_mtime(path: Path, other: Path) -> None:
    """Write another file's bytes over ``path`` in place and set its times back, as ``cp -p`` or ``touch -r`` do."""
    before = path.stat()
    with open(path, "r+b") as f:
        f.write(other.read_bytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


@pytest.fixture
def two_files(make_array: Callable[..., Path]) -> tuple[Path, Path, np.ndarray]:
    """Two files of one size: ``data``, and ``-data`` (contiguous, uncompressed: a stale read raises nothing)."""
    data = np.arange(N_ROWS * 16, dtype="<f4").reshape(N_ROWS, 16)
    path = make_array(data, complib=None, kind="array")
    other = make_array(-data, complib=None, kind="array")
    assert path.stat().st_size == other.stat().st_size
    return path, other, data


def test_the_signature_sees_a_rewrite_whose_modification_time_was_set_back(two_files: tuple) -> None:
    path, other, _ = two_files
    signature = file_signature(path)
    time.sleep(0.05)  # a later tick of the filesystem clock
    _rewrite_keeping_mtime(path, other)
    with pytest.raises(FileChangedError, match="change time"):
        check_file_unchanged(path, signature)


def test_a_stream_stops_at_a_rewrite_whose_modification_time_was_set_back(two_files: tuple, no_leaks: None) -> None:
    path, other, data = two_files
    time.sleep(0.05)
    got = []
    with hang_guard(GUARD, "a stream over a rewritten file"):
        with multitables.Streamer(path).get_queue("/data", n_procs=1, block_size=BLOCK, read_ahead=2, ordered=True) as q:
            with q.get() as block:
                got.append(block.copy())
                _rewrite_keeping_mtime(path, other)
            with pytest.raises(FileChangedError, match="while it was being streamed"):
                for guard in q:
                    with guard as block:
                        got.append(block.copy())
    assert len(got) < N_ROWS // BLOCK
    for k, block in enumerate(got):  # whatever came is the original file's
        np.testing.assert_array_equal(block, data[k * BLOCK : (k + 1) * BLOCK])


def test_a_request_fails_after_a_rewrite_whose_modification_time_was_set_back(two_files: tuple, no_leaks: None) -> None:
    path, other, data = two_files
    with hang_guard(GUARD, "a request over a rewritten file"), multitables.Reader(path, n_procs=1) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(BLOCK)
        np.testing.assert_array_equal(reader.request(ds[:BLOCK], stage).get(), data[:BLOCK])
        time.sleep(0.05)
        _rewrite_keeping_mtime(path, other)
        with pytest.raises(FileChangedError):
            reader.request(ds[BLOCK : 2 * BLOCK], stage).get()


_SIGINT_AT_BIRTH = r"""
import os, signal, sys, threading, time
import numpy as np, psutil, multitables

path, what = sys.argv[1], sys.argv[2]
me, hit, stop = psutil.Process(), set(), threading.Event()

def interrupt_children():
    # Ctrl-C reaches every process of the group; here only the new ones get it, as early as they can be found.
    while not stop.is_set():
        for child in me.children(recursive=True):
            try:  # a short-lived child (the PyTables probe) may be gone before its command line is read
                if child.pid not in hit and "resource_tracker" not in " ".join(child.cmdline()):
                    hit.add(child.pid)
                    os.kill(child.pid, signal.SIGINT)
            except (psutil.Error, ProcessLookupError):
                pass
        time.sleep(0.0005)

threading.Thread(target=interrupt_children, daemon=True).start()
if what == "stream":
    stream = multitables.Streamer(path, start_method="spawn")
    rows = sum(len(g.block) for g in stream.get_queue("/data", n_procs=2, block_size=500))
else:
    with multitables.Reader(path, n_procs=2, start_method="spawn") as reader:
        ds = reader.get_dataset("/data")
        rows = len(reader.request(ds[:1000], ds.create_stage(1000)).get())
stop.set()
print("rows", rows, "interrupted", len(hit))
"""


@pytest.mark.parametrize("what", ["stream", "reader"])
def test_processes_ignore_ctrl_c_from_their_first_instruction(make_array: Callable[..., Path], what: str) -> None:
    # A spawned interpreter takes a while to import before it runs our entry point; a Ctrl-C then used to
    # kill it with a KeyboardInterrupt traceback.
    path = make_array(np.arange(N_ROWS * 4, dtype="<f4").reshape(N_ROWS, 4))
    done = subprocess.run(
        [sys.executable, "-c", _SIGINT_AT_BIRTH, str(path), what],
        capture_output=True, text=True, timeout=GUARD, cwd=Path(__file__).parent,
    )
    assert done.returncode == 0, done.stderr
    assert "KeyboardInterrupt" not in done.stderr
    rows, n_hit = done.stdout.split()[1], int(done.stdout.split()[3])
    assert rows == (str(N_ROWS) if what == "stream" else "1000") and n_hit >= 2


_ORPHANED_MID_BLOCK = r"""
import sys, time, multitables, multitables._io.h5py_engine as h5py_source

read_into = h5py_source.H5pySource.read_into

def slow(self, start, stop, out):  # 2 ms a row: one block of 5,000 rows takes 10 s
    time.sleep(0.002 * (stop - start))
    return read_into(self, start, stop, out)

h5py_source.H5pySource.read_into = slow  # the reader is forked: it reads this slowly too
queue = multitables.Streamer(sys.argv[1], engine="h5py", start_method="fork").get_queue(
    "/data", n_procs=1, block_size=5000, read_ahead=1
)
print(queue.reader_pids[0], flush=True)
queue.get()
"""


def test_an_orphaned_reader_stops_within_a_second_even_mid_block(make_array: Callable[..., Path]) -> None:
    import psutil
    import signal

    path = make_array(np.arange(20_000 * 4, dtype="<f4").reshape(20_000, 4), chunkshape=(100, 4))
    consumer = subprocess.Popen([sys.executable, "-c", _ORPHANED_MID_BLOCK, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        reader = psutil.Process(int(consumer.stdout.readline()))
        time.sleep(1.0)  # the reader is well into its first block
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(GUARD)
        # Before, it read on to the end of the block (10 s here); the promise is about a second.
        gone, alive = psutil.wait_procs([reader], timeout=3.0)
        assert not alive, "the orphaned reader read on to the end of its block"
    finally:
        consumer.kill()
        consumer.wait(GUARD)


_LOCKS_AT_FORK = r"""
import importlib, os, pkgutil, sys, threading
import multitables

kinds = (type(threading.Lock()), type(threading.RLock()))
locks = []
for info in pkgutil.walk_packages(multitables.__path__, "multitables."):
    try:
        module = importlib.import_module(info.name)
    except ImportError:  # multitables.torch without PyTorch
        continue
    locks += [(info.name, name) for name, value in vars(module).items() if isinstance(value, kinds)]
held, done = threading.Event(), threading.Event()

def hold():
    taken = [getattr(sys.modules[m], n) for m, n in locks]
    for lock in taken:
        lock.acquire()
    held.set()
    done.wait(60)
    for lock in taken:
        lock.release()

threading.Thread(target=hold).start()
held.wait(60)
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # the reader's side of a fork: none of the parent's threads, every lock as the fork left it
    try:
        stuck = [f"{m}.{n}" for m, n in locks if not getattr(sys.modules[m], n).acquire(timeout=1.0)]
        os.write(w, " ".join(stuck).encode() or b"-")
    finally:
        os._exit(0)
os.close(w)
with os.fdopen(r) as f:
    print(len(locks), f.read())
os.waitpid(pid, 0)
done.set()
"""


def test_a_forked_reader_finds_every_lock_of_the_package_free_though_a_thread_held_it() -> None:
    # Readers fork from a process whose threads (batches' draws and copies, closes in the background, the caller's)
    # may hold a lock of this package at that moment; a reader that took it would wait forever.
    run = subprocess.run([sys.executable, "-c", _LOCKS_AT_FORK], capture_output=True, text=True, timeout=GUARD)
    assert run.returncode == 0, run.stderr
    n_locks, stuck = run.stdout.split(maxsplit=1)
    assert int(n_locks) >= 8  # the layouts', the sets', the releases' and the object store's
    assert stuck.strip() == "-", f"held in a forked child: {stuck.strip()}"


_CODEC_LOADING_AT_FORK = r"""
import importlib.abc, sys, threading
import multitables

path = sys.argv[1]
inside, go_on = threading.Event(), threading.Event()

class SlowDeflate(importlib.abc.MetaPathFinder):
    # imagecodecs loads a codec on first use, under a lock of its own: here the "loader" thread takes 0.5 s to.
    def find_spec(self, name, path=None, target=None):
        if name != "imagecodecs._deflate" or threading.current_thread().name != "loader":
            return None
        spec = next(s for s in (f.find_spec(name, path, target) for f in sys.meta_path[1:]) if s is not None)
        real = spec.loader

        class Slow(importlib.abc.Loader):
            def create_module(self, spec):
                return real.create_module(spec)

            def exec_module(self, module):
                inside.set()
                go_on.wait()
                real.exec_module(module)

        spec.loader = Slow()
        return spec

sys.meta_path.insert(0, SlowDeflate())
import imagecodecs
threading.Thread(target=lambda: imagecodecs.deflate_decode, name="loader").start()
inside.wait()
threading.Timer(0.5, go_on.set).start()
with multitables.Reader(path, n_procs=1, start_method="fork") as reader:  # forks while the loader holds the lock
    ds = reader.get_dataset("/data")
    with reader.request(ds[:100], ds.create_stage(100)).get_unsafe(timeout=20) as rows:
        print(rows[:, 0].tolist() == [16.0 * k for k in range(100)])
"""


def test_a_reader_forked_while_another_thread_loads_a_codec_reads(make_array: Callable[..., Path]) -> None:
    """A reader forked while another thread of the consumer (a stream's, say) had imagecodecs load a codec found its
    lock held for ever, and the request never came (NOTE [forking among threads] in ``_sys.forks``)."""
    path = make_array(np.arange(N_ROWS * 16, dtype="<f4").reshape(N_ROWS, 16), complib="zlib", chunkshape=(BLOCK, 16))
    run = subprocess.run(
        [sys.executable, "-c", _CODEC_LOADING_AT_FORK, str(path)], capture_output=True, text=True, timeout=GUARD,
        cwd=Path(__file__).parent,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["True"]


def test_a_reader_that_cannot_start_its_watch_thread_says_why(
    make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """Under a process limit (``ulimit -u``) a reader's first thread cannot start: the consumer hears that, with the
    reader's traceback, not only that it "died unexpectedly"."""
    import threading

    path = make_array(np.arange(N_ROWS * 4, dtype="<f4").reshape(N_ROWS, 4), chunkshape=(BLOCK, 4))
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "multitables-orphan-watch":  # as the kernel refuses a thread past RLIMIT_NPROC
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)  # the readers are forked: they inherit it
    with hang_guard(GUARD, "watch thread"), pytest.raises(multitables.ReaderError, match="can't start new thread") as err:
        with multitables.Streamer(path, start_method="fork").get_queue("/data", n_procs=1, block_size=BLOCK) as q:
            for guard in q.iter():
                guard.release()
    assert isinstance(err.value, RuntimeError) and "died unexpectedly" not in str(err.value)


def test_a_reader_whose_fd_table_is_full_still_sees_its_consumer_alive(make_array: Callable[..., Path], no_leaks: None) -> None:
    """A forked reader inherits its consumer's fds: near ``ulimit -n`` it cannot open ``/proc/<pid>/stat``. Not knowing
    the consumer's start time is not its death: the reader asks the kernel whether the pid lives (else it unlinked the
    ring and left, and the stream hung or failed with another error)."""
    script = (
        "import os, resource; from multitables._procs.process import ParentWatch, process_start_time\n"
        "me = os.getpid(); watch, gone = ParentWatch(me, process_start_time(me)), ParentWatch(2 ** 22 + 1, '5')\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)); held = []\n"
        "try:\n    while True: held.append(os.open(os.devnull, os.O_RDONLY))\nexcept OSError: pass\n"
        "print(process_start_time(me), watch(), gone())\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["?", "True", "False"]


def test_a_request_reader_holds_the_names_of_the_stages_it_maps_not_of_every_stage_it_mapped(
    make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_leaks: None
) -> None:
    """A Reader that makes and drops stages all its life (a stage a batch): each request reader's list of names to
    unlink if orphaned (NOTE [stuck orphans]) holds the control segment's and the stages mapped now, whatever the
    number of stages made before (it grew by a name a stage, unlinked long ago: reader memory without end)."""
    from multitables._procs import serve

    path = make_array(np.arange(N_ROWS, dtype="<f8"), chunkshape=(BLOCK,))
    real_close = serve._Server.close

    def close(self: Any) -> None:  # in each forked reader, at its loop's end: what it would unlink
        (tmp_path / f"held-{os.getpid()}").write_text("\n".join(sorted(self.reader.segments)))
        real_close(self)

    monkeypatch.setattr(serve._Server, "close", close)  # the readers are forked: they inherit it
    with hang_guard(GUARD, "stages"), multitables.Reader(filename=str(path), n_procs=2, start_method="fork") as reader:
        dataset = reader.get_dataset("/data")
        for i in range(40):
            stage = dataset.create_stage(10)
            assert reader.request(dataset[i:i + 10], stage).get().tolist() == list(range(i, i + 10))
            stage.close()
        kept = dataset.create_stage(10)  # mapped while the readers stop
        assert reader.request(dataset[5:15], kept).get().tolist() == list(range(5, 15))
        pids = reader.reader_pids
    held = {pid: (tmp_path / f"held-{pid}").read_text().split() for pid in pids}
    assert [len(names) for names in held.values()] == [2, 2], held  # the control segment and the kept stage


def test_readers_that_leave_before_they_map_the_ring_are_an_error_at_once(
    make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_leaks: None
) -> None:
    """Readers that end with nothing to report before they map the ring (as one that found its consumer gone does),
    while another runs on, are an error within a tick, not after the 120 s the consumer waits for them to map it."""
    import multitables._procs.stream as stream

    path = make_array(np.arange(N_ROWS * 4, dtype="<f4").reshape(N_ROWS, 4), chunkshape=(BLOCK, 4))
    attach = stream.Ring.attach

    def leave_first(*args: object, **kwargs: object) -> object:  # forked readers inherit it: two leave, one maps
        for i in range(2):
            try:
                os.close(os.open(tmp_path / f"left-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
            os._exit(0)
        return attach(*args, **kwargs)

    monkeypatch.setattr(stream.Ring, "attach", leave_first)
    t0 = time.monotonic()
    with hang_guard(GUARD, "readers gone before mapping"), pytest.raises(multitables.ReaderError, match=r"reader process "
                                                                            r"\d \(pid \d+\) of .* ended with exit code 0 before it could start"):
        multitables.Streamer(path, start_method="fork").get_queue("/data", n_procs=3, block_size=BLOCK)
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_one_reader_that_leaves_before_it_maps_the_ring_while_the_others_map_it_is_named_at_once(
    make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_leaks: None, start_method: str
) -> None:
    """One reader that ends with exit code 0 and nothing to report before it maps the ring, after the others mapped it
    (so fewer readers ended than mapped), is an error naming it, its pid, exit code and file, within a tick: the
    consumer waited the whole 120 s for it, then said only that the readers did not start."""
    import _leave_early

    path = make_array(np.arange(N_ROWS * 4, dtype="<f4").reshape(N_ROWS, 4), chunkshape=(BLOCK, 4))
    marks = tmp_path / "mapped"
    marks.mkdir()
    if start_method == "fork":  # the readers inherit the patch
        _leave_early.install(monkeypatch.setattr, 3, marks)
    else:  # each imports it with the transform, and patches itself
        monkeypatch.setenv(_leave_early.ENV, f"3:{marks}")
    batches = multitables.Streamer(path, start_method=start_method).get_batches(
        "/data", 100, shuffle=False, n_procs=3, block_size=BLOCK, transform=_leave_early.keep
    )
    try:
        with hang_guard(GUARD, "one reader gone before mapping"), pytest.raises(
            multitables.ReaderError,
            match=r"reader process 0 \(pid \d+\) of .* ended with exit code 0 before it could start, with no error to report",
        ) as err:
            next(iter(batches))
    finally:
        batches.close()
    assert (err.value.reader_index, err.value.exitcode, err.value.filename) == (0, 0, str(path))
    assert err.value.pid > 0 and sorted(p.name for p in marks.iterdir()) == ["1", "2"]


def test_a_reader_the_system_cannot_start_is_named_in_the_error(
    make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """Past ``ulimit -u`` fork fails with EAGAIN, whose words name no reader: the error says what could not start,
    keeps its type and errno, and nothing of the stream is left."""
    import errno
    import multiprocessing.process

    path = make_array(np.arange(N_ROWS * 4, dtype="<f4").reshape(N_ROWS, 4), chunkshape=(BLOCK, 4))

    def refuse(self: object) -> None:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    with pytest.raises(BlockingIOError, match="could not start reader process 0 of 2 for .*a limit of processes") as err:
        multitables.Streamer(path, start_method="fork").get_queue("/data", n_procs=2, block_size=BLOCK)
    assert err.value.errno == errno.EAGAIN


def _consumer_whose_readers_start_late(path: str, face: str, tracker_held: str = "") -> None:
    """A pool worker's part (forked, sharing its parent's resource tracker, as a pool's workers share their parent's):
    start readers that wait until this process is killed, then import for a second before their loop, as spawn's
    readers do. ``tracker_held``: the readers are forked while the tracker's lock is held, as by another thread, and
    stay stuck there (as in a read that hangs), so that their watch thread alone ends them (NOTE [stuck orphans])."""
    import multiprocessing.resource_tracker

    import multitables._procs.pool as pool
    import multitables._procs.process as process

    if tracker_held:
        lock = multiprocessing.resource_tracker._resource_tracker._lock
        os.register_at_fork(before=lock.acquire, after_in_parent=lock.release)

    reader_main, limit_threads, me = pool.reader_main, process.limit_threads, os.getpid()

    def late(*args: object) -> None:
        while os.getppid() == me:
            time.sleep(0.01)
        reader_main(*args)  # type: ignore[arg-type]

    def importing() -> None:
        time.sleep(GUARD * 10 if tracker_held else 1.0)
        limit_threads()

    pool.reader_main, process.limit_threads = late, importing  # type: ignore[assignment]
    if face == "stream":
        multitables.Streamer(path, start_method="fork").get_queue("/data", n_procs=1, block_size=BLOCK)
    else:
        multitables.Reader(path, n_procs=1, start_method="fork")


def _orphan_its_reader(consumer: Any, mine: str, timeout: float) -> list:
    """Kill ``consumer`` once it has a reader and a segment named ``mine...``; its reader, in a list, if it still
    lives ``timeout`` seconds later (killed then: else it would hold the test's pipes)."""
    import signal

    import psutil

    deadline = time.monotonic() + GUARD
    while not (psutil.Process(consumer.pid).children() and any(n.startswith(mine) for n in os.listdir("/dev/shm"))):
        assert time.monotonic() < deadline, "the consumer never started its reader"
        time.sleep(0.01)
    reader = psutil.Process(consumer.pid).children()[0]
    os.kill(consumer.pid, signal.SIGKILL)  # a zombie until joined: dead to its reader's watch
    _gone, alive = psutil.wait_procs([reader], timeout=timeout)
    for stuck in alive:
        stuck.kill()
    consumer.join(GUARD)  # its sentinel's pipe is its reader's too: joined once the reader is gone
    return alive


_KILLED_WHILE_READERS_START = r"""
import json, multiprocessing, multiprocessing.resource_tracker, os, sys
from multitables._shm.segment import SHM_PREFIX
from test_reader_process import GUARD, _consumer_whose_readers_start_late, _orphan_its_reader

multiprocessing.resource_tracker.ensure_running()  # the pool's parent's, which outlives the worker
consumer = multiprocessing.get_context("fork").Process(target=_consumer_whose_readers_start_late, args=sys.argv[1:4])
consumer.start()
try:
    mine = f"{SHM_PREFIX}{consumer.pid}_"
    alive = _orphan_its_reader(consumer, mine, GUARD)
finally:
    consumer.kill()  # killed already, unless a step above failed
    consumer.join(GUARD)
print(json.dumps({"alive": len(alive), "left": [n for n in os.listdir("/dev/shm") if n.startswith(mine)]}))
"""


@pytest.mark.parametrize("face, tracker_held", [("stream", ""), ("reader", ""), ("stream", "held")])
def test_a_reader_whose_consumer_is_killed_before_it_starts_unlinks_what_it_was_to_map(
    make_array: Callable[..., Path], face: str, tracker_held: str, no_leaks: None
) -> None:
    """A pool that ends its worker (loky's terminate, dask's nanny, a Pool's terminate) while the worker's readers
    still start (spawn imports for seconds) left the ring in /dev/shm: the readers found the consumer gone before they
    mapped anything, and unlinked nothing (NOTE [stuck orphans]). The reader that unlinks it also takes it off the
    resource tracker the worker shares with the pool's parent, which at that parent's exit warned of a leaked
    segment, then of its failure to unlink it; one forked while a thread of the worker held the tracker's lock
    (held in it for ever) leaves it there, and exits all the same."""
    import json

    path = make_array(np.arange(N_ROWS * 4, dtype="<f4").reshape(N_ROWS, 4), chunkshape=(BLOCK, 4))
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), here, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", _KILLED_WHILE_READERS_START, str(path), face, tracker_held],
                         capture_output=True, text=True, timeout=GUARD * 2, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == {"alive": 0, "left": []}
    # The tracker's output (it ends after the program): the name unlinked, a warning of its leak, then of its absence.
    assert ("leaked" in run.stderr) == bool(tracker_held), run.stderr[-3000:]


def _consumer_whose_readers_may_not_unlink(path: str) -> None:
    """A consumer whose readers (forked) may not unlink the names they map (EACCES, as a segment of another user's in
    /dev/shm) and stay stuck before their loop, as in a read that hangs: their watch thread alone can end them once
    this process is killed (NOTE [stuck orphans])."""
    import errno

    import multitables._procs.process as process

    def refused(name: str, tracked: bool = False) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", f"/dev/shm/{name}")

    process.unlink_orphan = refused  # type: ignore[assignment]
    process.limit_threads = lambda: time.sleep(GUARD * 10)  # type: ignore[assignment]
    multitables.Streamer(path, start_method="fork").get_queue("/data", n_procs=1, block_size=BLOCK)


_KILLED_WHILE_UNLINK_REFUSED = r"""
import json, multiprocessing, multiprocessing.resource_tracker, os, sys
from multitables._shm.segment import SHM_PREFIX, unlink_orphan
from test_reader_process import GUARD, _consumer_whose_readers_may_not_unlink, _orphan_its_reader

multiprocessing.resource_tracker.ensure_running()  # shared with the consumer: it forgets what is unlinked below
consumer = multiprocessing.get_context("fork").Process(target=_consumer_whose_readers_may_not_unlink, args=sys.argv[1:2])
consumer.start()
mine, alive, left = f"{SHM_PREFIX}{consumer.pid}_", [], []
try:
    alive = _orphan_its_reader(consumer, mine, 10.0)  # its watch looks every 0.5 s
finally:
    consumer.kill()  # killed already, unless a step above failed
    consumer.join(GUARD)
    left = [n for n in os.listdir("/dev/shm") if n.startswith(mine)]
    for name in left:  # the consumer's, which its reader was refused
        unlink_orphan(name, tracked=True)
print(json.dumps({"alive": len(alive), "left": len(left)}))
"""


def test_an_orphaned_reader_refused_the_unlink_of_its_segments_still_ends(
    make_array: Callable[..., Path], no_leaks: None
) -> None:
    """An unlink refused for another reason than a name gone (EACCES) escaped the watch thread before its
    ``os._exit``, and the orphaned reader, stuck in a read, lived on. It ends, saying on stderr what it could not
    unlink (NOTE [stuck orphans])."""
    import json

    path = make_array(np.arange(N_ROWS * 4, dtype="<f4").reshape(N_ROWS, 4), chunkshape=(BLOCK, 4))
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), here, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", _KILLED_WHILE_UNLINK_REFUSED, str(path)],
                         capture_output=True, text=True, timeout=GUARD * 2, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    counts = json.loads(run.stdout)
    assert counts["alive"] == 0 and counts["left"] > 0, run.stderr[-3000:]
    said = [line for line in run.stderr.splitlines() if "could not unlink" in line]
    assert len(said) == 1 and "Permission denied" in said[0], run.stderr[-3000:]


def _consumer_that_names_its_semaphores(path: str, face: str, method: str, conn: object) -> None:
    """A pool worker's part (spawned, sharing the test's resource tracker, as a pool's workers share their parent's):
    readers started by ``method`` read once; the names of every semaphore made here, the readers' pids and what they
    read are sent; then it waits to be killed."""
    import multiprocessing.synchronize

    names: list[str] = []
    init = multiprocessing.synchronize.SemLock.__init__

    def recording(self: object, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        names.append(self._semlock.name)  # type: ignore[attr-defined]

    multiprocessing.synchronize.SemLock.__init__ = recording  # type: ignore[method-assign]
    if face == "stream":
        # ordered: the first block is block 0 (in finishing order, any block a reader finished first: block 5 once)
        held: object = multitables.Streamer(path, start_method=method).get_queue(
            "/data", n_procs=2, block_size=BLOCK, ordered=True
        )
        with held.get() as block:  # type: ignore[attr-defined]
            first = float(block[0, 0])
    else:
        held = multitables.Reader(path, n_procs=2, max_stages=4, start_method=method)
        dataset = held.get_dataset("/data")  # type: ignore[attr-defined]
        request = held.request(dataset[BLOCK : BLOCK * 3], dataset.create_stage(BLOCK * 2))  # type: ignore[attr-defined]
        first = float(request.get()[-1, 0])
    conn.send((names, held.reader_pids, first))  # type: ignore[attr-defined]
    time.sleep(GUARD)


@pytest.mark.parametrize("face, method", [("stream", "spawn"), ("reader", "forkserver")])
def test_a_killed_consumer_leaves_no_semaphore_behind(make_array: Callable[..., Path], face: str, method: str) -> None:
    """Under spawn and forkserver each semaphore shared with the readers is a name in /dev/shm, which only the
    consumer's finalizers or, at the exit of the pool's parent, its resource tracker unlinked: a pool's worker that
    the pool killed left them (7 a stream, 70 a Reader) for as long as the pool ran (NOTE [semaphore names])."""
    import multiprocessing
    import multiprocessing.resource_tracker
    import signal

    import psutil
    from _multiprocessing import sem_unlink

    from multitables._shm.segment import SHM_PREFIX

    path = make_array(np.arange(N_ROWS * 4, dtype="<f4").reshape(N_ROWS, 4), chunkshape=(BLOCK, 4))
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    consumer = ctx.Process(target=_consumer_that_names_its_semaphores, args=(str(path), face, method, send))
    consumer.start()
    send.close()
    left: list[str] = []
    try:
        assert recv.poll(GUARD), "the consumer never started its readers"
        names, pids, first = recv.recv()
        assert first == (0.0 if face == "stream" else (BLOCK * 3 - 1) * 4)  # the readers work on, the names gone
        readers = [psutil.Process(pid) for pid in pids]
        os.kill(consumer.pid, signal.SIGKILL)
        consumer.join(GUARD)
        _, alive = psutil.wait_procs(readers, timeout=GUARD)
        assert not alive
        left = [name for name in names if os.path.exists(f"/dev/shm/sem.{name.lstrip('/')}")]
        assert len(names) == (7 if face == "stream" else 2 + 4 + 4) and left == []
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"{SHM_PREFIX}{consumer.pid}_")]
    finally:
        consumer.kill()
        consumer.join(GUARD)
        consumer.close()
        recv.close()
        for name in left:  # ours alone: made by the consumer above
            sem_unlink(name)
            multiprocessing.resource_tracker.unregister(name, "semaphore")


_KILLED_BEFORE_THE_START_BARRIER = r'''
"""Run as a file: spawn and forkserver import it in the consumer, and in the readers or their server, as __mp_main__."""
import json, multiprocessing, multiprocessing.resource_tracker, multiprocessing.synchronize, os, signal, sys, time

import multitables._procs.process as process

MARK, WHEN = os.environ["MT_TEST_KILLED"], os.environ["MT_TEST_WHEN"]
limit_threads = process.limit_threads


def late_start() -> None:
    """Run where a reader opens its semaphores: reader 1 waits for the consumer's death (reader 0 too if nobody is to
    have opened them by then), then long enough for reader 0's watch to unlink every name."""
    index = int(multiprocessing.current_process().name.rpartition("-")[2])
    if index or WHEN == "none opened":
        while not os.path.exists(MARK):
            time.sleep(0.01)
    if index:
        time.sleep(4 * process.PARENT_CHECK_INTERVAL)
    limit_threads()


process.limit_threads = late_start


def consumer(path, face, method, conn):
    """A pool worker's part: record the names of the semaphores made here, start readers, send the names (once reader 0
    passed the barrier, with "one opened"), and wait for the readers until killed."""
    import multitables
    from multitables._procs import pool

    names = []
    init, start = multiprocessing.synchronize.SemLock.__init__, pool.ReaderPool.start

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        names.append(self._semlock.name)

    def started(self, *args, **kwargs):
        start(self, *args, **kwargs)
        while WHEN == "one opened" and not self.attached[0].get_value():
            time.sleep(0.01)
        conn.send((names, self.pids))

    multiprocessing.synchronize.SemLock.__init__, pool.ReaderPool.start = recording, started
    if face == "stream":
        multitables.Streamer(path, start_method=method).get_queue("/data", n_procs=2, block_size=500)
    else:
        multitables.Reader(path, n_procs=2, max_stages=4, start_method=method)


if __name__ == "__main__":
    import psutil
    from _multiprocessing import sem_unlink
    from multitables._shm.segment import SHM_PREFIX

    multiprocessing.resource_tracker.ensure_running()  # the pool's parent's, which outlives its worker
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    worker = ctx.Process(target=consumer, args=(*sys.argv[1:4], send))
    worker.start()
    send.close()
    names, pids = recv.recv()
    readers = [psutil.Process(pid) for pid in pids]
    os.kill(worker.pid, signal.SIGKILL)
    worker.join()
    open(MARK, "w").close()
    _, alive = psutil.wait_procs(readers, timeout=60)
    for stuck in alive:
        stuck.kill()
    left = [name for name in names if os.path.exists(f"/dev/shm/sem.{name.lstrip('/')}")]
    segments = [n for n in os.listdir("/dev/shm") if n.startswith(f"{SHM_PREFIX}{worker.pid}_")]
    print(json.dumps({"names": len(names), "left": left, "segments": segments, "alive": len(alive)}), flush=True)
    for name in left:  # ours alone: made by the worker above
        sem_unlink(name)
        multiprocessing.resource_tracker.unregister(name, "semaphore")
'''


@pytest.mark.parametrize("face, method, when", [
    ("stream", "spawn", "one opened"), ("stream", "spawn", "none opened"), ("reader", "forkserver", "one opened"),
])
def test_a_consumer_killed_before_its_readers_start_barrier_leaves_no_semaphore(
    make_array: Callable[..., Path], tmp_path: Path, face: str, method: str, when: str
) -> None:
    """A pool's worker killed while its readers started (spawn imports for a second or more) left its semaphores (7 a
    stream, 10 this Reader) until the pool's parent exited: only the consumer unlinked them. Each reader is handed the
    names and unlinks them once it finds the consumer gone; a reader that then opens them finds them gone and exits
    quietly, as one that opened none yet (NOTE [semaphore names])."""
    import json

    path = make_array(np.arange(N_ROWS * 4, dtype="<f4").reshape(N_ROWS, 4), chunkshape=(BLOCK, 4))
    script = tmp_path / "killed_before_barrier.py"
    script.write_text(_KILLED_BEFORE_THE_START_BARRIER)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(here), os.environ.get("PYTHONPATH", "")]),
               MT_TEST_KILLED=str(tmp_path / "killed"), MT_TEST_WHEN=when)
    run = subprocess.run([sys.executable, str(script), str(path), face, method],
                         capture_output=True, text=True, timeout=GUARD * 2, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    assert got == {"names": 7 if face == "stream" else 2 + 2 * 2 + 4, "left": [], "segments": [], "alive": 0}, run.stderr
    # No reader failed to open a name another unlinked, and the tracker (ending after the script) warned of nothing.
    assert "Traceback" not in run.stderr and "leaked" not in run.stderr, run.stderr[-3000:]
