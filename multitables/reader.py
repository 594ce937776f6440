"""Random access: a :class:`Reader` serves numpy-style requests asynchronously into shared-memory stages.

The data path, top-down: ``dataset[key]`` makes a :class:`Request`, planned
at once by :mod:`multitables._plan.requests` (NOTE [request plan]);
:meth:`Reader.request` writes the plan into a :class:`Stage` and hands its
shares to the reader processes of :mod:`multitables._procs.serve` (NOTE
[request protocol]), which read the rows straight into the stage; the
:class:`Future` waits for them and shows the stage as a numpy array.
"""

from __future__ import annotations

import math
import os
import weakref
from typing import Any, Callable

import numpy as np

from ._access.awaiting import request_async
from ._access.compat2x import first_op
from ._access.futures import Future, RequestPool
from ._access.inline import InlineServer
from ._access.proxy import DataProxy
from ._access.readercore import ReaderCore, not_pickled, quiet_at_exit
from ._access.request import Request, field_list
from ._access.stages import Stage, StagePool
from ._io.engines import check_engine, check_open_options, resolve_engine
from ._io.files import growing
from ._io.fileset import check_files, describe_files, own_flags
from ._io.names import as_files
from ._io.node import NodeInfo, check_file
from ._io.objects.config import make_store
from ._io.objects.urls import is_url, shown
from ._plan.readers import Machine, plan_requests
from ._plan.requests import effective_chunk_rows, split_shares
from ._procs.pool import check_start_method
from ._procs.serve import ServeReaders
from ._shm.stagemap import MAX_SHARES
from ._sys.checks import check_int
from .errors import NoSuchFieldError, ReaderError, StreamClosedError

__all__ = ["Reader", "Dataset", "Request", "Stage", "StagePool", "Future", "DataProxy", "RequestPool"]

#: Stages a Reader can have open at once, unless told otherwise.
DEFAULT_MAX_STAGES = 64


