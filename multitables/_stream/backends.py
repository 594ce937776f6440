"""The two back ends a :class:`~multitables._stream.queue.Queue` reads through: reader processes, or this process.

:class:`RingBackend` takes blocks from reader processes through the
shared-memory ring (``_procs.stream.StreamReaders``); :class:`InlineBackend`
reads them in this process, for datasets too small for processes to pay. Both
read a block the same way (``_io.blockread.BlockReader``). A back end gives
``take() -> (slot, rows)``, ``returned`` (the slots the queue gave back,
appended to) and ``give_back()`` (what it holds to the readers: NOTE [a slot
given back] in ``_stream.queue``), ``check()``, ``close()`` and ``pids``; the
ring's also ``lend``. A stream whose blocks are published as it
goes (NOTE [readers across epochs] in ``_procs.stream``) also takes
``extend(starts, stops)`` and ``rewind()``, and says how many blocks are
``published`` and which is ``next``. Where each block read holds several of
the caller's (NOTE [read plan]), :class:`SplitBackend` hands them out. What
``take`` returns is also its ``out`` until the queue records it and sets None,
and a take meanwhile returns it again (NOTE [a slot in hand] in ``_stream.queue``).

NOTE [stalled readers]
    A reader that stays alive and delivers nothing is no failure ``check()``
    can see: a transform that calls JAX or TensorFlow in a reader forked
    after the library started its threads waits for ever on a lock the fork
    copied held; a read from a network file system whose server is gone
    blocks in the kernel; a transform loops. The consumer would wait in
    silence. So a ring's ``take`` that has waited :data:`STALL_WARNING`
    seconds for its block, its readers alive, warns: the file, the dataset,
    the rows awaited (in plan order), the readers' pids, the likely causes
    and how to see where a reader is. It goes on waiting: a slow disk is no
    error. The clock starts at the first tick without a block (a block
    there at once, the hot path, costs nothing) and runs only inside
    ``take``: a consumer busy elsewhere is not waiting. Once per stream: a
    stream that stalled and then went on is slow, not stuck, and one stalled
    at every epoch by a slow disk would repeat the same words; a hang is
    what the first warning is for, and it names every reader.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import warnings
from types import FrameType
from typing import Any, cast

import numpy as np

from .._io.fileset import node_signature
from .._io.files import check_file_unchanged
from .._io.objects.urls import shown
from .._plan.blocks import GrowingPlan
from .._procs.failure import FailureReport
from .._procs.stream import StreamReaders, StreamSpec
from .._shm.ring import TICK
from .._sys.refs import held_elsewhere
from .._sys.signals import raised_by_handler
from .._sys.spares import spare_bytes
from ..errors import FileChangedError, StreamClosedError


#: Seconds a consumer waits for one block from readers that stay alive before it warns, once per stream, that they
#: may be stuck (NOTE [stalled readers]); it goes on waiting.
STALL_WARNING = 60.0


def empty_block(spec: StreamSpec) -> np.ndarray:
    """An uninitialised array shaped like one full block of ``spec``."""
    return np.empty((spec.plan.block_size,) + spec.row_shape, spec.dtype)


def block_memory(spec: StreamSpec) -> np.ndarray:
    """Memory for one full block of ``spec``, as bytes (uint8) to view with :func:`as_block`: spare bytes (NOTE
    [spare buffers] in ``_sys.spares``), the caller's, which become a spare again once no view of them is alive."""
    shape, dtype = (spec.plan.block_size,) + spec.row_shape, spec.dtype
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:  # nothing to fault, and bytes cannot be viewed as elements of no size
        return np.empty(shape, dtype)
    return spare_bytes(nbytes)


