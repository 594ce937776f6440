"""Futures: a request on its way into a stage, and a pool of them to wait on together.
"""

from __future__ import annotations

import collections
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator

import numpy as np

from .._io.fields import select_field
from .._shm.stagemap import FAILED, PENDING
from .proxy import DataProxy, Lease
from .._shm.ring import TICK
from ..errors import ReaderError, StreamClosedError

from .request import Request
from .stages import Stage
from .readercore import not_pickled, quiet_at_exit
from .awaiting import awaited
from .._sys.awake import look
from .._sys.copies import copied
if TYPE_CHECKING:
    from ..reader import Reader  # bound at run time: NOTE [annotations from above] in ``multitables/__init__.py``

class Future:
    """The result of :meth:`Reader.request`, to come: wait for it and take the data.

    Take the data once, by one of:

    * :meth:`get`: a private copy;
    * ``with future.get_unsafe() as data``: the stage itself, zero-copy,
      valid only inside the ``with`` (writable: the stage is yours until
      then; what you write reaches nothing else);
    * ``with future.get_proxy() as data``: the same, behind a proxy that
      raises if used after the ``with``;
    * :meth:`get_direct`: calls a function on the zero-copy data.

    Each gives the stage back afterwards. A failed read raises here: a
    :class:`ReaderError` that is also the original exception's type.

    Attributes
    ----------
    request : Request
        What is read.
    shape, dtype
        Those of the result (``shape`` is None for a query until its data is got).
    """

    def __init__(self, reader: Reader, request: Request, stage: Stage, req: int, readers: "list[int]") -> None:
        self._reader = reader
        self.request = request
        self.shape: "tuple[int, ...] | None" = request.shape
        self.dtype: np.dtype = request.dtype
        self._stage: "Stage | None" = stage
        self._req = req
        self._readers = readers
        self._asked = time.perf_counter()
        self._lock = threading.Lock()
        self._ready = False
        self._lent = False  # inside get_unsafe()'s with: the data is taken
        self._error: "BaseException | None" = None

    def done(self) -> bool:
        """Whether the data is there (or the read failed): ``get*`` would not wait."""
        self._reader._live().pool.check_owner()  # a forked child's stage is not its own: it may hold other rows
        stage = self._stage
        if self._ready or self._error is not None or stage is None:
            return True
        try:
            status = stage._status(len(self._readers))
        except StreamClosedError:  # freed (its reader stopped), maybe by another thread just now
            return True
        if PENDING not in status:
            return True
        # A share whose reader died stays pending for ever: get() would raise at once, so it is done.
        pool = self._reader._live().pool
        pool.look()
        return any(s == PENDING and pool.is_dead(w) for w, s in zip(self._readers, status))

    def wait(self, timeout: "float | None" = None) -> bool:
        """Wait until :meth:`done`, for up to ``timeout`` s; False if it timed out. Does not raise read errors."""
        self._reader._live().pool.check_owner()  # not a read error: a forked child cannot use its copy
        try:
            with self._lock:
                self._wait(timeout)
        except TimeoutError:
            return False
        except Exception:
            pass
        return True

    def _wait(self, timeout: "float | None") -> None:
        """Wait for every share; raise the read's error, or TimeoutError. Call with the lock held."""
        core = self._reader._live()
        core.pool.check_owner()  # in a forked child the stage holds what the parent put there since
        if self._error is not None:
            raise self._error.with_traceback(None)
        stage = self._stage
        if stage is None:
            raise StreamClosedError("the data of this future was already released")
        if self._ready:
            if stage._map.words is None:  # its data came, but stop() has freed the stage since
                core.check_not_stopped("this future's data was got")
                raise StreamClosedError("the stage of this future was freed before its data was got")
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        n = len(self._readers)
        channel = core.pool.channels[stage._stage_id]
        awake = core.awake.eager and timeout != 0  # NOTE [waiting awake]
        try:
            while True:
                if stage._freed:
                    core.check_not_stopped()
                    raise StreamClosedError("the stage of this future was closed before its data came")
                status = stage._status(n)
                if PENDING not in status:
                    break  # every share has its final status
                if awake:
                    awake = False
                    if look(lambda: PENDING not in stage._status(n)):
                        continue
                wait = TICK if deadline is None else max(0.0, min(TICK, deadline - time.monotonic()))
                if channel.acquire(timeout=wait):
                    continue
                core.check_not_stopped()  # first: readers that stop() told to exit are not dead
                core.pool.look()
                for reader, share in zip(self._readers, stage._status(n)):
                    if share == PENDING:
                        died = core.pool.dead_error(reader, self.request.dataset.path)
                        if died is not None:
                            core.check_not_stopped()  # by another thread since: they exited as told
                            raise died
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"the data of {self.request!r} did not come within {timeout} s")
            core.awake.saw(time.perf_counter() - self._asked)
            while channel.acquire(False):  # the wake-ups of shares seen done without them: spent, not left for later
                pass
            if n == 1 and core.last_req == self._req:
                core.idle_reader = self._readers[0]
            if FAILED in status:
                raise core.pool.failure(self._req)
        except (ReaderError, StreamClosedError) as exc:
            self._error = exc
            raise
        if stage._last is not None and stage._last[0] == self._req:
            stage._last = (self._req, self._readers, True)
        self._ready = True

    def _data(self) -> Any:
        stage = self._stage
        assert stage is not None
        request = self.request
        node, plan = request._node, request._plan
        data = None
        try:
            if plan is None:  # a query: as many rows as its reader wrote
                data = stage._map.data(node.dtype, (stage._map.result_rows,) + node.row_shape)
            else:
                data = stage._map.data(node.dtype, (plan.n_read,) + node.row_shape)[plan.local_key]
            for key in request._post:
                data = select_field(data, key) if isinstance(key, str) else data[key]
            if request._fields is not None:
                data = data[request._fields]  # a view, as numpy's
            if self.shape is None:
                self.shape = np.shape(data)
            return data
        except StreamClosedError:  # freed by stop() from another thread since the wait saw the data
            data = None
            self._reader._live().check_not_stopped("this future's data was got")
            raise
        except BaseException:
            data = None  # a view on the stage kept by a traceback's frame (Ctrl-C) would keep the mapping
            raise

    def _lend(self, timeout: "float | None") -> Any:
        """Wait, then take the data, as :meth:`get_unsafe` lends it; :meth:`_end_loan` gives the stage back."""
        with self._lock:
            if self._lent:  # a second take would give the stage back under the first one's view
                raise RuntimeError(f"the data of {self.request!r} is lent to a with still open: it is taken once")
            try:
                self._wait(timeout)
            except (ReaderError, StreamClosedError):
                self.release()  # the data will never come: the stage can serve another request
                quiet_at_exit()
                raise
            data = self._data()
            self._lent = True
            return data

    def _end_loan(self) -> None:
        """Give the stage back after :meth:`_lend`: the data can no longer be got."""
        self.release()
        self._lent = False  # taken: a later get says it was released

    @contextmanager
    def get_unsafe(self, timeout: "float | None" = None) -> Iterator[Any]:
        """Wait, then lend the data: a writable view on the stage where the request allows (see
        :attr:`Request.zero_copy`), valid only inside the ``with``; the stage is given back at its end.
        """
        data = self._lend(timeout)
        try:
            yield data
        finally:
            del data
            self._end_loan()

    @contextmanager
    def get_proxy(self, timeout: "float | None" = None) -> Iterator[DataProxy]:
        """As :meth:`get_unsafe`, behind a :class:`DataProxy` that raises if used after the ``with``."""
        with self.get_unsafe(timeout) as data:
            lease = Lease(data)
            try:
                yield DataProxy(lease, data)
            finally:
                lease.alive = False
                lease.root = None

    def get(self, timeout: "float | None" = None) -> Any:
        """Wait, and return a private copy of the data (a numpy scalar for a single element, as numpy gives it)."""
        data = self._lend(timeout)  # not through get_unsafe: no generator per request
        try:
            if isinstance(data, (np.ndarray, np.void)) and self.request.zero_copy:
                return copied(data) if isinstance(data, np.ndarray) else data.copy()
            return data  # gathered into private memory already, or an immutable scalar
        finally:
            del data  # as get_unsafe: no view on the stage left in a traceback's frame (Ctrl-C in the copy)
            self._end_loan()

    def get_direct(self, action: Callable[[Any], Any], timeout: "float | None" = None) -> Any:
        """Wait, call ``action(data)`` on the zero-copy data, return what it returns; the stage is then given back."""
        with self.get_unsafe(timeout) as data:
            return action(data)

    def __await__(self) -> Generator[Any, None, Any]:
        """``await future``: as :meth:`get`, the event loop going on meanwhile (NOTE [awaited futures] in
        ``_access.awaiting``). Cancelled (``asyncio.wait_for``'s timeout too), it gives the stage back once the
        readers are done with it."""
        return awaited(self).__await__()

    def release(self) -> None:
        """Give the stage back (idempotent); the data can no longer be got. Does not wait for the read."""
        stage, self._stage = self._stage, None
        if stage is not None:
            stage._give_back()

    def __del__(self) -> None:
        # A future dropped without taking its data must not hold its stage forever.
        try:
            self.release()
        except Exception:
            pass

    __reduce__ = not_pickled  # its readers and shared memory are this process's

    def __repr__(self) -> str:
        try:
            state = "released" if self._stage is None else ("done" if self.done() else "pending")
        except RuntimeError:  # a forked child's copy
            state = "of another process"
        return f"<multitables.Future {self.request!r} ({state})>"


class RequestPool:
    """A thread-safe first-in, first-out queue of futures (or anything): one thread adds, another takes.

    The established API's pattern for keeping many requests in flight: a
    loader thread adds the futures :meth:`Reader.request` returns, the
    consumer takes them in order with :meth:`next`.
    """

    def __init__(self) -> None:
        self._items: "collections.deque[Any]" = collections.deque()
        self._cond = threading.Condition()

    def add(self, item: Any) -> None:
        """Put ``item`` at the end of the pool."""
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def next(self, timeout: "float | None" = None) -> Any:
        """Take the first item, waiting while there is none (for up to ``timeout`` s, then ``TimeoutError``)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._items, timeout):
                raise TimeoutError(f"no item came into the pool within {timeout} s")
            return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)
