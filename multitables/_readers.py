"""The consumer's side of a pool of reader processes: start, watch, report, stop.

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

    The segment name is normally unlinked much earlier, as soon as every
    reader has attached (NOTE [segment lifetime]). Readers, for their part,
    watch that the consumer lives (pid and start time) and exit within
    ~0.5 s of its death.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import time
from typing import Any

from ._node import NodeInfo
from ._plan import BlockPlan
from ._reader_process import ReaderSettings, process_start_time, run
from ._ring import TICK, Ring, RingLayout, RingSync
from .errors import ReaderError, _reader_died, _ReaderFailure

#: Seconds readers get to stop by themselves before they are terminated.
JOIN_TIMEOUT = 2.0
#: Seconds the consumer waits for every reader to map the ring.
ATTACH_TIMEOUT = 120.0


class ReaderPool:
    """``n_procs`` reader processes filling one ring; owned by one queue."""

    def __init__(
        self,
        node: NodeInfo,
        engine: str,
        open_kwargs: dict[str, Any],
        plan: BlockPlan,
        n_procs: int,
        n_slots: int,
        start_method: "str | None",
    ) -> None:
        self._closed = False
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._watched: dict[Any, int] = {}  # sentinel -> reader index
        self.path = node.path
        ctx = multiprocessing.get_context(start_method)
        layout = RingLayout(n_slots, plan.block_size, node.row_shape, node.dtype)
        sync = RingSync.create(ctx, n_slots)
        self.ring = Ring.create(layout, sync)  # may raise ShmSpaceError; nothing started yet
        try:
            me = os.getpid()
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
                    parent_start=process_start_time(me),
                )
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=run, args=(settings, sync, send), name=f"multitables-reader-{i}", daemon=True)
                self._conns.append(recv)
                proc.start()
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
                    raise ReaderError(f"reader processes for {self.path!r} did not start within {ATTACH_TIMEOUT:.0f} s")

    def check(self) -> bool:
        """Raise the error of a reader that failed or died; True otherwise. Cheap enough to call per block."""
        if self.ring.failed:
            self._raise_reported()
        if self._watched:
            for sentinel in multiprocessing.connection.wait(list(self._watched), timeout=0):
                i = self._watched.pop(sentinel)  # type: ignore[call-overload]
                proc = self._procs[i]
                proc.join(TICK)
                if proc.exitcode != 0:
                    self._raise_reported()
                    raise _reader_died(i, proc.pid, proc.exitcode, self.path)
                if self.ring.failed:
                    self._raise_reported()
        return True

    def _raise_reported(self) -> None:
        """Raise a reader's own report of its failure, if one came (waits up to 1 s for it)."""
        ready = multiprocessing.connection.wait(self._conns, timeout=1.0)
        for conn in ready:
            try:
                failure: _ReaderFailure = conn.recv()
            except (EOFError, OSError):
                continue
            raise failure.to_exception()

    def close(self) -> None:
        """Stop every reader and free everything; see NOTE [shutdown]. Idempotent."""
        if self._closed:
            return
        self._closed = True
        ring = self.ring
        ring.stop()
        ring.wake_readers(len(self._procs))
        deadline = time.monotonic() + JOIN_TIMEOUT
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for escalate in ("terminate", "kill"):
            alive = [p for p in self._procs if p.exitcode is None]
            for proc in alive:
                getattr(proc, escalate)()
            for proc in alive:
                proc.join(1.0)
        for conn in self._conns:
            conn.close()
        for proc in self._procs:
            if proc.exitcode is not None:
                proc.close()
        self._watched.clear()
        ring.segment.unlink()
        ring.close()
