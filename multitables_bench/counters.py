"""What delivering a GiB costs the readers and the consumer, counted: minor page faults and context switches.

Issue 29's target for the ring: after its first lap (every slot written
once), fewer minor page faults per GiB delivered than 1% of the pages a GiB
spans, in the readers and in the consumer. A reader that faults on every slot
page it writes, or a consumer on every page it reads, shows it here on any
machine, two cores included, where the time it costs may hide among others.

:func:`drain_counted` takes every block of an open queue and counts over a
window: the consumer with ``getrusage(RUSAGE_SELF)`` (all its threads), each
reader from ``/proc/<pid>/stat`` (minor faults, the whole process) and
``/proc/<pid>/task/*/status`` (voluntary and involuntary switches, summed
over its threads).

NOTE [counting window]
    The window opens once the ring's first lap is taken: ``lap`` blocks (the
    queue's read-ahead), and a block out of every slot, or, where some slots
    go unused, none out of a slot not used before for ``lap`` blocks (a
    reader writes into the slot given back last: NOTE [warm slots] in
    ``multitables._shm.ring``). Readers with slots of their own may use
    some of them first several blocks after ``lap`` (two readers, six slots:
    at blocks 6 to 9), and the consumer's first read of a slot faults (a
    fault per 16 pages, where the kernel maps the pages around the one
    read): a cost of the first lap, not of the blocks after it. A slot first
    used inside the window, when the consumer falls behind, is counted. In this process (no readers) blocks are read into buffers
    allocated as needed, and the first ``lap`` blocks are the lap. The
    window closes ``2 * lap``
    blocks before the last, so that no reader has run out of blocks yet: a
    reader is at most ``lap`` blocks ahead of the consumer's releases and
    holds one block at a time, so with ``2 * lap`` blocks not yet taken at
    least ``lap`` are not yet claimed. A reader gone all the same (one that
    is handed a share of its own and ends early) is left out of both
    snapshots, and :attr:`Counted.readers_counted` says how many were
    counted. Passes of ``3 * lap`` blocks or fewer have no window, nor those
    whose slots settle ``2 * lap`` blocks before the end or later.
"""

from __future__ import annotations

import glob
import os
import resource
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

GiB = 1 << 30
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
#: The target: minor faults per GiB delivered below this fraction of the pages a GiB spans.
FAULT_TARGET = 0.01


def pages_per_gib() -> int:
    """The pages a GiB delivered spans (262,144 with 4 KiB pages)."""
    return GiB // PAGE_SIZE


@dataclass(frozen=True)
class Usage:
    """A process's (or a sum of processes') minor page faults and context switches."""

    minflt: int = 0
    voluntary: int = 0
    involuntary: int = 0

    @property
    def switches(self) -> int:
        return self.voluntary + self.involuntary

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.minflt + other.minflt, self.voluntary + other.voluntary, self.involuntary + other.involuntary)

    def __sub__(self, other: "Usage") -> "Usage":
        return Usage(self.minflt - other.minflt, self.voluntary - other.voluntary, self.involuntary - other.involuntary)


def self_usage() -> Usage:
    """This process, every thread of it, from ``getrusage(RUSAGE_SELF)``."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return Usage(ru.ru_minflt, ru.ru_nvcsw, ru.ru_nivcsw)


def proc_usage(pid: int) -> "Usage | None":
    """Process ``pid`` from ``/proc``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        voluntary = involuntary = 0
        for status in glob.glob(f"/proc/{pid}/task/*/status"):
            try:
                with open(status) as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches:"):
                            voluntary += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches:"):
                            involuntary += int(line.split()[1])
            except FileNotFoundError:  # a thread ended meanwhile
                pass
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ")".
    fields = stat[stat.rindex(")") + 2:].split()
    return Usage(int(fields[7]), voluntary, involuntary)  # field 10 of proc(5), minflt


@dataclass(frozen=True)
class Snapshot:
    """The consumer's usage and each reader's (None: gone), at one moment."""

    consumer: Usage
    readers: dict[int, Optional[Usage]]


