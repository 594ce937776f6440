"""Random access: a :class:`Reader` serves numpy-style requests asynchronously into shared-memory stages.

The data path, top-down: ``dataset[key]`` makes a :class:`Request`, planned
at once by :mod:`multitables._request` (NOTE [request plan]);
:meth:`Reader.request` writes the plan into a :class:`Stage` and hands its
shares to the worker processes of :mod:`multitables._request_workers` (NOTE
[request protocol]), who read the rows straight into the stage; the
:class:`Future` waits for them and shows the stage as a numpy array.
"""

from __future__ import annotations

import collections
import itertools
import operator
import os
import queue
import sys
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from ._engines import check_engine, resolve_engine
from ._node import NodeInfo, as_filename, check_file, file_signature, inspect_node
from ._plan import available_cpus, cap_readers
from ._checks import check_int
from ._established import first_op, next_op
from ._request import RowPlan, compose_keys, effective_chunk_rows, normalize_key, plan_rows, split_shares
from ._readers import check_start_method
from ._request_workers import (
    FAILED,
    MAX_SHARES,
    PENDING,
    StageLayout,
    StageMap,
    WorkerPool,
    describe,
    describe_query,
)
from ._proxy import DataProxy, _Lease
from ._ring import TICK
from ._shm import Segment
from .errors import QueueClosed, ReaderError, SharedMemoryError, StreamClosedError

__all__ = ["Reader", "Dataset", "Request", "Stage", "StagePool", "Future", "DataProxy", "RequestPool"]

#: Stages a Reader can have open at once, unless told otherwise.
DEFAULT_MAX_STAGES = 64


class _Core:
    """What the Reader's datasets, stages and futures share: the workers and the bookkeeping.

    Three states, in order: *closed* (no new requests or stages: ``close()``
    or ``stop()``), *stopped* (``stop()``: requests not yet read are
    dropped), *shut* (the workers are gone; the stages no future holds are
    freed, the others when their future gives them back).
    """

    def __init__(
        self,
        filename: str,
        engine: str,
        open_kwargs: dict[str, Any],
        pool: WorkerPool,
        max_stages: int,
        notify: "Callable[[Any], Any] | None",
    ) -> None:
        self.filename = filename
        self.engine = engine
        self.open_kwargs = open_kwargs
        self.pool = pool
        self.closed = False
        self.stopped = False
        self.shut = False
        self.lock = threading.Lock()
        self._shut_lock = threading.Lock()
        self.free_slots = list(range(max_stages - 1, -1, -1))
        self.stages: dict[int, StageMap] = {}
        self.held: set[int] = set()  # slots of stages a future holds
        # Stages dropped by the garbage collector, detached at the next call
        # (a finalizer must not wait on anything; SimpleQueue.put never does).
        self.dropped: "queue.SimpleQueue[int]" = queue.SimpleQueue()
        self.req_ids = itertools.count()
        self.next_worker = 0
        self.notifier = _Notifier(notify) if notify is not None else None

    def check_open(self) -> None:
        """Raise unless new requests can be made."""
        if self.closed:
            raise StreamClosedError(f"the Reader of {self.filename!r} is closed")
        self.check_alive()

    def check_alive(self) -> None:
        """Raise unless requests already made can still be read."""
        if self.stopped:
            raise StreamClosedError(
                f"the Reader of {self.filename!r} was stopped (stop(), or it was garbage-collected) before this "
                f"request was read"
            )
        broken = self.pool.broken()
        if broken is not None:
            raise broken

    def detach_dropped(self) -> None:
        """Let the workers unmap the stages closed since the last call; their slots become free."""
        while True:
            try:
                slot = self.dropped.get_nowait()
            except queue.Empty:
                return
            try:
                if not self.closed and self.pool.broken() is None:
                    self.pool.detach(slot)
            finally:
                self.free_slots.append(slot)

    def close(self, wait: bool) -> None:
        """No more requests; the workers stop once they have read every request made (waits if ``wait``)."""
        with self.lock:
            if not self.closed:
                self.closed = True
                if not self.stopped:
                    self.pool.finish()  # after every request pushed so far (pushes hold this lock)
                    if not wait:
                        threading.Thread(target=self._finish, name="multitables-reader-close", daemon=True).start()
        if wait:
            self._finish()

    def _finish(self) -> None:
        """Wait until the workers have stopped by themselves (or died), then shut down."""
        try:
            while not self.shut and self.pool.running(TICK):
                pass
        finally:
            self.shutdown()

    def stop(self) -> None:
        """No more requests, and those not yet read are dropped: stop the workers now."""
        self.closed = self.stopped = True
        self.shutdown()

    def shutdown(self) -> None:
        with self._shut_lock:
            if self.shut:
                return
            self.shut = True
            self.pool.close()
            for slot, smap in list(self.stages.items()):
                if self.stopped or slot not in self.held:
                    del self.stages[slot]
                    smap.close()
        if self.notifier is not None:
            self.notifier.end()

    def give_back(self, slot: int) -> None:
        """A future gave its stage back; free the stage if the reader has shut down meanwhile."""
        self.held.discard(slot)
        if self.shut:
            smap = self.stages.pop(slot, None)
            if smap is not None:
                smap.close()


