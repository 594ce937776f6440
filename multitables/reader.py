"""Random access: a :class:`Reader` serves numpy-style requests asynchronously into shared-memory stages.

The data path, top-down: ``dataset[key]`` makes a :class:`Request`, planned
at once by :mod:`multitables._request` (NOTE [request plan]);
:meth:`Reader.request` writes the plan into a :class:`Stage` and hands its
shares to the worker processes of :mod:`multitables._request_workers` (NOTE
[request protocol]), who read the rows straight into the stage; the
:class:`Future` waits for them and shows the stage as a numpy array.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from ._engines import ENGINES, resolve_engine
from ._node import NodeInfo, check_file, inspect_node
from ._plan import available_cpus
from ._reader_process import file_signature
from ._request import RowPlan, effective_chunk_rows, normalize_key, plan_rows, split_shares
from ._request_workers import (
    FAILED,
    H_EXPLICIT,
    H_N_READ,
    H_REQ,
    H_START,
    H_STATUS,
    H_STEP,
    MAX_SHARES,
    PENDING,
    READ,
    StageLayout,
    StageMap,
    WorkerPool,
    describe,
)
from ._ring import TICK
from ._shm import Segment
from .errors import ReaderError, StreamClosedError

__all__ = ["Reader", "Dataset", "Request", "Stage", "StagePool", "Future", "DataProxy"]

#: The key of a request that has not been indexed yet (``dataset['col']``): everything.
_WHOLE = object()

#: Stages a Reader can have open at once, unless told otherwise.
DEFAULT_MAX_STAGES = 64


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


class _Core:
    """What the Reader's datasets, stages and futures share: the workers and the bookkeeping."""

    def __init__(self, filename: str, engine: str, open_kwargs: dict[str, Any], pool: WorkerPool, max_stages: int) -> None:
        self.filename = filename
        self.engine = engine
        self.open_kwargs = open_kwargs
        self.pool = pool
        self.closed = False
        self.lock = threading.Lock()
        self.free_slots = list(range(max_stages - 1, -1, -1))
        self.stages: dict[int, StageMap] = {}
        # Stages dropped by the garbage collector, detached at the next call
        # (a finalizer must not wait on anything; SimpleQueue.put never does).
        self.dropped: "queue.SimpleQueue[int]" = queue.SimpleQueue()
        self.req_ids = itertools.count()
        self.next_worker = 0

    def check_open(self) -> None:
        if self.closed:
            raise StreamClosedError(f"the Reader of {self.filename!r} is closed")
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

    def close(self) -> None:
        self.closed = True
        self.pool.close()
        for stage in list(self.stages.values()):
            stage.close()
        self.stages.clear()


