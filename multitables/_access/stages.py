"""Stages: shared memory that holds the result of one request at a time, and pools of them.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable


from .._shm.stagemap import FAILED, PENDING, StageLayout, StageMap
from .._shm.ring import TICK
from ..errors import SharedMemoryError, StreamClosedError

from .readercore import ReaderCore, not_pickled
from .request import Request
if TYPE_CHECKING:
    import asyncio  # at run time where a loop runs: importing it costs 20 ms, and ssl with it

    from ..reader import Reader  # bound at run time: NOTE [annotations from above] in ``multitables/__init__.py``

class Stage:
    """Shared memory that holds the result of one request at a time; make one with :meth:`Dataset.create_stage`.

    A stage is held from :meth:`Reader.request` until its future's data is
    released (after :meth:`Future.get`, at the end of a ``with
    future.get_unsafe()`` or ``get_proxy()``, by :meth:`Future.release`, or
    when the future is garbage-collected). Close it when done (or use it in a
    ``with``); it is also closed with its reader or when collected.
    """

    def __init__(self, reader: Reader, n_rows: int, nbytes: int) -> None:
        core = reader._live()
        core.check_open()
        self._reader = reader
        #: Rows of the dataset it was made for that it holds.
        self.n_rows: int = n_rows
        #: Bytes of data it holds; a request fits if its result (and the rows it reads) fit.
        self.nbytes: int = nbytes
        # Its pool, weakly: the pool holds its stages, and a stage holding the pool back would make a cycle that keeps
        # the reader (and its reader processes) alive until the cycle collector runs.
        self._pool: "weakref.ref[StagePool] | None" = None
        self._hold = threading.Lock()  # held from request to release
        self._last: "tuple[int, list[int], bool] | None" = None  # (request, readers, collected)
        # Room for the positions of as many scattered rows as 8-byte rows would fill the data, allocated as requests
        # need it (NOTE [stage room] in ``_shm.stagemap``): unused room costs nothing.
        layout = StageLayout(max(n_rows, nbytes // 8), nbytes)
        segment = core.pool.stage_segment(layout)
        try:
            with core.lock:
                core.detach_dropped()
                if not core.free_stage_ids:
                    raise RuntimeError(
                        f"this Reader already has {len(core.stages)} stages open (max_stages); close stages no longer "
                        f"needed, or make the Reader with a larger max_stages"
                    )
                self._stage_id = core.free_stage_ids.pop()
                self._map = StageMap(segment, layout, writable=True)  # the data is the consumer's while it holds it
                try:
                    core.pool.attach(self._stage_id, self._map)
                except BaseException:
                    core.free_stage_ids.append(self._stage_id)
                    self._map.close()  # its views first: the segment is unmapped below
                    raise
                core.stages[self._stage_id] = self._map
        except BaseException:
            segment.close()
            raise
        finally:
            segment.unlink()  # every reader has it mapped (NOTE [segment lifetime]), or the stage failed
        self._closed = False
        self._finalizer = weakref.finalize(self, drop_stage, core, self._stage_id, self._map)

    @property
    def closed(self) -> bool:
        """Whether it can take no more requests (it, or its reader, was closed)."""
        return self._closed or self._reader.closed

    @property
    def _freed(self) -> bool:
        """Whether its memory is gone (closed, or its reader stopped)."""
        return self._closed or self._map.words is None

    def _check_fits(self, request: Request) -> None:
        n = request.n_rows_read
        if n is None:
            return  # a query: the reader checks its result
        need = n * request._node.row_nbytes
        if need > self.nbytes:
            raise SharedMemoryError(
                f"{request!r} reads {n} rows ({need} bytes) but the stage holds {self.nbytes} bytes; use a larger "
                f"stage or split the request"
            )
        plan = request._plan
        if plan is not None and plan.rows is not None and n > self._map.layout.max_rows:
            raise SharedMemoryError(
                f"{request!r} reads {n} scattered rows but the stage has room for the positions of "
                f"{self._map.layout.max_rows}; use a larger stage or split the request"
            )

    def _claim(self) -> "Stage":
        if self.closed:
            if not self._closed:  # its Reader was, by another thread since request() looked at it perhaps: say so
                self._reader._live().check_not_closed()
            raise StreamClosedError("the stage is closed")
        if not self._hold.acquire(blocking=False):
            raise RuntimeError(
                "the stage still holds the data of an earlier request; release it first (get() it, leave its "
                "`with`, or call future.release()), or use a StagePool"
            )
        try:
            self._settle()
        except BaseException:
            self._hold.release()
            raise
        return self

    def _settle(self) -> None:
        """Wait until every share of the last request is finished, so its readers no longer write here."""
        if self._last is None:
            return
        req, readers, collected = self._last
        core = self._reader._live()
        channel = core.pool.channels[self._stage_id]
        while PENDING in self._status(len(readers)):
            if channel.acquire(timeout=TICK):
                continue
            core.pool.look()
            core.check_open()
        if not collected and FAILED in self._status(len(readers)):
            core.pool.forget(req)
        self._last = None

    def _status(self, n_shares: int) -> list[int]:
        """The status of the first ``n_shares`` shares of the request in the stage."""
        try:
            return self._map.status(n_shares)
        except StreamClosedError:
            core = self._reader._core
            if core is not None:  # freed by stop() from another thread meanwhile: say that, not "the stage is closed"
                core.check_not_stopped()
                if not self._closed:  # freed at the close of the Reader (n_procs=0: at once), held by no future
                    core.check_not_closed()
            raise

    def _give_back(self) -> None:
        """Release the hold (never blocks: may run in a finalizer)."""
        try:
            self._hold.release()
        except RuntimeError:
            return
        core = self._reader._core
        if core is not None:
            core.give_back(self._stage_id)
        pool = self._pool() if self._pool is not None else None
        if pool is not None:  # a pool dropped meanwhile hands out no stage again
            pool._free.put(self)
            if pool._waiting:
                pool._wake()

    def close(self) -> None:
        """Free the shared memory (idempotent). Data still held from it stays readable until dropped."""
        if not self._closed:
            self._closed = True
            self._finalizer()
            core = self._reader._core
            if core is not None and not core.closed:
                with core.lock:
                    core.detach_dropped()

    def __enter__(self) -> "Stage":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    __reduce__ = not_pickled  # its readers and shared memory are this process's

    def __repr__(self) -> str:
        return f"<multitables.Stage {self.n_rows} rows, {self.nbytes} bytes{' (closed)' if self.closed else ''}>"


def drop_stage(core: ReaderCore, stage_id: int, smap: StageMap) -> None:
    """Finalizer of a stage: unmap here, and queue the readers' unmapping for the next call."""
    if core.stages.pop(stage_id, None) is not None:
        smap.close()
        core.dropped.put(stage_id)


