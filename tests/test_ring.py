"""The ring's slots and readers (NOTE [slots and page tables] in ``multitables._shm.ring``).

The slots belong to readers (slot ``s`` to reader ``s % N``): a reader
claims blocks only into its own, which it maps into its page tables whole.
"""

from __future__ import annotations

import mmap
import multiprocessing
import resource
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from multitables._shm.layout import RingLayout, RingSync
from multitables._shm.ring import Ring


def _always() -> bool:
    return True


@pytest.fixture
def rings() -> Iterator[tuple[Ring, list[Ring]]]:
    """A consumer's ring of 6 slots of 1 MiB, and two readers' (reader 0 and 1 of 2) in this process."""
    layout = RingLayout(6, 256, (1024,), np.dtype("<f4"))
    sync = RingSync.create(multiprocessing.get_context("fork"), layout.n_slots, n_readers=2)
    consumer = Ring.create(layout, sync)
    readers = [Ring.attach(consumer.segment.name, layout, sync, reader=r) for r in range(2)]
    for ring in readers:
        ring.map_own_slots()
    try:
        yield consumer, readers
    finally:
        for ring in readers:
            ring.close()
        consumer.segment.unlink()
        consumer.close()


def _claims(ring: Ring, ticks: int = 2):
    """What ``claim`` answers, giving up after ``ticks`` waits for a free slot."""
    left = [ticks]

    def keep_going() -> bool:
        left[0] -= 1
        return left[0] > 0

    return ring.claim(None, keep_going)


def test_each_reader_claims_blocks_in_order_into_its_own_slots(rings: tuple[Ring, list[Ring]]) -> None:
    _, (r0, r1) = rings
    got = [_claims(r0), _claims(r1), _claims(r1), _claims(r0)]
    assert got == [(0, 0), (1, 1), (2, 3), (3, 2)]  # blocks in claim order; slots even for reader 0, odd for 1


def _took(consumer: Ring) -> "int | None":
    """A slot taken and recorded, as the back end records it (the ring gives it again until then: NOTE [a slot in
    hand] in ``multitables._stream.queue``)."""
    slot = consumer.take(1.0)
    assert consumer.take(1.0) == slot
    consumer.taken = None
    return slot


def test_a_reader_writes_next_into_its_slot_given_back_last(rings: tuple[Ring, list[Ring]]) -> None:
    """NOTE [warm slots]: while the consumer keeps up, a reader takes turns between two slots, not all of its own."""
    consumer, (r0, _r1) = rings
    used = []
    held = None
    for _ in range(6):
        k, s = _claims(r0)
        used.append(s)
        r0.publish(s, k, 256, _always)
        assert _took(consumer) == s
        if held is not None:
            consumer.release(held, _always)  # the block before: a consumer holds one while it takes the next
        held = s
    assert used == [0, 2, 0, 2, 0, 2]  # slot 4, also reader 0's, is never needed
    consumer.release(held, _always)
    k, s = _claims(r0)
    assert (k, s) == (6, 2)


def test_a_reader_whose_slots_are_all_taken_waits_for_one_of_its_own(rings: tuple[Ring, list[Ring]]) -> None:
    consumer, (r0, r1) = rings
    mine = [_claims(r0) for _ in range(3)]
    assert [k for k, _ in mine] == [0, 1, 2] and sorted(s for _, s in mine) == [0, 2, 4]
    assert _claims(r0) is None  # none of its own free: it waits, though slots 1, 3 and 5 are free
    k, theirs = _claims(r1)
    assert k == 3 and theirs % 2 == 1  # the other reader goes on, with the next block, in one of its own
    for k, s in mine + [(3, theirs)]:
        (r0 if s % 2 == 0 else r1).publish(s, k, 256, _always)
    for k, s in mine + [(3, theirs)]:  # the consumer takes them in the order published, and gives them back
        assert _took(consumer) == s and consumer.meta(s)[0] == k
        consumer.release(s, _always)
    k, s = _claims(r0)
    assert k == 4 and s % 2 == 0
    k, s = _claims(r1)
    assert k == 5 and s % 2 == 1


def test_with_fewer_slots_than_readers_readers_share_a_slots_group() -> None:
    layout = RingLayout(2, 4, (8,), np.dtype("<f4"))
    sync = RingSync.create(multiprocessing.get_context("fork"), layout.n_slots, n_readers=3)
    consumer = Ring.create(layout, sync)
    readers = [Ring.attach(consumer.segment.name, layout, sync, reader=r) for r in range(3)]
    try:
        assert [sync.group(r) for r in range(3)] == [0, 1, 0]
        assert _claims(readers[2]) == (0, 0)  # reader 2 claims group 0's slot
        assert _claims(readers[0]) is None  # and reader 0, of the same group, waits for it
        assert _claims(readers[1]) == (1, 1)
    finally:
        for ring in readers:
            ring.close()
        consumer.segment.unlink()
        consumer.close()


def test_stopping_gives_every_reader_a_token_of_its_own_group(rings: tuple[Ring, list[Ring]]) -> None:
    """A reader blocked on its group's semaphore wakes at the stop, not at its next tick."""
    consumer, (r0, r1) = rings
    for _ in range(3):
        _claims(r0)
        _claims(r1)
    sync = consumer.sync
    assert [sem.get_value() for sem in sync.free] == [0, 0]  # every slot taken: both readers would block
    consumer.stop()
    consumer.wake_readers(3)  # three readers: 0 and 2 in group 0, 1 in group 1
    assert [sem.get_value() for sem in sync.free] == [2, 1]
    assert r0.claim(None, _always) is None and r1.claim(None, _always) is None


