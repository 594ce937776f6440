"""What a Reader's datasets, stages and futures share: its readers, its stages, its notify thread.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import pickle
import queue
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from .._io.engines import set_look
from .._io.files import GrowingFile, check_same_file, file_signature, grew
from .._io.fileset import inspect_files, own_flags
from .._io.node import NodeInfo
from .._io.objects.config import Store
from .._io.setref import NodeRef, SetRef
from .._procs.pool import READER_ELSEWHERE
from .._procs.serve import ServeReaders
from .._shm.ring import TICK
from .._shm.segment import interpreter_exiting
from .._shm.stagemap import MAX_DESC, StageMap, describe
from .._sys.awake import Eagerness
from .._sys.background import DaemonThreads
from ..errors import QueueClosed, StreamClosedError

if TYPE_CHECKING:
    from .futures import Future
    from .inline import InlineServer


def quiet_at_exit() -> None:
    """In a thread other than the main one, once the interpreter's exit handlers have begun, wait for the end of the
    process instead of raising: they closed the Reader under a daemon thread still using it (a loader thread,
    say), whose traceback would tell of nothing the program did."""
    if interpreter_exiting() and threading.current_thread() is not threading.main_thread():
        threading.Event().wait()


def not_pickled(obj: Any) -> NoReturn:
    """Raise the ``TypeError`` a Reader's objects give when pickled or copied, saying why and what to do instead."""
    name = type(obj).__name__
    what = "a Reader" if name == "Reader" else "a Reader's " + name
    raise TypeError(
        f"{what} is tied to this process (its readers, its stages, its open files), so it is neither pickled nor "
        "copied: a DataLoader's workers started by spawn or forkserver (Python 3.14's default) get the dataset "
        f"pickled; {READER_ELSEWHERE}"
    )


#: Every ReaderCore of this process, for :func:`_renew_locks_in_child`.
_CORES: "weakref.WeakSet[ReaderCore]" = weakref.WeakSet()


def _renew_locks_in_child() -> None:
    """In a forked child, new locks for every Reader's core: one held at the fork by another thread of the parent (a
    request being read there, with ``n_procs=0``) would be held for ever in the child, a DataLoader's worker, whose
    first request then waited for it."""
    for core in list(_CORES):
        core.lock, core._shut_lock = threading.Lock(), threading.Lock()
        core._waiters, core._waiters_lock = None, threading.Lock()  # its threads are the parent's


os.register_at_fork(after_in_child=_renew_locks_in_child)


