"""The ring's slots and readers (NOTE [slots and page tables] in ``multitables._shm.ring``).

Each reader prefers its own slots (``slot % readers == reader``) and takes
another's only when none of its own is free; a reader's own slots are in its
page tables from attach, another's from its first claim.
"""

from __future__ import annotations

import mmap
import multiprocessing
import resource
from typing import Iterator

import numpy as np
import pytest

from multitables._shm.ring import Ring, RingLayout, RingSync


def _always() -> bool:
    return True


@pytest.fixture
def rings() -> Iterator[tuple[Ring, list[Ring]]]:
    """A consumer's ring of 6 slots of 1 MiB, and two readers' (reader 0 and 1 of 2) in this process."""
    layout = RingLayout(6, 256, (1024,), np.dtype("<f4"))
    sync = RingSync.create(multiprocessing.get_context("fork"), layout.n_slots)
    consumer = Ring.create(layout, sync)
    readers = [Ring.attach(consumer.segment.name, layout, sync, reader=r, n_readers=2) for r in range(2)]
    for ring in readers:
        ring.map_own_slots()
    try:
        yield consumer, readers
    finally:
        for ring in readers:
            ring.close()
        consumer.segment.unlink()
        consumer.close()


def test_each_reader_claims_its_own_slots_while_it_has_free_ones(rings: tuple[Ring, list[Ring]]) -> None:
    _, (r0, r1) = rings
    got = [r0.claim(None, _always), r1.claim(None, _always), r1.claim(None, _always), r0.claim(None, _always)]
    assert got == [(0, 0), (1, 1), (2, 3), (3, 2)]  # blocks in claim order; slots even for reader 0, odd for 1


def test_a_reader_with_none_of_its_own_free_takes_another_readers_slot(rings: tuple[Ring, list[Ring]]) -> None:
    consumer, (r0, r1) = rings
    mine = [r0.claim(None, _always) for _ in range(3)]
    assert [s for _, s in mine] == [0, 2, 4]
    k, s = r0.claim(None, _always)  # none of its own left: one of the other's
    assert k == 3 and s in (1, 3, 5)
    for k, s in mine + [(k, s)]:
        r0.publish(s, k, 256, _always)
    for _ in range(4):  # the consumer gives slot 0, 2, 4 and the other's back, in block order
        consumer.release(consumer.take(1.0), _always)
    assert r0.claim(None, _always) == (4, 0)  # its own again, though two of the other's were free before it
    k, s = r1.claim(None, _always)
    assert k == 5 and s in (1, 3, 5)


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
def test_own_slots_are_mapped_at_attach_and_anothers_at_its_first_claim(rings: tuple[Ring, list[Ring]]) -> None:
    _, (r0, r1) = rings
    pages = r0.layout.slot_stride // mmap.PAGESIZE
    assert [r0.claim(None, _always)[1] for _ in range(3)] == [0, 2, 4]
    assert all(_faults_writing(r0.slots[s]) < pages // 8 for s in (0, 2, 4))  # its own: mapped (a stray fault may come)
    _, s = r0.claim(None, _always)
    assert s in (1, 3, 5)
    assert _faults_writing(r0.slots[s]) < pages // 8  # another's, mapped whole when claimed
    never = min({1, 3, 5} - {s})
    assert _faults_writing(r0.slots[never]) >= pages // 2  # another's, never claimed here: a fault a page