def _populate_works() -> bool:
    region = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        region.madvise(23, 0, mmap.PAGESIZE)  # MADV_POPULATE_WRITE
        return True
    except OSError:
        return False
    finally:
        region.close()


def _faults_writing(slot: np.ndarray) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    slot[...] = 1.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _shmem_huge_pages_forced() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            return "[force]" in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not _populate_works(), reason="the kernel lacks MADV_POPULATE_WRITE (Linux < 5.14): slots fault as written")
@pytest.mark.skipif(_shmem_huge_pages_forced(), reason="shared memory in huge pages (shmem_enabled=force): a fault maps 2 MiB")
def test_a_readers_own_slots_are_mapped_whole_and_no_other(rings: tuple[Ring, list[Ring]]) -> None:
    _, (r0, _r1) = rings
    pages = r0.layout.slot_stride // mmap.PAGESIZE
    assert all(_faults_writing(r0.slots[s]) < pages // 8 for s in (0, 2, 4))  # its own: mapped (a stray fault may come)
    assert _faults_writing(r0.slots[1]) >= pages // 2  # reader 1's, never mapped here: a fault a page


# -- the consumer's part while its readers start (NOTE [slots while readers start]) ----------------------------------


def _stream_rows(path: Path, n_rows: int) -> np.ndarray:
    import multitables

    got = []
    with multitables.Streamer(str(path)).get_queue("/data", n_procs=1, block_size=500, ordered=True) as q:
        for guard in q.iter():
            with guard as block:
                got.append(block.copy())
    assert sum(len(b) for b in got) == n_rows
    return np.concatenate(got)


@pytest.mark.parametrize("cpus, siblings, allocated", [(4, 0, True), (1, 0, False), (4, 3, False)],
                         ids=["a-cpu-left-over", "a-reader-per-cpu", "a-cpu-each-beside-siblings"])
def test_the_consumer_allocates_the_slots_while_its_readers_start_where_a_cpu_is_left_over(
    make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, no_leaks: None, cpus: int, siblings: int,
    allocated: bool
) -> None:
    """Counted in this process's share of the CPUs: 4 CPUs shared with 3 siblings (NOTE [CPU siblings]) leave none
    over for the consumer beside one reader."""
    from multitables._plan import readers

    rings_allocated: list[int] = []
    real = Ring.allocate_slots
    monkeypatch.setattr(readers, "available_cpus", lambda: cpus)
    monkeypatch.setattr(readers, "cpu_siblings", lambda: siblings)
    monkeypatch.setattr(Ring, "allocate_slots", lambda self: rings_allocated.append(self.layout.n_slots) or real(self))
    data = np.arange(4000 * 16, dtype="<f4").reshape(4000, 16)
    path = make_array(data, chunkshape=(100, 16))
    np.testing.assert_array_equal(_stream_rows(path, len(data)), data)
    assert rings_allocated == ([4] if allocated else [])  # one reader: 2 x 1 + 2 slots


def test_slots_the_consumer_cannot_allocate_are_left_to_its_readers(
    make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """/dev/shm full when the consumer allocates: no error from it; each reader maps its own slots, as without it."""
    import errno
    import os

    from multitables._procs import stream
    from multitables._shm import segment as _shm

    consumer, real = os.getpid(), _shm._madvise

    def full_in_the_consumer(buf: mmap.mmap, advice: int, offset: int, nbytes: int) -> None:
        if os.getpid() == consumer and offset:  # the slots; the header, at 0, is had
            raise OSError(errno.EFAULT, "Bad address")
        real(buf, advice, offset, nbytes)

    monkeypatch.setattr(stream, "cpu_share", lambda: 4)
    monkeypatch.setattr(_shm, "_madvise", full_in_the_consumer)  # the forked reader inherits it, with another pid
    data = np.arange(4000 * 16, dtype="<f4").reshape(4000, 16)
    path = make_array(data, chunkshape=(100, 16))
    np.testing.assert_array_equal(_stream_rows(path, len(data)), data)


class _RaisesAsAcquireReturns:
    """A ring lock whose first ``acquire`` takes it and then raises, as a signal handler's exception landing just as
    ``acquire`` returned does."""

    def __init__(self, lock: object) -> None:
        self.lock, self.armed = lock, True
        self._semlock = lock._semlock  # type: ignore[attr-defined]

    def acquire(self, *args: object, **kwargs: object) -> bool:
        got = self.lock.acquire(*args, **kwargs)  # type: ignore[attr-defined]
        if got and self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return got

    def release(self) -> None:
        self.lock.release()  # type: ignore[attr-defined]


@pytest.mark.parametrize("side", ["reader publishes", "consumer rewinds"])
def test_a_handlers_exception_as_the_ring_lock_is_taken_leaves_it_free(
    rings: tuple[Ring, list[Ring]], side: str
) -> None:
    """The exception reaches the caller, and the lock is free: every other reader and the consumer would else wait on
    it for ever."""
    import dataclasses

    consumer, readers = rings
    k, slot = _claims(readers[0])  # type: ignore[misc]
    real = consumer.sync.lock
    raising = dataclasses.replace(consumer.sync, lock=_RaisesAsAcquireReturns(real))
    ring = readers[0] if side == "reader publishes" else consumer
    ring.sync = raising  # type: ignore[misc]
    with pytest.raises(KeyboardInterrupt):
        if side == "reader publishes":
            ring.publish(slot, k, 256, _always)
        else:
            ring.rewind(_always)
    assert real.acquire(False), "the ring's lock was left held"
    real.release()
