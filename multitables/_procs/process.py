"""What every reader process does around its loop: signals, thread limits, parent watch, failure report.

A pool (``pool.ReaderPool``) starts each reader at :func:`reader_main` with a
*loop*: a module-level function of ``(reader, *args)`` that does the work
(``stream.stream_loop`` fills a ring with blocks; ``serve.serve_loop`` reads
requests into stages). The entry is a module-level function taking picklable
arguments, so it works under the fork, spawn and forkserver start methods
alike. Modelled on PyTorch's ``_utils/worker.py``.

NOTE [stuck orphans]
    A reader checks that its consumer lives between pieces of a read (NOTE
    [orphans] in ``_io.blockread``), but a read can block where no check
    runs: a server that stopped answering mid-response held a reader in the
    socket's timeouts and retries for three minutes after its consumer was
    killed, and a transform or an NFS read can block as long. So each reader
    also runs a thread that looks every ``PARENT_CHECK_INTERVAL`` and, once
    the consumer is gone, unlinks the names the reader mapped and ends the
    process at once (``os._exit``: nothing it would finish has a reader),
    whatever the unlinks raised (a refused one is said on stderr).
    The names it is handed at start count as mapped from its first
    instruction: a reader started by spawn imports for a second or more,
    and a consumer killed meanwhile (a pool's worker that the pool ended)
    unlinked nothing, so no other process would (the resource tracker only
    at the pool's parent's exit). The pool's semaphores go the same way
    (NOTE [semaphore names] in ``_shm.semaphores``): a reader opens them
    once its watch runs (:class:`Sealed`), and one that finds a name
    another unlinked fails with nobody left to hear it, and unlinks the
    rest.

NOTE [random draws in readers]
    A transform (NOTE [transforms] in ``_io.blockread``) runs in the
    readers, where a ``DataLoader``'s ``__getitem__`` ran in its workers, and
    augmentations draw from the global generators there. Readers forked from
    one consumer inherit its numpy state, and torch's CPU generator starts
    from one fixed seed in any process, so every reader drew the same
    numbers: the same flips and crops in each reader's blocks. PyTorch seeds
    each worker's generators apart for this reason. Each reader draws new
    seeds from the OS at start for numpy's global generator and, where the
    process has imported PyTorch, torch's CPU generator (``random`` is
    reseeded after a fork by Python itself, and fresh under spawn); where the
    consumer has not imported ``numpy.random``, a reader leaves it to seed
    itself from the OS when something in the reader first imports it. The draws
    are not reproducible from ``seed``: which reader reads which block, and
    whether readers read at all, varies (NOTE [readers bought] in
    ``_train.feed``).
"""

from __future__ import annotations

import functools
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Iterable

import numpy as np

from .._io.engines import limit_threads
from .._shm.segment import unlink_orphan
from .._shm.semaphores import unlink_orphan_semaphore
from .._sys.forks import renew_lock_in_children
from .._sys.siblings import stat_fields
from .._sys.signals import ignore_sigint
from .failure import FailureReport

#: Seconds between checks that the consumer is still alive while busy.
PARENT_CHECK_INTERVAL = 0.5
#: A reader's main thread (its end) and its watch (NOTE [stuck orphans]) both unlink what a dead consumer left: one
#: at a time, so that the watch's ``os._exit`` does not cut the other short between a name's unlink and its removal
#: from the resource tracker (which then warned of a leaked semaphore at its exit). Seconds the watch waits for them.
_UNLINKING, UNLINKING_WAIT = threading.Lock(), 5.0
renew_lock_in_children(globals(), "_UNLINKING")  # a child has none of its parent's threads, one of which may hold it


def process_start_time(pid: int) -> "str | None":
    """The kernel's start time of ``pid`` (tells a live process from a reused pid); None if gone or unknown."""
    try:
        fields = stat_fields(pid)
    except FileNotFoundError:
        return None
    except OSError:  # no procfs, or no fd free (EMFILE: a reader inherits a consumer's table near its limit)
        return "?"
    if fields[0] == b"Z":  # a zombie: dead, not yet reaped
        return None
    return fields[19].decode()


