"""One pool of reader processes, the consumer's side: start, watch, report, stop.

Both front ends run on it: a stream's readers (``stream.StreamReaders``) and
a Reader's request readers (``serve.ServeReaders``) differ only in the loop
their readers run and in what they do with what the pool sees.

NOTE [failure reports]
    Modelled on PyTorch's DataLoader. A reader that raises catches the exception at the top of
    :func:`~multitables._procs.process.reader_main` (or, for one request, in its loop) and sends
    ``(tag, FailureReport)`` over its own one-way pipe: the exception's type *name*, message and formatted traceback, the
    reader's index and pid, the file, the dataset and the rows it was reading. Tag -1 is the reader's own failure
    (it then exits with code 1); a tag >= 0 is the request that failed (the reader goes on). A stream's reader also
    sets the ring's error flag first, which wakes the consumer. A reader that dies without a word (SIGKILL, a crash
    in C) shows up as its process sentinel becoming ready with a non-zero exit code.

    :meth:`ReaderPool.look` collects both, cheaply enough to run every
    ``TICK`` of any wait: reports waiting on the pipes, and readers that
    ended (their exit code and own report, waiting up to
    ``REPORT_TIMEOUT`` s for the report of one that failed). The front end
    decides what an end means: for a stream, any failure ends the pass,
    and every reader having ended with no block ready is an error rather
    than a hang; for a Reader, a failed request fails its future, and a
    dead reader breaks the pool for later requests. The error raised is a
    ``ReaderError`` that is also the original type, or, for a silent
    death, a ``ReaderError`` naming the reader, its pid and exit code (and
    signal).

NOTE [shutdown]
    :meth:`ReaderPool.close` is the one way a pool ends, whatever ended it
    (the pass is over, ``close()``, ``break``, an exception in the loop
    body, garbage collection, interpreter exit, a reader error). It is
    idempotent and escalates:

    1. tell the readers to stop (the front end's ``tell_stop``: the ring's
       stop flag, or the inboxes' stop word) and wake those that wait;
    2. join all readers for up to ``JOIN_TIMEOUT`` s in all (a reader checks
       the flag every ``TICK`` and between blocks or requests);
    3. SIGTERM the ones still alive, join briefly; then SIGKILL and join;
    4. close the report pipes and the Process objects (their fds); the
       front end then unlinks what it had not unlinked yet and unmaps.

    Step 1 comes first and cannot block, so even a ``close()`` cut short (a
    second Ctrl-C) leaves readers that stop by themselves within a ``TICK``.
    Step 1 alone also runs as soon as a stream sees a reader error, and the
    error is raised at once: joining the survivors first kept it from the
    user for up to ``JOIN_TIMEOUT``.

    Segment names are normally unlinked much earlier, as soon as every
    reader has attached (NOTE [segment lifetime]). Readers, for their part,
    watch that the consumer lives (pid and start time) and exit within
    ~0.5 s of its death; one that finds the consumer gone unlinks the names
    it mapped itself, in case the consumer died before it could.

NOTE [forked children]
    A program may fork while it holds a stream, batches or a Reader (an ``os.fork`` of its own, a library's). The
    readers are the parent's: a child that closed or dropped its copy told them to stop and tried to join them, and
    the parent then waited for ever on its next batch. So a pool remembers the process that started it
    (:attr:`ReaderPool.owner`); in any other, :meth:`ReaderPool.close` closes only that process's copies of the
    pipes, looking reads no report (they are the parent's), and using the readers raises a ``RuntimeError`` that
    says why (the front ends call :meth:`ReaderPool.check_owner`; a slot or stage given back there touches nothing
    shared). Training batches, a position more than a stream, start readers, copy threads and draws of the child's
    own at its first iteration, and read the next epoch's window read ahead again (the parent's threads and window
    buffers are not in a fork). multiprocessing's exit handler, which a forked child runs when it exits normally,
    would also terminate every daemonic process it believes it started: the readers leave its list in every fork.
"""

