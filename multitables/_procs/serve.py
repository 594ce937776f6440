"""Random access on the reader pool: the loop that reads requests into stages, and the consumer's side of it.

NOTE [request protocol]
    A :class:`~multitables.Reader` starts ``n_procs`` reader processes on a
    :class:`~.pool.ReaderPool`. Each has an *inbox* (``_shm.inbox``): a ring
    of fixed-size items in one shared control segment, written by the
    consumer only and read by that reader only. Items, in the order they
    are put:

    * ``ATTACH stage_id name``: map the stage segment ``name`` as stage ``stage_id``,
      then release ``attached``. A stage is created by the consumer, attached
      by every reader, then unlinked (NOTE [segment lifetime]).
    * ``READ request stage_id share a b``: read rows ``a..b`` of the plan held in
      the stage's header into rows ``a..b`` of its data.
    * ``DETACH stage_id``: unmap the stage (it was closed).
    * ``LEARN name nbytes``: copy a set's node out of the segment ``name``,
      then release ``attached`` (NOTE [set descriptions] in ``_io.setref``).
    * ``STOP``.

    * ``READ request stage_id 0 0 0`` of a *query* (the stage says so): run the
      PyTables call the header describes (``Table.read_where``,
      ``read_sorted``) and copy its result into the data; its row count goes
      into the header. The size of a query's result is known only
      once it has run, so it is one share, and a result larger than the
      stage fails with :class:`~multitables.SharedMemoryError`.

    A stage segment (``_shm.stagemap``) holds a header (request id, the rows
    plan of NOTE [request plan], which node to read, one status word per
    share), the explicit rows read when the plan has them, then the data:
    the rows read, in order. ``Reader.request`` writes header and rows, then puts one READ
    per share into the inboxes of distinct readers. A reader reads its share,
    sends a report (tagged with the request) on its pipe if it failed, sets its share's status
    (DONE or FAILED) and releases the stage's *channel*: one semaphore per
    stage id, made when the readers start, since semaphores cannot be
    handed to processes that are already running.

    Status words are the truth; channel tokens only wake the waiting future,
    so a request dropped before it finished leaves at most spurious wake-ups
    behind. A stage is reused only once every share of its last request has a
    status. Inboxes are served in order, so a DETACH comes after every READ
    that used the stage, and a later ATTACH of the same stage_id after that.

    Every wait, on either side, is a loop of ``TICK`` waits that looks at the
    other side: the consumer at the readers' sentinels and error pipes, a
    reader at the stop flag and at whether the consumer still lives.
"""

from __future__ import annotations

import pickle
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._io.fileset import own_flags
from .._io.files import REQUESTED, FileSignature, GrowingFile, check_file_unchanged, grew
from .._io.node import NodeInfo
from .._io.objects.config import Store
from .._io.objects.identity import ObjectIdentity
from .._io.engines import open_rows
from .._io.scattered import Stopped
from .._io.setref import Learned, NodeRef, SetRef
from .._io.tables_engine import pytables_options
from .._plan.requests import ReadRows
from .._shm.inbox import ATTACH, DETACH, LEARN, READ, STOP, InboxSync, Inboxes, Item
from .._shm.ring import TICK
from .._shm.segment import Segment
from .._shm.space import semaphores_for
from .._shm.stagemap import DONE, FAILED, StageLayout, StageMap
from .._sys.awake import Eagerness, acquire
from ..errors import FileChangedError, ReaderError, SharedMemoryError, StreamClosedError
from .failure import died_error
from .pool import REPORT_TIMEOUT, ReaderPool
from .process import ReaderProcess

#: What a /dev/shm too full for a Reader's semaphores (one per stage and two per reader) calls them.
SEMAPHORES = "The Reader's semaphores"


@dataclass(frozen=True)
class ServeSettings:
    """What every request reader of one Reader needs, sent once at process start."""

    open_kwargs: dict[str, Any]
    control_name: str
    file_signature: "FileSignature | GrowingFile | ObjectIdentity | None"
    #: The Reader's file, or its set's files (NOTE [file sets] in ``_io.fileset``).
    files: "str | tuple[str, ...]" = ""
    #: How objects (URLs) are reached; None where no file is one.
    store: "Store | None" = None


