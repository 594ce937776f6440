"""What runs inside a reader process: attach the ring, open the node, fill slots until done.

The entry point :func:`run` is a module-level function taking one frozen
settings object, so it works under the fork, spawn and forkserver start
methods alike.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from ._engines import limit_threads, open_source
from ._node import NodeInfo
from ._plan import BlockPlan
from ._ring import PeerGone, Ring, RingLayout, RingSync
from ._shm import unlink_orphan
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
    plan: BlockPlan
    shm_name: str
    layout: RingLayout
    parent_pid: int
    parent_start: "str | None"


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
    """Reader process entry point."""
    # Ctrl-C goes to the whole foreground process group; the consumer decides
    # what happens (it stops us), so the reader ignores it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit_threads()
    ring = Ring.attach(settings.shm_name, settings.layout, sync)
    sync.attached.release()
    parent_alive = _ParentWatch(settings.parent_pid, settings.parent_start)
    rows: "tuple[int, int] | None" = None
    source = None
    try:
        source = open_source(settings.engine, settings.node, settings.open_kwargs)
        plan = settings.plan
        n_blocks = plan.n_blocks
        while True:
            claimed = ring.claim(n_blocks, parent_alive)
            if claimed is None:
                break
            k, slot = claimed
            out = ring.slots[slot]
            for piece in plan.pieces(k):
                rows = (piece.start, piece.stop)
                source.read_into(piece.start, piece.stop, out[piece.dst : piece.dst + piece.stop - piece.start])
            rows = None
            ring.publish(slot, k, plan.rows(k), parent_alive)
            if not parent_alive():
                break
    except PeerGone:
        pass  # the consumer died while we waited for the ring lock
    except BaseException as exc:
        failure = _ReaderFailure.from_exception(exc, settings.index, os.getpid(), settings.node.path, rows)
        try:
            error_conn.send(failure)
        finally:
            ring.fail()
    finally:
        if source is not None:
            source.close()
        error_conn.close()
        if not parent_alive():
            unlink_orphan(settings.shm_name)  # the consumer died before it could
        ring.close()