class Reader:
    """Random access to the datasets of one HDF5 file, served by worker processes.

    Parameters
    ----------
    filename : str or os.PathLike
        The HDF5 file.
    n_procs : int, optional
        Worker processes reading requests; default: the CPUs this process may
        use. A large request is split among them, so they decode in parallel.
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
    ``with``); it is also closed when it is garbage-collected. Datasets,
    stages and futures keep their reader alive.
    """

    def __init__(
        self,
        filename: "str | os.PathLike[str]",
        n_procs: "int | None" = None,
        *,
        engine: str = "auto",
        start_method: "str | None" = None,
        max_stages: int = DEFAULT_MAX_STAGES,
        **open_kwargs: Any,
    ) -> None:
        import multiprocessing

        self._core: "_Core | None" = None
        filename = os.fspath(filename)
        n_procs = available_cpus() if n_procs is None else _positive_int("n_procs", n_procs)
        max_stages = _positive_int("max_stages", max_stages)
        if engine not in ENGINES:
            raise ValueError(f"engine={engine!r} is not one of {ENGINES}")
        if start_method is not None and start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"start_method={start_method!r} is not one of {multiprocessing.get_all_start_methods()}")
        check_file(filename)
        pool = WorkerPool(filename, open_kwargs, n_procs, max_stages, start_method, file_signature(filename))
        self._core = _Core(filename, engine, open_kwargs, pool, max_stages)
        self._finalizer = weakref.finalize(self, self._core.close)

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
        """Whether :meth:`close` was called (or the reader was collected)."""
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

    def request(self, request: "Request", stage: "Stage | StagePool", *, timeout: "float | None" = None) -> "Future":
        """Schedule ``request`` into ``stage`` (or a free stage of a :class:`StagePool`); returns at once.

        Raises at once, before any worker is involved, if the request reads
        more rows than the stage holds, if the stage is still held by an
        earlier future (for a :class:`Stage`), or if the reader is closed or
        broken. With a :class:`StagePool` it waits for a free stage, for up to
        ``timeout`` seconds if given (then ``TimeoutError``).
        """
        core = self._live()
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
            return self._submit(core, request, held)
        except BaseException:
            held._give_back()
            raise

    def _submit(self, core: _Core, request: "Request", stage: "Stage") -> "Future":
        plan = request._plan
        pool = core.pool
        chunk = effective_chunk_rows(request._node.chunk_rows, request._node.row_nbytes)
        shares = split_shares(plan, chunk, min(pool.n_procs, MAX_SHARES))
        smap = stage._map
        w = smap.words
        with core.lock:
            core.check_open()
            core.detach_dropped()
            req = next(core.req_ids)
            w[H_REQ] = req
            w[H_EXPLICIT] = plan.rows is not None
            w[H_START] = plan.start
            w[H_STEP] = plan.step
            w[H_N_READ] = plan.n_read
            w[H_STATUS : H_STATUS + MAX_SHARES] = PENDING
            smap.write_desc(request._desc)
            if plan.rows is not None:
                smap.rows[: plan.n_read] = plan.rows
            first = core.next_worker
            workers = [(first + s) % pool.n_procs for s in range(len(shares))]
            core.next_worker = (first + max(len(shares), 1)) % pool.n_procs
            pushed = 0
            try:
                for s, ((a, b), worker) in enumerate(zip(shares, workers)):
                    pool.push(worker, [READ, req, stage._slot, s, a, b])
                    pushed += 1
            finally:
                # The stage is reused once these shares are done (Stage._settle).
                stage._last = (req, workers[:pushed], False)
        return Future(self, request, stage, req, workers)

    def close(self) -> None:
        """Stop the workers and free every stage (idempotent). Futures not yet got fail afterwards."""
        if self._core is not None:
            self._finalizer()

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.n_procs} workers"
        return f"<multitables.Reader {self._core.filename if self._core else '?'!r} ({state})>"


class Dataset:
    """A node of a :class:`Reader`'s file, to make requests on; get one with :meth:`Reader.get_dataset`.

    Index it as you would the data (``dataset[10:20]``, ``dataset[[3, 1, 4]]``,
    ``dataset[mask, ..., :5]``; for a table ``dataset['col']`` or
    ``dataset.col('col')``) to get a :class:`Request`: nothing is read until
    :meth:`Reader.request`.
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
        return Request(self, None, key)

    def col(self, name: str) -> "Request":
        """A request for the column ``name`` of a table (index it further: ``dataset.col('a')[5:9]``)."""
        return Request(self, name, _WHOLE)

    def read(self, start: "int | None" = None, stop: "int | None" = None, step: "int | None" = None, field: "str | None" = None) -> "Request":
        """Rows ``start:stop:step`` (of column ``field``), as PyTables' ``read``."""
        return Request(self, field, slice(start, stop, step))

    def read_coordinates(self, coords: Any, field: "str | None" = None) -> "Request":
        """The rows at ``coords`` (of column ``field``), as PyTables' ``read_coordinates``."""
        return Request(self, field, np.asarray(coords))

    def create_stage(self, n_rows: "int | tuple[int, ...]") -> "Stage":
        """A :class:`Stage`: shared memory for up to ``n_rows`` rows of this dataset.

        It holds the result of one request at a time: up to ``n_rows`` rows
        read, of this dataset or one of its columns (or of another dataset
        whose rows are no bigger).
        """
        if isinstance(n_rows, tuple):  # the established API took a shape, rows first
            if not n_rows:
                raise ValueError("a stage shape needs at least the number of rows")
            n_rows = n_rows[0]
        n_rows = _positive_int("n_rows", n_rows)
        return Stage(self._reader, n_rows, n_rows * self._node.row_nbytes)

    def create_stage_pool(self, n_rows: int, n_stages: int) -> "StagePool":
        """A :class:`StagePool` of ``n_stages`` stages of ``n_rows`` rows each."""
        n_stages = _positive_int("n_stages", n_stages)
        return StagePool([self.create_stage(n_rows) for _ in range(n_stages)])

    def __repr__(self) -> str:
        return f"<multitables.Dataset {self.path!r} shape={self.shape} dtype={self.dtype}>"


