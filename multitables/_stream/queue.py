"""A stream's blocks, one at a time: :class:`Queue` and :class:`Guard`, over the readers or this process.

A queue reads through one of two back ends (``_stream.backends``): reader
processes filling a shared-memory ring, or this process.

NOTE [a slot in hand]
    A signal's Python handler runs between two instructions (NOTE [a
    handler's exception] in ``_sys.signals``): after a call returns, or as a
    function starts, never between plain stores. One that raises in a
    ``get()`` the caller catches and goes on from must lose no block, so a
    slot is always in some hands a later ``get()`` looks in: the ready ring
    (``Ring.take`` pops it into ``Ring.taken``), the back end's ``out``
    (ordered: its early arrivals), the queue's record (``_holders``, and the
    guard made for it in ``_made``), the caller. Each hand-off is stores
    alone, the new hands set and the old cleared, and each ``take`` or
    ``get`` gives first what its hands hold. So the guard is made ahead
    (``_spare``, for the next block), and handed its slot with stores: made
    after, a handler raising as its call returned would drop it, and its
    finaliser give the slot back unread. A token of ``ready`` dropped as
    ``acquire`` returned leaves its slot in the ring, seen there after a
    wait (NOTE [ring protocol] in ``_shm.ring``). Stores alone also keep
    other threads out (the GIL changes hands where a handler may run), so a
    thread's ``get()`` returns the guard ``_made`` for it and no other's.
    No signal mask: holding the signals costs 18 us a span, and one that
    came before the span still runs in it.

NOTE [a slot given back]
    A guard's release gives its slot back once, wherever a handler's
    exception cuts it: lost, the readers have a slot fewer for good (a
    caller holding the others waits for ever); given twice, two readers
    fill it at once. So each hand the slot passes on its way back takes it
    in stores and at most one call, the last: the guard's ``[queue, slot]``
    cleared, the queue's count and holder, the back end's ``returned``
    appended to (``_give_back``, under the queue's lock, entered in C).
    Then the back end gives what ``returned`` holds to the readers: a
    slot cut into several blocks once every block is back; the ring pushes
    the slot on its free stack under its lock and records it pushed
    (``Ring._pushed``, a store), then takes it off ``returned`` and posts
    its token, the last call. Cut anywhere, what is left is recorded, and
    the next release or take (each tick of a wait) finishes it: a slot
    pushed is not pushed again, only its token posted. A lock whose
    ``acquire`` returned as the exception came (its answer not stored) is
    given back where the exception passes, if this thread holds it. No
    signals held: that costs 18 us a release.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterator, Literal, Sequence

import numpy as np

from .._io.objects.urls import shown
from .._plan.blocks import BlockPlan, GrowingPlan
from .._procs.stream import StreamSpec
from .._shm.ring import TICK
from .._sys.signals import signals_deferred
from ..errors import QueueClosed, QueueClosedType, StreamClosedError
from .backends import InlineBackend, RingBackend, SplitBackend


def _end(
    backend: "InlineBackend | RingBackend | SplitBackend", before_unmap: "list[Callable[[], None]]", background: bool = False
) -> None:
    """Close ``backend``; the hooks of ``Queue.at_close`` first, each once, all of them even where one fails (its
    error is raised once the backend is closed)."""
    error: "BaseException | None" = None
    while before_unmap:
        try:
            before_unmap.pop(0)()
        except BaseException as exc:  # noqa: BLE001 - raised below, after the clean-up
            error = error or exc
    backend.close(background)
    if error is not None:
        raise error


def _end_early(backend: "InlineBackend | RingBackend | SplitBackend", before_unmap: "list[Callable[[], None]]") -> None:
    """:func:`_end` before a pass's end (a ``break``, an error, a queue dropped), done whole: it may run as a finalizer,
    where a Ctrl-C raised would be printed as "Exception ignored" and lost (18 us a call, which a pass's end, the path
    of every small stream, does not pay)."""
    try:
        with signals_deferred(later=True):
            _end(backend, before_unmap)
    except BaseException:  # a handler's, before the signals were held (each step of _end is idempotent): end the rest
        _end(backend, before_unmap)
        raise


#: Why a queue or a guard refuses a pickle or a copy (a process pool's task pickles its arguments; Python's own error
#: named a lock), and what to pass instead; ``{}`` is what refuses.
NOT_PICKLED = ("{} belongs to this process (its readers, its shared memory), so it is neither pickled nor copied: pass {}the "
               "Streamer (it pickles) or the file's name, and open the stream in the task that reads it")


def _give_back(held: list) -> None:
    """A guard's slot back to its queue, in one step (NOTE [a slot given back]); ``held``: the guard's ``[queue,
    slot]``, no queue for a guard never handed a block or whose slot went back already."""
    queue = held[0]
    if queue is None:
        return
    slot = held[1]
    with queue._lock:  # entered in C: no handler runs as it is taken. Reentrant: see Queue.__init__
        if held[0] is queue:  # not given back meanwhile by another thread
            held[0] = None  # a released guard must not keep the queue (and its readers) alive
            queue._held -= 1
            if slot in queue._holders:
                del queue._holders[slot]
            if not queue._closed:  # else the readers are gone
                queue._backend.returned.append(slot)  # the step's one call: a handler runs after it
        queue._changed.notify_all()
    queue._backend.give_back()  # outside the queue's lock: the ring's lock may be waited for


def _dropped(held: list) -> None:
    """A dropped guard's finaliser: :func:`_give_back`; a stream that failed or closed meanwhile needs nothing."""
    try:
        _give_back(held)
    except Exception:
        pass


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

    __slots__ = ("_held", "block", "_released", "_entered", "_dropped", "__weakref__")

    def __init__(self) -> None:
        # Made ahead of its block, which the queue hands it in stores alone (NOTE [a slot in hand]): ``[queue,
        # slot]`` from then on, shared with the finaliser; no queue till then (a queue keeps its next guard).
        self._held: "list[Any]" = [None, -1]
        self.block: np.ndarray = None  # type: ignore[assignment]  # None until handed a block, and once released
        self._released = self._entered = False
        # A guard dropped without ``with`` must not keep its slot for ever: a finaliser gives it back. Not a
        # ``__del__``: that would run Python code at the end of every guard's life, and a Ctrl-C arriving then
        # is raised inside it, where Python ignores it; a finaliser detached at release runs nothing.
        self._dropped = weakref.finalize(self, _dropped, self._held)
        self._dropped.atexit = False

    def __enter__(self) -> np.ndarray:
        if self._released or self._held[0] is None:  # its slot may hold another block by now
            raise StreamClosedError("this guard's block was released already: a guard gives its block once")
        if self._entered:  # the inner with's end would give the slot back under the outer one
            raise RuntimeError("this guard's with is open already: a guard gives its block once, to one with")
        queue, slot = self._held
        # Handed out before a close, as 2.x's guards went on working after it: its block kept its bytes, the slot
        # held by this guard at the close (NOTE [segment lifetime] in ``_shm.segment``).
        if not queue.closed:
            queue._hold(slot)
        # Entered last, after the calls: a handler's exception in them leaves the with unopened (no __exit__ runs)
        # and the guard as it was, for the caller to enter again (NOTE [a slot in hand]).
        self._entered = True
        return self.block

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __reduce__(self) -> Any:
        raise TypeError(NOT_PICKLED.format("a Guard", "block.copy() (taken inside its with), or "))

    def __repr__(self) -> str:
        held = "released" if self._released else "lent" if self.block is None else f"a block of {len(self.block)} rows"
        return f"<multitables.Guard ({held})>"

    def release(self) -> None:
        """Give the slot back (idempotent). The block must not be used afterwards."""
        if not self._released:
            # First: a handler's exception as it starts leaves the guard as it was; one after, the slot given back
            # (NOTE [a slot given back]), the guard's own stores for the next call.
            _give_back(self._held)
            self._released = True
            self.block = None  # type: ignore[assignment]  # released: no block to read
            self._dropped.detach()


