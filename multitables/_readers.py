"""The consumer's side of a pool of reader processes: start, watch, report, stop.

NOTE [failure reports]
    Modelled on PyTorch's DataLoader. A reader that raises catches the
    exception at the top of :func:`~multitables._reader_process.run`, sets the
    ring's error flag, wakes the consumer, and sends a ``_ReaderFailure`` (the
    exception's type *name*, message and formatted traceback, the reader's
    index and pid, the file, the dataset and the row range it was reading)
    over its own one-way pipe, then exits. A reader that dies without a word
    (SIGKILL, a crash in C) shows up as its process sentinel becoming ready
    with a non-zero exit code.

    The consumer's :meth:`ReaderPool.check` runs before every wait for a block
    (every ``TICK`` while it waits) and looks at both: the error flag (then it
    waits up to ``REPORT_TIMEOUT`` s for the report) and the sentinels (then
    it reads that reader's pipe without waiting). It raises the report as a
    ``ReaderError`` that is also the original type, or, for a silent death, a
    ``ReaderError`` naming the reader, its pid and exit code (and signal). If
    every reader has ended normally yet no block is ready, the block the
    consumer waits for can never come, and that is an error too rather than a
    hang. The first error is kept: the pool tells its readers to stop at once
    (without waiting for them), and every later ``check()`` raises the same
    error again.

NOTE [shutdown]
    ``ReaderPool.close()`` is the one way a pool ends, whatever ended it (the
    pass is over, ``close()``, ``break``, an exception in the loop body,
    garbage collection, interpreter exit, a reader error). It is idempotent
    and escalates:

    1. set the stop flag in the ring and wake readers blocked on a slot;
    2. join all readers for up to ``JOIN_TIMEOUT`` s in all (a reader checks
       the flag every ``TICK`` and between blocks);
    3. SIGTERM the ones still alive, join briefly; then SIGKILL and join;
    4. close the error pipes and the Process objects (their fds), unlink the
       segment name if it was not unlinked yet, unmap the ring.

    Step 1 comes first and cannot block, so even a ``close()`` cut short (a
    second Ctrl-C) leaves readers that stop by themselves within a ``TICK``.
    Step 1 alone also runs as soon as a reader error is seen (NOTE [failure
    reports]), and the error is raised at once: joining the survivors first
    kept it from the user for up to ``JOIN_TIMEOUT``. They stop by
    themselves meanwhile, and ``close()`` (a ``with``, the finalizer) ends
    them as for any other end.

    The segment name is normally unlinked much earlier, as soon as every
    reader has attached (NOTE [segment lifetime]). Readers, for their part,
    watch that the consumer lives (pid and start time) and exit within
    ~0.5 s of its death; one that finds the consumer gone unlinks the name
    itself, in case the consumer died before it could.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import time
from typing import Any

from ._node import NodeInfo, file_signature
from ._plan import BlockPlan, RangePlan
from ._reader_process import ReaderSettings, process_start_time, run
from ._signals import sigint_held_for_children
from ._ring import TICK, Ring, RingLayout, RingSync
from ._shm import check_space
from .errors import ReaderError, StreamClosedError, _reader_died, _ReaderFailure

#: Seconds readers get to stop by themselves before they are terminated.
JOIN_TIMEOUT = 2.0
#: Seconds the consumer waits for every reader (or request worker) to map a segment.
ATTACH_TIMEOUT = 120.0
#: Seconds the consumer waits for the report of a process that flagged a failure.
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


class ReaderPool:
    """``n_procs`` reader processes filling one ring; owned by one queue."""

    def __init__(
        self,
        node: NodeInfo,
        engine: str,
        open_kwargs: dict[str, Any],
        plan: "BlockPlan | RangePlan",
        n_procs: int,
        n_slots: int,
        start_method: "str | None",
        cache: str = "page",
    ) -> None:
        self._closed = False
        self._stopped = False
        self._error: "ReaderError | None" = None
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._open_conns: set[int] = set()  # readers whose pipe has not reached EOF
        self._watched: dict[Any, int] = {}  # sentinel -> reader index
        self.filename = node.filename
        self.path = node.path
        ctx = multiprocessing.get_context(start_method)
        layout = RingLayout(n_slots, plan.block_size, node.row_shape, node.dtype)
        check_space(layout.nbytes)  # before anything is created; Ring.create checks again
        signature = file_signature(node.filename)
        sync = RingSync.create(ctx, n_slots)
        self.ring = Ring.create(layout, sync)  # may raise ShmSpaceError; nothing started yet
        try:
            me = os.getpid()
            me_start = process_start_time(me)
            for i in range(n_procs):
                settings = ReaderSettings(
                    index=i,
                    node=node,
                    engine=engine,
                    open_kwargs=open_kwargs,
                    plan=plan,
                    shm_name=self.ring.segment.name,
                    layout=layout,
                    parent_pid=me,
                    parent_start=me_start,
                    file_signature=signature,
                    cache=cache,
                    n_readers=n_procs,
                )
                recv, send = ctx.Pipe(duplex=False)
                self._conns.append(recv)
                self._open_conns.add(i)
                try:
                    proc = ctx.Process(target=run, args=(settings, sync, send), name=f"multitables-reader-{i}", daemon=True)
                    with sigint_held_for_children():
                        proc.start()
                finally:
                    send.close()
                self._procs.append(proc)
                self._watched[proc.sentinel] = i
            self._wait_attached(n_procs)
        except BaseException:
            self.close()
            raise
        finally:
            self.ring.segment.unlink()

    @property
    def pids(self) -> list[int]:
        """Process ids of the readers."""
        return [p.pid for p in self._procs]

    def _wait_attached(self, n: int) -> None:
        deadline = time.monotonic() + ATTACH_TIMEOUT
        for _ in range(n):
            while not self.ring.sync.attached.acquire(timeout=TICK):
                self.check()
                if time.monotonic() > deadline:
                    raise ReaderError(
                        f"reader processes for {self.path!r} in {self.filename!r} did not start within "
                        f"{ATTACH_TIMEOUT:.0f} s"
                    )

    def check(self) -> bool:
        """Raise the error of a reader that failed or died; True otherwise. Cheap enough to call per block.

        See NOTE [failure reports].
        """
        if self._error is not None:
            raise self._error.with_traceback(None)
        if self._closed:  # closed from another thread while this one waited for a block
            raise StreamClosedError(f"the stream of {self.path!r} in {self.filename!r} was closed")
        try:
            self._look()
        except ReaderError as exc:
            self._error = exc
            self._tell_stop()  # raise first: close() joins the others (NOTE [shutdown])
            raise
        return True

    def _look(self) -> None:
        ring = self.ring
        if ring.failed:
            self._raise_reported(range(len(self._conns)), REPORT_TIMEOUT)
            raise ReaderError(f"a reader of {self.path!r} in {self.filename!r} failed without sending a report")
        if not self._watched:
            return
        for sentinel in multiprocessing.connection.wait(list(self._watched), timeout=0):
            i = self._watched.pop(sentinel, None)  # type: ignore[call-overload]
            if i is None:  # another thread (a guard's release) got to it first
                continue
            proc = self._procs[i]
            proc.join(TICK)
            self._raise_reported((i,), 0.0)  # a report, if any, is in the pipe before the exit
            if ring.failed:  # another reader flagged a failure meanwhile
                self._raise_reported(range(len(self._conns)), REPORT_TIMEOUT)
            if proc.exitcode != 0:
                raise _reader_died(i, proc.pid, proc.exitcode, self.filename, self.path)
        if not self._watched and not ring.stopped and ring.ready_count() == 0:
            raise ReaderError(
                f"every reader of {self.path!r} in {self.filename!r} has exited, but the block the "
                f"consumer waits for never came"
            )

    def _raise_reported(self, readers: "range | tuple[int, ...]", timeout: float) -> None:
        """Raise the first report that comes from ``readers`` within ``timeout`` s; return if none does."""
        deadline = time.monotonic() + timeout
        while True:
            conns = {self._conns[i]: i for i in readers if i in self._open_conns}
            if not conns:
                return
            ready = multiprocessing.connection.wait(list(conns), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                return
            for conn in ready:
                try:
                    failure: _ReaderFailure = conn.recv()
                except (EOFError, OSError):
                    self._open_conns.discard(conns[conn])  # ended without a report
                    continue
                except Exception as exc:  # a report that does not unpickle here
                    i = conns[conn]
                    err = ReaderError(
                        f"reader {i} of {self.path!r} in {self.filename!r} failed, and its report could not "
                        f"be read: {exc!r}"
                    )
                    err.reader_index, err.filename, err.path = i, self.filename, self.path
                    raise err from exc
                raise failure.to_exception()

    def _stop_readers(self) -> None:
        """Steps 1-3 of NOTE [shutdown]: stop, join, terminate, kill. Idempotent."""
        if self._stopped:
            return
        self._tell_stop()
        end_processes(self._procs)
        self._stopped = True

    def _tell_stop(self) -> None:
        """Step 1 of NOTE [shutdown], which cannot block. Idempotent (only the consumer sets the flag)."""
        if not self.ring.stopped:
            self.ring.stop()
            self.ring.wake_readers(len(self._procs))

    def close(self) -> None:
        """Stop every reader and free everything; see NOTE [shutdown]. Idempotent."""
        if self._closed:
            return
        self._stop_readers()
        self._closed = True
        for conn in self._conns:
            conn.close()
        for proc in self._procs:
            if proc.exitcode is not None:
                proc.close()
        self._watched.clear()
        self.ring.segment.unlink()
        self.ring.close()