class Request:
    """Which data to read: made by indexing a :class:`Dataset`; checked and planned at once, read by :meth:`Reader.request`.

    Index errors (out of range, too many indices, a missing column) are
    raised when the request is made. A request can be submitted any number
    of times.

    Attributes
    ----------
    dataset : Dataset
    field : str or None
        The table column it reads, if any.
    shape : tuple of int
        The shape of the result.
    dtype : numpy.dtype
        The dtype of the result.
    """

    def __init__(self, dataset: Dataset, field: "str | None", key: Any, field_last: bool = False) -> None:
        node, desc = dataset._field(field)
        self.dataset = dataset
        self.field = field
        self._key = key
        self._node = node
        self._desc = desc
        shape = (node.n_rows,) + node.row_shape
        if field_last:
            # records[key][field]: index the records, then the column's sub-array axes come last.
            sub = len(node.row_shape)
            nkey = normalize_key(key, shape[:1]) + (slice(None),) * sub
        else:
            nkey = normalize_key(() if key is _WHOLE else key, shape)
        self._plan: RowPlan = plan_rows(nkey, shape)
        self.shape: tuple[int, ...] = self._plan.shape
        self.dtype: np.dtype = node.dtype

    @property
    def n_rows_read(self) -> int:
        """Rows the request reads (what must fit in a stage)."""
        return self._plan.n_read

    @property
    def zero_copy(self) -> bool:
        """Whether the result is a view of the stage (else it is gathered into private memory)."""
        return self._plan.view

    def __getitem__(self, key: Any) -> "Request":
        if isinstance(key, str):
            if self.field is not None:
                raise KeyError(f"this request already reads column {self.field!r}; it has no field {key!r}")
            return Request(self.dataset, key, self._key, field_last=self._key is not _WHOLE)
        if self._key is not _WHOLE:
            raise IndexError(
                "this request is already indexed; give the whole index at once (dataset[a, b] rather than dataset[a][b])"
            )
        return Request(self.dataset, self.field, key)

    def __repr__(self) -> str:
        col = f" field={self.field!r}" if self.field is not None else ""
        return f"<multitables.Request {self.dataset.path!r}{col} shape={self.shape} dtype={self.dtype}>"


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
        #: Most rows a request may read into this stage.
        self.n_rows: int = n_rows
        #: Bytes of data it holds.
        self.nbytes: int = nbytes
        self._pool: "StagePool | None" = None
        self._hold = threading.Lock()  # held from request to release
        self._last: "tuple[int, list[int], bool] | None" = None  # (request, workers, collected)
        layout = StageLayout(n_rows, nbytes)
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
                self._map = StageMap(segment, layout, writable=False)
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
        return self._closed or self._reader.closed

    def _check_fits(self, request: Request) -> None:
        n = request.n_rows_read
        need = n * request._node.row_nbytes
        if n > self.n_rows or need > self.nbytes:
            raise ValueError(
                f"{request!r} reads {n} rows ({need} bytes) but the stage holds {self.n_rows} rows ({self.nbytes} "
                f"bytes); use a larger stage or split the request"
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
        """The status of the first ``n_shares`` shares of the request in the stage.

        A copy: a view on the stage kept in a frame (say, of a traceback)
        would keep the mapping, and its file descriptor, alive.
        """
        words = self._map.words
        if words is None:
            raise StreamClosedError("the stage is closed")
        return words[H_STATUS : H_STATUS + n_shares].tolist()

    def _give_back(self) -> None:
        """Release the hold (never blocks: may run in a finalizer)."""
        try:
            self._hold.release()
        except RuntimeError:
            return
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


class _Lease:
    """Whether data lent by :meth:`Future.get_proxy` may still be used."""

    __slots__ = ("alive", "root")

    def __init__(self, root: Any) -> None:
        self.alive = True
        self.root = root


class DataProxy:
    """Stands for a request's data inside ``with future.get_proxy()``; raises once the ``with`` is left.

    Indexing, attributes, methods, arithmetic and numpy functions go to the
    array; results that are views of the stage are proxies too. Only
    ``numpy.asarray(proxy)`` gives the bare view, which is then yours to drop.
    """

    __slots__ = ("_lease", "_data")

    def __init__(self, lease: _Lease, data: Any) -> None:
        object.__setattr__(self, "_lease", lease)
        object.__setattr__(self, "_data", data)

    def _get(self) -> Any:
        lease = object.__getattribute__(self, "_lease")
        if not lease.alive:
            raise StreamClosedError(
                "this data was released when its `with future.get_proxy()` block ended (its stage may already "
                "hold another request); copy what you keep inside the block"
            )
        return object.__getattribute__(self, "_data")

    def _wrap(self, value: Any) -> Any:
        lease = object.__getattribute__(self, "_lease")
        if isinstance(value, np.ndarray) and isinstance(lease.root, np.ndarray) and np.may_share_memory(value, lease.root):
            return DataProxy(lease, value)
        return value

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._get(), name)
        if callable(value):
            def method(*args: Any, **kwargs: Any) -> Any:
                return self._wrap(getattr(self._get(), name)(*args, **kwargs))

            return method
        return self._wrap(value)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get(), name, value)

    def __getitem__(self, key: Any) -> Any:
        return self._wrap(self._get()[key])

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[Any]:
        for item in self._get():
            yield self._wrap(item)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = np.asarray(self._get())
        if dtype is not None:
            return data.astype(dtype, copy=bool(copy)) if copy is not None else data.astype(dtype, copy=False)
        return data.copy() if copy else data

    def __repr__(self) -> str:
        if not object.__getattribute__(self, "_lease").alive:
            return "<multitables.DataProxy (released)>"
        return f"DataProxy({self._get()!r})"

    def __bool__(self) -> bool:
        return bool(self._get())