# -- the reader's side -----------------------------------------------------------------------


def serve_loop(reader: ReaderProcess, settings: ServeSettings, sync: InboxSync, channels: tuple[Any, ...]) -> None:
    """A request reader's loop: serve its inbox until STOP, the stop word, or the consumer's death."""
    reader.segments.add(settings.control_name)
    server = _Server(reader, settings, channels, Inboxes.attach(settings.control_name, reader.identity.n_readers))
    try:
        reader.attached()
        server.serve(sync)
    finally:
        server.close()


class ShareReader:
    """Reads a request's share into a stage: the nodes, and the engines' rows readers opened on them, kept; PyTables'
    file for queries. A request reader's, or the consumer's where it reads the requests itself (``n_procs=0``)."""

    def __init__(self, filename: str, settings: ServeSettings, learned: "Learned | None" = None) -> None:
        self.filename, self.settings = filename, settings
        #: Sets' nodes the consumer handed over (NOTE [set descriptions] in ``_io.setref``).
        self.learned = Learned() if learned is None else learned
        self.readers: dict[bytes, Any] = {}
        self.nodes: dict[bytes, tuple[str, NodeInfo]] = {}
        self.tables_file: Any = None  # PyTables' handle on the file, opened by the first query
        #: What every read checks the file against: for a file read with swmr=True, as large as the latest look at
        #: it known here saw it (NOTE [file identity]).
        self.expected = settings.file_signature

    def _node(self, desc: bytes) -> tuple[str, NodeInfo]:
        """The engine and the node of a stage's description (decoded once): known before an open that may fail."""
        got = self.nodes.get(desc)
        if got is None:
            engine, node = pickle.loads(desc)
            flags = own_flags(self.settings.open_kwargs)
            if isinstance(node, NodeRef):  # handed over before the request (NOTE [set descriptions])
                node = node.resolve(self.learned)
            if isinstance(node, SetRef):
                if flags["swmr"]:  # its files looked at by this process's one open of each (NOTE [swmr extent])
                    self.drop_opens(node.path)
                node = node.resolve(self.settings.files, self.settings.store, **flags,  # type: ignore[arg-type]  # a set's: a tuple
                                    learned=self.learned)
            elif grew(node.identity, self.expected):  # a later look at a growing file: no smaller than it saw
                self.expected = node.identity
            got = self.nodes[desc] = (engine, node)
        return got

    def _reader(self, desc: bytes) -> Any:
        reader = self.readers.get(desc)
        if reader is None:
            engine, node = self._node(desc)
            if own_flags(self.settings.open_kwargs)["swmr"]:  # its one open here, which refreshes: NOTE [swmr extent]
                self.drop_opens(node.path)
            reader = self.readers[desc] = open_rows(engine, node, self.settings.open_kwargs)
        return reader

    def drop_opens(self, path: "str | None" = None) -> None:
        """Close the rows readers open on the dataset at ``path`` of the Reader's files (None: on any), to be opened
        again when next read."""
        for desc, (_engine, known) in self.nodes.items():
            if desc in self.readers and (path is None or known.path == path):
                try:
                    self.readers.pop(desc).close()
                except Exception:
                    pass

    def read(self, stage: StageMap, req: int, a: int, b: int,
             stopped: Callable[[], bool]) -> "tuple[Exception, str, tuple[int, int] | None] | None":
        """Read rows ``a..b`` of request ``req`` into ``stage``: None once read, else ``(error, node path, rows)``;
        :class:`Stopped` where ``stopped()`` says so meanwhile."""
        node: "NodeInfo | None" = None
        rows: "ReadRows | None" = None
        try:
            if stage.request_id != req:
                raise RuntimeError(f"the stage holds request {stage.request_id}, not {req}")
            if stage.is_query:
                node, method, kwargs = pickle.loads(stage.read_desc())
                self.query(stage, node, method, kwargs)
            else:
                desc = stage.read_desc()
                node, rows = self._node(desc)[1], stage.rows_of(a, b)  # named where the open fails too
                reader = self._reader(desc)
                out = stage.data(node.dtype, (stage.n_read,) + node.row_shape)[a:b]
                reader.read(rows, out, stopped)
            check_file_unchanged(self.filename, self.expected, REQUESTED)
            return None
        except Stopped:
            raise
        except Exception as exc:
            try:  # a file changed under a read explains the read's failure (NOTE [file identity])
                check_file_unchanged(self.filename, self.expected, REQUESTED)
            except FileChangedError as changed:
                changed.__cause__, exc = exc, changed
            span = (int(rows[0]), int(rows[-1]) + 1) if rows is not None and len(rows) else None
            return exc, node.path if node is not None else "", span

    def query(self, stage: StageMap, node: NodeInfo, method: str, kwargs: dict[str, Any]) -> None:
        """Run PyTables' ``method(**kwargs)`` on ``node``; its result becomes ``stage``'s data."""
        if self.tables_file is None:
            import tables

            self.tables_file = tables.open_file(self.filename, "r", **pytables_options(self.settings.open_kwargs))
        with warnings.catch_warnings():
            # PyTables' own, of a float32 column's full index (bounds cast in tables/index.py), with plain PyTables
            # too: nothing of the rows, and an error for a user who runs with -W error.
            warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning, r"tables\.index")
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
        stage.set_result_rows(len(result))

    def close(self) -> None:
        """Close what it opened (never raises)."""
        for reader in self.readers.values():
            try:
                reader.close()
            except Exception:
                pass
        if self.tables_file is not None:
            try:
                self.tables_file.close()
            except Exception:
                pass


