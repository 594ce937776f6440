"""The shuffle windows' buffers: two per dataset, kept from epoch to epoch, which forked readers do not share.

NOTE [window buffers and fork]
    Readers started by ``fork`` share the consumer's memory copy-on-write:
    fork write-protects every private page the consumer has, and its next
    write to each faults. The shuffle windows' buffers (256 MiB by default,
    kept from epoch to epoch) were written again every epoch after that
    epoch's readers forked: 66,000 faults an epoch, twice the consumer's CPU
    time, two readers with a transform 20% slower from the second epoch on
    (BENCHMARKS.md, transforms). So the buffers are anonymous memory marked
    ``MADV_WIPEONFORK``: a child gets that range as fresh zero pages, so fork
    shares and protects nothing of it (a child that used a buffer would find
    zeros, which every window overwrites before reading). Huge pages as numpy
    asks for its own large arrays. Where the kernel lacks it (before Linux
    4.14, other systems): ``np.empty``.
"""

from __future__ import annotations

import math
import mmap
import os
import platform
import sys
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .copier import Copier, copy_threads

if TYPE_CHECKING:
    from .windows import Staging


#: ``madvise`` advice absent from Python's mmap module: Linux's value (parisc's differs).
_MADV_WIPEONFORK = 71 if platform.machine().startswith("parisc") else 18


def empty_window_buffer(shape: "tuple[int, ...]", dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)`` that forked children do not share (NOTE [window buffers and fork]); it owns its memory."""
    dtype = np.dtype(dtype)
    count = math.prod(int(n) for n in shape)
    if sys.platform != "linux" or count * dtype.itemsize == 0:
        return np.empty(shape, dtype)
    region = mmap.mmap(-1, count * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(_MADV_WIPEONFORK)
    except OSError:  # a kernel before 4.14
        region.close()
        return np.empty(shape, dtype)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError):  # pragma: no cover - no transparent huge pages
        pass
    return np.frombuffer(region, dtype, count=count).reshape(shape)


def window_buffers(rows: int, row_types: "Sequence[tuple[Any, tuple[int, ...]]]") -> "list[list[np.ndarray]]":
    """Two buffers of ``rows`` rows per dataset (``row_types``: dtype and row shape of each), for the windows.

    Kept from epoch to epoch: fresh memory page-faults on first touch, and at
    256 MiB that costs more than the copy into it. Batches are gathered out of
    them into arrays of their own, so reusing them is safe; forked readers do
    not share them (NOTE [window buffers and fork]).
    """
    return [[empty_window_buffer((rows,) + tuple(shape), dtype) for dtype, shape in row_types] for _ in range(2)]


class WindowMemory:
    """What a batches' windows keep from epoch to epoch: the copier, and the window buffers once a window is shuffled.

    ``rows`` and ``row_types``: see :func:`window_buffers`. Owned by one
    batches, which closes it.
    """

    def __init__(self, rows: int, row_types: "Sequence[tuple[Any, tuple[int, ...]]]") -> None:
        self._rows, self._row_types = rows, row_types
        self._buffers: "list[list[np.ndarray]] | None" = None
        self._staging: "Staging | None" = None  # the last to take rows out of the buffers
        self._copier, self._pid = Copier(copy_threads()), os.getpid()

    @property
    def copier(self) -> Copier:
        """The copier of this process: in a fork of the one that made it, a new one (a fork copies no thread: the
        parent's copier, used here, would wait for ever on threads it believes idle; it is left to the parent)."""
        if self._pid != os.getpid():
            self._copier, self._pid = Copier(copy_threads()), os.getpid()
        return self._copier

    def buffers(self) -> "list[list[np.ndarray]]":
        if self._buffers is None:
            self._buffers = window_buffers(self._rows, self._row_types)
        return self._buffers

    def let_go(self) -> None:
        """The last staging releases every guard it holds (before the queues are rewound or closed)."""
        if self._staging is not None:
            self._staging.let_go()

    def staged_by(self, staging: "Staging") -> None:
        """``staging`` takes the rows out of the buffers from now on; the one before lets go of them first."""
        if self._staging is not None and self._staging is not staging:
            self._staging.settle()
        self._staging = staging

    def close(self) -> None:
        if self._staging is not None:
            self._staging.settle()
            self._staging = None
        self._buffers = None
        self.copier.close()