def _proxy_op(name: str) -> Callable[..., Any]:
    def op(self: DataProxy, *args: Any) -> Any:
        args = tuple(np.asarray(a) if isinstance(a, DataProxy) else a for a in args)
        return self._wrap(getattr(self._get(), name)(*args))

    op.__name__ = name
    return op


for _name in (
    "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift "
    "radd rsub rmul rtruediv rfloordiv rmod rpow rmatmul rand ror rxor rlshift rrshift "
    "eq ne lt le gt ge neg pos abs invert float int index complex"
).split():
    setattr(DataProxy, f"__{_name}__", _proxy_op(f"__{_name}__"))
DataProxy.__hash__ = None  # type: ignore[assignment]


class Future:
    """The result of :meth:`Reader.request`, to come: wait for it and take the data.

    Take the data once, by one of:

    * :meth:`get`: a private copy;
    * ``with future.get_unsafe() as data``: the stage itself, zero-copy
      (read-only), valid only inside the ``with``;
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
        Those of the result.
    """

    def __init__(self, reader: Reader, request: Request, stage: Stage, req: int, workers: "list[int]") -> None:
        self._reader = reader
        self.request = request
        self.shape: tuple[int, ...] = request.shape
        self.dtype: np.dtype = request.dtype
        self._stage: "Stage | None" = stage
        self._req = req
        self._workers = workers
        self._lock = threading.Lock()
        self._ready = False
        self._error: "BaseException | None" = None

    def done(self) -> bool:
        """Whether the data is there (or the read failed): ``get*`` would not wait."""
        if self._ready or self._error is not None or self._stage is None or self._stage.closed:
            return True
        return PENDING not in self._stage._status(len(self._workers))

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
                if stage.closed:
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
                core.check_open()
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
        node = self.request._node
        plan = self.request._plan
        rows = stage._map.data(node.dtype, (plan.n_read,) + node.row_shape)
        return rows[plan.local_key]

    @contextmanager
    def get_unsafe(self, timeout: "float | None" = None) -> Iterator[Any]:
        """Wait, then lend the data: a read-only view on the stage where the request allows (see
        :attr:`Request.zero_copy`), valid only inside the ``with``; the stage is given back at its end.
        """
        with self._lock:
            self._wait(timeout)
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