class _Server:
    """The state of one request reader; see NOTE [request protocol]."""

    def __init__(self, reader: ReaderProcess, settings: ServeSettings, channels: tuple[Any, ...], inboxes: Inboxes) -> None:
        self.reader, self.settings, self.channels, self.inboxes = reader, settings, channels, inboxes
        self.stages: dict[int, StageMap] = {}
        self.shares = ShareReader(reader.identity.filename, settings)

    def stopped(self) -> bool:
        return self.inboxes.stopped or not self.reader.parent_alive()

    def serve(self, sync: InboxSync) -> None:
        me = self.reader.identity.index
        head = 0
        awake = Eagerness()  # NOTE [waiting awake]
        while True:
            if not acquire(sync.work, awake, TICK):
                if self.stopped():
                    return
                continue
            item = self.inboxes.get(me, head)
            head += 1
            sync.space.release()
            if item.kind == STOP or self.stopped():
                return
            if item.kind == READ:
                self.read_share(item)
            elif item.kind == ATTACH:
                self.reader.segments.add(item.name)
                layout = StageLayout(item.max_rows, item.data_nbytes)
                self.stages[item.stage_id] = StageMap(Segment.attach(item.name, layout.nbytes), layout, writable=True)
                self.reader.attached()
            elif item.kind == DETACH:
                stage = self.stages.pop(item.stage_id, None)
                if stage is not None:
                    # Its consumer unlinked the name once every reader mapped it, before any DETACH: kept, it would
                    # grow the orphan's list by a name a stage ever made (a Reader making stages all its life).
                    self.reader.segments.discard(stage.segment.name)
                    stage.close()
            elif item.kind == LEARN:
                self.reader.segments.add(item.name)
                segment = Segment.attach(item.name, item.data_nbytes)
                try:
                    self.shares.learned.add(*pickle.loads(segment.buf[:item.data_nbytes]))
                finally:
                    segment.close()
                self.reader.attached()

    def read_share(self, item: Item) -> None:
        stage = self.stages[item.stage_id]
        try:
            failed = self.shares.read(stage, item.req, item.a, item.b, self.stopped)
        except Stopped:
            return
        if failed is not None:
            self.reader.report(item.req, *failed)
        stage.set_status(item.share, DONE if failed is None else FAILED)
        self.channels[item.stage_id].release()

    def close(self) -> None:
        self.shares.close()
        for stage in self.stages.values():
            stage.close()
        self.inboxes.close()


# -- the consumer's side ---------------------------------------------------------------------