class Queue:
    """Direct, zero-copy access to the blocks of one stream.

    Get one with :meth:`Streamer.get_queue`. ``get()`` returns a
    :class:`Guard` per block, or :data:`multitables.QueueClosed` once the pass
    is over. Safe to share between threads: each block reaches exactly one,
    and a ``get()`` that finds every slot held waits for another thread to
    release one. ``len(queue)`` is the blocks of a pass (a cyclic queue has
    none), so ``tqdm(queue)`` shows a total.
    """

    def __init__(
        self, spec: StreamSpec, open_kwargs: dict[str, Any], start_method: "str | None", whole: bool = False
    ) -> None:
        # NOTE [read plan]: the caller's blocks cut from the larger ones read, unless ``whole`` (the generator's rows).
        split = 0 if whole else spec.read.split_rows
        #: Rows per block (the last block of a pass may be shorter with ``remainder=True``).
        self.block_size: int = split or spec.plan.block_size
        #: The engine reading the file, ``"chunks"``, ``"h5py"`` or ``"tables"`` (what ``auto`` chose).
        self.engine: str = spec.engine
        #: Reader processes (``n_procs``, capped); 0 when blocks are read in this process (asked, or too small to pay).
        self.n_procs: int = spec.n_procs
        self._source = f"{spec.node.path!r} of {shown(spec.node.filename)!r}"  # for repr: a URL without its secrets
        self._growing = isinstance(spec.plan, GrowingPlan)  # NOTE [readers across epochs]
        self._n_blocks = None if self._growing else spec.plan.n_blocks
        if split and self._n_blocks is not None:
            assert isinstance(spec.plan, BlockPlan)  # blocks read several at a time: a regular plan's (plan_stream)
            self._n_blocks = -(-spec.plan.n_rows // split)
        self._delivered = 0
        #: Slots, the blocks the readers and the caller hold at once (``read_ahead``); a ``get()`` waits while the
        #: caller's guards hold them all.
        self.read_ahead: int = spec.read.read_ahead
        self._held = 0  # guards handed out and not yet released
        self._holders: dict[int, threading.Thread] = {}  # slot -> the thread holding its guard
        self._taker: "threading.Thread | None" = None  # the thread in backend.take(): one at a time
        self._spare: "Guard | None" = None  # the next block's guard, made ahead (NOTE [a slot in hand])
        self._made: "dict[threading.Thread, Guard]" = {}  # a guard handed its block, which the thread's get() returns
        # Reentrant: a guard the GC frees while its thread holds the lock releases through it (_give_back).
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # a slot released, a take done, closed
        self._closed = False
        backend: "InlineBackend | RingBackend | SplitBackend"
        if spec.n_procs == 0:
            backend = InlineBackend(spec, open_kwargs)
        else:
            backend = RingBackend(spec, open_kwargs, start_method)
        try:
            if split:
                backend = SplitBackend(backend, split, -(-spec.plan.block_size // split))
            self._backend = backend
            self._before_unmap: "list[Callable[[], None]]" = []  # see at_close
            self._finalizer = weakref.finalize(self, _end_early, backend, self._before_unmap)
        except BaseException:  # a Ctrl-C: the frames of its traceback, which a notebook keeps, hold the readers
            backend.close()
            raise

    @property
    def reader_pids(self) -> list[int]:
        """Process ids of the reader processes (empty when reading in this process)."""
        return list(self._backend.pids)

    def get(self, _into: "list[Guard | None] | None" = None) -> "Guard | Literal[QueueClosedType.QueueClosed]":
        """Wait for the next block; return its :class:`Guard`, or ``QueueClosed`` at the end of the pass.

        While every slot is held, waits for another thread to release a guard
        (a guard is held by the thread that called ``get()`` for it, then by
        the thread that enters its ``with``) or to close the queue (then
        ``QueueClosed``). Raises ``RuntimeError`` where no thread could: every
        guard is the caller's, or no other thread runs; and
        :class:`multitables.ReaderError` (also an instance of the original
        exception type) if a reader failed or died, waiting or not. Ctrl-C
        while it waits closes the queue: the ``KeyboardInterrupt`` reaches
        the caller once the readers are gone.
        """
        # ``_into`` (ours, the row generator's): the guard is also stored in ``_into[0]`` before it is returned, so that
        # a handler's exception as this returns does not leave the caller without it (NOTE [a slot in hand]). One frame
        # for both: a get() calling an inner one had a return, between the two, where such an exception lost the guard.
        into = _into
        me = threading.current_thread()
        made = self._made.get(me)  # the guard an exception kept a get() of this thread from returning
        if made is not None:
            if not self._closed:  # else released by the close
                if into is not None:
                    into[0] = made
                del self._made[me]
                return made
            del self._made[me]
        slot = None
        try:
            if not self._wait_turn(me):
                return QueueClosed
            try:
                if self._spare is None:
                    self._spare = Guard()
                slot, block = self._backend.take()  # outside the lock: guards can be released meanwhile
            finally:
                with self._changed:
                    self._taker = None
                    if slot is not None:  # the back end's hands to the caller's: stores alone (NOTE [a slot in hand])
                        made, self._spare, self._backend.out = self._spare, None, None
                        made._held[0], made._held[1], made.block = self, slot, block  # type: ignore[union-attr]  # _spare: set above
                        self._made[me] = made  # type: ignore[assignment]  # as above
                        self._delivered += 1
                        self._held += 1
                        self._holders[slot] = me
                    self._changed.notify_all()
        except StreamClosedError:
            if self._closed:  # by another thread while this one waited
                return QueueClosed
            raise
        except KeyboardInterrupt:  # Ctrl-C ends the stream, as leaving its with does (a 2.x loop has none)
            self.close()
            raise
        made = self._made[me]
        if self._closed:  # by another thread while this one took the block: the pass is over for it too
            del self._made[me]
            made.release()
            return QueueClosed
        if into is not None:
            into[0] = made  # the caller's hands, then ours cleared: stores alone
        del self._made[me]
        return made

    def _wait_turn(self, me: threading.Thread) -> bool:
        """Wait for a free slot and for no other thread to be taking a block, then take the turn; False once over."""
        while True:
            with self._changed:
                if self._closed or self.at_end:
                    return False
                starved = self._held >= self.read_ahead
                # A turn this thread holds already was left by an exception as get() gave it back (a signal's
                # handler raising as its finally began): no other take runs, so it is this get's turn.
                if not starved and (self._taker is None or self._taker is me):
                    self._taker = me
                    return True
                mine = all(holder is me for holder in self._holders.values())
                if starved and (mine or threading.active_count() == 1):  # nobody could release one
                    raise RuntimeError(
                        f"all {self.read_ahead} slots of the queue are held by unreleased guards "
                        f"{'of this thread' if mine else 'and no other thread runs to release one'}; leave a "
                        f"guard's `with` (or call guard.release()) before asking for more, or use a larger read_ahead"
                    )
                self._changed.wait(TICK)
            if starved and not self._closed:
                self._backend.check(taking=False)  # a reader failing ends the wait too; readers done do not

    def iter(self) -> Iterator[Guard]:
        """Iterate over guards until ``QueueClosed``. An exception of :meth:`get` ends no iteration (a generator's
        would): after a signal handler's, the next guard is the block ``get()`` was taking."""
        return iter(self.get, QueueClosed)  # type: ignore[arg-type]  # a generator would end at the exception

    def __iter__(self) -> Iterator[Guard]:
        return self.iter()

    def __len__(self) -> int:
        """Blocks of the pass, wherever it stands: what ``tqdm(queue)`` shows as the total. ``TypeError`` for a
        cyclic queue, which never ends."""
        if self._n_blocks is None:
            raise TypeError(f"a cyclic queue over {self._source} has no length: it never ends")
        return self._n_blocks

    def __bool__(self) -> bool:
        return True  # a queue, whatever len() says (and a cyclic one has none)

    @property
    def at_end(self) -> bool:
        """Whether the last block of the pass has been handed out (never, for a cyclic stream).

        For a stream that grows: whether every block published so far has been handed out.
        """
        if self._growing:  # never a SplitBackend, which only a regular plan gets (no check here: once a block)
            return self._backend.next >= self._backend.published  # type: ignore[union-attr]
        # Not while a failure waits: the rows before it came as a block of their own, the last one if it was last.
        return self._n_blocks is not None and self._delivered >= self._n_blocks and not self._backend.failure_held

    def extend(self, starts: "Sequence[int] | np.ndarray", stops: "Sequence[int] | np.ndarray") -> None:
        """Publish more blocks, rows ``[starts[i], stops[i])``, read after those published (a stream that grows: NOTE
        [readers across epochs]); ``ValueError`` for one that does not fit a slot, checked once, where they are
        written (the ring: in numpy)."""
        if not self._growing:
            raise TypeError("only a stream made over a GrowingPlan takes more blocks")
        with self._lock:
            self._backend.extend(starts, stops)  # type: ignore[union-attr]  # growing: as at_end

    def rewind(self) -> None:
        """Withdraw the blocks published and not handed out; those read meanwhile are dropped. No guard may be held."""
        if not self._growing:
            raise TypeError("only a stream made over a GrowingPlan can be rewound")
        with self._lock:
            for made in list(self._made.values()):  # never the caller's (NOTE [a slot in hand]): withdrawn too
                made.release()
            self._made.clear()
            if self._held:
                raise RuntimeError(f"{self._held} guard(s) of the queue are still held: release them before a rewind")
            self._backend.rewind()  # type: ignore[union-attr]  # growing: as at_end

    def lend(self, guard: Guard) -> np.ndarray:
        """A new writable array on ``guard``'s slot (ring streams only): NOTE [lent blocks]."""
        rows = self._backend.lend(guard._held[1], len(guard.block))
        guard.block = None  # type: ignore[assignment]  # the rows are the block now: the slot's array goes unheld
        return rows

    def slot_memory(self) -> "tuple[int, int] | None":
        """Where every block of this queue lies in this process: the address and size in bytes of the ring's slots,
        for page-locking them in place (NOTE [slots on a device] in ``_train.device``); None where blocks are read in
        this process, each into memory of its own. Valid until :meth:`close`, which unmaps it."""
        return self._backend.slot_memory()

    def _hold(self, slot: int) -> None:
        """The calling thread holds ``slot``'s guard from now on (it entered the guard's ``with``)."""
        me = threading.current_thread()
        if self._holders.get(slot) is not me:  # usually the thread that called get() for it
            with self._lock:
                if slot in self._holders:
                    self._holders[slot] = me

    def close(self) -> None:
        """Stop the readers and free the ring (idempotent). A guard handed out before still gives its block, and a
        block used after the close reads its bytes, kept until the last reference goes (NOTE [segment lifetime]).

        After a pass's last block (not cyclic, not growing), the ring's memory is given back after this returns
        (NOTE [release off the path] in ``_sys.release``); otherwise (an early stop, an error, an interrupt) before.
        """
        self._closed = True
        for made in list(self._made.values()):  # never the caller's (NOTE [a slot in hand]): its get returns QueueClosed
            made.release()  # and no longer keeps this queue
        with self._changed:
            self._changed.notify_all()  # a get() waiting for a slot returns QueueClosed
        if not self._growing and self.at_end and self._finalizer.alive:
            # Detached once ended: a handler's exception that cuts the end short leaves it to the finalizer (a
            # close again, the queue dropped), which ends what is left (each step is idempotent). Readers' ends are
            # held over whole: one cut short is not always done again (``_sys.signals.HELD``).
            with signals_deferred() if self._backend.pids else contextlib.nullcontext():
                _end(self._backend, self._before_unmap, background=True)
            self._finalizer.detach()
        else:
            self._finalizer()

    def at_close(self, hook: "Callable[[], None]") -> None:
        """Call ``hook()`` once when the queue is closed (or collected), before its slots are unmapped: for who
        page-locked :meth:`slot_memory` (NOTE [slots on a device] in ``_train.device``). At once if closed."""
        if self._closed:
            hook()
        else:
            self._before_unmap.append(hook)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (or the queue was collected)."""
        return self._closed

    def __reduce__(self) -> Any:
        raise TypeError(NOT_PICKLED.format("a Queue", ""))

    def __enter__(self) -> "Queue":
        return self

    def __repr__(self) -> str:
        readers = f"{self.n_procs} reader{'' if self.n_procs == 1 else 's'}" if self.n_procs else "read in this process"
        state = ", closed" if self._closed else ""
        return f"<multitables.Queue {self._source}: {readers}, blocks of {self.block_size} rows, {self.engine!r} engine{state}>"

    def __exit__(self, *exc: object) -> None:
        self.close()