class _Notifier:
    """Calls the Reader's ``notify`` in a thread with each future once it is done, then with ``QueueClosed``.

    The established API's callback. Futures are polled (``Future.done``
    reads status words only): a thread waiting on one stage's channel would
    take the wake-ups its own ``get()`` waits for.
    """

    POLL = 0.0005  # seconds between looks while futures are pending

    def __init__(self, callback: Callable[[Any], Any]) -> None:
        self._callback = callback
        self._pending: list[Future] = []
        self._cond = threading.Condition()
        self._ending = False
        self._thread = threading.Thread(target=self._run, name="multitables-notify", daemon=True)
        self._thread.start()

    def add(self, future: "Future") -> None:
        with self._cond:
            self._pending.append(future)
            self._cond.notify()

    def end(self) -> None:
        """Call ``notify(QueueClosed)`` once the futures pending now are done, then stop."""
        with self._cond:
            self._ending = True
            self._cond.notify()

    def _call(self, arg: Any) -> None:
        try:
            self._callback(arg)
        except Exception:  # keep notifying the others; show it as an uncaught thread exception would be
            threading.excepthook(threading.ExceptHookArgs((*sys.exc_info(), self._thread)))  # type: ignore[arg-type]

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._ending:
                    self._cond.wait()
                if not self._pending:
                    break
                pending = list(self._pending)
            done = [f for f in pending if f.done()]
            if not done:
                time.sleep(self.POLL)
                continue
            with self._cond:
                self._pending = [f for f in self._pending if f not in done]
            for future in done:
                self._call(future)
        self._call(QueueClosed)