from __future__ import annotations

import errno
import multiprocessing
import multiprocessing.connection
import os
import select
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, cast

from .._io.prefork import READING_LIBRARIES, before_fork
from .._io.handles import refuse_written_here
from .._sys.forks import (
    collector_paused_for_readers, note_ready_server, running_forkserver, start_method as default_start_method,
    unguarded_main_call,
)
from .._sys.release import settle_releases
from .._shm.ring import TICK
from .._shm.semaphores import semaphore_names, unlink_names
from .._shm.space import semaphores_for
from .._sys.signals import signals_deferred, sigint_held_for_children
from ..errors import ReaderError
from .failure import FailureReport, died_error
from .process import ReaderIdentity, Sealed, process_start_time, reader_main

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext

#: Seconds readers get to stop by themselves before they are terminated.
JOIN_TIMEOUT = 2.0
#: Seconds the consumer waits for every reader to map a segment.
ATTACH_TIMEOUT = 120.0
#: Seconds the consumer waits for the report of a reader that flagged a failure.
REPORT_TIMEOUT = 1.0


def check_start_method(start_method: "str | None") -> "str | None":
    """``start_method`` if multiprocessing has it (None: its default), else ``ValueError``."""
    if start_method is not None and start_method not in multiprocessing.get_all_start_methods():
        raise ValueError(f"start_method={start_method!r} is not one of {multiprocessing.get_all_start_methods()}")
    return start_method


def end_processes(procs: "list[Any]", timeout: float = JOIN_TIMEOUT) -> None:
    """Join ``procs`` for up to ``timeout`` s in all, then SIGTERM, then SIGKILL the ones left (NOTE [shutdown] 2-3)."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for escalate in ("terminate", "kill"):
        alive = [p for p in procs if p.exitcode is None]
        for proc in alive:
            getattr(proc, escalate)()
        for proc in alive:
            proc.join(1.0)


def preload_in_forkserver(ctx: Any) -> bool:
    """Under the ``forkserver`` start method (Python 3.14's default on Linux), have the server import the
    reader's modules once, so that each reader forked from it need not; whether the server is yet to start (then
    with them: NOTE [fork server] in ``_sys.forks``).

    Each reader imported numpy and the library itself: 0.2 s more per pool start than ``fork`` (a shuffled
    epoch of 256 MiB: 0.50 s against 0.27; with the preload 0.30 s). Then each still imported h5py and the
    codecs when it opened its file, 25-30 ms a reader (8 readers on 2 CPUs: the first block 0.10-0.14 s
    after ``get_queue``, against 0.01-0.02 with ``fork``); so the server also imports those of
    :data:`READING_LIBRARIES` that this process has imported (its engines read with those), once. The
    server's list is added to, not replaced (``__main__`` is on it by default); it is read from where
    multiprocessing keeps it, since there is no getter, and a server already running keeps the list it
    started with.
    """
    if ctx.get_start_method() != "forkserver":
        return False
    from multiprocessing import forkserver

    current = list(getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None) or ["__main__"])
    wanted = [reader_main.__module__] + [name for name in READING_LIBRARIES if name in sys.modules]
    missing = [name for name in wanted if name not in current]
    if missing:
        ctx.set_forkserver_preload(current + missing)
    return running_forkserver() is None


#: Every pool that started readers, for the fork hook below.
_POOLS: "weakref.WeakSet[ReaderPool]" = weakref.WeakSet()


def _disown_readers() -> None:
    """In a forked child: the readers are not its processes (NOTE [forked children])."""
    children = getattr(multiprocessing.process, "_children", None)
    if children is not None:
        for pool in list(_POOLS):
            children.difference_update(pool._procs)


os.register_at_fork(after_in_child=_disown_readers)


#: What a Reader's user in a daemonic process (a DataLoader's worker) can do instead: it may start no readers there.
READER_ELSEWHERE = (
    "make a Reader with n_procs=0 in each worker (the default there), which reads in the worker itself: lazily, in "
    "the Dataset's __getitem__ on first use or in worker_init_fn (see 'A PyTorch map-style Dataset' in the "
    "random-access docs)"
)

#: What a forked child that may start processes (a pre-fork server's worker) does with its parent's Reader instead.
READER_ANEW = (
    "make a Reader anew in this process; a server that forks its workers (gunicorn with --preload, say) makes one in "
    "each worker (gunicorn's post_fork hook, or at a worker's first request), not in the parent before it forks"
)


def check_working_directory(start_method: str) -> None:
    """``FileNotFoundError`` saying so where the working directory was removed: multiprocessing's spawn and
    forkserver ask for it to start a process, and failed with a bare "No such file or directory"."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise FileNotFoundError(
            errno.ENOENT, f"this process's working directory was removed, and readers started by {start_method} need "
            "one: os.chdir() to a directory that exists first, or give start_method='fork'") from None


