"""Room in shared memory for rings of the defaults: their fewest slots, and how many default readers fit.

NOTE [read plan] in ``readers`` says when these apply: only to what the
caller left to the defaults (readers and read-ahead). What the caller gives
is kept, and a ring of it that does not fit is refused before any reader
starts.
"""

from __future__ import annotations

from typing import Sequence

#: The share of the shared memory free at a stream's start that a ring of the defaults takes at most (NOTE [read
#: plan]): the rest is left to others, and to the next ring.
SHM_SHARE = 0.5


def fewest_slots(n_procs: int) -> int:
    """The fewest slots a default ring gets where shared memory is short: one per reader, and the consumer's."""
    return n_procs + 1


def readers_that_fit(readers: Sequence[int], slot_bytes: Sequence[int], shm_free: int) -> list[int]:
    """Default readers of rings whose slots hold ``slot_bytes`` each: fewer, one at a time from the ring that takes
    most, while the rings' fewest slots together take more than :data:`SHM_SHARE` of ``shm_free``; down to none
    (the blocks read in the consumer, which takes no shared memory)."""
    fitted = list(readers)

    def ring(i: int) -> int:
        return fewest_slots(fitted[i]) * slot_bytes[i] if fitted[i] else 0

    while sum(ring(i) for i in range(len(fitted))) > SHM_SHARE * shm_free:
        fitted[max(range(len(fitted)), key=ring)] -= 1
    return fitted