class StagePool:
    """Stages handed out to requests in turn; make one with :meth:`Dataset.create_stage_pool`.

    :meth:`Reader.request` takes a free stage, waiting while all are held; a
    stage comes back when its future's data is released.
    """

    def __init__(self, stages: "list[Stage]") -> None:
        self._stages = stages
        self._reader = stages[0]._reader
        self._free: "queue.SimpleQueue[Stage]" = queue.SimpleQueue()
        # Tasks of event loops waiting for a free stage, first come first served: the first is woken when a stage is
        # given back (NOTE [awaited futures] in ``_access.awaiting``).
        self._waiting: "collections.deque[Waiting]" = collections.deque()
        for stage in stages:
            stage._pool = weakref.ref(self)
            self._free.put(stage)
        #: Most rows a request may read into a stage of the pool.
        self.n_rows: int = stages[0].n_rows
        #: Bytes of data each stage holds.
        self.nbytes: int = stages[0].nbytes

    def __len__(self) -> int:
        return len(self._stages)

    @property
    def closed(self) -> bool:
        return any(s.closed for s in self._stages)

    def _check_fits(self, request: Request) -> None:
        self._stages[0]._check_fits(request)

    def _take(self, timeout: "float | None") -> Stage:
        deadline = None if timeout is None else time.monotonic() + timeout
        core = self._reader._live()
        while True:
            if self.closed:
                if not any(s._closed for s in self._stages):  # its Reader was, by another thread perhaps: say so
                    core.check_not_closed()
                raise StreamClosedError("the stage pool is closed")
            wait = TICK if deadline is None else max(0.0, min(TICK, deadline - time.monotonic()))
            try:
                stage = self._free.get(timeout=wait)
            except queue.Empty:
                core.pool.look()
                core.check_open()
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"no stage of the pool came free within {timeout} s: all {len(self)} are held by futures "
                        f"whose data was not released"
                    ) from None
                continue
            if not stage._hold.acquire(blocking=False):  # pragma: no cover - a stage is in the queue only when free
                continue
            try:
                stage._settle()
            except BaseException:
                stage._give_back()
                raise
            return stage

    def _wake(self) -> None:
        """Wake the first task waiting for a stage (from any thread, a finalizer's too: never blocks)."""
        while True:
            try:
                head = self._waiting[0]
            except IndexError:
                return
            try:
                head.loop.call_soon_threadsafe(head.wake)
                return
            except RuntimeError:  # its loop is closed, and the task with it: the next one
                try:
                    self._waiting.remove(head)
                except ValueError:
                    pass

    def close(self) -> None:
        """Close every stage of the pool (idempotent)."""
        for stage in self._stages:
            stage.close()

    def __enter__(self) -> "StagePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    __reduce__ = not_pickled  # its readers and shared memory are this process's

    def __repr__(self) -> str:
        return f"<multitables.StagePool {len(self)} stages of {self.n_rows} rows>"


class Waiting:
    """A task waiting in its event loop for a stage of a pool (NOTE [awaited futures] in ``_access.awaiting``)."""

    __slots__ = ("loop", "waker")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waker: "asyncio.Future[None] | None" = None

    def wake(self) -> None:
        """In its loop: end its :meth:`sleep` (a wake-up while it is awake is not needed: it is about to look)."""
        if self.waker is not None and not self.waker.done():
            self.waker.set_result(None)

    async def sleep(self, seconds: "float | None", unless: "Callable[[], bool]") -> None:
        """Wait until woken, or ``seconds`` have passed (None: no limit); not at all if ``unless()`` is true once
        ready to be woken (a wake-up that came before then found no one to wake)."""
        self.waker = self.loop.create_future()
        if unless():
            return
        timer = None if seconds is None else self.loop.call_later(seconds, self.wake)
        try:
            await self.waker
        finally:
            if timer is not None:
                timer.cancel()
            self.waker = None
