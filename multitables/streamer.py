"""Streaming a dataset: the :class:`Streamer`, its direct-access :class:`Queue` and the row generator.

NOTE [lent blocks]
    The generator yields the rows of the readers' slots themselves: copying
    each block out first took the consumer's time from the cores the
    readers decode on (measured in BENCHMARKS.md). A slot is lent: it
    goes back to the readers once no row of it is alive. Every row is a
    view of one array made for that block (``Ring.lend``), so
    ``sys.getrefcount`` on that array says whether the caller still holds
    a row; it is checked for each lent block whenever the next block comes.
    At most ``_LENT_BLOCKS`` are lent at once, and never every slot: the
    block being yielded and the one before, whose last row a ``for``
    loop's name still holds. A caller who keeps rows (``list(gen)``)
    pins the blocks lent so far; from then on blocks are copied into two
    private buffers in turn, so the readers are never starved of slots.
    The last block of a pass is always copied: after the loop its last
    row is still bound, and should not hold the ring. Rows the caller
    still holds when the ring closes stay valid: their slots are moved
    to private memory then (NOTE [segment lifetime] in ``_shm``).
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from ._checks import check_bool, check_int
from ._engines import CACHES, check_engine, open_source, resolve_engine
from ._node import NodeInfo, as_filename, check_file_unchanged, close_dataset, file_signature, inspect_node, open_node
from ._plan import BlockPlan, RangePlan, ahead, available_cpus, cap_readers, default_block_size, default_read_ahead
from ._plan import parallel_pays
from ._readers import ReaderPool, check_start_method
from ._ring import TICK
from .errors import QueueClosed, StreamClosedError

if TYPE_CHECKING:
    from .batches import Batches

__all__ = ["Streamer", "Queue", "Guard"]


@dataclass(frozen=True)
class _StreamSpec:
    """A validated, planned stream: everything but the processes."""

    node: NodeInfo
    engine: str
    plan: "BlockPlan | RangePlan"
    n_procs: int  # 0: read in the consumer process
    n_slots: int
    ordered: bool
    #: Where chunk bytes come from: "page" or "direct" (O_DIRECT).
    cache: str = "page"
    #: The h5py.Dataset the checks opened (``_node.open_node``), kept for an in-process read (the queue closes it).
    dataset: Any = dc_field(default=None, compare=False, repr=False)


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


#: sys.getrefcount of a block buffer nobody else holds: its list, a local name, the call's argument.
_FREE_BUFFER_REFS = 3

#: Blocks the generator lends at most at once (NOTE [lent blocks]): the one it yields and the one
#: before, whose last row a ``for`` loop's name still holds when the next block's first row comes.
_LENT_BLOCKS = 2


class _InlineBackend:
    """Reads blocks in the consumer process, for datasets too small for processes to pay."""

    def __init__(self, spec: _StreamSpec, open_kwargs: dict[str, Any]) -> None:
        self._plan = spec.plan
        self._source = open_source(spec.engine, spec.node, open_kwargs, spec.plan, spec.dataset, cache=spec.cache)
        self._spec = spec
        self._signature = file_signature(spec.node.filename)
        self._buffers: "list[np.ndarray | None]" = [None] * spec.n_slots  # allocated on first use
        self._free = list(range(spec.n_slots))
        self._next = 0
        self.pids: list[int] = []

    def take(self) -> tuple[int, np.ndarray]:
        slot, k = self._free.pop(0), self._next
        self._next += 1
        out = self._buffers[slot]
        # A fresh buffer where a caller still holds rows of this slot's last
        # block (views count as references): so rows stay valid, and the
        # generator can hand these private blocks out without a copy.
        if out is None or sys.getrefcount(out) > _FREE_BUFFER_REFS:
            out = self._buffers[slot] = _empty_block(self._spec)
        for p in ahead(self._plan, k, 1):  # NOTE [prefetch], with one reader: the consumer
            self._source.prefetch(p.start, p.stop)
        for p in self._plan.pieces(k):
            out_part = out[p.dst : p.dst + p.stop - p.start]
            self._source.read_into(p.start, p.stop, out_part)
        check_file_unchanged(self._spec.node.filename, self._signature)  # as the readers do
        return slot, out[: self._plan.rows(k)]  # every row is read again for the next block of this slot

    def check(self) -> None:
        """Nothing to watch: no reader processes."""

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def close(self) -> None:
        self._source.close()


class _RingBackend:
    """Blocks from reader processes through the shared-memory ring."""

    def __init__(self, spec: _StreamSpec, open_kwargs: dict[str, Any], start_method: "str | None") -> None:
        self._plan = spec.plan
        self._ordered = spec.ordered
        self._pool = ReaderPool(
            spec.node, spec.engine, open_kwargs, spec.plan, spec.n_procs, spec.n_slots, start_method, spec.cache
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
        """Raise the error of a reader that failed or died (NOTE [failure reports] in ``_readers``)."""
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

    def __init__(self, spec: _StreamSpec, open_kwargs: dict[str, Any], start_method: "str | None") -> None:
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
        backend: "_InlineBackend | _RingBackend"
        if spec.n_procs == 0:
            backend = _InlineBackend(spec, open_kwargs)
        else:
            backend = _RingBackend(spec, open_kwargs, start_method)
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
                if self._closed or self._at_end:
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
    def _at_end(self) -> bool:
        """Whether the last block of the pass has been handed out (never, for a cyclic stream)."""
        return self._n_blocks is not None and self._delivered >= self._n_blocks

    def _lend(self, guard: Guard) -> np.ndarray:
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


def _rows_alive(entry: "tuple[Guard, np.ndarray]") -> bool:
    """Whether a row of a lent block (``(guard, base of its rows)``) is still alive somewhere."""
    # References to the base when none is: the entry, and getrefcount's argument.
    return sys.getrefcount(entry[1]) > 2


def _give_back_unused(lent: "list[tuple[Guard, np.ndarray]]") -> "list[tuple[Guard, np.ndarray]]":
    """Release the lent blocks of which no row is alive any more; return the others."""
    kept = []
    for entry in lent:
        if _rows_alive(entry):
            kept.append(entry)
        else:
            entry[0].release()
    return kept


def _empty_block(spec: _StreamSpec) -> np.ndarray:
    """An uninitialised array shaped like one full block of ``spec``."""
    return np.empty((spec.plan.block_size,) + spec.node.row_shape, spec.node.dtype)


class Streamer:
    """Streams datasets of one HDF5 file through parallel reader processes.

    Parameters
    ----------
    filename : str, bytes or os.PathLike
        The HDF5 file (written by PyTables, h5py or anything else producing HDF5).
    engine : {"auto", "chunks", "h5py", "tables"}
        What the readers decode with. ``chunks`` reads the stored chunks
        itself and decodes them straight into the slots (zlib + shuffle 2.7x
        h5py's rate per core). ``h5py`` uses hdf5plugin's filters and
        decodes zlib 1.8x and blosc 2.3x faster per core than the PyTables
        wheel. ``auto`` takes ``chunks`` where it reads the node and was
        measured faster (deflate and lzf, contiguous storage), else h5py, and
        PyTables when PyTables open options are given or only PyTables reads
        the dataset. :attr:`Queue.engine` says which engine reads. Every
        engine delivers what h5py's ``dataset[()]`` gives, or refuses the
        dataset before any reader starts (:class:`MissingFilterError` for a
        filter nothing here decodes).
    cache : {"page", "direct"}
        ``direct`` reads chunk bytes with ``O_DIRECT``, past the page cache
        (chunk engine only; with the stock wheels, no HDF5 rebuild needed).
    start_method : str, optional
        The multiprocessing start method for the readers (``fork``,
        ``spawn``, ``forkserver``); default: multiprocessing's default.
    **open_kwargs
        Passed to the engine's open call, as in the established API (for
        PyTables: e.g. ``DRIVER='H5FD_CORE'``).
    """

    Queue = Queue  # the established API had the queue class here

    def __init__(
        self,
        filename: "str | bytes | os.PathLike[str] | os.PathLike[bytes]",
        *,
        engine: str = "auto",
        cache: str = "page",
        start_method: "str | None" = None,
        **open_kwargs: Any,
    ) -> None:
        self._filename = as_filename(filename)
        self._engine = engine
        self._cache = cache
        self._start_method = start_method
        self._open_kwargs = open_kwargs
        check_engine(engine)
        if cache not in CACHES:
            raise ValueError(f"cache={cache!r} is not one of {CACHES}")
        if cache == "direct" and engine not in ("auto", "chunks"):
            raise ValueError(f"cache='direct' needs the chunk engine (engine='auto' or 'chunks'), not engine={engine!r}")
        check_start_method(start_method)

    @property
    def filename(self) -> str:
        """The HDF5 file's name, as given."""
        return self._filename

    def _spec(
        self,
        path: str,
        n_procs: "int | None",
        read_ahead: "int | None",
        cyclic: bool,
        block_size: "int | None",
        ordered: bool,
        field: "str | None",
        remainder: bool,
    ) -> _StreamSpec:
        """Check every argument and the node, and plan the stream; starts nothing."""
        n_procs = check_int("n_procs", n_procs, 1)
        read_ahead = check_int("read_ahead", read_ahead, 1)
        block_size = check_int("block_size", block_size, 1)
        cyclic = check_bool("cyclic", cyclic)
        ordered = check_bool("ordered", ordered)
        remainder = check_bool("remainder", remainder)
        node, dataset = open_node(self._filename, path, field)
        try:
            engine = self._resolve(node, dataset)
            cpus = available_cpus()
            if n_procs is None:
                nbytes = node.n_rows * node.row_nbytes
                n_procs = cpus if parallel_pays(nbytes, node.filter_ids, self._start_method, cpus, engine) else 0
            n_procs = cap_readers(n_procs, None, cpus)  # first: the default block size depends on it
            if block_size is None:
                block_size = default_block_size(node.n_rows, node.row_nbytes, node.chunk_rows, n_procs)
            elif block_size > node.n_rows:
                raise ValueError(f"block_size={block_size} is larger than {path!r}, which has {node.n_rows} rows")
            plan = BlockPlan(node.n_rows, block_size, cyclic=cyclic, remainder=remainder)
            n_procs = cap_readers(n_procs, plan.n_blocks, cpus)
            if read_ahead is None:
                read_ahead = default_read_ahead(n_procs)
        except BaseException:
            close_dataset(dataset)
            raise
        if n_procs or engine not in ("h5py", "chunks"):
            close_dataset(dataset)  # readers open their own
            dataset = None
        return _StreamSpec(node, engine, plan, n_procs, read_ahead, ordered, self._cache, dataset)

    def _resolve(self, node: NodeInfo, dataset: Any = None) -> str:
        """The engine that will read ``node``; refuses ``cache='direct'`` where the chunk engine cannot read it."""
        engine = resolve_engine(self._engine, node, self._open_kwargs, dataset)
        if self._cache == "direct" and engine != "chunks":
            raise ValueError(
                f"cache='direct' needs the chunk engine, which cannot read {node.path!r} in {node.filename!r} "
                f"(it would be read by {engine!r})"
            )
        return engine

    def get_queue(
        self,
        path: str,
        n_procs: "int | None" = None,
        read_ahead: "int | None" = None,
        cyclic: bool = False,
        block_size: "int | None" = None,
        ordered: bool = False,
        field: "str | None" = None,
        remainder: bool = False,
    ) -> Queue:
        """Start readers on the dataset at ``path`` and return a :class:`Queue` of its blocks.

        Parameters
        ----------
        path : str
            The node in the file: an Array, CArray, EArray or Table.
        n_procs : int, optional
            Reader processes. Default: the CPUs this process may use, or none
            at all (blocks read in this process) when starting them would cost
            more than they save: small datasets, one CPU (see
            ``multitables._plan.parallel_pays``). Capped at 4 per usable CPU
            and at the blocks of a pass (not cyclic); :attr:`Queue.n_procs`
            says how many run.
        read_ahead : int, optional
            Slots in the ring (blocks in flight). Default ``2 * n_procs + 2``.
        cyclic : bool
            Wrap at the end forever; the block spanning the end holds the last
            rows followed by the first ones. Stop with :meth:`Queue.close`.
        block_size : int, optional
            Rows per block. Default: whole chunks near 4 MiB (1 MiB for
            contiguous datasets), fewer for small datasets.
        ordered : bool
            Deliver blocks in on-disk order (else in the order they finish).
        field : str, optional
            For a Table: stream this column only.
        remainder : bool
            Also deliver the last, short block (``len % block_size`` rows);
            otherwise get it with :meth:`get_remainder`.

        Returns
        -------
        Queue
            Owns the reader processes and the shared memory; close it (or use
            it in a ``with``) when done.
        """
        spec = self._spec(path, n_procs, read_ahead, cyclic, block_size, ordered, field, remainder)
        return Queue(spec, self._open_kwargs, self._start_method)

    def _queue_for_plan(
        self,
        path: str,
        plan: RangePlan,
        n_procs: int,
        read_ahead: "int | None" = None,
        ordered: bool = True,
        field: "str | None" = None,
    ) -> Queue:
        """A queue over explicitly planned blocks (for the training layer; ``n_procs=0`` reads in-process)."""
        node = inspect_node(self._filename, path, field)
        if max(plan.stops) > node.n_rows:
            raise ValueError(f"the plan reads up to row {max(plan.stops)} but {path!r} has {node.n_rows} rows")
        engine = self._resolve(node)
        n_procs = cap_readers(n_procs, plan.n_blocks, available_cpus())
        n_slots = read_ahead if read_ahead is not None else default_read_ahead(n_procs)
        spec = _StreamSpec(node, engine, plan, n_procs, n_slots, ordered, self._cache)
        return Queue(spec, self._open_kwargs, self._start_method)

    def get_generator(
        self,
        path: str,
        n_procs: "int | None" = None,
        read_ahead: "int | None" = None,
        cyclic: bool = False,
        block_size: "int | None" = None,
        ordered: bool = False,
        field: "str | None" = None,
        remainder: bool = True,
    ) -> Iterator[np.ndarray]:
        """Iterate over the rows of ``path``: every row once per pass, remainder included.

        Rows are yours: safe to keep and to change, and nothing overwrites
        them while any row of their block is alive. They are views of the
        block they came from: of the readers' slot itself while you hold no
        more than a block or two (the slot returns to the readers once every
        row of it is gone), else of a private copy (NOTE [lent blocks]).
        Arguments as for :meth:`get_queue`; they are checked now, and the
        readers start at the first ``next()``. Closing the generator (or
        dropping it) stops them.
        """
        spec = self._spec(path, n_procs, read_ahead, cyclic, block_size, ordered, field, remainder)
        return self._rows(spec)

    def _rows(self, spec: _StreamSpec) -> Iterator[np.ndarray]:
        with Queue(spec, self._open_kwargs, self._start_method) as queue:
            if queue.n_procs == 0:
                # Read in this process: the blocks are private already, and the
                # backend never refills one whose rows someone holds. A copy
                # would cost ~10% of reading a small file.
                for guard in queue.iter():
                    with guard as block:
                        rows = block
                    del block
                    yield from rows
                    del rows
                return
            # Lend the slots themselves while the caller keeps no more than
            # _LENT_BLOCKS of them, and never all (NOTE [lent blocks]).
            lendable = min(_LENT_BLOCKS, spec.n_slots - 1)
            lent: "list[tuple[Guard, np.ndarray]]" = []
            # Otherwise two private copies in turn: reuse the older one's memory
            # unless the caller kept one of its rows (every row is a view
            # holding a reference to it); a fresh 4 MiB array page-faults on
            # every block. (The caller's loop variable still holds the newer
            # one's last row.)
            copies: "list[np.ndarray | None]" = [None, None]
            turn = 0
            try:
                for guard in queue.iter():
                    lent = _give_back_unused(lent)
                    if len(lent) < lendable and not queue._at_end:
                        rows = queue._lend(guard)
                        lent.append((guard, rows.base))  # every row's base
                        del guard
                        yield from rows
                        del rows
                        continue
                    with guard as block:
                        owner = copies[turn]
                        if owner is None or sys.getrefcount(owner) > _FREE_BUFFER_REFS or len(owner) < len(block):
                            owner = copies[turn] = _empty_block(spec)
                        rows = owner[: len(block)]
                        np.copyto(rows, block)
                    del owner, block
                    turn ^= 1
                    yield from rows
                    del rows
            finally:
                # Close with every lent slot still lent (given back now, one could be
                # refilled before the readers stop), having dropped the arrays of
                # those with no row alive: closing moves only the others to private
                # memory (NOTE [lent blocks]). Releasing the guards after the close
                # is a no-op.
                rows = None  # type: ignore[assignment]
                guards = [entry[0] for entry in lent]
                lent = [entry for entry in lent if _rows_alive(entry)]
                queue.close()
                del guards, lent

    def get_batches(self, paths: "str | list[str]", batch_size: int, **kwargs: Any) -> "Batches":
        """Batches of rows of ``paths`` (equal lengths) for training loops: shuffled, sharded, resumable.

        See :class:`multitables.Batches` for the arguments.
        """
        from .batches import Batches  # batches builds on this module

        return Batches(self, paths, batch_size, **kwargs)

    def get_remainder(self, path: str, block_size: int, field: "str | None" = None) -> np.ndarray:
        """The last ``len % block_size`` rows of ``path`` (empty when ``block_size`` divides the length), read here."""
        block_size = check_int("block_size", block_size, 1, allow_none=False)  # type: ignore[assignment]
        node = inspect_node(self._filename, path, field)
        start = block_size * (node.n_rows // block_size)
        out = np.empty((node.n_rows - start,) + node.row_shape, node.dtype)
        if len(out):
            source = open_source(self._resolve(node), node, self._open_kwargs, cache=self._cache)
            try:
                source.read_into(start, node.n_rows, out)
            finally:
                source.close()
        return out