class ReaderPool:
    """Reader processes running one loop, and what the consumer knows of them; owned by one front end.

    Make the pool, make the loop's process-shared objects from :attr:`ctx`,
    then :meth:`start`. Thread-safe: several threads may look at once.
    """

    def __init__(
        self, start_method: "str | None", filename: str, path: str = "", name: str = "reader",
        semaphores: str = "The readers' semaphores", *, n_readers: int,
    ) -> None:
        """For ``n_readers`` readers; ``semaphores``: what a /dev/shm too full for the pool's semaphores calls them
        (``semaphores_for``).

        ``RuntimeError`` in a daemonic process (a ``multiprocessing.Pool``'s or a DataLoader's worker), which
        multiprocessing allows no child: before anything is made, where its assert would come at the first start.
        """
        if multiprocessing.current_process().daemon:
            where = f"Reading {path!r} of {filename!r}" if path else f"A Reader of {filename!r}"
            instead = ("pass n_procs=0 to read in this process (leaving n_procs out does that here)" if name == "reader"
                       else READER_ELSEWHERE)
            raise RuntimeError(
                f"{where} needs reader processes, but this process is daemonic (a multiprocessing.Pool or DataLoader "
                f"worker, say), and multiprocessing lets a daemonic process start none: {instead}."
            )
        self.ctx = cast("ForkContext | ForkServerContext | SpawnContext",  # get_context(str) is typed their base
                        multiprocessing.get_context(default_start_method(start_method)))  # the default's, not fixing it
        method = self.ctx.get_start_method()
        unguarded = None if method == "fork" else unguarded_main_call()
        if unguarded is not None:
            raise RuntimeError(
                f"{unguarded[0]}, line {unguarded[1]}, reads {filename!r} with reader processes from the script's top "
                f"level, and readers started by {method} (forkserver is the default from Python 3.14 on Linux, spawn "
                "on macOS) run the script again, which would start readers of theirs: put the script's code under "
                "'if __name__ == \"__main__\":' (NOTE [the main script again] in multitables._sys.forks), or give "
                "start_method='fork'"
            )
        self._new_server = preload_in_forkserver(self.ctx)  # the readers' start starts it
        self.filename, self.path, self._name = filename, path, name
        #: The process that started the readers, the one that may use and stop them (NOTE [forked children]).
        self.owner = os.getpid()
        with semaphores_for(semaphores):
            #: One a reader, released by it once per segment it maps: the attach barrier, which tells who mapped.
            self.attached = tuple(self.ctx.Semaphore(0) for _ in range(n_readers))
        self.closed = False
        self._procs: list[Any] = []
        self._pids: list[int] = []  # kept: a closed process object no longer says its pid
        self._conns: list[Any] = []
        self._listening: dict[Any, int] = {}  # report pipe -> reader, until EOF
        self._watched: dict[Any, int] = {}  # sentinel -> reader, until it ends
        #: Readers that ended: index -> (pid, exit code, its own report or None).
        self.ended: dict[int, tuple[int, "int | None", "FailureReport | None"]] = {}
        self._own: dict[int, FailureReport] = {}  # a reader's own report, until its end is seen
        self._tagged: dict[int, FailureReport] = {}  # tag >= 0 -> report
        self._lock = threading.RLock()
        self._poller: Any = None
        self._poll_fds: frozenset[int] = frozenset()  # what _poller watches (see _quiet)

    def start(
        self, loop: Callable[..., None], args: "list[tuple[Any, ...]]", files: "str | tuple[str, ...]" = (),
        segments: tuple[str, ...] = (), semaphores: "tuple[Any, ...]" = (),
    ) -> None:
        """Start one reader per entry of ``args``, each running ``loop(reader, *args[i])``; ``files``: those they read,
        refused if this process writes one of them and the readers are forked from it (NOTE [files written here]);
        ``segments`` (the names each is to map) and ``semaphores`` (those in ``args``): what it unlinks if it finds this
        process gone (NOTE [stuck orphans]; :meth:`unlink_semaphores` unlinks the semaphores once all started)."""
        method = self.ctx.get_start_method()
        if method == "fork":
            refuse_written_here((files,) if isinstance(files, str) else files)
            before_fork()  # no unmapping on a thread, no reading library's lock held by one (NOTE [forking among threads])
        else:
            check_working_directory(method)
            settle_releases()  # no unmapping on a thread while a process starts (NOTE [release off the path])
        if len(args) != len(self.attached):
            raise ValueError(f"{len(args)} readers to start in a pool made for {len(self.attached)}")
        _POOLS.add(self)
        self._semaphores: "tuple[Any, ...]" = self.attached + tuple(semaphores)
        me, n, names = os.getpid(), len(args), semaphore_names(self._semaphores)
        me_start = process_start_time(me)
        for i, reader_args in enumerate(args):
            identity, send = ReaderIdentity(i, n, self.filename, me, me_start, segments, names), None
            try:
                with signals_deferred():  # a Ctrl-C between os.pipe and its fds' owners leaked them
                    recv, send = self.ctx.Pipe(duplex=False)
                    self._conns.append(recv)
                    self._listening[recv] = i
                proc = self.ctx.Process(
                    target=reader_main, args=(loop, identity, Sealed((self.attached[i], reader_args)), send),
                    name=f"multitables-{self._name}-{i}", daemon=True,
                )
                # Held in this thread (for the child's sake) and, in Python, until the reader is recorded: a Ctrl-C
                # another thread takes runs Python's handler here at once, between any two instructions.
                with signals_deferred(), sigint_held_for_children(), collector_paused_for_readers():
                    proc.start()
                    # Recorded before a Ctrl-C held meanwhile is let through: closing the pool then stops it too.
                    self._procs.append(proc)
                    self._pids.append(cast(int, proc.pid))  # started: an int
                    self._watched[proc.sentinel] = i
            except OSError as exc:  # EAGAIN: past ulimit -u; EMFILE: past ulimit -n
                raise type(exc)(exc.errno, f"could not start {self._name} process {i} of {n} for {self.filename!r}: "
                                           f"{exc.strerror} (a limit of processes or of open files?)") from exc
            finally:
                if send is not None:
                    send.close()
        if self._new_server:
            note_ready_server(running_forkserver())

    def unlink_semaphores(self) -> None:
        """Unlink the readers' semaphores' names once every reader passed the start barrier (NOTE [semaphore names])."""
        unlink_names(self._semaphores)

    @property
    def n_readers(self) -> int:
        return len(self._procs)

    @property
    def pids(self) -> list[int]:
        """Process ids of the readers (also once they are gone)."""
        return list(self._pids)

    @property
    def running(self) -> int:
        """Readers whose end the pool has not seen yet."""
        return len(self._watched)

    @property
    def foreign(self) -> bool:
        """Whether this process is not the one that started the readers: a forked child (NOTE [forked children])."""
        return os.getpid() != self.owner

    def check_owner(self) -> None:
        """Raise ``RuntimeError`` in a process that did not start the readers (NOTE [forked children])."""
        if not self.foreign:
            return
        reader = self._name == "request"  # a Reader's, not a stream's or batches'
        if multiprocessing.current_process().daemon:
            instead = ("; being daemonic (a DataLoader's or a Pool's worker), it may start none of its own either: "
                       + (READER_ELSEWHERE if reader else "read in the parent, or here with a stream's or batches' n_procs=0"))
        else:
            instead = ": " + (READER_ANEW if reader else "make the stream or batches anew here")
        raise RuntimeError(
            f"the {self._name} processes of {self.filename!r} belong to process {self.owner}, which made them; "
            f"this process ({os.getpid()}) is a fork of it and cannot use them" + instead
        )

    # -- watching ----------------------------------------------------------------
    def look(self) -> None:
        """Collect waiting reports and the readers that ended (NOTE [failure reports]); cheap, call it every block."""
        with self._lock:
            if self.closed or self.foreign or self._quiet():
                return
            self._drain(0.0)
            if not self._watched:
                return
            for sentinel in multiprocessing.connection.wait(list(self._watched), timeout=0):
                i = self._watched.pop(sentinel)
                proc = self._procs[i]
                proc.join(TICK)
                # A reader sends its report before it exits; wait for one that is still in flight.
                self._drain(REPORT_TIMEOUT if proc.exitcode else 0.0, until=i)
                self.ended[i] = (proc.pid, proc.exitcode, self._own.pop(i, None))

    def _quiet(self) -> bool:
        """No report waiting and no reader ended: one poll(2) on descriptors registered once (``multiprocessing.
        connection.wait`` registers every one anew at each call: with 16 readers, 0.1 ms a look, a sixth of the
        consumer's time a block on the lent H100: BENCHMARKS.md, issue 30). False where it cannot tell (no
        ``select.poll``): look the long way."""
        fds = frozenset([c.fileno() for c in self._listening] + list(self._watched))
        if fds != self._poll_fds:
            if not hasattr(select, "poll"):  # pragma: no cover - Windows
                return False
            self._poller, self._poll_fds = select.poll(), fds
            for fd in fds:
                self._poller.register(fd, select.POLLIN)
        return not self._poller.poll(0)

    def _drain(self, timeout: float, until: "int | None" = None) -> None:
        """Read every report waiting: wait up to ``timeout`` s for a first one, or, with ``until``, for that reader's own."""
        deadline = time.monotonic() + timeout
        while self._listening:
            if until is not None and (until in self._own or until not in self._listening.values()):
                return
            ready = cast("list[Connection]",  # of the report pipes listened to: Connections
                         multiprocessing.connection.wait(list(self._listening), timeout=max(0.0, deadline - time.monotonic())))
            if not ready:
                return
            for conn in ready:
                i = self._listening[conn]
                try:
                    tag, failure = conn.recv()
                except (EOFError, OSError):
                    del self._listening[conn]
                    continue
                except Exception as exc:  # a report that does not unpickle here
                    tag, failure = -1, FailureReport.from_exception(
                        RuntimeError(f"its failure report could not be read here: {exc!r}"),
                        i, self._procs[i].pid, self.filename, self.path, None,
                    )
                if tag < 0:
                    self._own[i] = failure
                else:
                    self._tagged[tag] = failure
            if until is None:
                deadline = 0.0  # one wait at most; then only what is already there

    def own_report(self, timeout: float) -> "FailureReport | None":
        """The first reader's own failure report that arrives within ``timeout`` s (it need not have exited yet)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                self._drain(0.0)
                if self._own:
                    return self._own[min(self._own)]
                reported = [report for _pid, _code, report in self.ended.values() if report is not None]
                if reported:
                    return reported[0]
                if not self._listening or time.monotonic() > deadline:
                    return None
                self._drain(TICK)

    def tagged_report(self, tag: int, timeout: float) -> "FailureReport | None":
        """The report for ``tag`` (a request), waiting up to ``timeout`` s for it; None if none came."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                got = self._tagged.pop(tag, None)
                if got is not None or time.monotonic() > deadline or not self._listening:
                    return got
                self._drain(TICK)

    def forget(self, tag: int) -> None:
        """Drop the report for ``tag``, if any: nobody will ask for it."""
        with self._lock:
            self._drain(0.0)
            self._tagged.pop(tag, None)

    def end_error(self, i: int, path: "str | None" = None) -> "ReaderError | None":
        """The error reader ``i``'s end means, if it ended with a failure: its report, or a silent death."""
        pid, exitcode, failure = self.ended.get(i, (0, 0, None))
        if failure is not None:
            return failure.to_exception()
        if exitcode == 0:
            return None
        return died_error(i, pid, exitcode, self.filename, self.path if path is None else path)

    def wait_attached(self, what: str, check: Callable[[], object]) -> None:
        """Wait until every reader has mapped one more segment, calling ``check`` every tick. A reader that ended
        first is an error at once, not after the timeout: its own (``check``'s), or, with no report (one that found
        its consumer gone, or whose code called ``os._exit(0)``: exit 0), one naming it."""
        deadline = time.monotonic() + ATTACH_TIMEOUT
        waiting = list(range(self.n_readers))
        while waiting:
            if self.attached[waiting[0]].acquire(timeout=TICK):
                del waiting[0]
                continue
            check()
            self.look()
            for i in [i for i in waiting if i in self.ended]:
                if self.attached[i].acquire(False):  # it mapped just before it ended
                    waiting.remove(i)
                    continue
                check()  # a failure, as the front end tells it
                raise self.end_error(i) or self._unmapped_error(i, what, self.n_readers - len(waiting))
            if time.monotonic() > deadline:
                raise ReaderError(
                    f"the {self._name} processes of {self.filename!r} did not {what} within {ATTACH_TIMEOUT:.0f} s"
                )

    def _unmapped_error(self, i: int, what: str, done: int) -> ReaderError:
        """The error for reader ``i``, which ended with nothing to report before it could ``what``."""
        pid, exitcode, _ = self.ended[i]
        exc = ReaderError(
            f"{self._name} process {i} (pid {pid}) of {self.filename!r} ended with exit code {exitcode} before it could "
            f"{what}, with no error to report ({len(self.ended)} of {self.n_readers} ended; {done} could {what})"
        )
        exc.reader_index, exc.pid, exc.filename, exc.path, exc.exitcode = i, pid, self.filename, self.path, exitcode
        return exc

    def wait_any(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a reader to end."""
        watched = list(self._watched)
        if watched and timeout > 0:
            multiprocessing.connection.wait(watched, timeout=timeout)

    # -- stopping ----------------------------------------------------------------
    def close(self, tell_stop: Callable[[], None]) -> None:
        """Stop every reader and close the pool's fds (NOTE [shutdown] 1-4); idempotent."""
        if self.closed:
            return
        if self.foreign:  # a fork's copy: its pipes only, the readers are the owner's
            with self._lock:
                self.closed = True
                for conn in self._conns:
                    conn.close()
                self._listening.clear()
                self._watched.clear()
            return
        tell_stop()
        end_processes(self._procs)
        with self._lock:  # another thread may be looking (a Reader's notify thread)
            self.closed = True
            for conn in self._conns:
                conn.close()
            self._listening.clear()
            for proc in self._procs:
                if proc.exitcode is not None:
                    proc.close()
            self._watched.clear()
