"""The ring: slots in one shared-memory segment, and the hand-off of slots between readers and consumer.

NOTE [ring protocol]
    The segment holds a small header, two lists of slots and ``n_slots`` slots of
    ``block_size`` rows each (page-aligned). A slot is always in exactly one
    of three hands: the *free stack*, a reader, or the consumer (via the
    *ready ring*).

    Reader:   acquire ``free`` (a slot is free)  ->  under ``lock``: claim the
              next block number ``k`` and pop a free slot ``s`` (the one given
              back last: NOTE [warm slots])  ->  read
              block ``k`` straight into slot ``s``  ->  write ``(k, rows)`` to
              the slot's meta  ->  under ``lock``: push ``s`` on the ready ring
              ->  release ``ready``.
    Consumer: acquire ``ready``  ->  pop ``s`` from the ready ring (the consumer
              is its only reader, so no lock)  ->  view slot ``s``  ->  on
              release, under ``lock``: push ``s`` on the free stack  ->  release
              ``free``. The ready ring's tail, not the tokens, says what is
              there: a token a handler's exception dropped (NOTE [a slot in
              hand] in ``_stream.queue``) leaves a slot with none, popped
              after a wait of ``timeout`` (tail read under ``lock``); its
              token, if it comes later, wakes a take that finds nothing.

    Claiming the block and popping its slot happen under one lock, so block
    numbers are handed out in order and every claimed block already owns its
    slot: an ``ordered`` consumer that sets early arrivals aside while it
    waits for block ``k`` can never wait on a slot held by a later block.
    Entries of the ready ring are written under the lock before ``ready`` is
    released, so once the consumer holds ``j`` tokens the first ``j`` entries
    are written. Semaphores hand-off costs ~0.1 us against ~126 us for a
    ``multiprocessing.Queue`` put+get (measured), which matters at GB/s.

    Every wait is a loop of short timed waits that checks the stop flag, the
    error flag and the liveness of the other side: nothing waits forever.

    A ring may also hold its stream's block table (``RingLayout.table``
    entries, each a block's first row and end): then the plan can grow while
    the readers run, and a stream outlives an epoch (NOTE [readers across
    epochs] in ``_procs.stream``). The consumer writes entries and moves
    the *published* count under ``lock``; a reader claims block ``k`` only
    below it, copying the entry under the same ``lock``, and otherwise gives
    its ``free`` token back and waits on ``more`` (released by every
    publication). An entry is overwritten only once the block ``table``
    places before it has been claimed. *Rewinding* (a jump of the position)
    sets the published count back to the next block to claim, waits until
    every claimed block is *done* (published to the ready ring, counted
    under ``lock``), and gives every ready slot back.

    Ending: the consumer sets the *stop flag* and releases ``free`` once per
    reader; from then on a reader gives up whatever it waits for (a slot, the
    lock) within a ``TICK``, and the consumer no longer hands slots back
    (``release`` is a no-op on a stopped ring), so a process that died holding
    the lock cannot block the end. A reader that fails sets the *error flag*
    and releases ``ready`` to wake the consumer, *then* sends its report (NOTE
    [failure reports] in ``_procs.pool``).

NOTE [slots and page tables]
    A process's first write to a page of the segment faults (about 1 us a 4 KiB page here). With any reader
    taking any free slot, every reader comes to map every slot: N x the ring's pages, at a fault each, or all at
    attach with 16 readers walking the same pages at once (12 s of system time a GiB, the first block at 0.33 s;
    BENCHMARKS.md, issue 29). So the slots belong to readers: slot ``s`` to reader ``s % N`` (two or three each
    with the default ``2N + 2`` slots; with fewer slots than readers, readers ``r`` and ``r + n_slots`` share
    group ``r % n_slots``). Each group has its own ``free`` semaphore, released by the consumer when it gives
    one of the group's slots back, and a reader claims the next block only with a free slot of its group. Claims
    stay in block order under the lock, so an ordered consumer never waits on a later block's slot. Once
    attached, a reader maps its group's slots whole (MADV_POPULATE_WRITE), which also allocates their pages: the
    consumer does not reserve them (``posix_fallocate`` zeroed them all in the consumer before any reader
    started), and a full /dev/shm is a ``ShmSpaceError`` from that reader, never a SIGBUS at a write. Until they
    are allocated, statvfs shows the slots free: the consumer counts them as taken (``space.promise``, by mincore
    on its own mapping), so a ring made meanwhile in this process is sized and checked against what is left.
    Kernels without it (before 5.14) reserve at creation and fault as before.

NOTE [slots while readers start]
    Allocating a slot's pages is two thirds of mapping them fresh (16 MiB: 6.5 of 10 ms here), and a reader maps its
    slots before its first block, while the consumer only waits. So where a CPU is left over (fewer readers than
    CPUs), the consumer allocates every slot in its own mapping right after starting the readers, and a reader's
    populate then mostly maps pages already there; the consumer's own reads of the slots no longer fault either.
    It goes from the last slot back, as the readers go from their first: slot by slot from the first, the two
    walked the same pages in step and the first block came later than without (22.4 -> 25.6 ms). With a reader per
    CPU it would take a reader's CPU: not done. One reader on a 1 GiB blosc file, from ``get_queue`` to the first
    block, medians of 25 (``benchmarks/stream_startup.py``): 21.4-23.3 -> 19.1-21.0 ms in four rounds; in a fresh
    process each, 26.8 -> 25.3 ms. The whole pass moves by less than its noise (BENCHMARKS.md, issue 29, twelfth
    session).

NOTE [warm slots]
    The free slots are a stack: a reader takes the slot of its group given back last. While the consumer keeps up,
    a reader so writes into two slots by turns, whose lines the caches still hold, instead of every slot of its
    group in turn; the others wait for a consumer that falls behind. Blosc 3 on a 2-core VM, 1 GiB: decoding
    each block into one reused buffer took 254 ms a pass, and into four in turn 273-282 ms; one reader with the
    default four slots went from 0.85x and 0.88x of one h5py process to 0.92x and 0.93x (BENCHMARKS.md, issue
    29, eleventh session). The slots are mapped whole at attach all the same (NOTE [slots and page tables]): a
    full /dev/shm is an error at the start, never a SIGBUS at a write.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np

from .._sys.awake import Eagerness, acquire, release_if_held
from .._sys.refs import held_elsewhere
from .._sys.release import release_later
from ..errors import ShmSpaceError
from .layout import HEADER_WORDS, RingLayout, RingSync
from .segment import Segment, can_populate

#: Seconds between liveness checks while a side waits.
TICK = 0.05

_STOP, _ERROR, _NEXT, _FREE_TOP, _READY_TAIL, _PUBLISHED, _DONE = range(HEADER_WORDS)


class _Wait:
    """What :meth:`Ring.claim` answers when a block table has no block published beyond the claimed ones."""

    def __repr__(self) -> str:
        return "WAIT"


#: No block to claim yet: wait for the consumer to publish more (:meth:`Ring.wait_for_more`).
WAIT = _Wait()


class PeerGone(Exception):
    """The other side is gone, or the ring was stopped, while waiting for the lock."""


class Ring:
    """One side's mapping of a ring segment; see NOTE [ring protocol]."""

    def __init__(self, segment: Segment, layout: RingLayout, sync: RingSync) -> None:
        self.segment = segment
        self.layout = layout
        self.sync = sync
        n = layout.n_slots
        words = np.frombuffer(segment.buf, dtype=np.int64, count=layout.header_words)
        self._hdr = words[:HEADER_WORDS]
        self._free_stack = words[HEADER_WORDS : HEADER_WORDS + n]
        self._ready_ring = words[HEADER_WORDS + n : HEADER_WORDS + 2 * n]
        self._meta = words[HEADER_WORDS + 2 * n : HEADER_WORDS + 4 * n].reshape(n, 2)
        self._table = words[HEADER_WORDS + 4 * n :].reshape(layout.table, 2)  # (first row, end) of block k % table
        self._claimed: dict[int, tuple[int, int]] = {}  # reader-local: the entries of blocks this reader claimed
        self._ready_head = 0  # consumer-local
        #: Consumer-local: the slot :meth:`take` popped last, until its caller records it and sets None (NOTE [a slot
        #: in hand] in ``_stream.queue``); a take meanwhile gives it again.
        self.taken: "int | None" = None
        #: Consumer-local: the slots given back and not yet the readers' (NOTE [a slot given back] in
        #: ``_stream.queue``); the first may be pushed on the free stack already (``_pushed``), its token not posted.
        self.returned: list[int] = []
        self._giving = threading.RLock()  # one thread gives back at a time, and once: not in a finalizer run inside
        self._pushed = self._giving_now = False
        # slot -> lend()'s array, weakly: plain references, no callback, so that no Python code runs where the
        # last row of a block dies (a signal's handler run there has its exception dropped: "Exception ignored")
        self._lent: "dict[int, weakref.ref[np.ndarray]]" = {}
        self._group = 0  # reader-local: the group whose free slots this reader claims
        self._closed = False
        self._awake = Eagerness()  # this side's: whether it looks for a token before sleeping (NOTE [waiting awake])
        shape = (layout.block_size,) + layout.row_shape
        self.slots: list[np.ndarray] = []
        for s in range(n):
            # No buffer export (unlike lend()): close() counts the references
            # to each slot's array instead (a guard's view holds one).
            # Writable on both sides: a slot is the consumer's until released,
            # and a reader writes every row of a block before publishing it,
            # so nothing the consumer writes outlives the block.
            self.slots.append(np.ndarray(shape, layout.dtype, buffer=segment.buf, offset=layout.slot_offset(s)))

    def lend(self, slot: int, rows: int) -> np.ndarray:
        """A new, writable array on the first ``rows`` rows of ``slot`` (the consumer's side).

        Made afresh on the mapping at each call; its ``base`` is the object
        every row of it points at, so its reference count (``_sys.refs``) tells
        whether any row is still alive (NOTE [lent blocks] in ``streamer``).
        Rows outliving :meth:`close` stay valid: np.frombuffer holds a
        buffer export, so ``Segment.close`` sees them and moves the slots
        still lent to private memory (np.ndarray(buffer=...) holds none).
        """
        layout = self.layout
        flat = np.frombuffer(self.segment.buf, layout.dtype, count=rows * layout.row_items,
                             offset=layout.slot_offset(slot))
        self._lent[slot] = weakref.ref(flat)
        return flat.reshape((rows,) + layout.row_shape)

    # -- set-up ---------------------------------------------------------------
    @classmethod
    def create(cls, layout: RingLayout, sync: RingSync) -> "Ring":
        """The consumer's ring: a new segment with every slot on the free stack.

        Where the kernel can populate, the slots' pages are allocated by the
        readers that write them (NOTE [slots and page tables]), not here.
        """
        segment = Segment.create(layout.nbytes, reserve=not can_populate())
        segment.populate(0, layout.data_offset)  # the header, written by both sides (nothing where reserved)
        ring = cls(segment, layout, sync)
        ring._hdr[:] = 0
        ring._free_stack[:] = np.arange(layout.n_slots)[::-1]  # a stack: slot 0 on top
        ring._hdr[_FREE_TOP] = layout.n_slots
        return ring

    @classmethod
    def attach(cls, name: str, layout: RingLayout, sync: RingSync, reader: int = 0) -> "Ring":
        """A reader's ring: map the consumer's segment by name; ``reader`` (its index) says its group's slots."""
        ring = cls(Segment.attach(name, layout.nbytes), layout, sync)
        ring._group = sync.group(reader)
        return ring

    def allocate_slots(self) -> None:
        """The consumer's, while its readers start: allocate every slot's pages in its own mapping (NOTE [slots while
        readers start]). Best effort: where /dev/shm has no room, each reader's own mapping says so."""
        layout = self.layout
        try:
            for slot in reversed(range(layout.n_slots)):  # readers map theirs from the first: meet them halfway
                self.segment.populate(layout.slot_offset(slot), layout.slot_stride)
        except (MemoryError, OSError):  # ShmSpaceError is a MemoryError
            pass

    def map_own_slots(self) -> None:
        """Map this reader's group's slots into its page tables, whole (ShmSpaceError: /dev/shm has no room for them)."""
        try:
            for slot in range(self._group, self.layout.n_slots, len(self.sync.free)):
                self.segment.populate(self.layout.slot_offset(slot), self.layout.slot_stride)
        except ShmSpaceError as exc:  # checked when the ring was made: what took the room came since, from elsewhere
            raise ShmSpaceError(f"{exc} (There was room when the stream started: another process, whose rings this "
                                f"one cannot count, took it since.)") from exc

    def close(self, background: bool = False) -> None:
        """Unmap (idempotent); the ring then counts as stopped. ``background``: where no slot's rows are lent, unmap
        after returning (NOTE [release off the path])."""
        if self._closed:
            return
        self._closed = True
        # A slot whose array something still references (a block kept past its with, a guard held) keeps its
        # pages, and its last block, until that goes (NOTE [segment lifetime]).
        held = [(self.layout.slot_offset(slot), self.slots[slot].nbytes)
                for slot in range(len(self.slots)) if self.segment.owner and held_elsewhere(self.slots, slot)]
        self.slots = []
        self._hdr = self._free_stack = self._ready_ring = self._meta = self._table = None  # type: ignore[assignment]  # closed: unmapped
        lent = {slot: ref() for slot, ref in self._lent.items()}
        still_lent = [(self.layout.slot_offset(slot), flat.nbytes) for slot, flat in lent.items() if flat is not None]
        del lent
        if background and not still_lent and self.segment.owner:
            release_later(functools.partial(self.segment.close, keep=still_lent, held=held))
        else:
            self.segment.close(keep=still_lent, held=held)

    # -- flags ----------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        return self._closed or bool(self._hdr[_STOP])

    def stop(self) -> None:
        if not self._closed:
            self._hdr[_STOP] = 1

    @property
    def failed(self) -> bool:
        return not self._closed and bool(self._hdr[_ERROR])

    def fail(self) -> None:
        """A reader's last act on error: flag it and wake the consumer."""
        self._hdr[_ERROR] = 1
        self.sync.ready.release()

    @contextmanager
    def _locked(self, check: Callable[[], bool]) -> Iterator[None]:
        """Hold the ring lock; ``check()`` runs every tick while waiting (it may raise, or say give up).

        A process killed while holding the lock would otherwise leave every
        other one waiting forever.
        """
        lock = self.sync.lock
        try:
            while not lock.acquire(timeout=TICK):
                if self.stopped or not check():
                    raise PeerGone
            yield
        finally:  # held or not: a handler's exception as acquire returned leaves it held, and no record says so
            release_if_held(lock)

    # -- reader side ----------------------------------------------------------
    def claim(self, n_blocks: "int | None", keep_going: Callable[[], bool]) -> "tuple[int, int] | _Wait | None":
        """Wait for a free slot and claim the next block: ``(k, slot)``, or None when done or stopped.

        With a block table, ``n_blocks`` is ignored: the published count
        bounds the claims, and :data:`WAIT` says none is published yet.
        """
        free = self.sync.free[self._group]
        if not acquire(free, self._awake, TICK):  # NOTE [waiting awake]
            while not free.acquire(timeout=TICK):
                if self.stopped or not keep_going():
                    return None
        try:
            return self._claim_slot(n_blocks, keep_going)
        except PeerGone:
            return None

    def _claim_slot(self, n_blocks: "int | None", keep_going: Callable[[], bool]) -> "tuple[int, int] | _Wait | None":
        table = self.layout.table
        with self._locked(keep_going):
            k = int(self._hdr[_NEXT])
            if table:
                n_blocks = int(self._hdr[_PUBLISHED])
            if self.stopped or (n_blocks is not None and k >= n_blocks):
                self.sync.free[self._group].release()  # let the group's other readers see the end too
                return None if self.stopped or not table else WAIT
            self._hdr[_NEXT] = k + 1
            s = self._pop_free()
            if table:
                start, stop = self._table[k % table]
                self._claimed[k] = (int(start), int(stop))
        return k, s

    def _pop_free(self) -> int:
        """Pop the free slot of this reader's group given back last (NOTE [warm slots]; under the lock, holding one of
        the group's tokens)."""
        free, groups = self._free_stack, len(self.sync.free)
        top = int(self._hdr[_FREE_TOP])  # the free slots are free[:top], the one given back last on top
        for j in range(top - 1, -1, -1):
            s = int(free[j])
            if s % groups == self._group:
                free[j : top - 1] = free[j + 1 : top].copy()  # the others keep their order
                self._hdr[_FREE_TOP] = top - 1
                return s
        raise AssertionError(f"a token of group {self._group} but none of its slots free")  # pragma: no cover

    def wait_for_more(self, keep_going: Callable[[], bool]) -> bool:
        """Wait until the consumer publishes blocks (or a tick passes); False once stopped or told to stop."""
        self.sync.more.acquire(timeout=TICK)
        return not self.stopped and keep_going()

    def entry(self, k: int) -> "tuple[int, int] | None":
        """Block ``k``'s ``(first row, end)`` in the table: the copy made when this reader claimed it, else
        the table's entry if it is published (unlocked: for hints only), else None."""
        got = self._claimed.get(k)
        if got is not None:
            return got
        table = self.layout.table
        if table and k < int(self._hdr[_PUBLISHED]) and k + table > int(self._hdr[_PUBLISHED]):
            start, stop = self._table[k % table]
            return int(start), int(stop)
        return None

    def publish(self, slot: int, k: int, rows: int, keep_going: Callable[[], bool]) -> None:
        """Hand a filled slot to the consumer."""
        self._meta[slot] = (k, rows)
        with self._locked(keep_going):
            self._ready_ring[self._hdr[_READY_TAIL] % self.layout.n_slots] = slot
            self._hdr[_READY_TAIL] += 1
            self._hdr[_DONE] += 1
        self._claimed.pop(k, None)
        self.sync.ready.release()

    # -- consumer side: the block table ---------------------------------------
    @property
    def published(self) -> int:
        """Blocks published to the table so far (block numbers ``0 .. published - 1``)."""
        return int(self._hdr[_PUBLISHED])

    def extend(self, starts: "np.ndarray | tuple[int, ...]", stops: "np.ndarray | tuple[int, ...]", n_readers: int,
               check: Callable[[], bool]) -> None:
        """Publish blocks ``[starts[i], stops[i])`` after those published; wake the readers waiting for some."""
        # Made and checked before the lock (readers wait on it), in few numpy calls: once an epoch, from cold caches.
        table, n, size = self.layout.table, len(starts), self.layout.block_size
        entries = np.empty((n, 2), np.int64)  # (first row, end) of each block, as the table holds them
        entries[:, 0], entries[:, 1] = starts, stops
        rows = entries[:, 1] - entries[:, 0]
        if n and (entries[:, 0].min() < 0 or rows.min() <= 0 or rows.max() > size):
            a, b = entries[np.flatnonzero((entries[:, 0] < 0) | (rows <= 0) | (rows > size))[0]]
            raise ValueError(f"block [{a}, {b}) does not fit a slot of {size} rows")
        with self._locked(check):
            first, claimed = int(self._hdr[_PUBLISHED]), int(self._hdr[_NEXT])
            if first + n - table > claimed:
                raise ValueError(f"the block table holds {table} blocks, and {first - claimed} published ones are not "
                                 f"claimed yet: {n} more do not fit")
            at, k = first % table, min(n, table - first % table)  # k up to the table's end, the rest from its start
            self._table[at : at + k], self._table[: n - k] = entries[:k], entries[k:]
            self._hdr[_PUBLISHED] = first + n
        for _ in range(n_readers):
            self.sync.more.release()

    def rewind(self, check: Callable[[], bool]) -> int:
        """Withdraw the blocks published and not claimed, wait for the claimed ones, give every ready slot back.

        Returns the number the next published block will have. ``check()``
        runs every tick while waiting (it raises if a reader failed).
        """
        with self._locked(check):
            self._hdr[_PUBLISHED] = next_k = int(self._hdr[_NEXT])
        while True:
            with self._locked(check):
                done = int(self._hdr[_DONE]) == next_k
            if done:
                break
            check()
            time.sleep(TICK / 10)
        # Every block published to the ready ring and not taken goes back: as many as the ring holds, each
        # waited for (a reader counts a block done under the lock, and releases ``ready`` just after it).
        with self._locked(check):
            waiting = int(self._hdr[_READY_TAIL]) - self._ready_head
        for _ in range(waiting):
            got = self.sync.ready.acquire(timeout=TICK)  # none after a tick: a token a handler's exception dropped
            if got and self.failed:
                self.sync.ready.release()  # the failing reader's wake-up, not a slot: check() raises its error
            if not got or self.failed:
                check()
            slot = int(self._ready_ring[self._ready_head % self.layout.n_slots])
            self._ready_head += 1
            self.release(slot, check)
        return next_k

    # -- consumer side (one thread at a time) ---------------------------------
    def take(self, timeout: float) -> "int | None":
        """Pop a filled slot, or None if none came within ``timeout`` s or a reader failed; it is :attr:`taken` until
        the caller sets that None."""
        if self._closed:
            return None
        if self.taken is not None:
            return self.taken
        if acquire(self.sync.ready, self._awake, timeout):  # NOTE [waiting awake]
            if self.failed:
                self.sync.ready.release()  # keep the wake-up for the next look
                return None
            there = int(self._hdr[_READY_TAIL]) > self._ready_head  # not: the token of a slot popped without it
        else:  # a slot whose token a handler's exception dropped is there all the same (NOTE [ring protocol])
            try:
                with self._locked(lambda: False):  # the tail and the entries before it; a tick's wait, then give up
                    there = int(self._hdr[_READY_TAIL]) > self._ready_head
            except PeerGone:
                return None
        if not there:
            return None
        s = int(self._ready_ring[self._ready_head % self.layout.n_slots])
        self._ready_head += 1
        self.taken = s  # no handler runs between the two (stores alone)
        return s

    def meta(self, slot: int) -> tuple[int, int]:
        """``(block number, rows)`` of a filled slot."""
        k, rows = self._meta[slot]
        return int(k), int(rows)

    def ready_count(self) -> int:
        """Filled slots not yet taken, or taken and not recorded (:attr:`taken`); exact once the readers have
        exited."""
        return int(self._hdr[_READY_TAIL]) - self._ready_head + (self.taken is not None)

    def release(self, slot: int, check: Callable[[], bool]) -> None:
        """Give a slot back to the readers (nothing to do once the ring is stopped): :meth:`give_back`."""
        self.returned.append(slot)  # the one call before the work: a handler's exception after it leaves it recorded
        self.give_back(check)

    def give_back(self, check: Callable[[], bool]) -> None:
        """Give the slots of :attr:`returned` back to the readers, in order, each once (NOTE [a slot given back] in
        ``_stream.queue``); ``check()`` runs every tick while the lock is waited for."""
        returned = self.returned
        with self._giving:  # entered in C: no handler runs between its acquire and the with's hold of it
            if self._giving_now:  # a finalizer run inside the loop below (this thread's): the loop gives its slot
                return
            self._giving_now = True
            try:
                while returned:
                    slot = returned[0]  # the first: a finalizer that runs in this loop appends, never moves it
                    if self.stopped or not self._pushed and not self._push(slot, check):
                        returned.clear()  # stopped (or while waiting for the lock): nobody needs them any more
                        return
                    free = self.sync.free[self.sync.group(slot)]
                    del returned[0]  # stores, then the call: a handler runs after the token only
                    self._pushed = False
                    free.release()
            finally:
                self._giving_now = False

    def _push(self, slot: int, check: Callable[[], bool]) -> bool:
        """Push ``slot`` on the free stack under the lock, and record it pushed (stores alone); False once stopped."""
        lock = self.sync.lock
        try:
            while not lock.acquire(timeout=TICK):
                if self.stopped or not check():
                    return False
            self._free_stack[self._hdr[_FREE_TOP]] = slot
            self._hdr[_FREE_TOP] += 1
            self._pushed = True
            lock.release()
        except BaseException:  # a handler's exception as acquire returned: the lock is ours, and no record says so
            release_if_held(lock)
            raise
        return True

    def wake_readers(self, n: int) -> None:
        """A free and a ``more`` token for each of ``n`` readers: those blocked on a slot or a block see the stop now."""
        for reader in range(n):
            self.sync.free[self.sync.group(reader)].release()
            self.sync.more.release()