class Reader:
    """Random access to the datasets of an HDF5 file, or of a set of files, served by reader processes.

    Parameters
    ----------
    filename : str, bytes, os.PathLike, or a list of them
        The HDF5 file; a list of files or a glob pattern is one dataset of
        the files' rows in turn, as for :class:`Streamer` (queries, which
        PyTables runs on one file, are refused on a set).
    n_procs : int, optional
        Reader processes reading requests; default: the CPUs this process may
        use (its share beside the ranks, jobs or pool workers started like it
        on them, as for :meth:`Streamer.get_queue
        <multitables.Streamer.get_queue>`, and none where that share is one
        CPU), and at most 4 per CPU
        (:attr:`n_procs` says how many run). A large
        request is split among them, so they decode in parallel. ``0`` reads
        each request in this process, in the thread that makes it, before
        :meth:`request` returns (the default in a daemonic process, such as a
        DataLoader's worker, which may start no process): the same rows,
        errors and API, nothing in shared memory.
    notify : callable, optional
        Called in a thread of its own with each :class:`Future` once its data
        is there (or its read failed), and with :data:`QueueClosed` once the
        reader has shut down (the established API's callback).
    engine : str
        What the readers decode with, as for :class:`Streamer` (``"auto"``
        picks).
    start_method : str, optional
        The multiprocessing start method of the readers; default:
        multiprocessing's own.
    max_stages : int
        Stages that can be open at once (each has a semaphore made when the
        readers start). Default 64.
    storage_options : dict, optional
        For files given as URLs, as for :class:`Streamer` (see
        :doc:`object_storage`). Queries (``where``, ``read_sorted``), which
        PyTables runs, are refused on an object.
    **open_kwargs
        Passed to the engine's open call (for PyTables: e.g.
        ``DRIVER="H5FD_CORE"``); as :class:`Streamer` takes them.

    Notes
    -----
    The readers start at once. Close the reader when done (or use it in a
    ``with``): :meth:`close` reads the requests already made, then stops;
    :meth:`stop` (and the garbage collector) stops at once. Datasets,
    stages and futures keep their reader alive.
    """

    def __init__(
        self,
        filename: "str | bytes | os.PathLike[str] | os.PathLike[bytes] | list[Any] | tuple[Any, ...]",
        n_procs: "int | None" = None,
        notify: "Callable[[Any], Any] | None" = None,
        *,
        engine: str = "auto",
        start_method: "str | None" = None,
        max_stages: int = DEFAULT_MAX_STAGES,
        storage_options: "dict[str, Any] | None" = None,
        **open_kwargs: Any,
    ) -> None:
        self._core: "ReaderCore | None" = None
        urls = is_url(filename) or (isinstance(filename, (list, tuple)) and any(is_url(f) for f in filename))
        store = make_store(storage_options) if storage_options is not None or urls else None
        files = as_files(filename, store)
        n_procs = plan_requests(check_int("n_procs", n_procs, 0), Machine.here(start_method))
        max_stages = check_int("max_stages", max_stages, 1, allow_none=False)
        check_engine(engine)
        check_open_options(engine, open_kwargs, stacklevel=2)
        check_start_method(start_method)
        if notify is not None and not callable(notify):
            raise TypeError(f"notify must be callable, not {type(notify).__name__}")
        if isinstance(files, str):
            # Read with swmr=True, a file may grow (NOTE [file identity] in ``_io.files``).
            signature = growing(check_file(files, store), own_flags(open_kwargs)["swmr"])
            where = shown(files)
        else:  # each file is checked, and its identity taken, with each dataset (NOTE [file sets])
            check_files(files, store)
            where, signature = describe_files(files), None
        pool: "ServeReaders | InlineServer"
        if n_procs == 0:  # NOTE [requests in this process] in ``_access.inline``
            pool = InlineServer(where, open_kwargs, max_stages, signature, files, store)
        else:
            pool = ServeReaders(where, open_kwargs, n_procs, max_stages, start_method, signature, files, store)
        try:
            self._core = ReaderCore(files, engine, open_kwargs, pool, max_stages, notify, store)
            self._finalizer = weakref.finalize(self, self._core.stop)
        except BaseException:  # a Ctrl-C: the frames of its traceback, which a notebook keeps, hold the readers
            if self._core is not None:
                self._core.stop()
            else:
                pool.close()
            raise

    @property
    def filename(self) -> "str | tuple[str, ...]":
        """The HDF5 file, from the root for a local file (as the working directory was when the Reader was made); for
        a set, its files in row order."""
        return self._live().filename

    @property
    def n_procs(self) -> int:
        """Reader processes; 0 where requests are read in this process."""
        return self._live().pool.n_procs

    @property
    def reader_pids(self) -> list[int]:
        """Process ids of the request readers (empty with ``n_procs=0``)."""
        return self._live().pool.pids

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` or :meth:`stop` was called (no more requests can be made)."""
        return self._core is None or self._core.closed

    def _live(self) -> ReaderCore:
        assert self._core is not None
        return self._core

    def get_dataset(self, path: str) -> "Dataset":
        """A :class:`Dataset` to make requests on: an Array, CArray, EArray or Table at ``path``.

        Raises ``KeyError`` if there is no such node and
        :class:`NodeTypeError` if it cannot be read by rows. Of a file read
        with ``swmr=True``, the dataset has the rows its writer had flushed by
        this call, and keeps them: its requests read those rows, and one past
        them is refused as numpy refuses it (``IndexError``; a slice stops at
        its length), as an h5py dataset not refreshed. Call ``get_dataset``
        again for the rows flushed since (h5py's ``refresh()``).
        """
        core = self._live()
        core.check_open()
        node = core.inspect(path)
        # Requests resolve as reader processes do, n_procs=0 too: on blosc the chunk engine read requests faster
        # either way (BENCHMARKS.md, engine choice for in-process reads); unfiltered chunks too, whose streams h5py takes.
        engine = resolve_engine(core.engine, node, core.open_kwargs, readers=True, requests=True)
        return Dataset(self, node, engine)

    def request(self, key: "Request", stage: "Stage | StagePool", *, timeout: "float | None" = None) -> "Future":
        """Schedule the request ``key`` into ``stage`` (or a free stage of a :class:`StagePool`); returns at once.

        ``key`` is a :class:`Request`, made by indexing a :class:`Dataset`
        (the established API's name for it). Raises at once, before any
        reader is involved, if its result does not fit in the stage
        (:class:`SharedMemoryError`; a query's result, whose size only the
        read tells, fails at ``get``), if the stage is still held by an
        earlier future (for a :class:`Stage`), or if the reader is closed or
        broken. With a :class:`StagePool` it waits for a free stage, for up to
        ``timeout`` seconds if given (then ``TimeoutError``).
        """
        core = self._live()
        core.pool.check_owner()  # in a forked child, before what its copy of a stage says (the parent's futures hold them)
        request = key
        if not isinstance(request, Request):
            raise TypeError(f"request must be a Request made by indexing a Dataset, not {type(request).__name__}")
        if request.dataset._reader is not self:
            raise ValueError("the request is on a dataset of another Reader")
        if not isinstance(stage, (Stage, StagePool)):
            raise TypeError(f"stage must be a Stage or a StagePool, not {type(stage).__name__}")
        if stage._reader is not self:
            raise ValueError("the stage belongs to another Reader")
        try:
            core.check_open()
            stage._check_fits(request)
            held = stage._take(timeout) if isinstance(stage, StagePool) else stage._claim()
            try:
                future = self._submit(core, request, held)
            except BaseException:
                held._give_back()
                raise
        except (ReaderError, StreamClosedError):
            quiet_at_exit()
            raise
        if core.notifier is not None:
            core.notifier.add(future)
        return future

    async def request_async(
        self, key: "Request", stage: "Stage | StagePool", *, timeout: "float | None" = None
    ) -> "Future":
        """:meth:`request` for asyncio: waits for a free stage of a :class:`StagePool` without blocking the event
        loop (for up to ``timeout`` seconds if given, then ``TimeoutError``); ``await`` the future it returns for the
        data (NOTE [awaited futures] in ``_access.awaiting``). Raises as :meth:`request` does."""
        return await request_async(self, key, stage, timeout)

    def _submit(self, core: ReaderCore, request: "Request", stage: "Stage") -> "Future":
        plan = request._plan
        pool = core.pool
        width = max(pool.n_procs, 1)  # n_procs=0: one share, read here
        if plan is None:  # a query: one reader runs it whole
            shares = [(0, 0)]
        else:
            chunk = effective_chunk_rows(request._node.chunk_rows, request._node.row_nbytes)
            shares = split_shares(plan, chunk, min(width, MAX_SHARES))
        with core.lock:
            core.check_not_closed()  # by another thread since request() looked at the readers
            core.detach_dropped()
            req = next(core.req_ids)
            core.hand_over(request._desc)  # a wide table's node, where the readers dropped it since
            stage._map.write_request(req, plan, request._desc)
            if len(shares) == 1 and core.idle_reader is not None:  # NOTE [waiting awake]: it is the one awake
                readers = [core.idle_reader]
            else:
                first = core.next_reader
                readers = [(first + s) % width for s in range(len(shares))]
                core.next_reader = (first + max(len(shares), 1)) % width
            core.last_req, core.idle_reader = req, None
            pushed = 0
            try:
                for s, ((a, b), reader) in enumerate(zip(shares, readers)):
                    pool.read(reader, req, stage._stage_id, s, a, b)
                    pushed += 1
            finally:
                # The stage is reused once these shares are done (Stage._settle).
                stage._last = (req, readers[:pushed], False)
            core.held.add(stage._stage_id)
        return Future(self, request, stage, req, readers)

    def close(self, wait: bool = False) -> None:
        """Take no more requests; the readers stop once every request already made is read (idempotent).

        Futures already made still get their data. With ``wait=True``,
        returns once the readers have stopped; else at once, and they stop in
        the background. Stages no future holds are freed when the readers
        stop, the others when their future gives them back.
        """
        if self._core is not None:
            self._core.close(wait)

    def stop(self) -> None:
        """Stop the readers now and free every stage (idempotent); futures not yet got raise
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

    __reduce__ = not_pickled  # its readers and shared memory are this process's

    def __repr__(self) -> str:
        n = 0 if self.closed else self.n_procs
        state = "closed" if self.closed else f"{n} reader{'' if n == 1 else 's'}" if n else "read in this process"
        return f"<multitables.Reader {self._core.pool.filename if self._core else '?'!r} ({state})>"


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
        self._fields: dict["str | None", tuple[NodeInfo, bytes]] = {None: (node, reader._live().describe(engine, node))}
        #: The node's path in the file.
        self.path: str = node.path
        #: The node's shape (rows first).
        self.shape: tuple[int, ...] = (node.n_rows,) + node.row_shape
        #: The node's dtype (a compound dtype for a table).
        self.dtype: np.dtype = node.dtype

    @property
    def ndim(self) -> int:
        """The number of axes of :attr:`shape` (rows first), as numpy's ``ndim``."""
        return len(self.shape)

    @property
    def is_table(self) -> bool:
        """Whether the rows are records (a PyTables Table, a compound dataset), whose columns can be selected."""
        return self.dtype.names is not None

    def __len__(self) -> int:
        return self.shape[0]

    def _field(self, field: "str | None") -> tuple[NodeInfo, bytes]:
        got = self._fields.get(field)
        if got is None:
            if not isinstance(field, str):
                raise TypeError(f"a column is named by a str, not {type(field).__name__}")
            core = self._reader._live()
            node = core.inspect(self._node.path, field)  # KeyError for a missing column
            got = self._fields[field] = (node, core.describe(self._engine, node))
        return got

    def __getitem__(self, key: Any) -> "Request":
        if isinstance(key, str):
            return self.col(key)
        if field_list(key):  # records[['a', 'b']]: every row, those fields
            return Request(self, None, (), op=first_op(self.is_table, ()))[key]
        return Request(self, None, key, op=first_op(self.is_table, key))

    def col(self, name: str) -> "Request":
        """A request for the column ``name`` of a table (index it further: ``dataset.col('a')[5:9]``); in a nested
        column, PyTables' path to one (``'outer/inner'``), as ``Table.col`` takes it."""
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
        """The rows of a table where ``condition`` holds: PyTables' ``Table.read_where``, run by a reader.

        How many rows match is known only once the reader has run it: the
        future's ``shape`` is None until then, and a result larger than the
        stage fails at ``get`` with :class:`SharedMemoryError`.
        """
        self._need_table("where")
        if not isinstance(condition, str):
            raise TypeError(f"condition must be a str (a PyTables condition), not {type(condition).__name__}")
        kwargs = dict(condition=condition, condvars=dict(condvars or {}), start=start, stop=stop, step=step)
        return Request._of_query(self, None, "read_where", kwargs, None, op="WhereOp")

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
        the reader runs the read. How many rows a range gives is PyTables' to say (its negative steps and
        bounds are not Python's): the future's ``shape`` is known before the read for the whole table only,
        else once the reader has run it, as :meth:`where`'s.
        """
        self._need_table("read_sorted")
        if not isinstance(sortby, str):
            raise TypeError(f"sortby must be a str naming a column, not {type(sortby).__name__}")
        dtype = self.dtype
        for part in sortby.split("/"):  # PyTables names a nested column 'outer/inner'
            if dtype.names is None or part not in dtype.names:
                raise NoSuchFieldError(f"{self.path!r} has no column {sortby!r} to sort by; its columns are "
                                      f"{list(self.dtype.names or ())}")  # a table's (_need_table): names, never None
            dtype = dtype[part]
        n = len(self) if start is None and stop is None and step in (None, 1) else None
        kwargs = dict(sortby=sortby, checkCSI=bool(checkCSI), field=field, start=start, stop=stop, step=step)
        return Request._of_query(self, field, "read_sorted", kwargs, n, op="SortOp")

    def _need_table(self, what: str) -> None:
        if not self.is_table:
            raise TypeError(f"{what}() is a query on a table's columns; {self.path!r} is an array")
        if self._node.parts:
            raise ValueError(
                f"{what}() is a PyTables query, which runs on one file; {self.path!r} spans {self._node.filename!r}: "
                f"make a Reader of each file to query it"
            )
        if self._node.remote is not None:
            raise ValueError(f"{what}() is a PyTables query, and PyTables reads local files only; {self._node.filename!r} "
                             f"is an object")

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
            return rows, math.prod(int(d) for d in full) * self.dtype.itemsize
        rows = check_int("shape", shape, 1, allow_none=False)
        return rows, rows * self._node.row_nbytes

    def create_stage(self, shape: "int | tuple[int | None, ...]") -> "Stage":
        """A :class:`Stage` of shared memory to hold the result of one request at a time.

        ``shape`` is a number of rows of this dataset, or a shape whose
        missing (or -1, None) axes are the dataset's, as in the established
        API. The stage holds ``prod(shape) * itemsize`` bytes: any request
        whose result (and rows read) fit, of this dataset, a column, or
        another dataset; rows read at scattered positions, as many as rows of
        8 bytes would fill it (or ``shape``'s rows, if more).
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

    __reduce__ = not_pickled  # its readers and shared memory are this process's

    def __repr__(self) -> str:
        return f"<multitables.Dataset {self.path!r} shape={self.shape} dtype={self.dtype}>"
