"""What runs inside a reader process: attach the ring, open the node, fill slots until done.

The entry point :func:`run` is a module-level function taking one frozen
settings object, so it works under the fork, spawn and forkserver start
methods alike.

NOTE [prefetch]
    A reader alternates between waiting for the disk and decoding; alone, it
    leaves the disk idle while it decodes and the CPU idle while it waits.
    Readers claim blocks in order from one counter, so with n readers the
    block a reader will claim next is about k + n when it has just claimed
    k. Before reading block k it asks the source to start fetching block
    k + n (``Source.prefetch``: ``POSIX_FADV_WILLNEED`` on the chunks' byte
    ranges, which queues the reads and returns). The page cache is shared,
    so it does not matter which reader ends up claiming that block. With
    ``O_DIRECT`` there is no cache to warm.
    Measured on a cold 1 GiB zlib-3 file (PyTables chunks of 512 KiB, 4 MiB
    blocks), two readers, 8 interleaved passes each: median 705 MB/s
    without, 1,125 MB/s with (every pass with it faster than every pass
    without); hinting further ahead (k+1..k+3, k+2..k+4) did no better. The
    gain depends on the device: later runs, once this VM's host had cached
    the disk image, and runs under a blkio bandwidth limit (420 and 840
    MiB/s, where the kernel's own 8 MiB readahead already keeps the disk
    busy) showed no difference either way (within the +-10% noise), and
    a warm file no cost beyond that noise. A hint costs microseconds a block.
    Those runs predate the benchmark's memory settling (NOTE [free page
    reporting] in ``_pagecache``); with it, ``benchmarks/profile_readers.py
    pattern`` puts two processes reading alternate blocks within this VM's
    noise of each other with and without the hint. It stays: it is what keeps
    a device busy that does not read ahead for a strided pattern.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ._engines import limit_threads, open_source
from ._node import FileSignature, NodeInfo, check_file_unchanged
from ._plan import BlockPlan, RangePlan, ahead
from ._ring import PeerGone, Ring, RingLayout, RingSync
from ._shm import unlink_orphan
from ._signals import ignore_sigint
from .errors import _ReaderFailure


#: Seconds between checks that the consumer is still alive while busy reading.
PARENT_CHECK_INTERVAL = 0.5


@dataclass(frozen=True)
class ReaderSettings:
    """Everything a reader needs, sent once at process start."""

    index: int
    node: NodeInfo
    engine: str
    open_kwargs: dict[str, Any]
    plan: "BlockPlan | RangePlan"
    shm_name: str
    layout: RingLayout
    parent_pid: int
    parent_start: "str | None"
    #: The file's identity when the stream started (None: not checked); see NOTE [file identity].
    file_signature: "FileSignature | None" = None
    #: Where chunk bytes come from: "page" (the page cache) or "direct" (O_DIRECT, chunk engine only).
    cache: str = "page"
    #: Readers sharing the plan: a reader that claims block k hints block k + n_readers (NOTE [prefetch]).
    n_readers: int = 1


def process_start_time(pid: int) -> "str | None":
    """The kernel's start time of ``pid`` (tells a live process from a reused pid); None if gone or unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:  # pragma: no cover - no procfs
        return "?"
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":  # a zombie: dead, not yet reaped
        return None
    return fields[19].decode()


class _ParentWatch:
    """Answers "is the consumer still alive?", at most once per interval when asked often."""

    def __init__(self, pid: int, start: "str | None") -> None:
        self._pid, self._start = pid, start
        self._next = 0.0
        self._alive = True

    def __call__(self) -> bool:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + PARENT_CHECK_INTERVAL
            if self._start is None or self._start == "?":
                try:
                    os.kill(self._pid, 0)
                except ProcessLookupError:
                    self._alive = False
            else:
                self._alive = process_start_time(self._pid) == self._start
        return self._alive