class ServeReaders:
    """The consumer's side of a Reader's request readers: start, feed, watch, stop.

    Shutdown follows NOTE [shutdown] in ``pool``: the stop word, and every
    reader woken, then join, SIGTERM, SIGKILL; the pool's pipes closed,
    the inboxes unlinked and unmapped.
    """

    def __init__(
        self,
        filename: str,
        open_kwargs: dict[str, Any],
        n_procs: int,
        max_stages: int,
        start_method: "str | None",
        file_signature: "FileSignature | GrowingFile | ObjectIdentity | None",
        files: "str | tuple[str, ...]" = "",
        store: "Store | None" = None,
    ) -> None:
        self.filename = filename
        self.n_procs = n_procs
        #: The file's identity when the Reader was made, which its readers check the file against (None: a set).
        self.file_signature = file_signature
        self.finishing = False  # told to stop once their inboxes are served (finish())
        self._tails = [0] * n_procs
        self._push_lock = threading.Lock()
        self._attach_lock = threading.Lock()
        self._learned = Learned()  # the refs of the nodes the readers hold, as they hold them
        self.pool = ReaderPool(start_method, filename, name="request", semaphores=SEMAPHORES, n_readers=n_procs)
        ctx = self.pool.ctx
        with semaphores_for(SEMAPHORES):
            self._syncs = [InboxSync.create(ctx) for _ in range(n_procs)]
            self.channels = tuple(ctx.Semaphore(0) for _ in range(max_stages))
        self._inboxes = Inboxes.create(n_procs)
        try:
            settings = ServeSettings(open_kwargs, self._inboxes.segment.name, file_signature, files, store)
            self.pool.start(serve_loop, [(settings, sync, self.channels) for sync in self._syncs], files=files or filename,
                            segments=(settings.control_name,),
                            semaphores=(*self.channels, *(s for sync in self._syncs for s in sync.semaphores)))
            self.pool.wait_attached("start", self._check_broken)
            self.pool.unlink_semaphores()  # every reader opened them (NOTE [semaphore names] in ``_shm.semaphores``)
            self._inboxes.segment.unlink()  # in the try, as a stream's ring is (``_procs.stream.StreamReaders``)
        except BaseException:
            try:
                self.close()
            finally:
                self._inboxes.segment.unlink()
            raise

    @property
    def closed(self) -> bool:
        return self.pool.closed

    @property
    def pids(self) -> list[int]:
        return self.pool.pids

    def drop_opens(self) -> None:
        """Nothing here: the readers hold their opens, in their processes (NOTE [swmr extent] in ``_io.handles``)."""

    # -- watching ---------------------------------------------------------------
    def look(self) -> None:
        """Collect failure reports and notice readers that ended; cheap, call it every tick of a wait."""
        self.pool.look()

    def _dead(self) -> list[int]:
        """Readers that ended other than as told (a clean exit after finish() is as told)."""
        return sorted(i for i, (_pid, code, _r) in self.pool.ended.items() if not (self.finishing and code == 0))

    def is_dead(self, i: int) -> bool:
        """Whether reader ``i`` ended other than as told (as last looked)."""
        return i in self._dead()

    def dead_error(self, i: int, path: str) -> "ReaderError | None":
        """A fresh error for reader ``i`` if it died, else None."""
        if i not in self._dead():
            return None
        error = self.pool.end_error(i, path)
        if error is None:  # exited cleanly though nobody told it to
            pid, code, _report = self.pool.ended[i]
            error = died_error(i, pid, code, self.filename, path)
        return error

    def broken(self) -> "ReaderError | None":
        """The error of the first reader that died, if one did: the pool takes no more requests."""
        for i in self._dead():
            exc = self.dead_error(i, "")
            broken = ReaderError(f"a request reader died, so this Reader cannot take more requests; close it. {exc}")
            broken.__cause__ = exc
            return broken
        return None

    def _check_broken(self) -> None:
        self.look()
        broken = self.broken()
        if broken is not None:
            raise broken

    def failure(self, req: int) -> ReaderError:
        """The error a reader reported for request ``req`` (it sends the report before flagging the share)."""
        report = self.pool.tagged_report(req, REPORT_TIMEOUT)
        if report is None:
            return ReaderError(f"a reader failed on request {req} of {self.filename!r}, but its report was lost")
        return report.to_exception()

    def forget(self, req: int) -> None:
        """Drop the report of a request nobody will ask about."""
        self.pool.forget(req)

    # -- feeding ----------------------------------------------------------------
    def check_owner(self) -> None:
        """Raise ``RuntimeError`` in a forked child: the readers are its parent's (NOTE [forked children] in ``pool``)."""
        self.pool.check_owner()

    def _push(self, reader: int, item: Item) -> None:
        """Put one item in a reader's inbox, waiting (with liveness checks) while it is full."""
        self.check_owner()
        space = self._syncs[reader].space
        while not space.acquire(timeout=TICK):
            self.look()
            if self.closed:
                raise StreamClosedError(f"the Reader of {self.filename!r} was closed")
            if reader in self._dead():
                raise self.broken()  # type: ignore[misc]  # not None: a reader is dead
        with self._push_lock:
            self._inboxes.put(reader, self._tails[reader], item)
            self._tails[reader] += 1
        self._syncs[reader].work.release()

    def read(self, reader: int, req: int, stage_id: int, share: int, a: int, b: int) -> None:
        """Have ``reader`` read rows ``a..b`` of request ``req`` (share ``share``) into stage ``stage_id``."""
        self._push(reader, Item(READ, req, stage_id, share, a, b))

    def stage_segment(self, layout: StageLayout) -> Segment:
        """Shared memory for a new stage, which every reader maps (:meth:`attach`)."""
        return Segment.create(layout.nbytes, what="The stage", lazy=layout.rows_room)

    def attach(self, stage_id: int, stage: StageMap) -> None:
        """Have every reader map a new stage, and wait until they all did (then the name can go)."""
        layout, name = stage.layout, stage.segment.name
        with self._attach_lock:
            for i in range(self.n_procs):
                self._push(i, Item(ATTACH, stage_id=stage_id, max_rows=layout.max_rows, data_nbytes=layout.data_nbytes, name=name))
            self.pool.wait_attached("map a new stage", self._check_broken)

    def learn(self, ref: "SetRef | NodeRef", node: NodeInfo) -> None:
        """Hand every reader ``node``, the set's node ``ref`` names, unless they hold it, and wait until they have it
        (NOTE [set descriptions] in ``_io.setref``)."""
        if ref in self._learned:
            return
        payload = pickle.dumps((ref, node), protocol=pickle.HIGHEST_PROTOCOL)
        segment = Segment.create(len(payload), what="A set's description")
        try:
            segment.buf[:len(payload)] = payload
            with self._attach_lock:
                for i in range(self.n_procs):
                    self._push(i, Item(LEARN, data_nbytes=len(payload), name=segment.name))
                self.pool.wait_attached("take a set's description", self._check_broken)
                self._learned.add(ref)
        finally:
            segment.unlink()
            segment.close()

    def detach(self, stage_id: int) -> None:
        """Have every live reader unmap a closed stage (does not wait)."""
        if self.pool.foreign:
            return  # the readers are another process's (NOTE [forked children] in ``pool``)
        dead = self._dead()
        for i in range(self.n_procs):
            if i not in dead and not self.closed:
                self._push(i, Item(DETACH, stage_id=stage_id))

    # -- stopping ---------------------------------------------------------------
    def finish(self) -> None:
        """Tell every reader to stop once it has served what its inbox holds (does not wait)."""
        if self.closed or self.finishing or self.pool.foreign:
            return
        self.finishing = True
        dead = self._dead()
        for i in range(self.n_procs):
            if i not in dead:
                self._push(i, Item(STOP))

    def running(self, timeout: float = 0.0) -> bool:
        """Whether a reader still runs, after waiting up to ``timeout`` s for one to end."""
        if self.closed or self.pool.foreign:
            return False
        self.pool.wait_any(timeout)
        self.look()
        return self.pool.running > 0

    def _tell_stop(self) -> None:
        self._inboxes.stop()
        for sync in self._syncs:
            sync.work.release()  # wake an idle reader now rather than at its next tick

    def close(self) -> None:
        """Stop every reader and free everything (idempotent); see NOTE [shutdown] in ``pool``."""
        if self.closed:
            return
        self.pool.close(self._tell_stop)
        self._inboxes.segment.unlink()
        self._inboxes.close()
