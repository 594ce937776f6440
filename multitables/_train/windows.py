"""Executing a rank's epoch of training batches: windows of rows from the feed's queues, cut into batches.

A *window* is the rows a shuffled epoch permutes together (NOTE [epoch plan]
in ``_plan.epoch``); :func:`cut` turns a sequence of windows into batches.

NOTE [window pipelining]
    A shuffled window can only hand out its first batch once all of its
    blocks are in. To keep the readers busy while the training loop works
    through window ``w``, after every batch handed out from window ``w`` (when
    the next is asked for) a part of window ``w + 1``'s blocks (``ceil(blocks
    / batches)``) is pulled from the queues into a second buffer; the readers
    meanwhile refill the slots. After, not before: a batch never waits for a
    pull, and the readers decode during the training step.
    Reading thus overlaps training, in one thread, at the cost of two window
    buffers per dataset. Unshuffled epochs need no buffer: each batch is
    copied straight out of the slots.

    The last window of an epoch pulls the next epoch's first window the same
    way, when the readers have it published behind this one (NOTE [readers
    across epochs] in ``_procs.stream``): what was pulled is a *carry*, and
    an iteration that starts that epoch from its first window goes on from
    it, so its first batch does not wait for a whole window to be read
    (files of up to one window, 256 MiB by default, were not read during
    training at all). Any other position drops the carry.

    What an epoch's first batch would still compute is made ahead too: the
    next epoch is made ready over the batches after this epoch's first (its
    plan and pieces on a copy thread, published by a later batch and handed
    to :meth:`Windows.then`: NOTE [the next epoch in steps] in ``feed``), a
    window's order (a permutation of up to 65,536 rows, 0.5-0.7 ms here, and
    what the staging makes of it: :meth:`Staging.order`) by the prefetch
    that starts pulling it, on a copy thread where the batches have some
    (NOTE [parallel copies]), and the carry brings the next epoch's plan,
    pieces and first order with it. Without copy threads an epoch's first batch cost
    the consumer 1.02-1.05 ms before, 0.22 ms after, its second 0.18-0.20
    and 0.91-0.98 ms, others 0.06-0.08 ms (``benchmarks/epoch_start.py``:
    ``device=``, 2 readers); with 2 copy threads its second 0.38-0.41 ms,
    and with the order on a thread of its own (no copy threads) 0.53-0.55.

NOTE [staging]
    How a shuffled window's rows reach its batches is the :class:`Staging`'s:
    by default (this module's) each batch is gathered on the host out of the
    window's buffer. Another staging (``_train.device.DeviceStaging``, for
    ``device="cuda"``) copies each piece to a device as it lands in the
    buffer (:meth:`Staging.pulled`), and gathers the batches there from that
    copy (:meth:`Staging.window`), so the host makes one copy of a row, not
    two. A buffer is written again only after :meth:`Staging.reusing` said
    so: a staging that copies out of it waits there until its copies are
    done. A staging may also take a piece straight out of its slots
    (:meth:`Staging.take_slots`: NOTE [slots on a device] in
    ``_train.device``), skipping the buffer. The same windows, pieces and
    permutations either way: the rows and their order do not depend on the
    staging.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator, Sequence

import numpy as np

from .._plan.epoch import RankEpoch
from .buffers import WindowMemory
from .copier import Copier

if TYPE_CHECKING:
    from .._plan.subset import Selections
    from .._stream.queue import Guard, Queue
    from .feed import EpochPieces, Feed

#: Rows of a window below which its permutation is made at once where there are no copy threads: handing it to the
#: copier's own thread takes longer (21-25 us on the 2-core VM) than permuting 1,024 rows (21 us; NOTE [parallel
#: copies]).
ORDER_THREAD_ROWS = 1024


@dataclass(frozen=True)
class Order:
    """A window's order: its permutation (None: as read), and what the staging ``by`` made of it ahead
    (:meth:`Staging.order`), for that staging's :meth:`Staging.window`."""

    perm: "np.ndarray | None"
    prepared: Any = None
    by: "Staging | None" = None