class Reader:
    """Random access to the datasets of one HDF5 file, served by worker processes.

    Parameters
    ----------
    filename : str, bytes or os.PathLike
        The HDF5 file.
    n_procs : int, optional
        Worker processes reading requests; default: the CPUs this process may
        use, and at most 4 per CPU (:attr:`n_procs` says how many run). A large
        request is split among them, so they decode in parallel.
    notify : callable, optional
        Called in a thread of its own with each :class:`Future` once its data
        is there (or its read failed), and with :data:`QueueClosed` once the
        reader has shut down (the established API's callback).
    engine : str
        What the workers decode with, as for :class:`Streamer` (``"auto"``
        picks).
    start_method : str, optional
        The multiprocessing start method of the workers; default:
        multiprocessing's own.
    max_stages : int
        Stages that can be open at once (each has a semaphore made when the
        workers start). Default 64.
    **open_kwargs
        Passed to the engine's open call (for PyTables: e.g.
        ``DRIVER="H5FD_CORE"``).

    Notes
    -----
    The workers start at once. Close the reader when done (or use it in a
    ``with``): :meth:`close` reads the requests already made, then stops;
    :meth:`stop` (and the garbage collector) stops at once. Datasets,
    stages and futures keep their reader alive.
    """

    def __init__(
        self,
        filename: "str | bytes | os.PathLike[str] | os.PathLike[bytes]",
        n_procs: "int | None" = None,
        notify: "Callable[[Any], Any] | None" = None,
        *,
        engine: str = "auto",
        start_method: "str | None" = None,
        max_stages: int = DEFAULT_MAX_STAGES,
        **open_kwargs: Any,
    ) -> None:
        self._core: "_Core | None" = None
        filename = as_filename(filename)
        cpus = available_cpus()
        n_procs = cap_readers(cpus if n_procs is None else check_int("n_procs", n_procs, 1, allow_none=False), None, cpus)
        max_stages = check_int("max_stages", max_stages, 1, allow_none=False)
        check_engine(engine)
        check_start_method(start_method)
        if notify is not None and not callable(notify):
            raise TypeError(f"notify must be callable, not {type(notify).__name__}")
        check_file(filename)
        pool = WorkerPool(filename, open_kwargs, n_procs, max_stages, start_method, file_signature(filename))
        self._core = _Core(filename, engine, open_kwargs, pool, max_stages, notify)
        self._finalizer = weakref.finalize(self, self._core.stop)

    @property
    def filename(self) -> str:
        """The HDF5 file."""
        return self._live().filename

    @property
    def n_procs(self) -> int:
        """Worker processes."""
        return self._live().pool.n_procs

    @property
    def reader_pids(self) -> list[int]:
        """Process ids of the workers."""
        return self._live().pool.pids

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` or :meth:`stop` was called: no more requests can be made."""
        return self._core is None or self._core.closed

    def _live(self) -> _Core:
        assert self._core is not None
        return self._core

    def get_dataset(self, path: str) -> "Dataset":
        """A :class:`Dataset` to make requests on: an Array, CArray, EArray or Table at ``path``.

        Raises ``KeyError`` if there is no such node and
        :class:`NodeTypeError` if it cannot be read by rows.
        """
        core = self._live()
        core.check_open()
        node = inspect_node(core.filename, path)
        engine = resolve_engine(core.engine, node, core.open_kwargs)
        return Dataset(self, node, engine)

    def request(self, key: "Request", stage: "Stage | StagePool", *, timeout: "float | None" = None) -> "Future":
        """Schedule the request ``key`` into ``stage`` (or a free stage of a :class:`StagePool`); returns at once.

        ``key`` is a :class:`Request`, made by indexing a :class:`Dataset`
        (the established API's name for it). Raises at once, before any
        worker is involved, if its result does not fit in the stage
        (:class:`SharedMemoryError`; a query's result, whose size only the
        read tells, fails at ``get``), if the stage is still held by an
        earlier future (for a :class:`Stage`), or if the reader is closed or
        broken. With a :class:`StagePool` it waits for a free stage, for up to
        ``timeout`` seconds if given (then ``TimeoutError``).
        """
        core = self._live()
        request = key
        if not isinstance(request, Request):
            raise TypeError(f"request must be a Request made by indexing a Dataset, not {type(request).__name__}")
        if request.dataset._reader is not self:
            raise ValueError("the request is on a dataset of another Reader")
        if not isinstance(stage, (Stage, StagePool)):
            raise TypeError(f"stage must be a Stage or a StagePool, not {type(stage).__name__}")
        if stage._reader is not self:
            raise ValueError("the stage belongs to another Reader")
        core.check_open()
        stage._check_fits(request)
        held = stage._take(timeout) if isinstance(stage, StagePool) else stage._claim()
        try:
            future = self._submit(core, request, held)
        except BaseException:
            held._give_back()
            raise
        if core.notifier is not None:
            core.notifier.add(future)
        return future

    def _submit(self, core: _Core, request: "Request", stage: "Stage") -> "Future":
        plan = request._plan
        pool = core.pool
        if plan is None:  # a query: one worker runs it whole
            shares = [(0, 0)]
        else:
            chunk = effective_chunk_rows(request._node.chunk_rows, request._node.row_nbytes)
            shares = split_shares(plan, chunk, min(pool.n_procs, MAX_SHARES))
        with core.lock:
            core.check_open()
            core.detach_dropped()
            req = next(core.req_ids)
            stage._map.write_request(req, plan, request._desc)
            first = core.next_worker
            workers = [(first + s) % pool.n_procs for s in range(len(shares))]
            core.next_worker = (first + max(len(shares), 1)) % pool.n_procs
            pushed = 0
            try:
                for s, ((a, b), worker) in enumerate(zip(shares, workers)):
                    pool.read(worker, req, stage._slot, s, a, b)
                    pushed += 1
            finally:
                # The stage is reused once these shares are done (Stage._settle).
                stage._last = (req, workers[:pushed], False)
            core.held.add(stage._slot)
        return Future(self, request, stage, req, workers)

    def close(self, wait: bool = False) -> None:
        """Take no more requests; the workers stop once every request already made is read (idempotent).

        Futures already made still get their data. With ``wait=True``,
        returns once the workers have stopped; else at once, and they stop in
        the background. Stages no future holds are freed when the workers
        stop, the others when their future gives them back.
        """
        if self._core is not None:
            self._core.close(wait)

    def stop(self) -> None:
        """Stop the workers now and free every stage (idempotent); futures not yet got raise
        :class:`StreamClosedError` (the established ``QueueClosedException``)."""
        if self._core is not None:
            self._finalizer()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close(wait=True)
        else:
            self.stop()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.n_procs} workers"
        return f"<multitables.Reader {self._core.filename if self._core else '?'!r} ({state})>"


class Dataset:
    """A node of a :class:`Reader`'s file, to make requests on; get one with :meth:`Reader.get_dataset`.

    Index it as you would the data (``dataset[10:20]``, ``dataset[[3, 1, 4]]``,
    ``dataset[mask, ..., :5]``; for a table ``dataset['col']`` or
    ``dataset.col('col')``) to get a :class:`Request`: nothing is read until
    :meth:`Reader.request`. A request can be indexed again, each step applying
    to the result of the one before, as numpy does (``dataset[:][:, mask]``).
    """

    def __init__(self, reader: Reader, node: NodeInfo, engine: str) -> None:
        self._reader = reader
        self._node = node
        self._engine = engine
        self._fields: dict["str | None", tuple[NodeInfo, bytes]] = {None: (node, describe(engine, node))}
        #: The node's path in the file.
        self.path: str = node.path
        #: The node's shape (rows first).
        self.shape: tuple[int, ...] = (node.n_rows,) + node.row_shape
        #: The node's dtype (a compound dtype for a table).
        self.dtype: np.dtype = node.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_table(self) -> bool:
        """Whether the rows are records (a PyTables Table, a compound dataset): columns can be selected."""
        return self.dtype.names is not None

    def __len__(self) -> int:
        return self.shape[0]

    def _field(self, field: "str | None") -> tuple[NodeInfo, bytes]:
        got = self._fields.get(field)
        if got is None:
            if not isinstance(field, str):
                raise TypeError(f"a column is named by a str, not {type(field).__name__}")
            node = inspect_node(self._node.filename, self._node.path, field)  # KeyError for a missing column
            got = self._fields[field] = (node, describe(self._engine, node))
        return got

    def __getitem__(self, key: Any) -> "Request":
        if isinstance(key, str):
            return self.col(key)
        return Request(self, None, key, op=first_op(self.is_table, key))

    def col(self, name: str) -> "Request":
        """A request for the column ``name`` of a table (index it further: ``dataset.col('a')[5:9]``)."""
        return Request(self, name, (), op="ColOp")

    def read(self, start: "int | None" = None, stop: "int | None" = None, step: "int | None" = None, field: "str | None" = None) -> "Request":
        """Rows ``start:stop:step`` (of column ``field``), as PyTables' ``read``."""
        return Request(self, field, slice(start, stop, step), op="ReadOpTable" if self.is_table else "ReadOpArray")

    def read_coordinates(self, coords: Any, field: "str | None" = None) -> "Request":
        """The rows at ``coords`` (of column ``field``), as PyTables' ``read_coordinates``."""
        return Request(self, field, np.asarray(coords), op="CoordOp")

    def where(
        self,
        condition: str,
        condvars: "dict[str, Any] | None" = None,
        start: "int | None" = None,
        stop: "int | None" = None,
        step: "int | None" = None,
    ) -> "Request":
        """The rows of a table where ``condition`` holds: PyTables' ``Table.read_where``, run by a worker.

        How many rows match is known only once the worker has run it: the
        future's ``shape`` is None until then, and a result larger than the
        stage fails at ``get`` with :class:`SharedMemoryError`.
        """
        self._need_table("where")
        if not isinstance(condition, str):
            raise TypeError(f"condition must be a str (a PyTables condition), not {type(condition).__name__}")
        kwargs = dict(condition=condition, condvars=dict(condvars or {}), start=start, stop=stop, step=step)
        return Request._query(self, None, "read_where", kwargs, None, op="WhereOp")

    def read_sorted(
        self,
        sortby: str,
        checkCSI: bool = False,
        field: "str | None" = None,
        start: "int | None" = None,
        stop: "int | None" = None,
        step: "int | None" = None,
    ) -> "Request":
        """Rows ``start:stop:step`` of a table in the order of column ``sortby``: PyTables' ``Table.read_sorted``.

        ``sortby`` needs a completely sorted index (``Column.create_csindex``);
        the worker runs the read.
        """
        self._need_table("read_sorted")
        n = len(range(*slice(start, stop, step).indices(len(self))))
        kwargs = dict(sortby=sortby, checkCSI=bool(checkCSI), field=field, start=start, stop=stop, step=step)
        return Request._query(self, field, "read_sorted", kwargs, n, op="SortOp")

    def _need_table(self, what: str) -> None:
        if not self.is_table:
            raise TypeError(f"{what}() is a query on a table's columns; {self.path!r} is an array")

    def _stage_nbytes(self, shape: Any) -> tuple[int, int]:
        """``(rows, bytes)`` of a stage for ``shape``: rows, or a shape whose missing or -1/None axes are this dataset's."""
        if isinstance(shape, (tuple, list)):
            if not shape:
                raise ValueError("a stage shape needs at least the number of rows")
            dims = list(shape) + [-1] * (self.ndim - len(shape))
            if len(dims) > self.ndim:
                raise ValueError(f"a stage shape has at most {self.ndim} axes, like the dataset; got {tuple(shape)}")
            full = [d if (d is not None and d != -1) else n for d, n in zip(dims, self.shape)]
            rows = check_int("shape[0]", full[0], 1, allow_none=False)
            for d in full[1:]:
                if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
                    raise ValueError(f"stage shape entries must be ints >= 0, -1 or None; got {tuple(shape)}")
            return rows, int(np.prod(full, dtype=np.int64)) * self.dtype.itemsize
        rows = check_int("shape", shape, 1, allow_none=False)
        return rows, rows * self._node.row_nbytes

    def create_stage(self, shape: "int | tuple[int | None, ...]") -> "Stage":
        """A :class:`Stage` of shared memory to hold the result of one request at a time.

        ``shape`` is a number of rows of this dataset, or a shape whose
        missing (or -1, None) axes are the dataset's, as in the established
        API. The stage holds ``prod(shape) * itemsize`` bytes: any request
        whose result (and rows read) fit, of this dataset, a column, or
        another dataset.
        """
        rows, nbytes = self._stage_nbytes(shape)
        return Stage(self._reader, rows, nbytes)

    def create_stage_natoms(self, size_natoms: int) -> "Stage":
        """A :class:`Stage` of ``size_natoms`` elements of this dataset's dtype (the established API)."""
        size_natoms = check_int("size_natoms", size_natoms, 1, allow_none=False)
        nbytes = size_natoms * self.dtype.itemsize
        return Stage(self._reader, max(1, nbytes // max(self._node.row_nbytes, 1)), nbytes)

    def create_stage_pool(self, shape: "int | tuple[int | None, ...]", num_stages: int) -> "StagePool":
        """A :class:`StagePool` of ``num_stages`` stages, each as :meth:`create_stage` makes for ``shape``."""
        num_stages = check_int("num_stages", num_stages, 1, allow_none=False)
        return StagePool([self.create_stage(shape) for _ in range(num_stages)])

    def __repr__(self) -> str:
        return f"<multitables.Dataset {self.path!r} shape={self.shape} dtype={self.dtype}>"


def _indexed(shape: "tuple[int, ...]", dtype: np.dtype, key: Any) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of ``data[key]`` for data of ``shape`` and ``dtype`` (numpy's rules and errors)."""
    if isinstance(key, str):
        if dtype.names is None or key not in dtype.names:
            raise KeyError(f"no field {key!r} in the result (its fields: {dtype.names})")
        sub = dtype[key]
        if sub.subdtype is not None:
            return shape + sub.subdtype[1], sub.subdtype[0]
        return shape, sub
    # Index a zero-stride stand-in: numpy checks the key and gives the shape; only a gather allocates (1 byte a value).
    stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=shape, strides=(0,) * len(shape))
    return np.shape(stand_in[key]), dtype


def _basic_key(key: Any) -> bool:
    """Whether numpy indexes with ``key`` by view (a field name, ints, slices, ``...`` and None only)."""
    entries = key if isinstance(key, tuple) else (key,)
    for e in entries:
        if isinstance(e, (str, slice)) or e is None or e is Ellipsis:
            continue
        if isinstance(e, (bool, np.bool_, list, np.ndarray)):
            return False
        try:
            operator.index(e)
        except TypeError:
            return False
    return True


class Request:
    """Which data to read: made by indexing a :class:`Dataset`; checked and planned at once, read by :meth:`Reader.request`.

    Index errors (out of range, too many indices, a missing column) are
    raised when the request is made. A request can be submitted any number
    of times, and indexed again: each step applies to the result of the one
    before (NOTE [chained keys] in ``_request``).

    Attributes
    ----------
    dataset : Dataset
    field : str or None
        The table column it reads, if any.
    shape : tuple of int, or None
        The shape of the result (None for :meth:`Dataset.where`, known only once read).
    dtype : numpy.dtype
        The dtype of the result.
    """

    def __init__(self, dataset: Dataset, field: "str | None", key: Any, *, op: str, field_last: bool = False) -> None:
        node, desc = dataset._field(field)
        self.dataset = dataset
        self.field = field
        self._node = node
        self._desc = desc
        self._op = op
        self._query: "tuple[str, dict[str, Any]] | None" = None
        self._post: tuple[Any, ...] = ()  # keys applied, in the consumer, to what was read
        self._post_view = True  # whether those keys give views
        shape = (node.n_rows,) + node.row_shape
        if field_last:
            # records[key][field]: index the records, then the column's sub-array axes come last.
            sub = len(node.row_shape)
            self._nkey = normalize_key(key, shape[:1]) + (slice(None),) * sub
        else:
            self._nkey = normalize_key(key, shape)
        self._plan: "RowPlan | None" = plan_rows(self._nkey, shape)
        self._n_read: "int | None" = self._plan.n_read
        self.shape: "tuple[int, ...] | None" = self._plan.shape
        self.dtype: np.dtype = node.dtype

    @classmethod
    def _query(
        cls, dataset: Dataset, field: "str | None", method: str, kwargs: dict[str, Any], n_rows: "int | None", *, op: str
    ) -> "Request":
        """A request the workers answer by a PyTables call (NOTE [request protocol])."""
        self = cls.__new__(cls)
        node, _desc = dataset._field(field)
        self.dataset, self.field, self._node, self._op = dataset, field, node, op
        self._query = (method, kwargs)
        self._desc = describe_query(node, method, kwargs)
        self._post, self._post_view, self._nkey, self._plan = (), True, (), None
        self._n_read = n_rows
        self.shape = None if n_rows is None else (n_rows,) + node.row_shape
        self.dtype = node.dtype
        return self

    def _then(self, key: Any, op: str) -> "Request":
        """This request, with ``key`` applied to its result in the consumer."""
        other = object.__new__(Request)
        other.__dict__.update(self.__dict__)
        other._op = op
        other._post = self._post + (key,)
        other._post_view = self._post_view and _basic_key(key)
        if self.shape is not None:
            other.shape, other.dtype = _indexed(self.shape, self.dtype, key)
        elif isinstance(key, str):
            other.dtype = _indexed((0,), self.dtype, key)[1]
        return other

    @property
    def n_rows_read(self) -> "int | None":
        """Rows the workers write into the stage (None for a query only the read can tell)."""
        return self._n_read

    @property
    def zero_copy(self) -> bool:
        """Whether the result is a view of the stage (else it is gathered into private memory)."""
        return (self._plan is None or self._plan.view) and self._post_view

    @property
    def _col(self) -> "str | None":
        # The established requests' name for the column read.
        return self.field

    def __getitem__(self, key: Any) -> "Request":
        op = next_op(self._op, key, self.field is None)
        if self._query is None and not self._post:
            if isinstance(key, str):
                if self.field is None and len(self._nkey) == 1 and self._nkey[0] is not None:
                    # records[k]['col'] reads only that column
                    return Request(self.dataset, key, self._nkey[0], op=op, field_last=True)
                if self.dtype.names is None:
                    raise KeyError(f"this request reads column {self.field!r}, which has no field {key!r}")
            else:
                shape = (self._node.n_rows,) + self._node.row_shape
                composed = compose_keys(self._nkey, shape, key)
                if composed is not None:
                    return Request(self.dataset, self.field, composed, op=op)
        return self._then(key, op)

    def __repr__(self) -> str:
        col = f" field={self.field!r}" if self.field is not None else ""
        what = f" {self._query[0]}()" if self._query is not None else ""
        return f"<multitables.Request {self.dataset.path!r}{col}{what} shape={self.shape} dtype={self.dtype}>"


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
        #: Bytes of data it holds: a request fits if its result (and the rows it reads) fit.
        self.nbytes: int = nbytes
        self._pool: "StagePool | None" = None
        self._hold = threading.Lock()  # held from request to release
        self._last: "tuple[int, list[int], bool] | None" = None  # (request, workers, collected)
        # Room for the positions of as many scattered rows as 8-byte rows would fill the data
        # (tmpfs pages are only allocated when written, so unused room costs nothing).
        layout = StageLayout(max(n_rows, nbytes // 8), nbytes)
        segment = Segment.create(layout.nbytes, what="The stage")
        try:
            with core.lock:
                core.detach_dropped()
                if not core.free_slots:
                    raise RuntimeError(
                        f"this Reader already has {len(core.stages)} stages open (max_stages); close stages no longer "
                        f"needed, or make the Reader with a larger max_stages"
                    )
                self._slot = core.free_slots.pop()
                try:
                    core.pool.attach(self._slot, segment, layout)
                except BaseException:
                    core.free_slots.append(self._slot)
                    raise
                self._map = StageMap(segment, layout, writable=True)  # the data is the consumer's while it holds it
                core.stages[self._slot] = self._map
        except BaseException:
            segment.close()
            raise
        finally:
            segment.unlink()  # every worker has it mapped (NOTE [segment lifetime]), or the stage failed
        self._closed = False
        self._finalizer = weakref.finalize(self, _drop_stage, core, self._slot, self._map)

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
            return  # a query: the worker checks its result
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
        """Wait until every share of the last request is finished, so its workers no longer write here."""
        if self._last is None:
            return
        req, workers, collected = self._last
        core = self._reader._live()
        channel = core.pool.channels[self._slot]
        while PENDING in self._status(len(workers)):
            if channel.acquire(timeout=TICK):
                continue
            core.pool.look()
            core.check_open()
        if not collected and FAILED in self._status(len(workers)):
            core.pool.forget(req)
        self._last = None

    def _status(self, n_shares: int) -> list[int]:
        """The status of the first ``n_shares`` shares of the request in the stage."""
        return self._map.status(n_shares)

    def _give_back(self) -> None:
        """Release the hold (never blocks: may run in a finalizer)."""
        try:
            self._hold.release()
        except RuntimeError:
            return
        core = self._reader._core
        if core is not None:
            core.give_back(self._slot)
        if self._pool is not None:
            self._pool._free.put(self)

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

    def __repr__(self) -> str:
        return f"<multitables.Stage {self.n_rows} rows, {self.nbytes} bytes{' (closed)' if self.closed else ''}>"


def _drop_stage(core: _Core, slot: int, smap: StageMap) -> None:
    """Finalizer of a stage: unmap here, and queue the workers' unmapping for the next call."""
    if core.stages.pop(slot, None) is not None:
        smap.close()
        core.dropped.put(slot)


class StagePool:
    """Stages handed out to requests in turn; make one with :meth:`Dataset.create_stage_pool`.

    :meth:`Reader.request` takes a free stage, waiting while all are held; a
    stage comes back when its future's data is released.
    """

    def __init__(self, stages: "list[Stage]") -> None:
        self._stages = stages
        self._reader = stages[0]._reader
        self._free: "queue.SimpleQueue[Stage]" = queue.SimpleQueue()
        for stage in stages:
            stage._pool = self
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

    def close(self) -> None:
        """Close every stage of the pool (idempotent)."""
        for stage in self._stages:
            stage.close()

    def __enter__(self) -> "StagePool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<multitables.StagePool {len(self)} stages of {self.n_rows} rows>"


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

    def __init__(self, reader: Reader, request: Request, stage: Stage, req: int, workers: "list[int]") -> None:
        self._reader = reader
        self.request = request
        self.shape: "tuple[int, ...] | None" = request.shape
        self.dtype: np.dtype = request.dtype
        self._stage: "Stage | None" = stage
        self._req = req
        self._workers = workers
        self._lock = threading.Lock()
        self._ready = False
        self._error: "BaseException | None" = None

    def done(self) -> bool:
        """Whether the data is there (or the read failed): ``get*`` would not wait."""
        stage = self._stage
        if self._ready or self._error is not None or stage is None:
            return True
        try:
            return PENDING not in stage._status(len(self._workers))
        except StreamClosedError:  # freed (its reader stopped), maybe by another thread just now
            return True

    def wait(self, timeout: "float | None" = None) -> bool:
        """Wait until :meth:`done`, for up to ``timeout`` s; False if it timed out. Does not raise read errors."""
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
        if self._error is not None:
            raise self._error.with_traceback(None)
        stage = self._stage
        if stage is None:
            raise StreamClosedError("the data of this future was already released")
        if self._ready:
            return
        core = self._reader._live()
        deadline = None if timeout is None else time.monotonic() + timeout
        n = len(self._workers)
        channel = core.pool.channels[stage._slot]
        try:
            while True:
                if stage._freed:
                    core.check_alive()
                    raise StreamClosedError("the stage of this future was closed before its data came")
                if PENDING not in stage._status(n):
                    break
                wait = TICK if deadline is None else max(0.0, min(TICK, deadline - time.monotonic()))
                if channel.acquire(timeout=wait):
                    continue
                core.pool.look()
                for worker, status in zip(self._workers, stage._status(n)):
                    if status == PENDING:
                        died = core.pool.dead_error(worker, self.request.dataset.path)
                        if died is not None:
                            raise died
                core.check_alive()
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"the data of {self.request!r} did not come within {timeout} s")
            if FAILED in stage._status(n):
                raise core.pool.failure(self._req)
        except (ReaderError, StreamClosedError) as exc:
            self._error = exc
            raise
        if stage._last is not None and stage._last[0] == self._req:
            stage._last = (self._req, self._workers, True)
        self._ready = True

    def _data(self) -> Any:
        stage = self._stage
        assert stage is not None
        request = self.request
        node, plan = request._node, request._plan
        if plan is None:  # a query: as many rows as its worker wrote
            data = stage._map.data(node.dtype, (stage._map.result_rows,) + node.row_shape)
        else:
            data = stage._map.data(node.dtype, (plan.n_read,) + node.row_shape)[plan.local_key]
        for key in request._post:
            data = data[key]
        if self.shape is None:
            self.shape = np.shape(data)
        return data

    @contextmanager
    def get_unsafe(self, timeout: "float | None" = None) -> Iterator[Any]:
        """Wait, then lend the data: a writable view on the stage where the request allows (see
        :attr:`Request.zero_copy`), valid only inside the ``with``; the stage is given back at its end.
        """
        with self._lock:
            try:
                self._wait(timeout)
            except (ReaderError, StreamClosedError):
                self.release()  # the data will never come: the stage can serve another request
                raise
            data = self._data()
        try:
            yield data
        finally:
            del data
            self.release()

    @contextmanager
    def get_proxy(self, timeout: "float | None" = None) -> Iterator[DataProxy]:
        """As :meth:`get_unsafe`, behind a :class:`DataProxy` that raises if used after the ``with``."""
        with self.get_unsafe(timeout) as data:
            lease = _Lease(data)
            try:
                yield DataProxy(lease, data)
            finally:
                lease.alive = False
                lease.root = None

    def get(self, timeout: "float | None" = None) -> Any:
        """Wait, and return a private copy of the data (a numpy scalar for a single element)."""
        with self.get_unsafe(timeout) as data:
            if isinstance(data, (np.ndarray, np.void)) and self.request.zero_copy:
                return data.copy()
            return data  # gathered into private memory already, or an immutable scalar

    def get_direct(self, action: Callable[[Any], Any], timeout: "float | None" = None) -> Any:
        """Wait, call ``action(data)`` on the zero-copy data, return what it returns; the stage is then given back."""
        with self.get_unsafe(timeout) as data:
            return action(data)

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

    def __repr__(self) -> str:
        state = "released" if self._stage is None else ("done" if self.done() else "pending")
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
