"""Requests read in this process: a Reader with ``n_procs=0`` (NOTE [requests in this process]).

NOTE [requests in this process]
    A Reader made with ``n_procs=0`` (the default in a daemonic process, a
    DataLoader's worker, which may start no process) has no readers: its
    :class:`InlineServer` stands where ``_procs.serve.ServeReaders`` would,
    and each share a request puts is read at once, in the calling thread,
    by the same ``ShareReader`` a request reader runs, before
    ``Reader.request`` returns; a read that fails sets the share FAILED and
    keeps its report for the future's ``get``, as a reader's would. Stages
    are private memory (``Segment.private``): nothing in /dev/shm, no
    semaphore of multiprocessing, no process, no thread (but ``notify``'s),
    and no wake-up: a share's status is final before its future exists.

    ``close`` (``stop()`` from another thread, the garbage collector) waits
    for the read in flight, under the server's lock, and a read that comes
    after it reads nothing: its share stays pending and its future says the
    Reader was stopped. Closed under a read, the files and the stage were
    gone beneath it (a ``TypeError`` out of ``request``).

    Forked (a DataLoader's workers started by fork, of a Dataset that made
    the Reader in ``__init__``), the child's copy goes on working: its
    stages are copy-on-write like any memory, and at its first use it opens
    the files anew, leaving the parent's handles to the parent (an HDF5
    handle or a connection shared by two processes is not safe to use). A
    Reader is still not pickled (spawn, forkserver): make it in the worker.
"""

from __future__ import annotations

import os
import threading
import traceback
from typing import Any

from .._io.files import FileSignature, GrowingFile
from .._io.node import NodeInfo
from .._io.objects.config import Store
from .._io.objects.identity import ObjectIdentity
from .._io.setref import Learned, NodeRef, SetRef
from .._procs.failure import FailureReport
from .._procs.serve import ServeSettings, ShareReader
from .._shm.segment import Segment
from .._shm.stagemap import DONE, FAILED, StageLayout, StageMap
from .._sys.signals import raised_by_handler
from ..errors import ReaderError


def _never() -> bool:
    return False


def _never_signalled() -> threading.Lock:
    """A stage's channel, which wakes the futures of request readers: none here, since a share is read before its
    future exists, so its status is final when anyone looks. A lock held from the start acts as a semaphore that no
    token ever reaches (``acquire(False)`` says no at once, a timed acquire waits out its timeout) without a
    semaphore's Python-level release and acquire in each request."""
    lock = threading.Lock()
    lock.acquire()
    return lock


class InlineServer:
    """Serves a Reader's requests in this process: the consumer's side of request readers, with none."""

    n_procs = 0
    finishing = False

    def __init__(
        self, filename: str, open_kwargs: dict[str, Any], max_stages: int,
        file_signature: "FileSignature | GrowingFile | ObjectIdentity | None", files: "str | tuple[str, ...]" = "", store: "Store | None" = None,
    ) -> None:
        self.filename = filename
        self.file_signature = file_signature
        self._settings = ServeSettings(open_kwargs, "", file_signature, files, store)
        self._learned = Learned()
        self._shares = ShareReader(filename, self._settings, self._learned)
        self._owner = os.getpid()
        self._stages: dict[int, StageMap] = {}
        self._reports: dict[int, tuple[FailureReport, Exception]] = {}
        self.channels = tuple(_never_signalled() for _ in range(max_stages))
        self.closed = False
        self.pids: list[int] = []
        self._lock = threading.Lock()  # a read against close (NOTE [requests in this process])

    # -- as the request readers' consumer side (``ServeReaders``) ---------------------
    def look(self) -> None:
        """Nothing to watch: no reader processes."""

    def broken(self) -> None:
        return None

    def is_dead(self, i: int) -> bool:
        return False

    def dead_error(self, i: int, path: str) -> None:
        return None

    def check_owner(self) -> None:
        """In a forked child, open the files anew at its first use (NOTE [requests in this process])."""
        if os.getpid() != self._owner:
            self._owner = os.getpid()
            self._lock = threading.Lock()  # perhaps held at the fork by a thread the child does not have
            self._shares = ShareReader(self.filename, self._settings, self._learned)  # the parent's handles: dropped
            self._reports.clear()

    def drop_opens(self) -> None:
        """Close the files the reads here hold, opened again by the next: a dataset of a file read with swmr=True is
        then described with the rows flushed last (NOTE [swmr extent] in ``_io.handles``)."""
        with self._lock:
            if not self.closed and os.getpid() == self._owner:
                self._shares.drop_opens()

    def learn(self, ref: "SetRef | NodeRef", node: NodeInfo) -> None:
        """Keep ``node``, the set's node ``ref`` names, for the reads here (NOTE [set descriptions] in
        ``_io.setref``); no lock: a read only looks a node up."""
        self._learned.add(ref, node)

    def stage_segment(self, layout: StageLayout) -> Segment:
        return Segment.private(layout.nbytes)

    def attach(self, stage_id: int, stage: StageMap) -> None:
        self._stages[stage_id] = stage  # the consumer's own map: it closes it

    def detach(self, stage_id: int) -> None:
        self._stages.pop(stage_id, None)

    def read(self, reader: int, req: int, stage_id: int, share: int, a: int, b: int) -> None:
        """Read rows ``a..b`` of request ``req`` into stage ``stage_id`` now; a failure is kept for :meth:`failure`.
        ``Reader.request`` asked :meth:`check_owner` first."""
        with self._lock:
            if self.closed:  # stopped meanwhile: nothing to read with, nothing to read into
                return
            stage = self._stages[stage_id]
            failed = self._shares.read(stage, req, a, b, _never)
            if failed is not None:
                exc, path, span = failed
                if raised_by_handler(exc):
                    raise exc  # the user's own, as a KeyboardInterrupt would leave: NOTE [a handler's exception]
                report = FailureReport.from_exception(exc, -1, os.getpid(), self.filename, path, span)
                traceback.clear_frames(exc.__traceback__)  # kept as the cause: no view on the stage left in its frames
                self._reports[req] = (report, exc)
            stage.set_status(share, DONE if failed is None else FAILED)

    def failure(self, req: int) -> ReaderError:
        """The error of request ``req``'s read, its original exception chained."""
        got = self._reports.pop(req, None)
        if got is None:
            return ReaderError(f"a read of request {req} of {self.filename!r} failed, but its report was lost")
        error = got[0].to_exception()
        error.__cause__ = got[1]
        return error

    def forget(self, req: int) -> None:
        self._reports.pop(req, None)

    def finish(self) -> None:
        """Every request is read already."""

    def running(self, timeout: float = 0.0) -> bool:
        return False

    def close(self) -> None:
        """Close the files once the read in flight is done (idempotent)."""
        with self._lock:
            if not self.closed:
                self.closed = True
                self._stages.clear()
                self._reports.clear()
                if os.getpid() == self._owner:
                    self._shares.close()