def run(settings: ReaderSettings, sync: RingSync, error_conn: Any) -> None:
    """Reader process entry point; see NOTE [ring protocol] and NOTE [failure reports]."""
    # SIGTERM is the consumer's escalation (NOTE [shutdown]): a handler
    # inherited through fork from the user's program must not keep us alive.
    ignore_sigint()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    parent_alive = _ParentWatch(settings.parent_pid, settings.parent_start)
    rows: "tuple[int, int] | None" = None
    ring: "Ring | None" = None
    source = None
    try:
        limit_threads()
        ring = Ring.attach(settings.shm_name, settings.layout, sync)
        sync.attached.release()
        keep_going = _keep_going(ring, parent_alive)
        pacer = _Pacer(settings.node.chunk_rows)
        filename = settings.node.filename
        source = open_source(settings.engine, settings.node, settings.open_kwargs, settings.plan, cache=settings.cache)
        check_file_unchanged(filename, settings.file_signature)
        plan = settings.plan
        n_blocks = plan.n_blocks
        while True:
            claimed = ring.claim(n_blocks, keep_going)
            if claimed is None:
                break
            k, slot = claimed
            for piece in ahead(plan, k, settings.n_readers):
                source.prefetch(piece.start, piece.stop)
            out = ring.slots[slot]
            for piece in plan.pieces(k):
                for a, b in pacer.split(piece.start, piece.stop):
                    rows = (a, b)
                    t = time.perf_counter()
                    dst = piece.dst + a - piece.start
                    source.read_into(a, b, out[dst : dst + b - a])
                    pacer.took(b - a, time.perf_counter() - t)
                    if not parent_alive():
                        raise PeerGone  # orphaned: stop now rather than at the end of the block
            check_file_unchanged(filename, settings.file_signature)
            rows = None
            ring.publish(slot, k, plan.rows(k), keep_going)
            if not parent_alive():
                break
    except PeerGone:
        pass  # the consumer died or stopped us while we waited for the ring lock
    except BaseException as exc:
        _report(exc, settings, rows, ring, error_conn)
    finally:
        if source is not None:
            try:
                source.close()
            except Exception:
                pass
        error_conn.close()
        if not parent_alive():
            unlink_orphan(settings.shm_name)  # the consumer died before it could
        if ring is not None:
            ring.close()


class _Pacer:
    """Cuts a read into whole chunks of about ``PARENT_CHECK_INTERVAL`` / 2 of work, so a reader notices its consumer died.

    NOTE [orphans]: a reader whose consumer was SIGKILLed must stop within
    about a second (nobody else would stop it). Between blocks is too
    seldom where one block takes seconds to decode (16 MiB of bzip2: 1.5 to
    8.4 s), and a parent check inside an engine's C call is impossible. So
    a reader reads a block in pieces sized from the rate it has measured,
    whole chunks (the unit a codec decodes), and checks between them; the
    first piece is one chunk, to time. A fast codec takes milliseconds a
    block: after that first chunk it is read in one piece, as before.
    """

    def __init__(self, chunk_rows: "int | None") -> None:
        self._unit = max(1, chunk_rows or 1)
        self._rows_per_piece = self._unit  # one chunk, until a read is timed

    def split(self, start: int, stop: int) -> "Iterator[tuple[int, int]]":
        """Rows ``start..stop`` as consecutive ``(a, b)`` pieces; call :meth:`took` after reading each."""
        a = start
        while a < stop:
            n = self._rows_per_piece
            # Cut at multiples of n: chunk boundaries, since n is a multiple of the chunk rows.
            b = stop if n >= stop - a else min(stop, (a // n + 1) * n)
            yield a, b
            a = b

    def took(self, rows: int, seconds: float) -> None:
        if rows <= 0 or seconds <= 0:
            return
        budget = PARENT_CHECK_INTERVAL / 2
        per_row = seconds / rows
        self._rows_per_piece = max(self._unit, int(budget / per_row) // self._unit * self._unit)


def _keep_going(ring: Ring, parent_alive: Callable[[], bool]) -> Callable[[], bool]:
    """What a reader asks while it waits: not stopped, and the consumer alive."""
    return lambda: not ring.stopped and parent_alive()


def _report(exc: BaseException, settings: ReaderSettings, rows: "tuple[int, int] | None", ring: "Ring | None", error_conn: Any) -> None:
    """Flag the failure in the ring (waking the consumer), then send the report; never raises."""
    try:
        failure = _ReaderFailure.from_exception(
            exc, settings.index, os.getpid(), settings.node.filename, settings.node.path, rows
        )
    except BaseException:  # pragma: no cover - formatting the traceback failed
        failure = None
    if ring is not None:
        ring.fail()
    try:
        if failure is not None:
            error_conn.send(failure)
    except BaseException:
        pass  # the consumer is gone or closed the pipe; it sees our exit instead
