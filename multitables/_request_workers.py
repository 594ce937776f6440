"""Request workers: processes that read the rows of requests straight into shared-memory stages.

NOTE [request protocol]
    A :class:`~multitables.Reader` starts ``n_procs`` worker processes. Each
    has an *inbox*: a ring of fixed-size items in one shared control segment,
    written by the consumer only and read by that worker only, with two
    semaphores: ``work`` (items waiting) and ``space`` (free places). A
    semaphore hand-off costs ~0.1 us against ~126 us for a
    ``multiprocessing.Queue`` put+get. Items, in the order they are put:

    * ``ATTACH slot name``: map the stage segment ``name`` as stage ``slot``,
      then release ``attached``. A stage is created by the consumer, attached
      by every worker, then unlinked (NOTE [segment lifetime]).
    * ``READ request slot share a b``: read rows ``a..b`` of the plan held in
      the stage's header into rows ``a..b`` of its data.
    * ``DETACH slot``: unmap the stage (it was closed).
    * ``STOP``.

    * ``READ request slot 0 0 0`` of a *query* (``H_QUERY`` set): run the
      PyTables call the header describes (``Table.read_where``,
      ``read_sorted``) and copy its result into the data; its row count goes
      into ``H_RESULT_ROWS``. The size of a query's result is known only
      once it has run, so it is one share, and a result larger than the
      stage fails with :class:`~multitables.SharedMemoryError`.

    A stage segment holds a header (request id, the rows plan of NOTE
    [request plan], which node to read, one status word per share), the
    explicit rows read when the plan has them, then the data: the rows read,
    in order. ``Reader.request`` writes header and rows, then puts one READ
    per share into the inboxes of distinct workers. A worker reads its share,
    sends a report on its error pipe if it failed, sets its share's status
    (DONE or FAILED) and releases the stage's *channel*: one semaphore per
    stage slot, made when the workers start, since semaphores cannot be
    handed to processes that are already running.

    Status words are the truth; channel tokens only wake the waiting future,
    so a request dropped before it finished leaves at most spurious wake-ups
    behind. A stage is reused only once every share of its last request has a
    status. Inboxes are served in order, so a DETACH comes after every READ
    that used the stage, and a later ATTACH of the same slot after that.

    Every wait, on either side, is a loop of ``TICK`` waits that looks at the
    other side: the consumer at the workers' sentinels and error pipes, a
    worker at the stop flag and at whether the consumer still lives.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ._engines import limit_threads, open_source
from ._node import FileSignature, NodeInfo, check_file_unchanged
from ._reader_process import _ParentWatch, process_start_time
from ._signals import ignore_sigint, sigint_held_for_children
from ._readers import ATTACH_TIMEOUT, REPORT_TIMEOUT, end_processes
from ._request import RowPlan, effective_chunk_rows, group_bounds, run_bounds
from ._ring import TICK
from ._shm import Segment, unlink_orphan
from .errors import ReaderError, SharedMemoryError, StreamClosedError, _reader_died, _ReaderFailure

PAGE = 4096
#: Items in each worker's inbox.
INBOX_ITEMS = 64
ITEM_WORDS = 16
_NAME_WORD = 8  # item words 8..15 hold a segment name
_NAME_BYTES = (ITEM_WORDS - _NAME_WORD) * 8

# Item kinds.
STOP, ATTACH, DETACH, READ = 1, 2, 3, 4
# Item words.
_KIND, _REQ, _SLOT, _SHARE, _A, _B, _ROWS, _DATA = range(8)

# Stage header: int64 words, then the node description from byte _DESC_AT.
H_REQ, H_EXPLICIT, H_START, H_STEP, H_N_READ, H_DESC_LEN, H_QUERY, H_RESULT_ROWS = range(8)
H_STATUS = 16
#: Most shares one request is split into (one status word each).
MAX_SHARES = 64
_DESC_AT = 1024
HEADER_BYTES = 2 * PAGE
# Share status.
PENDING, DONE, FAILED = 0, 1, 2

#: Most runs of rows in one h5py read: HDF5 builds a union of hyperslabs in
#: quadratic time (256 runs: ~2 ms; 2560: ~120 ms), so longer lists are read in pieces.
RUNS_PER_READ = 64


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class StageLayout:
    """Sizes and offsets of a stage segment (bytes)."""

    max_rows: int
    data_nbytes: int

    @property
    def rows_offset(self) -> int:
        return HEADER_BYTES

    @property
    def data_offset(self) -> int:
        return HEADER_BYTES + _round_up(8 * self.max_rows, PAGE)

    @property
    def nbytes(self) -> int:
        return self.data_offset + _round_up(max(self.data_nbytes, 1), PAGE)


class StageMap:
    """One process's mapping of a stage segment."""

    def __init__(self, segment: Segment, layout: StageLayout, writable: bool) -> None:
        self.segment = segment
        self.layout = layout
        self.words = np.frombuffer(segment.buf, dtype=np.int64, count=_DESC_AT // 8)
        self.rows = np.frombuffer(segment.buf, dtype=np.int64, count=layout.max_rows, offset=layout.rows_offset)
        self._writable = writable

    def data(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The first ``shape`` of the data area, as ``dtype``."""
        arr = np.ndarray(shape, dtype, buffer=self.segment.buf, offset=self.layout.data_offset)
        arr.flags.writeable = self._writable
        return arr

    def write_desc(self, desc: bytes) -> None:
        self.segment.buf[_DESC_AT : _DESC_AT + len(desc)] = desc
        self.words[H_DESC_LEN] = len(desc)

    # -- the consumer's side of the header: the one place that knows its words ----------------
    def write_request(self, req: int, plan: "RowPlan | None", desc: bytes) -> None:
        """Set up request ``req``: its rows ``plan`` (None: a query, described in ``desc``), every share pending."""
        w = self.words
        w[H_REQ] = req
        w[H_QUERY] = plan is None
        w[H_RESULT_ROWS] = 0
        if plan is not None:
            w[H_EXPLICIT] = plan.rows is not None
            w[H_START] = plan.start
            w[H_STEP] = plan.step
            w[H_N_READ] = plan.n_read
            if plan.rows is not None:
                self.rows[: plan.n_read] = plan.rows
        w[H_STATUS : H_STATUS + MAX_SHARES] = PENDING
        self.write_desc(desc)

    def status(self, n_shares: int) -> list[int]:
        """The status (PENDING, DONE, FAILED) of the first ``n_shares`` shares; ``StreamClosedError`` once closed.

        A copy: a view on the stage kept in a frame (say, of a traceback)
        would keep the mapping, and its file descriptor, alive.
        """
        words = self.words
        if words is None:
            raise StreamClosedError("the stage is closed")
        return words[H_STATUS : H_STATUS + n_shares].tolist()

    @property
    def result_rows(self) -> int:
        """Rows a query's worker wrote."""
        return int(self.words[H_RESULT_ROWS])

    def read_desc(self) -> bytes:
        return bytes(self.segment.buf[_DESC_AT : _DESC_AT + int(self.words[H_DESC_LEN])])

    def close(self) -> None:
        self.words = self.rows = None  # type: ignore[assignment]
        self.segment.close()


#: Longest node description a stage header holds.
MAX_DESC = HEADER_BYTES - _DESC_AT


def describe(engine: str, node: NodeInfo) -> bytes:
    """The bytes that tell a worker which node to read and how (written into the stage per request)."""
    desc = pickle.dumps((engine, node), protocol=pickle.HIGHEST_PROTOCOL)
    if len(desc) > MAX_DESC:
        raise ValueError(f"the file name and node path are too long to hand to the readers ({len(desc)} bytes described)")
    return desc


def describe_query(node: NodeInfo, method: str, kwargs: dict[str, Any]) -> bytes:
    """The bytes that tell a worker which PyTables call to run on which node (a query)."""
    desc = pickle.dumps((node, method, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    if len(desc) > MAX_DESC:
        raise ValueError(
            f"the query on {node.path!r} is too large to hand to the readers ({len(desc)} bytes pickled, at most "
            f"{MAX_DESC}): pass large condvars as columns of the table instead"
        )
    return desc


def _control_nbytes(n_workers: int) -> int:
    return PAGE + n_workers * _round_up(INBOX_ITEMS * ITEM_WORDS * 8, PAGE)


def _inbox(buf: Any, index: int) -> np.ndarray:
    offset = PAGE + index * _round_up(INBOX_ITEMS * ITEM_WORDS * 8, PAGE)
    return np.ndarray((INBOX_ITEMS, ITEM_WORDS), np.int64, buffer=buf, offset=offset)


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker needs, sent once at process start."""

    index: int
    filename: str
    open_kwargs: dict[str, Any]
    control_name: str
    n_workers: int
    parent_pid: int
    parent_start: "str | None"
    file_signature: "FileSignature | None"


@dataclass(frozen=True)
class WorkerSync:
    """One worker's process-shared primitives (picklable at process start)."""

    work: Any
    space: Any
    attached: Any
    channels: tuple[Any, ...]


# -- worker side ------------------------------------------------------------


class _Stopped(Exception):
    """The consumer asked the workers to stop while one was reading."""


class _H5pyRows:
    """Reads sorted rows with h5py's low-level calls: one HDF5 read per up to ``RUNS_PER_READ`` runs.

    The high-level ``read_direct`` costs ~100 us more per call than
    ``DatasetID.read``; a request of 256 scattered rows makes 256 runs.
    """

    def __init__(self, node: NodeInfo, open_kwargs: dict[str, Any]) -> None:
        import h5py
        import hdf5plugin  # noqa: F401  (registers the filters)
        from h5py import h5s, h5t

        self._h5s = h5s
        self._file = h5py.File(node.filename, "r", **open_kwargs)
        ds = self._file[node.path]
        self._id = ds.id
        self._fspace = self._id.get_space()
        self._file_row = tuple(int(d) for d in ds.shape[1:])
        # Read by the file's element type (HDF5 array elements are numpy axes), or one field of it.
        self._read_dtype = node.field_read_dtype if node.field is not None else node.file_dtype
        self._mtype = h5t.py_create(self._read_dtype)
        self._zero_first = node.zero_first

    def read(self, rows: np.ndarray, out: np.ndarray, stopped: Callable[[], bool]) -> None:
        if out.nbytes == 0:
            return
        if self._zero_first:  # HDF5 leaves unallocated storage untouched; h5py's reads give zeros
            out.reshape(-1).view(np.uint8).fill(0)
        h5s, fs, row = self._h5s, self._fspace, self._file_row
        zeros = (0,) * len(row)
        bounds = run_bounds(rows)
        firsts = rows[bounds[:-1]].tolist()
        lasts = rows[bounds[1:] - 1].tolist()
        idx = bounds.tolist()
        for r0 in range(0, len(firsts), RUNS_PER_READ):
            r1 = min(r0 + RUNS_PER_READ, len(firsts))
            op = h5s.SELECT_SET
            for lo, last in zip(firsts[r0:r1], lasts[r0:r1]):
                fs.select_hyperslab((lo,) + zeros, (last + 1 - lo,) + row, op=op)
                op = h5s.SELECT_OR
            i0, i1 = idx[r0], idx[r1]
            dest = np.ndarray((i1 - i0,) + row, self._read_dtype, buffer=out[i0:i1])
            self._id.read(h5s.create_simple((i1 - i0,) + row), fs, dest, self._mtype)
            if stopped():
                raise _Stopped

    def close(self) -> None:
        self._file.close()


class _SourceRows:
    """Reads sorted rows through any engine's ``Source.read_into``, one call per group (NOTE [request plan])."""

    def __init__(self, engine: str, node: NodeInfo, open_kwargs: dict[str, Any]) -> None:
        self._source = open_source(engine, node, open_kwargs)
        self._node = node
        self._chunk = effective_chunk_rows(node.chunk_rows, node.row_nbytes)
        self._scratch: "np.ndarray | None" = None

    def read(self, rows: np.ndarray, out: np.ndarray, stopped: Callable[[], bool]) -> None:
        if out.nbytes == 0:
            return
        bounds = group_bounds(rows, self._chunk).tolist()
        values = rows.tolist()
        for i0, i1 in zip(bounds[:-1], bounds[1:]):
            lo, hi = values[i0], values[i1 - 1] + 1
            if hi - lo == i1 - i0:
                self._source.read_into(lo, hi, out[i0:i1])
            else:  # runs within one chunk: read the span they cover once, then gather
                if self._scratch is None or len(self._scratch) < hi - lo:
                    self._scratch = np.empty((max(hi - lo, self._chunk),) + self._node.row_shape, self._node.dtype)
                span = self._scratch[: hi - lo]
                self._source.read_into(lo, hi, span)
                np.take(span, rows[i0:i1] - lo, axis=0, out=out[i0:i1])
            if stopped():
                raise _Stopped

    def close(self) -> None:
        self._source.close()


def _open_rows(engine: str, node: NodeInfo, open_kwargs: dict[str, Any]) -> "_H5pyRows | _SourceRows":
    if engine == "h5py":
        return _H5pyRows(node, open_kwargs)
    return _SourceRows(engine, node, open_kwargs)


class _Worker:
    """The state of one worker process; see NOTE [request protocol]."""

    def __init__(self, settings: WorkerSettings, sync: WorkerSync, error_conn: Any) -> None:
        self.settings = settings
        self.sync = sync
        self.error_conn = error_conn
        self.parent_alive = _ParentWatch(settings.parent_pid, settings.parent_start)
        self.stages: dict[int, StageMap] = {}
        self.names: set[str] = {settings.control_name}
        self.readers: dict[bytes, tuple[NodeInfo, Any]] = {}
        self.tables_file: Any = None  # PyTables' handle on the file, opened by the first query
        self.control: "Segment | None" = None

    def stopped(self) -> bool:
        return bool(self._flags[0]) or not self.parent_alive()

    def serve(self) -> None:
        s = self.settings
        self.control = Segment.attach(s.control_name, _control_nbytes(s.n_workers))
        self._flags = np.frombuffer(self.control.buf, dtype=np.int64, count=1)
        inbox = _inbox(self.control.buf, s.index)
        self.sync.attached.release()
        head = 0
        while True:
            if not self.sync.work.acquire(timeout=TICK):
                if self.stopped():
                    return
                continue
            item = inbox[head % INBOX_ITEMS].tolist()
            head += 1
            self.sync.space.release()
            kind = item[_KIND]
            if kind == STOP or self.stopped():
                return
            if kind == READ:
                self.read_share(item)
            elif kind == ATTACH:
                name = bytes(np.array(item[_NAME_WORD:], dtype=np.int64).tobytes()).rstrip(b"\0").decode()
                self.names.add(name)
                layout = StageLayout(item[_ROWS], item[_DATA])
                self.stages[item[_SLOT]] = StageMap(Segment.attach(name, layout.nbytes), layout, writable=True)
                self.sync.attached.release()
            elif kind == DETACH:
                stage = self.stages.pop(item[_SLOT], None)
                if stage is not None:
                    stage.close()

    def _reader(self, desc: bytes) -> tuple[NodeInfo, Any]:
        got = self.readers.get(desc)
        if got is None:
            engine, node = pickle.loads(desc)
            got = self.readers[desc] = (node, _open_rows(engine, node, self.settings.open_kwargs))
        return got

    def read_share(self, item: list[int]) -> None:
        req, slot, share, a, b = item[_REQ], item[_SLOT], item[_SHARE], item[_A], item[_B]
        stage = self.stages[slot]
        w = stage.words
        status = FAILED
        node: "NodeInfo | None" = None
        rows: "np.ndarray | None" = None
        try:
            if int(w[H_REQ]) != req:
                raise RuntimeError(f"stage {slot} holds request {int(w[H_REQ])}, not {req}")
            if w[H_QUERY]:
                node = self.query(stage)
            else:
                node, reader = self._reader(stage.read_desc())
                n_read = int(w[H_N_READ])
                if w[H_EXPLICIT]:
                    rows = np.array(stage.rows[a:b])
                else:
                    rows = int(w[H_START]) + int(w[H_STEP]) * np.arange(a, b, dtype=np.int64)
                out = stage.data(node.dtype, (n_read,) + node.row_shape)[a:b]
                reader.read(rows, out, self.stopped)
            check_file_unchanged(self.settings.filename, self.settings.file_signature)
            status = DONE
        except _Stopped:
            return
        except Exception as exc:
            span = (int(rows[0]), int(rows[-1]) + 1) if rows is not None and len(rows) else None
            self.report(req, exc, node.path if node is not None else "", span)
        w[H_STATUS + share] = status
        self.sync.channels[slot].release()

    def query(self, stage: StageMap) -> NodeInfo:
        """Run the query described in ``stage``'s header with PyTables; its result becomes the stage's data."""
        node, method, kwargs = pickle.loads(stage.read_desc())
        if self.tables_file is None:
            import tables

            self.tables_file = tables.open_file(self.settings.filename, "r", **self.settings.open_kwargs)
        result = getattr(self.tables_file.get_node(node.path), method)(**kwargs)
        result = np.asarray(result)
        if result.dtype != node.dtype:
            result = result.astype(node.dtype)
        if result.nbytes > stage.layout.data_nbytes:
            raise SharedMemoryError(
                f"the result of {method}() on {node.path!r} is {len(result)} rows ({result.nbytes} bytes), "
                f"more than the stage holds ({stage.layout.data_nbytes} bytes); use a larger stage or narrow the query"
            )
        stage.data(result.dtype, result.shape)[...] = result
        stage.words[H_RESULT_ROWS] = len(result)
        return node

    def report(self, req: int, exc: BaseException, path: str, rows: "tuple[int, int] | None") -> None:
        """Send a failure report to the consumer (``req`` -1: the worker itself failed); never raises."""
        try:
            failure = _ReaderFailure.from_exception(
                exc,
                reader_index=self.settings.index,
                pid=os.getpid(),
                filename=self.settings.filename,
                path=path,
                rows=rows,
            )
            self.error_conn.send((req, failure))
        except BaseException:
            pass  # the consumer is gone or closed the pipe; it sees our exit instead

    def close(self) -> None:
        for _node, reader in self.readers.values():
            try:
                reader.close()
            except Exception:
                pass
        if self.tables_file is not None:
            try:
                self.tables_file.close()
            except Exception:
                pass
        for stage in self.stages.values():
            stage.close()
        self.error_conn.close()
        if not self.parent_alive():
            for name in self.names:  # the consumer died, maybe before it could unlink these
                unlink_orphan(name)
        if self.control is not None:
            self._flags = None  # type: ignore[assignment]
            self.control.close()


def run(settings: WorkerSettings, sync: WorkerSync, error_conn: Any) -> None:
    """Worker process entry point; see NOTE [request protocol]."""
    ignore_sigint()  # the consumer decides what Ctrl-C does
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as stream readers: SIGTERM is the consumer's escalation
    worker = _Worker(settings, sync, error_conn)
    try:
        limit_threads()
        worker.serve()
    except BaseException as exc:
        worker.report(-1, exc, "", None)
        raise SystemExit(1) from None
    finally:
        worker.close()


# -- consumer side -----------------------------------------------------------


class WorkerPool:
    """The consumer's side of the request workers: start, feed, watch, stop.

    Shutdown follows NOTE [shutdown] in ``_readers``: set the stop flag and
    wake every worker, join for up to ``JOIN_TIMEOUT`` s, then SIGTERM, then
    SIGKILL; close the pipes, unlink what is left, unmap.
    """

    def __init__(
        self,
        filename: str,
        open_kwargs: dict[str, Any],
        n_procs: int,
        max_stages: int,
        start_method: "str | None",
        file_signature: "FileSignature | None",
    ) -> None:
        import threading

        self.filename = filename
        self.n_procs = n_procs
        self.closed = False
        self.finishing = False  # told to stop once their inboxes are served (finish())
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._listening: dict[Any, int] = {}  # error pipe -> worker, until EOF
        self._watched: dict[Any, int] = {}  # sentinel -> worker
        self._dead: dict[int, tuple[int, "int | None", "_ReaderFailure | None"]] = {}
        self._failures: dict[int, _ReaderFailure] = {}
        self._tails = [0] * n_procs
        self._push_lock = threading.Lock()
        self._attach_lock = threading.Lock()
        self._look_lock = threading.Lock()
        ctx = multiprocessing.get_context(start_method)
        self._works = [ctx.Semaphore(0) for _ in range(n_procs)]
        self._spaces = [ctx.Semaphore(INBOX_ITEMS) for _ in range(n_procs)]
        self._attached = ctx.Semaphore(0)
        self.channels = tuple(ctx.Semaphore(0) for _ in range(max_stages))
        self._control = Segment.create(_control_nbytes(n_procs), what="The request inboxes")
        self._control.buf[:PAGE] = bytes(PAGE)
        self._flags = np.frombuffer(self._control.buf, dtype=np.int64, count=1)
        self._inboxes = [_inbox(self._control.buf, i) for i in range(n_procs)]
        try:
            me = os.getpid()
            me_start = process_start_time(me)
            for i in range(n_procs):
                settings = WorkerSettings(
                    index=i,
                    filename=filename,
                    open_kwargs=open_kwargs,
                    control_name=self._control.name,
                    n_workers=n_procs,
                    parent_pid=me,
                    parent_start=me_start,
                    file_signature=file_signature,
                )
                sync = WorkerSync(self._works[i], self._spaces[i], self._attached, self.channels)
                recv, send = ctx.Pipe(duplex=False)
                self._conns.append(recv)
                self._listening[recv] = i
                try:
                    proc = ctx.Process(target=run, args=(settings, sync, send), name=f"multitables-request-{i}", daemon=True)
                    with sigint_held_for_children():
                        proc.start()
                finally:
                    send.close()
                self._procs.append(proc)
                self._watched[proc.sentinel] = i
            self._wait_attached("start")
        except BaseException:
            self.close()
            raise
        finally:
            self._control.unlink()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- watching ---------------------------------------------------------------
    def look(self) -> None:
        """Collect failure reports and notice workers that died; cheap, call it every tick of a wait."""
        with self._look_lock:
            self._drain(0)
            if self._watched:
                for sentinel in multiprocessing.connection.wait(list(self._watched), timeout=0):
                    i = self._watched.pop(sentinel)  # type: ignore[call-overload]
                    proc = self._procs[i]
                    proc.join(TICK)
                    if self.finishing and proc.exitcode == 0:
                        continue  # it served its inbox and stopped, as told
                    self._drain(REPORT_TIMEOUT if proc.exitcode else 0)
                    self._dead[i] = (proc.pid, proc.exitcode, self._failures.pop(-1 - i, None))

    def _drain(self, timeout: float) -> None:
        """Read every report waiting on the error pipes (waiting up to ``timeout`` s for a first one)."""
        while self._listening:
            ready = multiprocessing.connection.wait(list(self._listening), timeout=timeout)
            if not ready:
                return
            timeout = 0
            for conn in ready:
                try:
                    req, failure = conn.recv()
                except (EOFError, OSError):
                    del self._listening[conn]
                    continue
                # A worker's own failure is kept as -1 - index until its death is seen.
                self._failures[req if req >= 0 else -1 - failure.reader_index] = failure

    def dead_error(self, i: int, path: str) -> "ReaderError | None":
        """A fresh error for worker ``i`` if it died, else None."""
        dead = self._dead.get(i)
        if dead is None:
            return None
        pid, exitcode, failure = dead
        if failure is not None:
            return failure.to_exception()
        return _reader_died(i, pid, exitcode, self.filename, path)

    def broken(self) -> "ReaderError | None":
        """The error of the first worker that died, if one did: the pool takes no more requests."""
        for i in sorted(self._dead):
            exc = self.dead_error(i, "")
            assert exc is not None
            broken = ReaderError(f"a request reader died, so this Reader cannot take more requests; close it. {exc}")
            broken.__cause__ = exc
            return broken
        return None

    def failure(self, req: int) -> ReaderError:
        """The error a worker reported for request ``req`` (it sends the report before flagging the share)."""
        deadline = time.monotonic() + REPORT_TIMEOUT
        while True:
            with self._look_lock:
                got = self._failures.pop(req, None)
                if got is not None:
                    return got.to_exception()
                if time.monotonic() > deadline:
                    return ReaderError(f"a reader failed on request {req} of {self.filename!r}, but its report was lost")
                self._drain(TICK)

    def forget(self, req: int) -> None:
        """Drop the report of a request nobody will ask about."""
        with self._look_lock:
            self._drain(0)
            self._failures.pop(req, None)

    # -- feeding ----------------------------------------------------------------
    def push(self, worker: int, words: "list[int]", name: bytes = b"") -> None:
        """Put one item in a worker's inbox, waiting (with liveness checks) while it is full."""
        space = self._spaces[worker]
        while not space.acquire(timeout=TICK):
            self.look()
            if self.closed:
                raise StreamClosedError(f"the Reader of {self.filename!r} was closed")
            if worker in self._dead:
                raise self.broken()  # type: ignore[misc]
        with self._push_lock:
            item = self._inboxes[worker][self._tails[worker] % INBOX_ITEMS]
            item[:] = 0
            item[: len(words)] = words
            if name:
                item[_NAME_WORD:] = np.frombuffer(name.ljust(_NAME_BYTES, b"\0"), dtype=np.int64)
            self._tails[worker] += 1
        self._works[worker].release()

    def read(self, worker: int, req: int, slot: int, share: int, a: int, b: int) -> None:
        """Have ``worker`` read rows ``a..b`` of request ``req`` (share ``share``) into stage ``slot``."""
        self.push(worker, [READ, req, slot, share, a, b])

    def attach(self, slot: int, segment: Segment, layout: StageLayout) -> None:
        """Have every worker map a new stage, and wait until they all did (then the name can go)."""
        name = segment.name.encode()
        if len(name) > _NAME_BYTES:  # pragma: no cover - names are short by construction
            raise ValueError(f"segment name {segment.name!r} is too long")
        with self._attach_lock:
            for i in range(self.n_procs):
                self.push(i, [ATTACH, 0, slot, 0, 0, 0, layout.max_rows, layout.data_nbytes], name)
            self._wait_attached("map a new stage")

    def detach(self, slot: int) -> None:
        """Have every live worker unmap a closed stage (does not wait)."""
        for i in range(self.n_procs):
            if i not in self._dead and not self.closed:
                self.push(i, [DETACH, 0, slot])

    def _wait_attached(self, what: str) -> None:
        deadline = time.monotonic() + ATTACH_TIMEOUT
        for _ in range(self.n_procs):
            while not self._attached.acquire(timeout=TICK):
                self.look()
                broken = self.broken()
                if broken is not None:
                    raise broken
                if time.monotonic() > deadline:
                    raise ReaderError(f"the request readers of {self.filename!r} did not {what} within {ATTACH_TIMEOUT:.0f} s")

    # -- stopping ---------------------------------------------------------------
    def finish(self) -> None:
        """Tell every worker to stop once it has served what its inbox holds (does not wait)."""
        if self.closed or self.finishing:
            return
        self.finishing = True
        for i in range(self.n_procs):
            if i not in self._dead:
                self.push(i, [STOP])

    def running(self, timeout: float = 0.0) -> bool:
        """Whether a worker still runs, after waiting up to ``timeout`` s for one to end."""
        if self.closed:
            return False
        watched = list(self._watched)
        if watched and timeout > 0:
            multiprocessing.connection.wait(watched, timeout=timeout)
        self.look()
        return bool(self._watched)

    def close(self) -> None:
        """Stop every worker and free everything (idempotent); see NOTE [shutdown] in ``_readers``."""
        if self.closed:
            return
        self.closed = True
        self._flags[0] = 1
        for work in self._works:
            work.release()  # wake an idle worker now rather than at its next tick
        end_processes(self._procs)
        for conn in self._conns:
            conn.close()
        self._listening.clear()
        for proc in self._procs:
            if proc.exitcode is not None:
                proc.close()
        self._watched.clear()
        self._flags = None  # type: ignore[assignment]
        self._inboxes = []
        self._control.unlink()
        self._control.close()
