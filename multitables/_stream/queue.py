"""A stream's blocks, one at a time: :class:`Queue` and :class:`Guard`, over the readers or this process.

A queue reads through one of two backends: :class:`RingBackend` takes blocks
from reader processes through the shared-memory ring
(``_procs.stream.StreamReaders``); :class:`InlineBackend` reads them in this
process, for datasets too small for processes to pay. Both read a block with
the one loop in ``_io.blockread``.
"""

from __future__ import annotations

import sys
import threading
import weakref
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Iterator

import numpy as np

from .._io.blockread import Transform, read_block
from .._io.engines import open_source, resolve_engine
from .._io.fileset import inspect_files, node_signature
from .._io.node import NodeInfo, check_file_unchanged
from .._plan.blocks import BlockPlan, RangePlan, available_cpus, cap_readers, default_read_ahead
from .._procs.stream import StreamReaders
from .._shm.ring import TICK
from ..errors import QueueClosed, StreamClosedError

#: sys.getrefcount of a block buffer nobody else holds: its list, a local name, the call's argument.
FREE_BUFFER_REFS = 3


@dataclass(frozen=True)
class StreamSpec:
    """A validated, planned stream: everything but the processes."""

    node: NodeInfo
    engine: str
    plan: "BlockPlan | RangePlan"
    n_procs: int  # 0: read in the consumer process
    n_slots: int
    ordered: bool
    #: Where chunk bytes come from: "page" or "direct" (O_DIRECT).
    cache: str = "page"
    #: The h5py.Dataset the checks opened (``_io.node.open_node``), kept for an in-process read (the queue closes it).
    dataset: Any = dc_field(default=None, compare=False, repr=False)
    #: Run on each block's rows where it is read (NOTE [transforms]); the blocks are its output.
    transform: "Transform | None" = None

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape of a delivered row (the transform's output, with one)."""
        return self.node.row_shape if self.transform is None else self.transform.row_shape

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the delivered rows."""
        return self.node.dtype if self.transform is None else self.transform.dtype


@dataclass(frozen=True)
class StreamOptions:
    """How one :class:`~multitables.Streamer` opens its files: what every stream of it shares."""

    #: The file, or the files of a set in row order (NOTE [file sets] in ``_io.fileset``).
    files: "str | tuple[str, ...]"
    engine: str
    cache: str
    start_method: "str | None"
    open_kwargs: dict[str, Any]

    def resolve(self, node: NodeInfo, dataset: Any = None) -> str:
        """The engine that will read ``node``; refuses ``cache='direct'`` where the chunk engine cannot read it."""
        # O_DIRECT is the chunk engine's alone: with it, ``auto`` asks that engine first even where
        # h5py would be chosen for speed (blosc), rather than refuse a node the chunk engine reads.
        asked = "chunks" if self.cache == "direct" and self.engine == "auto" else self.engine
        engine = resolve_engine(asked, node, self.open_kwargs, dataset)
        if self.cache == "direct" and engine != "chunks":
            raise ValueError(
                f"cache='direct' needs the chunk engine, which cannot read {node.path!r} in {node.filename!r} "
                f"(it would be read by {engine!r})"
            )
        return engine

    def open_queue(self, spec: "StreamSpec") -> "Queue":
        """Start reading ``spec``: its readers, or in this process."""
        return Queue(spec, self.open_kwargs, self.start_method)

    def queue_for_plan(
        self,
        path: str,
        plan: RangePlan,
        n_procs: int,
        read_ahead: "int | None" = None,
        ordered: bool = True,
        field: "str | None" = None,
        transform: "Transform | None" = None,
    ) -> "Queue":
        """A queue over explicitly planned blocks (for the training layer; ``n_procs=0`` reads in-process)."""
        node = inspect_files(self.files, path, field)
        if max(plan.stops) > node.n_rows:
            raise ValueError(f"the plan reads up to row {max(plan.stops)} but {path!r} has {node.n_rows} rows")
        engine = self.resolve(node)
        n_procs = cap_readers(n_procs, plan.n_blocks, available_cpus())
        n_slots = read_ahead if read_ahead is not None else default_read_ahead(n_procs)
        return self.open_queue(StreamSpec(node, engine, plan, n_procs, n_slots, ordered, self.cache, transform=transform))


class Guard:
    """Holds one block of a :class:`Queue` until released.

    ``with guard as block:`` gives ``block``, a numpy view on the shared
    slot: no copy is made. The slot is yours until the guard is released:
    change the block in place if you like (``block -= mean``); the changes
    never reach the file or any other block. The view is only valid inside
    the ``with``; copy what you keep (``block.copy()``). Leaving the
    ``with`` gives the slot back to the readers. The thread that enters the
    ``with`` holds the guard from then on (see :meth:`Queue.get`).
    """

    __slots__ = ("_queue", "_slot", "block", "_released", "__weakref__")

    def __init__(self, queue: "Queue", slot: int, block: np.ndarray) -> None:
        self._queue: "Queue | None" = queue
        self._slot = slot
        self.block = block
        self._released = False

    def __enter__(self) -> np.ndarray:
        if not self._released:
            self._queue._hold(self._slot)  # type: ignore[union-attr]
        return self.block

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Give the slot back (idempotent). The block must not be used afterwards."""
        if not self._released:
            self._released = True
            self.block = None  # type: ignore[assignment]
            queue, self._queue = self._queue, None  # a released guard must not keep the queue (and its readers) alive
            queue._release(self._slot)

    def __del__(self) -> None:
        # A guard dropped without ``with`` must not keep its slot forever.
        try:
            self.release()
        except Exception:
            pass


class InlineBackend:
    """Reads blocks in the consumer process, for datasets too small for processes to pay."""

    def __init__(self, spec: StreamSpec, open_kwargs: dict[str, Any]) -> None:
        self._plan = spec.plan
        self._source = open_source(spec.engine, spec.node, open_kwargs, spec.plan, spec.dataset, cache=spec.cache)
        self._spec = spec
        self._signature = node_signature(spec.node)
        self._buffers: "list[np.ndarray | None]" = [None] * spec.n_slots  # allocated on first use
        self._free = list(range(spec.n_slots))
        self._next = 0
        self._scratch: "np.ndarray | None" = None  # the rows as read, for a transform
        self.pids: list[int] = []

    def take(self) -> tuple[int, np.ndarray]:
        slot, k = self._free.pop(0), self._next
        self._next += 1
        out = self._buffers[slot]
        # A fresh buffer where a caller still holds rows of this slot's last
        # block (views count as references): so rows stay valid, and the
        # generator can hand these private blocks out without a copy.
        if out is None or sys.getrefcount(out) > FREE_BUFFER_REFS:
            out = self._buffers[slot] = empty_block(self._spec)
        transform = self._spec.transform
        if transform is not None and self._scratch is None:
            self._scratch = np.empty((self._plan.block_size,) + self._spec.node.row_shape, self._spec.node.dtype)
        # NOTE [prefetch], with one reader: the consumer.
        rows = read_block(self._source, self._plan, k, out, 1, transform=transform, scratch=self._scratch)
        check_file_unchanged(self._spec.node.filename, self._signature)  # as the readers do
        return slot, rows  # every row is read again for the next block of this slot

    def check(self) -> None:
        """Nothing to watch: no reader processes."""

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def close(self) -> None:
        self._source.close()


class RingBackend:
    """Blocks from reader processes through the shared-memory ring."""

    def __init__(self, spec: StreamSpec, open_kwargs: dict[str, Any], start_method: "str | None") -> None:
        self._plan = spec.plan
        self._ordered = spec.ordered
        self._pool = StreamReaders(
            spec.node, spec.engine, open_kwargs, spec.plan, spec.n_procs, spec.n_slots, start_method, spec.cache,
            spec.transform,
        )
        self._ring = self._pool.ring
        self._pending: dict[int, int] = {}  # ordered mode: block -> slot, arrived early
        self._next = 0
        self.pids = self._pool.pids
        self._checking = threading.RLock()  # pool.check reads the readers' pipes: one thread at a time

    def take(self) -> tuple[int, np.ndarray]:
        ring = self._ring
        while True:
            if self._ordered and self._next in self._pending:
                slot = self._pending.pop(self._next)
                break
            self.check()
            slot = ring.take(TICK)  # type: ignore[assignment]
            if slot is None:
                continue
            k, _rows = ring.meta(slot)
            if self._ordered and k != self._next:
                self._pending[k] = slot
                continue
            break
        k, rows = ring.meta(slot)
        self._next += 1
        return slot, ring.slots[slot][:rows]

    def check(self) -> bool:
        """Raise the error of a reader that failed or died (NOTE [failure reports] in ``_procs.pool``)."""
        with self._checking:
            return self._pool.check()

    def release(self, slot: int) -> None:
        self._ring.release(slot, self.check)

    def lend(self, slot: int, rows: int) -> np.ndarray:
        return self._ring.lend(slot, rows)

    def close(self) -> None:
        self._pool.close()


class Queue:
    """Direct, zero-copy access to the blocks of one stream.

    Get one with :meth:`Streamer.get_queue`. ``get()`` returns a
    :class:`Guard` per block, or :data:`multitables.QueueClosed` once the pass
    is over. Safe to share between threads: each block reaches exactly one,
    and a ``get()`` that finds every slot held waits for another thread to
    release one.
    """

    def __init__(self, spec: StreamSpec, open_kwargs: dict[str, Any], start_method: "str | None") -> None:
        #: Rows per block (the last block of a pass may be shorter with ``remainder=True``).
        self.block_size: int = spec.plan.block_size
        #: The engine reading the file (``"h5py"`` or ``"tables"``).
        self.engine: str = spec.engine
        #: Reader processes (``n_procs``, capped); 0 when blocks are read in this process (too small to pay).
        self.n_procs: int = spec.n_procs
        self._n_blocks = spec.plan.n_blocks
        self._delivered = 0
        self._n_slots = spec.n_slots
        self._held = 0  # guards handed out and not yet released
        self._holders: dict[int, threading.Thread] = {}  # slot -> the thread holding its guard
        self._taker: "threading.Thread | None" = None  # the thread in backend.take(): one at a time
        # Reentrant: a guard the GC frees while its thread holds the lock releases through it.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # a slot released, a take done, closed
        self._closed = False
        backend: "InlineBackend | RingBackend"
        if spec.n_procs == 0:
            backend = InlineBackend(spec, open_kwargs)
        else:
            backend = RingBackend(spec, open_kwargs, start_method)
        self._backend = backend
        self._finalizer = weakref.finalize(self, backend.close)

    @property
    def reader_pids(self) -> list[int]:
        """Process ids of the reader processes (empty when reading in this process)."""
        return list(self._backend.pids)

    def get(self) -> "Guard | Any":
        """Wait for the next block; return its :class:`Guard`, or ``QueueClosed`` at the end of the pass.

        While every slot is held, waits for another thread to release a guard
        (a guard is held by the thread that called ``get()`` for it, then by
        the thread that enters its ``with``) or to close the queue (then
        ``QueueClosed``). Raises ``RuntimeError`` where no thread could: every
        guard is the caller's, or no other thread runs; and
        :class:`multitables.ReaderError` (also an instance of the original
        exception type) if a reader failed or died, waiting or not.
        """
        me = threading.current_thread()
        slot = None
        try:
            if not self._wait_turn(me):
                return QueueClosed
            try:
                slot, block = self._backend.take()  # outside the lock: guards can be released meanwhile
            finally:
                with self._changed:
                    self._taker = None
                    if slot is not None:
                        self._delivered += 1
                        self._held += 1
                        self._holders[slot] = me
                    self._changed.notify_all()
        except StreamClosedError:
            if self._closed:  # by another thread while this one waited
                return QueueClosed
            raise
        return Guard(self, slot, block)

    def _wait_turn(self, me: threading.Thread) -> bool:
        """Wait for a free slot and for no other thread to be taking a block, then take the turn; False once over."""
        while True:
            with self._changed:
                if self._closed or self.at_end:
                    return False
                starved = self._held >= self._n_slots
                if not starved and self._taker is None:
                    self._taker = me
                    return True
                mine = all(holder is me for holder in self._holders.values())
                if starved and (mine or threading.active_count() == 1):  # nobody could release one
                    raise RuntimeError(
                        f"all {self._n_slots} slots of the queue are held by unreleased guards "
                        f"{'of this thread' if mine else 'and no other thread runs to release one'}; leave a "
                        f"guard's `with` (or call guard.release()) before asking for more, or use a larger read_ahead"
                    )
                self._changed.wait(TICK)
            if starved and not self._closed:
                self._backend.check()  # a reader failing ends the wait too

    def iter(self) -> Iterator[Guard]:
        """Iterate over guards until ``QueueClosed``."""
        while True:
            guard = self.get()
            if guard is QueueClosed:
                return
            yield guard

    def __iter__(self) -> Iterator[Guard]:
        return self.iter()

    @property
    def at_end(self) -> bool:
        """Whether the last block of the pass has been handed out (never, for a cyclic stream)."""
        return self._n_blocks is not None and self._delivered >= self._n_blocks

    def lend(self, guard: Guard) -> np.ndarray:
        """A new writable array on ``guard``'s slot (ring streams only): NOTE [lent blocks]."""
        return self._backend.lend(guard._slot, len(guard.block))  # type: ignore[union-attr]

    def _hold(self, slot: int) -> None:
        """The calling thread holds ``slot``'s guard from now on (it entered the guard's ``with``)."""
        me = threading.current_thread()
        if self._holders.get(slot) is not me:  # usually the thread that called get() for it
            with self._lock:
                if slot in self._holders:
                    self._holders[slot] = me

    def _release(self, slot: int) -> None:
        try:
            if not self._closed:
                self._backend.release(slot)  # first: a waiting get() may take the slot at once
        finally:
            with self._changed:
                self._held -= 1
                self._holders.pop(slot, None)
                self._changed.notify_all()

    def close(self) -> None:
        """Stop the readers and free the ring (idempotent). Blocks still held become invalid."""
        self._closed = True
        with self._changed:
            self._changed.notify_all()  # a get() waiting for a slot returns QueueClosed
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (or the queue was collected)."""
        return self._closed

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def empty_block(spec: StreamSpec) -> np.ndarray:
    """An uninitialised array shaped like one full block of ``spec``."""
    return np.empty((spec.plan.block_size,) + spec.row_shape, spec.dtype)
