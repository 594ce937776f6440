"""Sizes in shared memory: pages, and what a ring is made of (its layout and its process-shared primitives).

:class:`RingLayout` and :class:`RingSync` are what a reader is given at its
start to map a ring (``_shm.ring``, NOTE [ring protocol]); :data:`PAGE` and
:func:`round_up` size every segment's parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

PAGE = 4096
#: Header words of a ring (int64): flags, counters, the free stack's top and the ready ring's tail (``_shm.ring``).
HEADER_WORDS = 7


def round_up(n: int, to: int) -> int:
    """``n`` rounded up to a multiple of ``to``."""
    return -(-n // to) * to


@dataclass(frozen=True)
class RingLayout:
    """Sizes and offsets of a ring segment (bytes)."""

    n_slots: int
    block_size: int
    row_shape: tuple[int, ...]
    dtype: np.dtype
    #: Entries of the block table (0: none; the readers' plan is fixed when they start).
    table: int = 0

    @property
    def row_items(self) -> int:
        """Elements of ``dtype`` in one row."""
        return math.prod(self.row_shape)

    @property
    def slot_nbytes(self) -> int:
        return self.block_size * self.row_items * self.dtype.itemsize

    @property
    def slot_stride(self) -> int:
        return round_up(max(self.slot_nbytes, 1), PAGE)

    @property
    def header_words(self) -> int:
        """int64 words before the slots' page: the header, the free stack, the ready ring, each slot's meta and the
        block table."""
        return HEADER_WORDS + 4 * self.n_slots + 2 * self.table

    @property
    def data_offset(self) -> int:
        return round_up(self.header_words * 8, PAGE)

    @property
    def nbytes(self) -> int:
        return self.data_offset + self.n_slots * self.slot_stride

    def slot_offset(self, slot: int) -> int:
        """Where ``slot`` starts in the segment."""
        return self.data_offset + slot * self.slot_stride


@dataclass(frozen=True)
class RingSync:
    """The process-shared primitives of one ring (picklable at process start)."""

    #: Semaphores, one per *group* of readers: group ``g``'s free slots, the slots ``s % len(free) == g``
    #: (NOTE [slots and page tables]).
    free: "tuple[Any, ...]"
    ready: Any  # Semaphore: filled slots not yet taken
    lock: Any  # Lock: block claims, the free stack, the ready ring, the block table
    more: Any  # Semaphore: released when blocks are published to the table (wakes readers waiting for some)

    @classmethod
    def create(cls, ctx: Any, n_slots: int, n_readers: int = 1) -> "RingSync":
        """For ``n_readers`` readers: a group each, or, with fewer slots than readers, one per slot."""
        groups = max(1, min(n_readers, n_slots))
        free = tuple(ctx.Semaphore(len(range(g, n_slots, groups))) for g in range(groups))
        return cls(free, ctx.Semaphore(0), ctx.Lock(), ctx.Semaphore(0))

    @property
    def semaphores(self) -> "tuple[Any, ...]":
        """Every primitive of the ring (their names go once the readers opened them: NOTE [semaphore names] in
        ``semaphores``)."""
        return (*self.free, self.ready, self.lock, self.more)

    def group(self, slot_or_reader: int) -> int:
        """The group of a slot, or of a reader by its index."""
        return slot_or_reader % len(self.free)