class ParentWatch:
    """Answers "is the consumer still alive?", at most once per interval when asked often."""

    def __init__(self, pid: int, start: "str | None") -> None:
        self._pid, self._start = pid, start
        self._next = 0.0
        self._alive = True

    def __call__(self) -> bool:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + PARENT_CHECK_INTERVAL
            start = "?" if self._start in (None, "?") else process_start_time(self._pid)
            if start == "?":  # no start time, then or now (no procfs; no fd free): does the pid live, says the kernel
                try:
                    os.kill(self._pid, 0)
                except ProcessLookupError:
                    self._alive = False
            else:
                self._alive = start == self._start  # None: gone, or a zombie; another: the pid reused
        return self._alive


@dataclass(frozen=True)
class ReaderIdentity:
    """Who a reader is and whom it serves; sent once at process start."""

    index: int
    n_readers: int
    filename: str
    parent_pid: int
    parent_start: "str | None"
    #: The segments the consumer made for it to map: a reader that finds its consumer gone before it mapped them
    #: still unlinks them (NOTE [stuck orphans]).
    segments: tuple[str, ...] = ()
    #: The names of the pool's semaphores, which such a reader unlinks too (NOTE [semaphore names]).
    semaphores: tuple[str, ...] = ()


class Sealed:
    """What a reader is started with that opens named semaphores when unpickled, pickled apart: the reader opens it
    (:meth:`open`) once its watch runs, not in its start method's unpickling (NOTE [semaphore names])."""

    def __init__(self, value: Any, pickled: bytes = b"") -> None:
        self._value, self._pickled = value, pickled

    def __reduce__(self) -> "tuple[type, tuple[None, bytes]]":
        # Called as the process starts, where multiprocessing lets a semaphore pickle (its spawning popen is set).
        return Sealed, (None, bytes(ForkingPickler.dumps(self._value)))

    def open(self) -> Any:
        """The value: unpickled here, in a reader started by spawn or forkserver (FileNotFoundError for a semaphore
        whose name is gone); the object itself under fork."""
        return pickle.loads(self._pickled) if self._pickled else self._value


@dataclass
class ReaderProcess:
    """A reader's own state, handed to its loop: what it reads now (for a report), what to unlink if orphaned."""

    identity: ReaderIdentity
    conn: Any  # the write end of this reader's report pipe
    parent_alive: Callable[[], bool]
    #: This reader's semaphore in the pool: released once per segment it maps (the attach barrier).
    barrier: Any = None
    #: The dataset and rows being read, named in a failure report.
    path: str = ""
    rows: "tuple[int, int] | None" = None
    #: Segment names this reader maps: unlinked on exit if the consumer died before it could.
    segments: set[str] = field(default_factory=set)
    #: Called before a failure report is sent (the stream loop flags its ring: that wakes the consumer).
    on_failure: "Callable[[], None] | None" = None

    def attached(self) -> None:
        """Tell the consumer one more segment is mapped (NOTE [segment lifetime])."""
        self.barrier.release()

    def report(self, tag: int, exc: BaseException, path: "str | None" = None, rows: "tuple[int, int] | None" = None) -> None:
        """Send ``(tag, FailureReport)`` to the consumer; tag -1 is the reader's own failure. Never raises."""
        try:
            failure = FailureReport.from_exception(
                exc,
                self.identity.index,
                os.getpid(),
                self.identity.filename,
                self.path if path is None else path,
                self.rows if path is None else rows,
                "serving" if self.barrier is not None else "starting to read",  # before its arguments were unpickled
            )
        except BaseException:  # pragma: no cover - formatting the traceback failed
            return
        try:
            self.conn.send((tag, failure))
        except BaseException:
            pass  # the consumer is gone or closed the pipe; it sees our exit instead