class ReaderCore:
    """What the Reader's datasets, stages and futures share: the readers and the bookkeeping.

    Three states, in order: *closed* (no new requests or stages: ``close()``
    or ``stop()``), *stopped* (``stop()``: requests not yet read are
    dropped), *shut* (the readers are gone; the stages no future holds are
    freed, the others when their future gives them back).
    """

    def __init__(
        self,
        filename: "str | tuple[str, ...]",
        engine: str,
        open_kwargs: dict[str, Any],
        pool: "ServeReaders | InlineServer",
        max_stages: int,
        notify: "Callable[[Any], Any] | None",
        store: "Store | None" = None,
    ) -> None:
        self.filename = filename
        self.store = store
        self.engine = engine
        self.open_kwargs = open_kwargs
        self.pool = pool
        self.closed = False
        self.stopped = False
        self.shut = False
        self.lock = threading.Lock()
        self._shut_lock = threading.Lock()
        _CORES.add(self)
        self.free_stage_ids = list(range(max_stages - 1, -1, -1))
        #: Nodes whose descriptions name them by a ref (:meth:`describe`), by description.
        self.handed: "dict[bytes, tuple[NodeRef, NodeInfo]]" = {}
        self.stages: dict[int, StageMap] = {}
        self.held: set[int] = set()  # ids of stages a future holds
        # Stages dropped by the garbage collector, detached at the next call
        # (a finalizer must not wait on anything; SimpleQueue.put never does).
        self.dropped: "queue.SimpleQueue[int]" = queue.SimpleQueue()
        self.req_ids = itertools.count()
        self.next_reader = 0
        # NOTE [waiting awake]: whether futures look for their data before sleeping; the reader that answered the
        # last request, while it is idle and the last (a request of one share, seen done, none made since).
        self.awake = Eagerness()
        self.last_req = -1
        self.idle_reader: "int | None" = None
        self.notifier = Notifier(notify) if notify is not None else None
        #: The latest look at a file read with swmr=True that saw it larger than the Reader did (None: none).
        self.looked: "GrowingFile | None" = None
        self._waiters: "DaemonThreads | None" = None  # NOTE [awaited futures]
        self._waiters_lock = threading.Lock()

    def in_thread(self, wait: "Callable[[], Any]") -> "concurrent.futures.Future[Any] | None":
        """Call ``wait`` in a waiter thread of awaited futures (NOTE [awaited futures] in ``_access.awaiting``);
        None once the Reader has shut down (every future is done then)."""
        with self._waiters_lock:  # not _shut_lock, held while the readers stop: the loop would wait on it
            if self.shut:
                return None
            if self._waiters is None:
                self._waiters = DaemonThreads("multitables-await")
            waiters = self._waiters
        try:
            return waiters.submit(wait)
        except RuntimeError:  # shut down meanwhile
            return None

    def inspect(self, path: str, field: "str | None" = None) -> NodeInfo:
        """The node at ``path`` (``field``: one column) of the Reader's files, checked now; one of 0 rows too (2.x's
        ``get_dataset`` took it: its requests select nothing, or are out of range)."""
        if own_flags(self.open_kwargs)["swmr"]:
            self.pool.drop_opens()  # its rows as flushed last, described by this process's one open of it
        node = inspect_files(self.filename, path, field, self.store, allow_empty=True,
                             look=set_look(self.engine, self.open_kwargs), **own_flags(self.open_kwargs))
        made = self.looked or self.pool.file_signature
        if isinstance(made, (tuple, GrowingFile)):  # a dataset of the file the readers read, not of its successor
            now = node.identity if node.identity is not None else file_signature(node.filename)
            # Read with swmr=True, the file may have grown since: its rows as they are now, and no smaller than the
            # latest look saw it (NOTE [file identity]).
            check_same_file(node.filename, now.signature if isinstance(now, GrowingFile) else now, made,
                            "since the Reader was made, whose readers read the file as it was then; make a new Reader "
                            "to read it as it is now")
            if grew(now, made):
                self.looked = now
        return node

    def describe(self, engine: str, node: NodeInfo) -> bytes:
        """The bytes a stage's header names ``node`` by (``_shm.stagemap.describe``); a set's node handed to the
        readers first, whose first request then opens no file to find it (NOTE [set descriptions] in ``_io.setref``)."""
        ref: "SetRef | NodeRef | None" = None
        if node.parts and isinstance(self.filename, tuple):
            ref = SetRef.of(node, self.filename)
        else:
            pickled = pickle.dumps((engine, node), protocol=pickle.HIGHEST_PROTOCOL)
            if len(pickled) > MAX_DESC:  # a wide table's dtype: handed over as a set's node is
                ref = NodeRef.of(node, pickled)
        desc = describe(engine, node, self.filename, ref)
        if isinstance(ref, NodeRef):
            self.handed[desc] = (ref, node)
        if ref is not None and not (isinstance(ref, SetRef) and ref.grown):  # a growing set's readers look themselves
            self.pool.learn(ref, node)
        return desc

    def hand_over(self, desc: bytes) -> None:
        """Have the readers hold the node ``desc`` names where it names one by a :class:`NodeRef` (they keep the last
        few handed over: NOTE [set descriptions] in ``_io.setref``); a look-up where they hold it."""
        handed = self.handed.get(desc)
        if handed is not None:
            self.pool.learn(*handed)

    def check_open(self) -> None:
        """Raise unless new requests can be made: open, not stopped, and no reader dead (looked at now)."""
        self.check_not_closed()
        self.check_not_stopped()
        self.pool.look()  # a reader may have died while nothing waited on it
        broken = self.pool.broken()
        if broken is not None:
            self.check_not_closed()  # by stop() in another thread since the look above: its readers exited as told
            raise broken

    def check_not_closed(self) -> None:
        """Raise if :meth:`close` or :meth:`stop` was called (the part of :meth:`check_open` that looks at no reader)."""
        if self.closed:
            raise StreamClosedError(f"the Reader of {self.pool.filename!r} is closed")

    def check_not_stopped(self, before: str = "this request was read") -> None:
        """Raise unless requests already made can still be read (a dead reader fails only its own shares)."""
        if self.stopped:
            why = "the interpreter is exiting" if interpreter_exiting() else "stop(), or it was garbage-collected"
            raise StreamClosedError(f"the Reader of {self.pool.filename!r} was stopped ({why}) before {before}")

    def detach_dropped(self) -> None:
        """Let the readers unmap the stages closed since the last call; their ids become free."""
        while not self.dropped.empty():  # its only taker, under self.lock (an empty get_nowait raises: slower)
            stage_id = self.dropped.get_nowait()
            try:
                if not self.closed and self.pool.broken() is None:
                    self.pool.detach(stage_id)
            finally:
                self.free_stage_ids.append(stage_id)

    def close(self, wait: bool) -> None:
        """No more requests; the readers stop once they have read every request made (waits if ``wait``)."""
        now = wait or not self.pool.n_procs  # n_procs=0: every request is read already, nothing to wait for
        with self.lock:
            if not self.closed:
                self.closed = True
                if not self.stopped:
                    self.pool.finish()  # after every request pushed so far (pushes hold this lock)
                    if not now:
                        threading.Thread(target=self._finish, name="multitables-reader-close", daemon=True).start()
        if now:
            self._finish()
            if self.notifier is not None:
                self.notifier.join()  # as 2.x's close(wait=True): every notify made, QueueClosed's too

    def _finish(self) -> None:
        """Wait until the readers have stopped by themselves (or died), then shut down."""
        try:
            while not self.shut and self.pool.running(TICK):
                pass
        finally:
            self.shutdown()

    def stop(self) -> None:
        """No more requests, and those not yet read are dropped: stop the readers now."""
        self.closed = self.stopped = True
        self.shutdown()

    def shutdown(self) -> None:
        with self._shut_lock:
            if self.shut:
                return
            self.shut = True
            with self._waiters_lock:
                waiters, self._waiters = self._waiters, None
            if waiters is not None:  # the waits queued end at once now, then its threads
                waiters.shutdown()
            # Under the lock of request()'s writes: a request that looked before stop() (which takes no lock) set
            # `closed` goes on writing into a stage no future holds yet, and into the readers' inboxes, which would
            # be freed memory.
            with self.lock:
                self.pool.close()
                for stage_id in list(self.stages):
                    if self.stopped or stage_id not in self.held:
                        smap = self.stages.pop(stage_id, None)  # None: its future gave it back meanwhile, and freed it
                        if smap is not None:
                            smap.close()
        if self.notifier is not None:
            self.notifier.end()

    def give_back(self, stage_id: int) -> None:
        """A future gave its stage back; free the stage if the reader has shut down meanwhile."""
        self.held.discard(stage_id)
        if self.shut:
            smap = self.stages.pop(stage_id, None)
            if smap is not None:
                smap.close()


class Notifier:
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

    def join(self) -> None:
        """Wait until ``notify`` has been called for the last time (at once from within ``notify`` itself)."""
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _call(self, arg: Any) -> None:
        try:
            self._callback(arg)
        except Exception:  # keep notifying the others; show it as an uncaught thread exception would be
            threading.excepthook(threading.ExceptHookArgs((*sys.exc_info(), self._thread)))

    def _run(self) -> None:
        while self._step():
            pass
        self._call(QueueClosed)

    def _step(self) -> bool:
        """Notify the futures done now, or wait a while; False once ended.

        The futures are this call's locals: held by a frame that goes on
        waiting, the last ones would keep their Reader from being collected.
        """
        with self._cond:
            while not self._pending and not self._ending:
                self._cond.wait()
            if not self._pending:
                return False
            pending = list(self._pending)
        done = [f for f in pending if f.done()]
        if not done:
            time.sleep(self.POLL)
            return True
        with self._cond:
            self._pending = [f for f in self._pending if f not in done]
        for future in done:
            self._call(future)
        return True