def as_block(memory: np.ndarray, spec: StreamSpec) -> np.ndarray:
    """``memory`` from :func:`block_memory` as one full block of ``spec``: a view, whose rows reference ``memory``."""
    shape, dtype = (spec.plan.block_size,) + spec.row_shape, spec.dtype
    if memory.shape == shape and memory.dtype == dtype:
        return memory
    return memory[: math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


def _outside_level() -> int:
    """The ``stacklevel`` that points a warning given by its caller at the first frame outside this package."""
    level, frame = 2, cast("FrameType | None", sys._getframe(2))
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == __name__.partition(".")[0]:
        level, frame = level + 1, frame.f_back
    return level


class InlineBackend:
    """Reads blocks in the consumer process, for datasets too small for processes to pay."""

    def __init__(self, spec: StreamSpec, open_kwargs: dict[str, Any]) -> None:
        self._blocks = spec.open(open_kwargs, 1)  # NOTE [prefetch], with one reader: the consumer
        self._spec = spec
        self._signature = node_signature(spec.node)
        self._buffers: "list[np.ndarray | None]" = [None] * spec.read.read_ahead  # allocated on first use
        self._free = list(range(spec.read.read_ahead))  # given back last at the end (see _pick)
        self.returned = self._free  # a slot given back is free at once: nothing is left to give_back
        self._next = 0
        self.pids: list[int] = []
        self._failure: "FailureReport | None" = None  # the read that ended the stream
        self._cause: "BaseException | None" = None  # its error, until the take that raises it (then dropped: a cycle)
        self.out: "tuple[int, np.ndarray] | None" = None  # NOTE [a slot in hand] in ``_stream.queue``

    def take(self) -> tuple[int, np.ndarray]:
        if self.out is not None:
            return self.out
        if self._failure is not None:  # every later take raises it again, as a failed reader's stream does
            cause, self._cause = self._cause, None
            raise self._failure.to_exception() from cause
        # Block k is used up (its number passed, its slot taken) only once read, or once its failure is kept: an
        # exception of the user's that leaves the read (a handler's, a KeyboardInterrupt) leaves block k the next.
        slot, k = self._pick(), self._next
        # A fresh buffer where a caller still holds rows of this slot's last
        # block (views count as references): so rows stay valid, and the
        # generator can hand these private blocks out without a copy.
        if self._buffers[slot] is None or held_elsewhere(self._buffers, slot):
            self._buffers[slot] = block_memory(self._spec)
        memory = self._buffers[slot]
        if memory is None:  # another thread closed the stream: its buffers may be another stream's now
            raise StreamClosedError("the stream was closed while a block was being taken")
        span: list[tuple[int, int]] = []
        try:
            rows = self._blocks.read(k, as_block(memory, self._spec), lambda a, b: span.append((a, b)))
            named = self._blocks.named(k)  # what a change of the file found now names
            if named is not None:
                span.append(named)
            check_file_unchanged(self._spec.node.filename, self._signature)  # as the readers do
        except Exception as exc:  # the form a reader's failure takes: a ReaderError of the original type, in context
            if raised_by_handler(exc):
                raise  # the user's own: NOTE [a handler's exception]
            node, cause = self._spec.node, exc
            try:  # a file changed under the read explains its failure (a truncated chunk, a decode error), as in readers
                check_file_unchanged(node.filename, self._signature)
            except FileChangedError as changed:  # its context: the read's error
                cause = changed
            self._failure = FailureReport.from_exception(cause, -1, os.getpid(), node.filename, node.path,
                                                         span[-1] if span else None)
            # The caller's blocks a read of several read whole before the one that failed come first, as when each
            # was a read of its own; the error at the next take (a growing plan's reader wants whole blocks).
            whole = 0 if cause is not exc or not span else self._blocks.whole_before(k, span[-1][0])
            self._next += 1  # its failure kept: block k is out
            self._free.remove(slot)
            if whole and not isinstance(self._spec.plan, GrowingPlan):
                self._cause = cause
                return slot, as_block(memory, self._spec)[:whole]
            raise self._failure.to_exception() from cause
        i = self._free.index(slot)
        # Block k from the read's hands to the caller's, in stores alone (NOTE [a slot in hand] in ``_stream.queue``).
        self._next += 1
        del self._free[i]
        self.out = (slot, rows)  # every row is read again for the next block of this slot
        if isinstance(self._spec.plan, GrowingPlan):
            self._spec.plan.forget(k)
        return self.out

    @property
    def failure_held(self) -> bool:
        """Whether a read failed, its error kept for the next :meth:`take` (the blocks before it were given first)."""
        return self._failure is not None

    def _pick(self) -> int:
        """The free slot to read the next block into.

        A buffer nobody holds, the one given back last first; else a slot
        never used; else the one given back last (which gets a fresh buffer).
        So a loop that still names its last block while it takes the next reads
        into two buffers in turn, not into every slot: each buffer's pages
        fault once, when first written (issue 29's counters).
        """
        buffers = self._buffers
        for slot in reversed(self._free):
            if buffers[slot] is not None and not held_elsewhere(buffers, slot):
                return slot
        for slot in self._free:  # no generator: one dropped runs its frame again to close it, as a finalizer
            if buffers[slot] is None:
                return slot
        return self._free[-1]

    @property
    def next(self) -> int:
        """The number of the next block :meth:`take` gives."""
        return self._next

    @property
    def published(self) -> int:
        return self._spec.plan.n_blocks  # type: ignore[return-value]  # growing only: a GrowingPlan's, an int

    def extend(self, starts: Any, stops: Any) -> None:
        self._spec.plan.extend(starts, stops)  # type: ignore[union-attr]  # growing only: a GrowingPlan

    def rewind(self) -> None:
        """Nothing is read ahead here: withdraw what was published and not taken (a block read and never handed on
        too: NOTE [a slot in hand] in ``_stream.queue``)."""
        if self.out is not None:
            self._free.append(self.out[0])
            self._next, self.out = self._next - 1, None
        self._spec.plan.truncate(self._next)  # type: ignore[union-attr]  # as extend

    def check(self, taking: bool = True) -> None:
        """Nothing to watch: no reader processes."""

    def give_back(self) -> None:
        """Nothing to do: the slots given back are free once in :attr:`returned`."""

    def lend(self, slot: int, rows: int) -> np.ndarray:
        raise TypeError("a queue whose blocks are read in this process lends none (each block is private already)")

    def slot_memory(self) -> None:
        """None: each block is read into an array of its own (see :meth:`take`)."""

    def close(self, background: bool = False) -> None:
        """Close the source, and drop the buffers: each becomes a spare once no row of it is alive (NOTE [spare
        buffers] in ``_sys.spares``), though the caller keep this closed queue. A take in another thread finds none
        from now on."""
        self._buffers = [None] * len(self._buffers)
        self._cause = None
        self._blocks.source.close()


class RingBackend:
    """Blocks from reader processes through the shared-memory ring."""

    #: A failed block is never published (its reader reports it): the pass cannot seem over before it is raised.
    failure_held = False

    def __init__(self, spec: StreamSpec, open_kwargs: dict[str, Any], start_method: "str | None") -> None:
        self._plan = spec.plan
        self._ordered = spec.ordered
        self._pending: dict[int, int] = {}  # ordered mode: block -> slot, arrived early
        self._next = 0
        self._warned = False  # NOTE [stalled readers]: once per stream
        self._checking = threading.RLock()  # pool.check reads the readers' pipes: one thread at a time
        self.out: "tuple[int, np.ndarray] | None" = None  # NOTE [a slot in hand] in ``_stream.queue``
        self._pool = StreamReaders(spec, open_kwargs, start_method)
        try:
            self._ring = self._pool.ring
            self.pids = self._pool.pids
            self.returned = self._ring.returned  # consumer-local, the ring's (NOTE [a slot given back])
        except BaseException:  # a Ctrl-C right there: see Queue.__init__
            self._pool.close()
            raise

    def take(self) -> tuple[int, np.ndarray]:
        if self.out is not None:
            return self.out
        ring, pending = self._ring, self._pending
        since: "float | None" = None  # when this take began waiting (NOTE [stalled readers])
        # A slot goes from the ring's hands (``taken``) or ``pending`` to ``out`` in stores alone (NOTE [a slot in hand]).
        while True:
            if ring.returned:  # given back, and a handler's exception cut the giving short (or it runs elsewhere)
                self.give_back()
            if self._ordered and self._next in pending:
                self._pool.pool.check_owner()  # check() below asks it of the others (NOTE [forked children])
                slot = pending[self._next]
                block = ring.slots[slot][: ring.meta(slot)[1]]
                self.out = (slot, block)
                del pending[self._next]
                break
            self.check()
            slot = ring.take(TICK)  # type: ignore[assignment]  # None: looked at next
            if slot is None:
                since = self._stalled(since)
                continue
            k, rows = ring.meta(slot)
            block = ring.slots[slot][:rows]
            if self._ordered and k != self._next:
                pending[k] = slot
                ring.taken = None
                continue
            self.out = (slot, block)
            ring.taken = None
            break
        self._next += 1
        return self.out

    def _stalled(self, since: "float | None") -> float:
        """A tick passed without a block: when the wait began; warn once the readers took :data:`STALL_WARNING` s."""
        now = time.monotonic()
        if since is None:
            return now - TICK
        if not self._warned and now - since >= STALL_WARNING:
            pids = self._pool.alive_pids
            if pids:  # else check() raises at the next tick
                self._warned = True
                warnings.warn(self._stall_message(now - since, pids), RuntimeWarning, stacklevel=_outside_level())
        return since

    def _stall_message(self, seconds: float, pids: list[int]) -> str:
        """The words of NOTE [stalled readers]."""
        rows = ""
        if self._ordered:
            try:
                pieces = self._plan.pieces(self._next)
            except Exception:  # a plan that no longer holds the block: the rows are not known
                pieces = ()
            if pieces:
                rows = f" (rows {', '.join(f'{p.start}:{p.stop}' for p in pieces)} awaited)"
        several = "s" if len(pids) > 1 else ""
        return (
            f"no block of {self._pool.path!r} in {shown(self._pool.filename)!r} has come for {seconds:.1f} s"
            f"{rows}, and its reader{several} (pid{several} {', '.join(map(str, pids))}) still run{'' if several else 's'}:"
            f" stuck? Likely causes: a transform that calls a multithreaded library (JAX, TensorFlow, ...) in readers "
            f"forked from this process after that library started its threads, where it waits for ever on a lock the "
            f"fork copied held (compute the transform with numpy, or give Streamer(..., start_method=\"forkserver\")); "
            f"a file system that stopped answering (a network mount whose server is gone); a transform that never "
            f"returns. See where a reader is with `py-spy dump --pid {pids[0]}`. Still waiting (a slow disk is no "
            f"error); said once per stream."
        )

    def check(self, taking: bool = True) -> bool:
        """Raise the error of a reader that failed or died (NOTE [failure reports] in ``_procs.pool``); ``taking``: a
        block is waited for (``StreamReaders.check``)."""
        with self._checking:
            return self._pool.check(taking)

    @property
    def next(self) -> int:
        """The number of the next block :meth:`take` gives (ordered streams)."""
        return self._next

    @property
    def published(self) -> int:
        return self._ring.published

    def extend(self, starts: Any, stops: Any) -> None:
        self._pool.extend(starts, stops)

    def rewind(self) -> None:
        """Withdraw what was published and not claimed; the blocks read meanwhile, early arrivals included, go back."""
        held = [*self._pending.values(), *([] if self.out is None else [self.out[0]]), self._ring.taken]
        for slot in held:
            if slot is not None:
                self._ring.release(slot, self.check)
        self._pending.clear()
        self.out = self._ring.taken = None
        self._next = self._pool.rewind()

    def give_back(self) -> None:
        if self._pool.pool.foreign:  # a fork's copy of a block: the ring is the owner's (NOTE [forked children] in
            self.returned.clear()  # ``_procs.pool``)
            return
        self._ring.give_back(self.check)

    def lend(self, slot: int, rows: int) -> np.ndarray:
        return self._ring.lend(slot, rows)

    def slot_memory(self) -> tuple[int, int]:
        """The address and size in bytes of this process's mapping of every slot (``Queue.slot_memory``)."""
        layout = self._ring.layout
        start = np.ndarray((0,), np.uint8, buffer=self._ring.segment.buf, offset=layout.data_offset)  # no export held
        return start.ctypes.data, layout.nbytes - layout.data_offset

    def close(self, background: bool = False) -> None:
        self.out = None
        self._pool.close(background)


class SplitBackend:
    """The caller's blocks of ``rows`` rows, one by one, out of the larger blocks a back end reads (NOTE [read plan]).

    A block's slot goes back to ``inner`` once every block cut from it is
    released. Its blocks are named ``slot * per_slot + i`` (``per_slot``: the
    most cut from one slot), unique while any is held. A caller holding fewer
    blocks than slots holds fewer slots than there are: the readers always
    have one to fill.
    """

    def __init__(self, inner: "InlineBackend | RingBackend", rows: int, per_slot: int) -> None:
        self._inner, self._rows, self._per_slot = inner, rows, per_slot
        self._cut: "tuple[int, np.ndarray, int] | None" = None  # the slot being cut, its rows, the next block in it
        self._left: dict[int, int] = {}  # slot -> its blocks not yet given back
        self._lock = threading.Lock()  # release() runs in any thread
        self._pid = os.getpid()
        self.pids = inner.pids
        self.out: "tuple[int, np.ndarray] | None" = None  # NOTE [a slot in hand] in ``_stream.queue``
        self.returned: list[int] = []  # blocks given back, not yet counted (NOTE [a slot given back])

    def take(self) -> tuple[int, np.ndarray]:
        if self.out is not None:
            return self.out
        if self.returned:  # a handler's exception cut a give_back short
            self.give_back()
        # A fork's take from readers' slots is the inner's, which refuses it; blocks read here are the fork's own copy.
        if self._cut is None or (self._inner.pids and os.getpid() != self._pid):
            self._cut = None
            slot, rows = self._inner.take()
            with self._lock:
                self._left[slot] = -(-len(rows) // self._rows)
            self._cut, self._inner.out = (slot, rows, 0), None  # stores alone (NOTE [a slot in hand])
        slot, rows, i = self._cut
        n = self._rows
        block = rows[i * n : (i + 1) * n]
        self._cut, self.out = (slot, rows, i + 1) if (i + 1) * n < len(rows) else None, (slot * self._per_slot + i, block)
        return self.out

    def give_back(self) -> None:
        """Count the blocks given back; a slot whose every block is back goes to the inner's ``returned``, each in
        stores and one call at the end (NOTE [a slot given back] in ``_stream.queue``)."""
        returned, left = self.returned, self._left
        with self._lock:  # entered in C; no finalizer runs inside: nothing in it makes an object the collector tracks
            while returned:
                slot = returned[0] // self._per_slot
                del returned[0]
                left[slot] -= 1
                if not left[slot]:
                    del left[slot]
                    self._inner.returned.append(slot)
        self._inner.give_back()

    def check(self, taking: bool = True) -> None:
        self._inner.check(taking)

    @property
    def failure_held(self) -> bool:
        return self._inner.failure_held

    def lend(self, slot: int, rows: int) -> np.ndarray:
        raise TypeError("a queue whose blocks are cut from larger ones lends none (the generator reads whole ones)")

    def slot_memory(self) -> "tuple[int, int] | None":
        return self._inner.slot_memory()

    def close(self, background: bool = False) -> None:
        self._cut = self.out = None
        self._inner.close(background)