def _end_when_orphaned(reader: ReaderProcess) -> None:
    """End the process once its consumer is gone, whatever the reader waits on (NOTE [stuck orphans])."""
    alive = ParentWatch(reader.identity.parent_pid, reader.identity.parent_start)  # its own: not shared across threads
    while alive():
        time.sleep(PARENT_CHECK_INTERVAL)
    try:
        for _ in range(3):  # the reader's thread may be adding a name
            try:
                names = tuple(reader.segments)
                break
            except RuntimeError:
                continue
        else:
            names = ()
        _UNLINKING.acquire(timeout=UNLINKING_WAIT)  # held until the exit: the main thread's unlinks ended first
        _unlink_left(names, reader.identity.semaphores)  # what they left, or all of it where they never ended
    finally:
        os._exit(0)  # whatever the unlink raised: an orphan that lives on reads for nobody and holds its mappings


def _unlink_left(segments: "Iterable[str]", semaphores: "Iterable[str]") -> None:
    """Unlink the segments and semaphores that a dead consumer left (NOTE [stuck orphans]); a name this process may
    not unlink (EACCES, EPERM) is said once on stderr, the only listener left (``os.write``: no lock another thread
    may hold), and the other names are still unlinked."""
    refused = []
    unlinks = [(name, functools.partial(unlink_orphan, name, tracked=True)) for name in segments]
    for name, unlink in unlinks + [(name, functools.partial(unlink_orphan_semaphore, name)) for name in semaphores]:
        try:
            unlink()
        except OSError as exc:
            refused.append(f"{name} ({exc.strerror or exc})")
    if refused:
        try:
            os.write(2, f"multitables: reader {os.getpid()}, its consumer gone, could not unlink its shared memory "
                        f"segments or semaphores {', '.join(refused)} from /dev/shm\n".encode(errors="replace"))
        except OSError:
            pass


def _fresh_random_state() -> None:
    """New seeds, from the OS, for the global generators a transform draws from (NOTE [random draws in readers])."""
    # numpy 2 imports numpy.random when first used: where the consumer had not, a reader that imports it later seeds
    # it from the OS itself, and importing it here cost each reader's start 10-18 ms.
    if "numpy.random" in sys.modules:
        np.random.seed(np.frombuffer(os.urandom(16), np.uint32))  # 0.1 ms; seed() with no argument takes 0.7 ms
    torch = sys.modules.get("torch")  # never imported here: a reader of a consumer without PyTorch stays without it
    if torch is not None:
        torch.random.default_generator.seed()


def reader_main(loop: Callable[..., None], identity: ReaderIdentity, sealed: Sealed, conn: Any) -> None:
    """Reader process entry point: open ``sealed``, ``(barrier, args)``, and run ``loop(reader, *args)``; report its
    exception and exit 1 if it raises (silent with its consumer gone: nobody reads the report)."""
    ignore_sigint()  # the consumer decides what Ctrl-C does
    # SIGTERM is the consumer's escalation (NOTE [shutdown]): a handler
    # inherited through fork from the user's program must not keep us alive.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    alive = ParentWatch(identity.parent_pid, identity.parent_start)
    reader = ReaderProcess(identity, conn, alive, segments=set(identity.segments))  # mapped or not (NOTE [stuck orphans])
    failed = False
    try:  # the watch's start too: under a process limit it fails, and the consumer must hear why
        threading.Thread(target=_end_when_orphaned, args=(reader,), name="multitables-orphan-watch", daemon=True).start()
        limit_threads()
        _fresh_random_state()
        reader.barrier, args = sealed.open()  # a name gone: another reader found the consumer dead
        loop(reader, *args)
    except BaseException as exc:
        failed = True
        if reader.on_failure is not None:
            try:
                reader.on_failure()
            except BaseException:
                pass
        reader.report(-1, exc)
    finally:
        conn.close()
        if not reader.parent_alive():
            with _UNLINKING:  # the consumer died, maybe before it could unlink these
                _unlink_left(reader.segments, identity.semaphores)
    if failed:
        raise SystemExit(1)