class Staging:
    """How a shuffled window's rows reach its batches (NOTE [staging]): gathered on the host, out of its buffer.

    ``buffer``: which of the two window buffers (0 or 1); ``arrays``: that
    buffer, one array per dataset (its whole length: the window's rows are
    its first ones).
    """

    #: The share of each queue's slots that this staging may hold at once (:meth:`take_slots`): queues started for it
    #: get as many more slots by default, so that their readers keep the default's (NOTE [slots on a device]).
    held = 0.0

    def __init__(self, copier: Copier) -> None:
        self.copier = copier

    def reusing(self, buffer: int, arrays: "list[np.ndarray]") -> None:
        """``arrays`` are about to be written with another window's rows: return once that is safe."""

    def pulled(self, buffer: int, arrays: "list[np.ndarray]", a: int, b: int) -> None:
        """Rows ``a .. b - 1`` of ``arrays`` now hold a piece of the window being pulled into them (``a == 0``:
        the window's first, or the rows a carry holds where another staging saw them pulled)."""

    def take_slots(self, buffer: int, arrays: "list[np.ndarray]", queues: "Sequence[Queue]", guards: "list[Guard]",
                   a: int, b: int) -> bool:
        """Take a piece's blocks (``guards``, one per queue) as rows ``a .. b - 1`` of the window being pulled into
        ``buffer`` (``arrays``), straight out of their slots where this staging can: it then owns the guards, and
        releases each once nothing of it reads the slot (at the latest at :meth:`let_go`); a block it cannot take
        so, it copies into ``arrays``. False (here, always): it took none; the caller copies the blocks into
        ``arrays`` and calls :meth:`pulled`."""
        return False

    def let_go(self) -> None:
        """Release every guard :meth:`take_slots` took (the queues may be rewound or closed next)."""

    def order(self, buffer: int, perm: "np.ndarray | None") -> Order:
        """The order of the window that goes to ``buffer``, as this staging delivers it; called where the
        permutation is made (a copy thread, where there are some), so what it prepares costs no batch."""
        return Order(perm)

    def window(self, buffer: int, arrays: "list[np.ndarray]", rows: int, order: Order) -> "Window":
        """The window held in the first ``rows`` rows of ``arrays``, delivered in ``order``."""
        return BufferWindow([a[:rows] for a in arrays], order.perm, self.copier)

    def settle(self) -> None:
        """Return once nothing of this staging reads the buffers any more (another staging writes them next)."""


class Window:
    """The rows of one window, in delivered order; ``take`` copies a run of them out."""

    rows: int

    def take(self, a: int, b: int, out: "list[np.ndarray]") -> None:
        """Copy rows ``a .. b - 1`` (delivered order) into ``out``: one array of ``b - a`` rows per dataset."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class Windows:
    """The windows of a rank's epoch from window ``w0`` on."""

    def __iter__(self) -> Iterator[Window]:
        raise NotImplementedError

    def prefetch(self) -> None:
        """Called after each batch goes out (see NOTE [window pipelining])."""

    def then(self, after: "tuple[RankEpoch, EpochPieces]") -> None:
        """The next epoch's plan and pieces, published behind this one's (read ahead where it helps)."""


class NoWindows(Windows):
    def __iter__(self) -> Iterator[Window]:
        return iter(())


class BufferWindow(Window):
    def __init__(self, buffers: list[np.ndarray], perm: "np.ndarray | None", copier: Copier) -> None:
        self._buffers, self._perm, self._copier = buffers, perm, copier
        self.rows = len(buffers[0])

    def take(self, a: int, b: int, out: "list[np.ndarray]") -> None:
        if self._perm is None:
            for buf, o in zip(self._buffers, out):
                self._copier.copy(o, buf[a:b])
            return
        idx = self._perm[a:b]
        for buf, o in zip(self._buffers, out):
            self._copier.take(buf, idx, o)


def _made_order(staging: Staging, plan: RankEpoch, w: int, buffer: int) -> Order:
    return staging.order(buffer, plan.window_perm(w))


def _selected(block: np.ndarray, selection: "np.ndarray | None") -> np.ndarray:
    return block if selection is None else np.take(block, selection, axis=0)