def snapshot(pids: Sequence[int], consumer_first: bool = True) -> Snapshot:
    """The consumer (this process) and the processes ``pids``, now: the consumer first, or (``consumer_first=False``) last.

    A window opens with the consumer read last and closes with it read first,
    so that reading ``/proc`` is not counted in it: the first time in a forked
    process, that costs the consumer about 170 minor faults (pages it shares
    with its parent, copied as they are written).
    """
    if consumer_first:
        consumer = self_usage()
        return Snapshot(consumer, {pid: proc_usage(pid) for pid in pids})
    readers = {pid: proc_usage(pid) for pid in pids}
    return Snapshot(self_usage(), readers)


@dataclass(frozen=True)
class Counted:
    """The counters over a window of a pass: what was delivered in it, and what it cost."""

    window_bytes: int
    window_blocks: int
    consumer: Usage
    #: Summed over the readers counted.
    readers: Usage
    readers_counted: int
    readers_total: int

    def per_gib(self) -> dict[str, float]:
        """Minor faults and context switches per GiB delivered in the window, readers and consumer."""
        gib = self.window_bytes / GiB
        return {
            "reader_minflt_per_gib": self.readers.minflt / gib,
            "reader_switches_per_gib": self.readers.switches / gib,
            "consumer_minflt_per_gib": self.consumer.minflt / gib,
            "consumer_switches_per_gib": self.consumer.switches / gib,
        }


def window(before: Snapshot, after: Snapshot, window_bytes: int, window_blocks: int) -> Counted:
    """The deltas between two snapshots; a reader missing from either is left out of both."""
    alive = [pid for pid, u in before.readers.items() if u is not None and after.readers.get(pid) is not None]
    readers = sum((after.readers[pid] - before.readers[pid] for pid in alive), Usage())  # type: ignore[operator]
    return Counted(window_bytes, window_blocks, after.consumer - before.consumer, readers, len(alive),
                   len(before.readers))


def first_lap(queue: Any, read_ahead: "int | None" = None) -> int:
    """Blocks in the ring's first lap: ``read_ahead``, else the queue's default (``2 * n_procs + 2``, get_queue's doc)."""
    return read_ahead if read_ahead is not None else 2 * queue.n_procs + 2


def touch(block: np.ndarray) -> float:
    """Read one value of every page of ``block``, as a consumer using it would (and fault where it is not mapped)."""
    flat = block.reshape(-1).view(np.uint8)
    return float(flat[::PAGE_SIZE].sum())


def drain_counted(
    queue: Any,
    n_blocks: int,
    read_ahead: "int | None" = None,
    on_block: "Callable[[int, np.ndarray], object] | None" = None,
) -> "tuple[int, int, Counted | None]":
    """Take every block of ``queue`` (``n_blocks`` in all), touching each; count the window after the first lap.

    ``on_block(i, block)``, if given, runs on block ``i`` inside its guard,
    after the touch. Returns (rows, bytes delivered, the window's
    :class:`Counted`, or None where the pass has no window: too few blocks,
    ``n_blocks <= 3 * lap``, or slots first taken too late). The window opens before block ``lap`` is taken,
    or later, once a block of every slot was, or none of a new slot for ``lap`` blocks (readers' queues), and closes
    before block ``n_blocks - 2 * lap`` is (NOTE [counting window] in
    ``multitables_bench.counters``).
    """
    lap = first_lap(queue, read_ahead)
    stop = n_blocks - 2 * lap
    slots = queue.read_ahead if queue.n_procs else 0
    seen: set[int] = set()  # the slots blocks came out of (their addresses), until all have
    last_new = -1  # the last block out of a slot not seen before
    pids = queue.reader_pids
    rows = nbytes = window_bytes = 0
    start: "int | None" = None
    before: "Snapshot | None" = None
    counted: "Counted | None" = None
    for i, guard in enumerate(queue.iter()):
        if start is None and lap <= i < stop and (len(seen) >= slots or i - last_new > lap):
            start, before = i, snapshot(pids, consumer_first=False)
        if start is not None and before is not None and i == stop:
            counted = window(before, snapshot(pids), window_bytes, stop - start)
        with guard as block:
            address = block.__array_interface__["data"][0]
            if len(seen) < slots and address not in seen:
                seen.add(address)
                last_new = i
            touch(block)
            if on_block is not None:
                on_block(i, block)
            rows += len(block)
            nbytes += block.nbytes
            if start is not None and i < stop:
                window_bytes += block.nbytes
    return rows, nbytes, counted
