"""Each epoch's weighted draw made ahead, on a thread of its own, while the epoch before it is read.

A draw takes 20 ms for 131,072 rows on the 2-core VM, 0.25 s for a million
(NOTE [subsets] in ``_plan.subset``). Made in the caller's thread when the
next epoch is planned, it was a batch's wait: :class:`DrawsAhead` starts it
on a thread once the epoch's first batch is out (numpy lets the GIL go while
it draws), and the batches plan the next epoch once it is done, or at the
last window at the latest (``Batches._iterate``).
"""

from __future__ import annotations

import os
from concurrent.futures import Future, wait

import numpy as np

from .._plan.subset import EpochRows
from .._sys.background import on_thread


class DrawsAhead:
    """``rows``' epochs, whose draws :meth:`draw_ahead` starts on threads; :meth:`close` waits for those in progress.

    Owns the threads it starts (each ends with its draw); ``rows`` keeps the
    draws taken (:meth:`EpochRows.of`).
    """

    def __init__(self, rows: EpochRows) -> None:
        self.rows = rows
        self._drawing: "dict[int, Future[np.ndarray]]" = {}  # draws in progress (or done, not yet taken), by epoch
        self._pid = os.getpid()

    @property
    def _ahead(self) -> "dict[int, Future[np.ndarray]]":
        """The draws started by this process: in a fork of the one that started them, none (their threads are the
        parent's, and a draw in progress there would never end here: the fork draws its epochs itself)."""
        if self._pid != os.getpid():
            self._drawing, self._pid = {}, os.getpid()
        return self._drawing

    @_ahead.setter
    def _ahead(self, value: "dict[int, Future[np.ndarray]]") -> None:
        self._drawing = value

    def of(self, epoch: int) -> "np.ndarray | None":
        """:meth:`EpochRows.of`: waits for a draw of ``epoch`` in progress (raising its error, with the thread's
        traceback, where it failed); draws it here if none is (or was kept)."""
        ahead = self._ahead.pop(epoch, None)
        return self.rows.of(epoch, None if ahead is None else ahead.result)

    def draw_ahead(self, epoch: int) -> None:
        """Start drawing ``epoch``'s rows on a thread, for :meth:`of` (nothing to draw: nothing done)."""
        if self.rows.kept(epoch) or epoch in self._ahead:
            return
        # Draws of other epochs that ended untaken (set_epoch went elsewhere) are dropped.
        self._ahead = {e: f for e, f in self._ahead.items() if not f.done()}
        self._ahead[epoch] = on_thread("multitables-draw", self.rows.draw, epoch)

    def ready(self, epoch: int) -> bool:
        """Whether :meth:`of` gives ``epoch``'s rows without waiting for a draw in progress."""
        ahead = self._ahead.get(epoch)
        return ahead is None or ahead.done()

    def close(self) -> None:
        """Wait for the draws in progress (their threads end with them); idempotent."""
        ahead, self._ahead = list(self._ahead.values()), {}
        wait(ahead)
