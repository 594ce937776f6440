"""Request inboxes: one ring of fixed-size items per reader, in one shared control segment.

Written by the consumer only, read by one reader only; ``work`` (items
waiting) and ``space`` (free places) semaphores hand items over. A semaphore
hand-off costs ~0.1 us against ~126 us for a ``multiprocessing.Queue``
put+get. See NOTE [request protocol] in ``_procs.serve``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .layout import PAGE, round_up
from .segment import Segment

#: Items in each reader's inbox.
INBOX_ITEMS = 64
_ITEM_WORDS = 16
_NAME_WORD = 8  # item words 8..15 hold a segment name
_NAME_BYTES = (_ITEM_WORDS - _NAME_WORD) * 8
_INBOX_BYTES = round_up(INBOX_ITEMS * _ITEM_WORDS * 8, PAGE)

# Item kinds.
STOP, ATTACH, DETACH, READ, LEARN = 1, 2, 3, 4, 5


@dataclass(frozen=True)
class Item:
    """One inbox item: what to do (``kind``), for which request, stage stage_id, share and rows."""

    kind: int
    req: int = 0
    stage_id: int = 0
    share: int = 0
    a: int = 0
    b: int = 0
    #: ATTACH: the stage's layout and segment name; LEARN: ``name``, the segment of ``data_nbytes`` bytes.
    max_rows: int = 0
    data_nbytes: int = 0
    name: str = ""


@dataclass(frozen=True)
class InboxSync:
    """One reader's inbox semaphores (picklable at process start)."""

    work: Any
    space: Any

    @classmethod
    def create(cls, ctx: Any) -> "InboxSync":
        return cls(ctx.Semaphore(0), ctx.Semaphore(INBOX_ITEMS))

    @property
    def semaphores(self) -> "tuple[Any, ...]":
        """Both (their names go once the reader opened them: NOTE [semaphore names] in ``semaphores``)."""
        return (self.work, self.space)


class Inboxes:
    """One process's mapping of the control segment: a stop word, then one inbox per reader."""

    def __init__(self, segment: Segment, n_readers: int) -> None:
        self.segment = segment
        self._flags: "np.ndarray | None" = np.frombuffer(segment.buf, dtype=np.int64, count=1)
        self._boxes = [
            np.ndarray((INBOX_ITEMS, _ITEM_WORDS), np.int64, buffer=segment.buf, offset=PAGE + i * _INBOX_BYTES)
            for i in range(n_readers)
        ]

    @staticmethod
    def nbytes(n_readers: int) -> int:
        return PAGE + n_readers * _INBOX_BYTES

    @classmethod
    def create(cls, n_readers: int) -> "Inboxes":
        segment = Segment.create(cls.nbytes(n_readers), what="The request inboxes")
        segment.buf[:PAGE] = bytes(PAGE)
        return cls(segment, n_readers)

    @classmethod
    def attach(cls, name: str, n_readers: int) -> "Inboxes":
        return cls(Segment.attach(name, cls.nbytes(n_readers)), n_readers)

    @property
    def stopped(self) -> bool:
        """Whether the consumer told every reader to stop now."""
        return self._flags is None or bool(self._flags[0])

    def stop(self) -> None:
        if self._flags is not None:
            self._flags[0] = 1

    def put(self, reader: int, position: int, item: Item) -> None:
        """Write ``item`` at ``position`` (a running count) of ``reader``'s inbox; the caller owns the place."""
        row = self._boxes[reader][position % INBOX_ITEMS]
        row[:] = 0
        row[:8] = (item.kind, item.req, item.stage_id, item.share, item.a, item.b, item.max_rows, item.data_nbytes)
        if item.name:
            name = item.name.encode()
            if len(name) > _NAME_BYTES:  # pragma: no cover - names are short by construction
                raise ValueError(f"segment name {item.name!r} is too long")
            row[_NAME_WORD:] = np.frombuffer(name.ljust(_NAME_BYTES, b"\0"), dtype=np.int64)

    def get(self, reader: int, position: int) -> Item:
        """The item at ``position`` of ``reader``'s inbox."""
        words = self._boxes[reader][position % INBOX_ITEMS].tolist()
        name = np.array(words[_NAME_WORD:], dtype=np.int64).tobytes().rstrip(b"\0").decode()
        kind, req, stage_id, share, a, b, max_rows, data_nbytes = words[:8]
        return Item(kind, req, stage_id, share, a, b, max_rows, data_nbytes, name)

    def close(self) -> None:
        self._flags = None
        self._boxes = []
        self.segment.close()