@dataclass(frozen=True, eq=False)  # compared as objects: its pieces are arrays
class Carry:
    """The next epoch's first window, pulled (in part) into a buffer while the last window was delivered.

    Good for the next iteration only if it is that epoch from its first
    window; else dropped (NOTE [window pipelining]).
    """

    epoch: int
    buffer: int  # which of the two buffers holds it
    pulled: int  # its pieces pulled, from the epoch's first
    filled: int  # rows of the buffer they filled
    staging: "Staging | None" = None  # the staging that saw them pulled (NOTE [staging])
    on_host: bool = True  # whether the buffer holds its rows (not so where the staging took slots: take_slots)
    plan: "RankEpoch | None" = None  # that epoch's plan, and its first window's order: made while it was pulled
    perm: "Future[Order] | None" = None
    rest: "EpochPieces | None" = None  # that epoch's pieces after those pulled, as published (None: not known)
    pid: int = field(default_factory=os.getpid)  # the process that pulled it

    def good_for(self, staging: "Staging | None") -> bool:
        """Whether an iteration with ``staging`` (None: on the host) can go on from it: its rows are where it looks.
        Not in a fork of the process that pulled it: a fork copies no window buffer (NOTE [window buffers and fork]
        in ``buffers``: the child found zeros there), nor the thread making its order."""
        return self.pid == os.getpid() and (self.on_host or (staging is not None and staging is self.staging))


@dataclass
class _Fill:
    """A window being pulled into a buffer: its pieces' rows, what each takes of its block, how far it got."""

    plan: RankEpoch
    w: int
    rows: "list[int]"
    selections: "Selections | None"  # of its pieces from ``carried`` on (None: each whole), each made as it is pulled
    buffer: int
    carried: int = 0  # its first pieces, pulled by the last epoch (a carry's): not pulled again
    pulled: int = 0
    filled: int = 0
    on_host: bool = True  # every piece pulled was copied into the buffer (none taken out of its slots)


