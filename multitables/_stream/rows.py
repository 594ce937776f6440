"""The rows of :meth:`~multitables.Streamer.get_generator`: :class:`RowIterator`, a chain over the blocks' rows,
walked by one thread at a time."""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from typing import Any, Generator, Iterator, NoReturn, cast

import numpy as np

from .._sys.signals import raised_by_handler
from ..errors import QueueClosed
from .queue import Guard, Queue


def _another_thread_takes(_: object) -> NoReturn:
    raise ValueError(
        "generator already executing: another thread is taking its next block. A generator serves one thread at a "
        "time, as Python's do (try again, or share a queue, get_queue, between threads)"
    )


#: What a thread walks that asks for a row while another takes the next block (:class:`_OneTaker`): one object, since
#: the chain drops it without a decref when the other thread sets the block it took (the chain assumes one thread).
_TAKING = map(_another_thread_takes, itertools.repeat(None))


def walked(queue: Queue) -> "Iterator[Guard | Iterator[np.ndarray]]":
    """The guards of ``queue``, for the blocks' generator (``Streamer._blocks``); in place of a signal handler's
    exception that a ``get()`` raised (NOTE [a handler's exception] in ``_sys.signals``), rows that raise it.

    An exception that left the blocks' generator would end it, and the chain with it: the caller who caught it
    (a timeout, a checkpoint saved) would find the rows over. Raised from the rows walked instead, it leaves both
    going, and the next row is the first of the block ``get()`` was taking. One that comes as ``get()`` returns,
    before its guard is stored (Python 3.10 runs a handler there), finds the guard in ``held``: yielded next.
    """
    guard: "Guard | Iterator[np.ndarray]"
    held: "list[Guard | None]" = [None]  # the guard get() handed over, till yielded (NOTE [a slot in hand])
    while True:
        try:
            if held[0] is None and queue.get(held) is QueueClosed:
                return
        except Exception as exc:
            if not raised_by_handler(exc):
                raise
            guard = _raising(exc)  # not kept in this frame once raised: its traceback holds the frame
        else:
            guard, held[0] = held[0], None  # type: ignore[assignment]  # stores alone
        yield guard


def _raising(exc: Exception) -> Iterator[np.ndarray]:
    """Rows that raise ``exc`` at the first ``next``, and then end."""
    try:
        raise exc
    finally:
        del exc  # this frame is in exc's traceback: a cycle, which would keep the stream until a collection
    yield  # pragma: no cover - a generator


class _OneTaker:
    """The blocks a generator's chain walks, taken by one thread at a time.

    ``itertools.chain`` ends for good on any error of its source, so a second thread's "generator already executing"
    from the blocks' generator would end the rows for every thread, silently. That thread walks :data:`_TAKING`
    instead, which raises in it and leaves the chain going, as Python's own generators behave. (The chain is not
    made for threads: a switch of the GIL just after the failed ``acquire``, while the other thread finishes its
    block, could still set :data:`_TAKING` over that block. So the docs say to share a queue, not a generator.)
    """

    __slots__ = ("_blocks", "_lock")

    def __init__(self, blocks: "Generator[Iterator[np.ndarray], None, None]") -> None:
        # Weak: the rows' iterator (:class:`RowIterator`) owns the blocks. A Ctrl-C that lands as this method starts
        # leaves its frame, and so this object, in the traceback the user is handling; the blocks (and the readers)
        # must not live on through it once the user's loop dropped the rows.
        self._blocks = weakref.ref(blocks)
        self._lock = threading.Lock()

    def __iter__(self) -> "_OneTaker":
        return self

    def __next__(self) -> "Iterator[np.ndarray]":
        if not self._lock.acquire(blocking=False):
            return _TAKING
        try:
            # No local: the frame must not hold the blocks (see __init__). Dropped, they have no more.
            return next(iter(self._blocks() or ()))
        finally:
            self._lock.release()


class RowIterator(itertools.chain[np.ndarray]):
    """What :meth:`Streamer.get_generator` returns: an iterator over the rows, one numpy row a ``next``, which
    :meth:`close` ends as a generator's ``close()`` does (dropping it or leaving a ``for`` loop early does the same).
    ``len()`` is the rows of the pass (a cyclic one has none), so ``tqdm`` shows a total.
    """

    # Annotated as this class, not Generator: it has a generator's close() but no send() or throw(), so a user's
    # type checker takes gen.close() and refuses what would fail. A row is a step of itertools.chain over the
    # blocks' row iterators, taken in C: a Python generator resumed for every row cost 1.4x a plain loop over the
    # same rows, which a dataset of short rows pays on every row (BENCHMARKS.md). The blocks come from a generator
    # (Streamer._blocks), resumed once a block.

    _blocks: "Generator[Iterator[np.ndarray], None, None]"
    _active: "list[Iterator[np.ndarray]]"
    _source: str
    _n_rows: "int | None"

    @classmethod
    def over(
        cls, blocks: "Generator[Iterator[np.ndarray], None, None]", active: "list[Iterator[np.ndarray]]", source: str,
        n_rows: "int | None",
    ) -> "RowIterator":
        """The rows of ``blocks``; ``active`` holds the row iterator being walked (none between blocks); ``source``:
        the dataset and file, for the repr; ``n_rows``: the rows of the pass (None: cyclic, endless)."""
        rows = cast(RowIterator, cls.from_iterable(_OneTaker(blocks)))  # a cls; typeshed says a chain
        rows._blocks, rows._active, rows._source, rows._n_rows = blocks, active, source, n_rows
        return rows

    def __len__(self) -> int:
        """Rows of the pass, wherever the iteration stands (as ``len()`` of batches counts an epoch's): what
        ``tqdm`` shows as the total. ``TypeError`` for a cyclic generator, which never ends."""
        if self._n_rows is None:
            raise TypeError(f"a cyclic generator over {self._source} has no length: it never ends")
        return self._n_rows

    def __bool__(self) -> bool:
        return True  # an iterator, whatever len() says (and a cyclic one has none)

    def __enter__(self) -> "RowIterator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<multitables.RowIterator over {self._source}>"

    def __reduce__(self) -> Any:
        # Python's message would name a weakref or a lock, and say nothing of what to do.
        raise TypeError(f"a generator's rows over {self._source} come from this process's readers, so it is neither "
                        "pickled nor copied: pass the Streamer (it pickles) or the file's name, and call get_generator in "
                        "the task that reads the rows")

    def close(self) -> None:
        """Stop the readers and give the memory back; no row comes after it (rows you hold stay yours, NOTE [lent
        blocks]). Idempotent, as ``generator.close``; leaving a ``with`` block of it does the same."""
        for rows in self._active:
            # A chain goes on with the block it holds: end that block's iterator (an ndarray's is a sequence
            # iterator, which takes a position), so that no row comes after and the ring need not copy the block.
            move = getattr(rows, "__setstate__", None)
            if move is not None:
                move(sys.maxsize - 1)
                next(rows, None)  # past the end: it lets the block go
        self._blocks.close()