class ShuffledWindows(Windows):
    """Windows copied out of the slots into two alternating buffers per dataset (NOTE [window pipelining]).

    ``pieces``: what the feed gives next (``feed.EpochPieces``: for a
    subset, the rows of each piece's block the epoch takes). ``carry``: the
    first window, already pulled in part by the last epoch. Given the next
    epoch's plan and pieces (:meth:`then`), its first window is pulled
    during this epoch's last, and :attr:`carry` says how far once this
    epoch is done.
    """

    def __init__(
        self,
        plan: RankEpoch,
        w0: int,
        feed: "Feed",
        memory: WindowMemory,
        batch_size: int,
        pieces: "EpochPieces",
        carry: "Carry | None" = None,
        staging: "Staging | None" = None,
    ) -> None:
        self._plan, self._w0, self._feed, self._batch_size = plan, w0, feed, batch_size
        self._buffers, self._copier = memory.buffers(), memory.copier
        self._staging = Staging(memory.copier) if staging is None else staging
        memory.staged_by(self._staging)
        self._pieces, self._first = pieces, 0 if carry is None else carry.buffer
        # Each window's fill, made when first needed and dropped once the window is delivered: an epoch's start makes
        # one, not one per window (400 windows of an epoch of 25,600 blocks took 0.4 ms).
        self._fills: "dict[int, _Fill]" = {}
        self._n_own = plan.n_windows - w0  # this epoch's windows; the next epoch's first may follow (then())
        if carry is not None:
            assert carry.good_for(staging), "a carry whose rows are on a device, taken by another staging"
            fill = self._fill_of(0)
            fill.pulled, fill.filled, fill.on_host = carry.pulled, carry.filled, carry.on_host
            if carry.staging is not self._staging and carry.filled:  # this staging has not seen those rows
                self._staging.pulled(carry.buffer, self._buffers[carry.buffer], 0, carry.filled)
        # Each window's order, started by the prefetch() that starts pulling it (a carry's: by the last epoch) on
        # a copy thread where there are some (a permutation lets the GIL go), not by the batch that delivers its
        # first rows: an epoch's first batch waits for no permutation, and where threads make them, no batch does.
        self._perms: "dict[int, Future[Order]]" = {}
        if carry is not None and carry.perm is not None and carry.plan == plan:
            self._perms[0] = carry.perm
        self._after: "tuple[RankEpoch, EpochPieces] | None" = None
        self._next = 0  # the window that prefetch() pulls into
        self._rate = 0  # pieces to pull per batch going out
        self._at: "tuple[int, int] | None" = None  # the window being delivered: its fill and rows
        #: Set once every window was delivered, if the next epoch's first window was pulled meanwhile.
        self.carry: "Carry | None" = None

    def then(self, after: "tuple[RankEpoch, EpochPieces]") -> None:
        """Pull the next epoch's first window (``after``: its plan and pieces, published behind this epoch's)
        during this epoch's last, from the next batch on; once, before the last window's last batch."""
        assert self._after is None
        self._after = after
        self._fills[self._n_own] = self._fill(after[0], 0, after[1], (self._first + self._n_own) % 2)
        if self._at is not None and self._at[0] + 1 == self._n_own:  # already in the last window
            self._pace(*self._at)

    def _fill_of(self, j: int) -> _Fill:
        """Window ``j``'s fill (``j`` counts from ``w0``; :attr:`_n_own`: the next epoch's first, given to :meth:`then`)."""
        fill = self._fills.get(j)
        if fill is None:
            assert j < self._n_own, (j, self._n_own)
            fill = self._fills[j] = self._fill(self._plan, self._w0 + j, self._pieces, (self._first + j) % 2)
        return fill

    @staticmethod
    def _fill(plan: RankEpoch, w: int, pieces: "EpochPieces", buffer: int) -> _Fill:
        lo, hi = plan.bounds[w], plan.bounds[w + 1]
        rows = plan.sizes[lo:hi].tolist()  # Python ints: looked up one at a time
        carried = max(0, pieces.first - lo)  # a carry's pieces (before ``pieces.first``) were pulled last epoch
        selections = None if pieces.selections is None else pieces.selections[lo + carried - pieces.first : hi - pieces.first]
        return _Fill(plan, w, rows, selections, buffer, carried=carried)

    def _pace(self, j: int, rows: int) -> None:
        """While window ``j`` (of ``rows`` rows) is delivered, pull the next one, a part per batch."""
        if j + 1 < self._n_own + (self._after is not None):
            self._next = j + 1
            self._rate = math.ceil(len(self._fill_of(j + 1).rows) / max(1, rows // self._batch_size))

    def _order(self, j: int) -> "Future[Order]":
        """Window ``j``'s order, made (or being made) on a copy thread (see ``_perms``)."""
        if j not in self._perms:
            fill = self._fill_of(j)
            small = fill.plan.window_rows(fill.w) < ORDER_THREAD_ROWS
            self._perms[j] = self._copier.later(_made_order, self._staging, fill.plan, fill.w, fill.buffer, small=small)
        return self._perms[j]

    def _pull(self, fill: _Fill, n: int) -> None:
        """Copy up to ``n`` more pieces of ``fill``'s window into its buffer."""
        arrays = self._buffers[fill.buffer]
        while n > 0 and fill.pulled < len(fill.rows):
            rows = fill.rows[fill.pulled]
            selection = None if fill.selections is None else fill.selections[fill.pulled - fill.carried]
            if fill.filled == 0:
                self._staging.reusing(fill.buffer, arrays)
            guards = self._feed.get()
            try:
                took = selection is None and self._staging.take_slots(
                    fill.buffer, arrays, self._feed.queues, guards, fill.filled, fill.filled + rows)
            except BaseException:
                for guard in guards:
                    guard.release()
                raise
            if took:
                fill.on_host = False
            else:
                for guard, buf in zip(guards, arrays):
                    with guard as block:
                        out = buf[fill.filled : fill.filled + rows]
                        if selection is None:
                            assert len(block) == rows, (len(block), rows)
                            self._copier.copy(out, block)
                        else:
                            self._copier.take(block, selection, out)
                self._staging.pulled(fill.buffer, arrays, fill.filled, fill.filled + rows)
            fill.filled += rows
            fill.pulled += 1
            n -= 1

    def __iter__(self) -> Iterator[Window]:
        plan = self._plan
        try:
            for j, w in enumerate(range(self._w0, plan.n_windows)):
                fill = self._fill_of(j)
                self._rate = 0
                self._pull(fill, len(fill.rows))  # the rest of window w
                rows = plan.window_rows(w)
                self._at = (j, rows)
                self._pace(j, rows)  # the next window (perhaps the next epoch's first) goes to the other buffer
                yield self._staging.window(fill.buffer, self._buffers[fill.buffer], rows, self._order(j).result())
                del self._fills[j]  # delivered: its order goes with its window, not all of them with the epoch
                self._perms.pop(j, None)
        except BaseException:  # left, or failed: the next iteration may rewind the queues, which no held guard outlasts
            self._staging.let_go()
            raise
        if self._after is None:
            self._staging.let_go()
        else:  # the carry's guards stay held, as within an epoch (NOTE [slots on a device])
            last, j = self._fills[self._n_own], self._n_own
            self.carry = Carry(self._after[0].epoch, last.buffer, last.pulled, last.filled, self._staging, last.on_host,
                               self._after[0], self._perms.get(j), self._after[1].since(last.pulled))

    def prefetch(self) -> None:
        if self._rate:
            self._pull(self._fill_of(self._next), self._rate)
            self._order(self._next)  # with the pull that starts it, if not yet (see _perms)


class SlotWindow(Window):
    """One block, held in its slots; batches are copied straight out of them."""

    def __init__(self, feed: "Feed", copier: Copier, selection: "np.ndarray | None" = None) -> None:
        self._guards = feed.get()
        self._blocks = [_selected(guard.block, selection) for guard in self._guards]
        self._copier = copier
        self.rows = len(self._blocks[0])

    def take(self, a: int, b: int, out: "list[np.ndarray]") -> None:
        for block, o in zip(self._blocks, out):
            self._copier.copy(o, block[a:b])

    def close(self) -> None:
        self._blocks = []
        for guard in self._guards:
            guard.release()


class BlockWindows(Windows):
    """Unshuffled: every window is one block (the plan has ``window=1``)."""

    def __init__(self, plan: RankEpoch, w0: int, feed: "Feed", copier: Copier,
                 selections: "Sequence[np.ndarray | None] | None" = None) -> None:
        self._n = plan.n_windows - w0
        self._feed, self._copier = feed, copier
        self._selections = selections

    def __iter__(self) -> Iterator[Window]:
        for i in range(self._n):  # one piece per window
            yield SlotWindow(self._feed, self._copier, None if self._selections is None else self._selections[i])


#: Makes the arrays of a batch of ``n`` rows: one per dataset, of the delivered dtype and row shape.
Alloc = Callable[[int], "list[np.ndarray]"]


#: Why an iteration a forked child inherited goes no further: its windows lie in buffers a fork does not copy
#: (NOTE [window buffers and fork] in ``buffers``); a new iteration there reads them again.
_FORKED = ("this iteration over the batches was started in process {pid}, and this process ({here}) is a fork of it: "
           "start one here (iter(batches), a new loop), which goes on from the same position with readers of this "
           "process")


#: Forks between the process this module was imported in and this one (a global's look costs less than a getpid).
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


def cut(source: Windows, skip: int, batch_size: int, alloc: Alloc) -> Generator[list[np.ndarray], None, None]:
    """Consecutive batches of ``batch_size`` rows over the windows (the last may be short); skips ``skip`` rows first.

    Each batch's rows are written straight into arrays from ``alloc``,
    across windows too (the last batch: the first rows of such arrays).
    """
    out: "list[np.ndarray] | None" = None
    have = 0
    pid, forks = os.getpid(), _forks
    windows = iter(source)
    try:
        for win in windows:
            pos, skip = skip, 0
            try:
                while pos < win.rows:
                    if out is None:
                        out = alloc(batch_size)
                    n = min(batch_size - have, win.rows - pos)
                    win.take(pos, pos + n, [o[have : have + n] for o in out])
                    pos += n
                    have += n
                    if have == batch_size:
                        batch, out, have = out, None, 0
                        yield batch
                        if _forks != forks:  # a fork's copy of this iteration: its windows are not in the fork
                            raise RuntimeError(_FORKED.format(pid=pid, here=os.getpid()))
                        source.prefetch()  # once the batch is out: the readers had its training step to decode
            finally:
                win.close()
    finally:
        getattr(windows, "close", lambda: None)()  # the windows' own clean-up now, not when collected
    if have and out is not None:
        yield [o[:have] for o in out]


def epoch_windows(
    plan: RankEpoch,
    w0: int,
    feed: "Feed",
    pieces: "EpochPieces",
    memory: WindowMemory,
    carry: "Carry | None" = None,
    staging: "Staging | None" = None,
) -> Windows:
    """The windows of a rank's epoch from window ``w0`` on, read through ``feed``, which gives ``pieces`` next.

    ``memory``: the copier, and for a shuffled epoch the window buffers
    (unshuffled, batches come straight out of the slots); ``carry``: see
    :class:`ShuffledWindows`; ``staging``: how a shuffled window's rows
    reach the batches (NOTE [staging]; None: gathered on the host).
    """
    if not plan.settings.shuffle:
        return BlockWindows(plan, w0, feed, memory.copier, pieces.selections)
    return ShuffledWindows(plan, w0, feed, memory, plan.settings.batch_size, pieces, carry, staging)
