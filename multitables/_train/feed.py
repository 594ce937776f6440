"""The readers of one :class:`~multitables.batches.Batches`, kept from epoch to epoch (NOTE [readers across epochs]
in ``_procs.stream``): one growing queue per dataset, and what has been published to them.

Every queue gets the same blocks in the same order (block ``k`` of each holds
the same rows of its dataset), so one list says what is published and not yet
taken, for all of them: pieces named ``(epoch, piece)``. An epoch asks for its
pieces from some window on (:meth:`Feed.provide`): what is already published
in that order is kept, the rest is published after it, and where the two part
the queues are rewound first. The next epoch's pieces can be published while
the current one is read (:meth:`Feed.follow`), so the readers go straight on.

NOTE [readers bought]
    By default a dataset is read in the training process where one epoch of
    it would not pay for starting readers (NOTE [read plan]). But readers
    kept across epochs start once for all the epochs a loop runs, and how
    many it runs is not known (``epochs=1``, iterated in the caller's loop).
    So after each epoch read to its end with such a dataset, the readers are
    priced again over the epochs read so far (``plan_batches``' ``passes``):
    once those would have paid for them, the next epoch starts them (rent,
    then buy: never more than twice the better choice's time, in
    hindsight). The rows of an epoch do not depend on its readers (NOTE
    [epoch plan]). Only where ``n_procs`` is left out, and only where no
    dataset would lose readers (their plan shares the CPUs). A checkpoint
    records the count (``state_dict``'s ``epochs_here``) and a restored
    loop goes on counting from it: a job restarted every few epochs would
    otherwise read in the training process for ever.

NOTE [the next epoch in steps]
    The next epoch is made ready while the current one is delivered
    (:class:`NextEpoch`): planned, its pieces published to the readers after
    the current epoch's, a shuffled epoch's first window pulled during this
    one's last. Done at once after an epoch's first batch, it made the next
    batch the epoch's slowest: 0.88-1.09 ms of the consumer's CPU against
    0.16-0.18 in mid-epoch (``benchmarks/epoch_start.py``, 2 readers on the
    2-core VM, where code that runs once an epoch runs from cold caches: the
    plan took 0.34 ms there, 45 us alone). So the plan and the pieces are made
    on the copier's thread (pure: nothing of the feed's), and published
    by later batches once made, at most :data:`PUBLISH_PIECES` a batch (an
    epoch of 25,600 pieces, published at once, took a batch 0.36 ms of the
    consumer's CPU); in the current epoch's last window, whatever is left is
    done at once, waiting for the thread where it must.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import warnings
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .._plan.blocks import GrowingPlan
from .._plan.epoch import RankEpoch
from .._plan.readers import BatchPlan, DatasetShape, Machine, plan_batches, rate_decides, transform_stake, would_save_s
from .._plan.subset import Selections, piece_spans
from .._procs.failure import fd_limit
from .._shm.space import shared_memory_free
from .._sys.forks import note_forgone
from ..errors import QueueClosed
from .transforms import price

if TYPE_CHECKING:
    from .._io.node import NodeInfo
    from .._plan.epoch import EpochSettings
    from .copier import Copier
    from .draws import DrawsAhead
    from .windows import Windows
    from .._stream.options import StreamOptions
    from .._stream.queue import Guard, Queue


@dataclass(frozen=True)
class FeedPlan:
    """What a batches' reading is planned from (:func:`plan_feed`), kept to plan it again (NOTE [readers bought])."""

    options: "StreamOptions"
    nodes: "tuple[NodeInfo, ...]"
    shapes: "tuple[DatasetShape, ...]"
    engines: "tuple[str, ...]"  # as ``auto`` chose them, before the readers' (``engine_for_readers``)
    machine: Machine
    n_rows: int
    given: "dict[str, Any]"  # plan_batches' arguments as the user gave them

    @property
    def by_default(self) -> bool:
        """Whether the readers are the default's (``n_procs`` left out)."""
        return self.given.get("n_procs") is None

    def at(self, passes: int = 1) -> "tuple[list[str], BatchPlan]":
        """Each dataset's engine and the plan, default readers priced over ``passes`` epochs and fitted to the shared
        memory free (NOTE [read plan])."""
        free = shared_memory_free() if self.by_default and self.given.get("read_ahead") is None else None
        plan = plan_batches(self.shapes, self.engines, self.machine, n_rows=self.n_rows, passes=passes, shm_free=free,
                            **self.given)
        return [self.options.engine_for_readers(n, e, k) for n, e, k in zip(self.nodes, self.engines, plan.n_procs)], plan


def plan_feed(
    options: "StreamOptions", nodes: "Sequence[NodeInfo]", transforms: Sequence[Any], *, n_rows: int, **given: Any
) -> FeedPlan:
    """What the batches' reading is planned from (``plan_batches``, ``given`` its arguments as the user gave them):
    each dataset's engine as ``auto`` chooses it (:meth:`FeedPlan.at` then takes, where the plan gives a dataset
    readers, the one faster there), its shape, at the rate measured where that decides, and the machine.

    A transform's work is priced at its times a call and a row (:func:`_priced`). Warns where a given
    ``block_size`` cuts a compressed chunk of a shuffled epoch, whose blocks each decode the whole chunk again.
    """
    engines = options.resolve_each(list(nodes))
    shapes = [_shape(n, t) for n, t in zip(nodes, transforms)]
    machine = options.machine
    if given.get("n_procs") is None:  # NOTE [read plan]: measured where the answer turns on it, as for a stream
        shapes = [replace(s, decode_rate=options.measure_rate(n, e)) if rate_decides(s, e, machine, looped=True) else s
                  for s, n, e in zip(shapes, nodes, engines)]
    if any(t is not None for t in transforms):
        shapes = _priced(options, nodes, transforms, shapes, engines, machine, n_rows, given)
    planning = FeedPlan(options, tuple(nodes), tuple(shapes), tuple(engines), machine, n_rows, dict(given))
    plan = planning.at()[1]  # the arguments checked here, before anything starts
    if planning.by_default:  # NOTE [fork server] in _sys.forks
        note_forgone(sum(would_save_s(s, e, machine, plan.block_size) for s, e in zip(shapes, engines)))
    if given.get("shuffle") and given.get("block_size") is not None:
        for node in nodes:
            split = node.chunk_rows or 0
            if node.filter_ids and split and plan.block_size % split and plan.block_size < node.n_rows \
                    and not node.parts:  # 1.5 chunks cut every other; one block of every row cuts none
                cut = (f"each compressed chunk of {node.path!r} in {node.filename!r} ({split:,} rows) into "
                       f"{-(-split // plan.block_size)} blocks" if plan.block_size < split else
                       f"compressed chunks of {node.path!r} in {node.filename!r} ({split:,} rows) between two blocks")
                warnings.warn(
                    f"block_size={plan.block_size} cuts {cut}, which a shuffled epoch reads apart: each decodes "
                    f"the whole chunk again. Give a multiple of {split:,} rows, or leave block_size out (whole "
                    f"chunks)", stacklevel=4)
    return planning


def _shape(node: "NodeInfo", transform: Any) -> DatasetShape:
    """What the plan needs of ``node``, read through ``transform`` (None: none). A transformed row is priced and
    planned as the larger of its bytes as read (a variable-length row's payload, not its pointer: NOTE
    [variable-length rows] in ``_io.vlen``) and as the transform writes it into a slot (NOTE [read plan])."""
    shape = DatasetShape.of(node, transformed=transform is not None)
    if transform is not None:
        shape = replace(shape, row_nbytes=max(transform.read_nbytes, transform.row_nbytes, 1))
    return shape


def _priced(options: "StreamOptions", nodes: "Sequence[NodeInfo]", transforms: Sequence[Any],
            shapes: "list[DatasetShape]", engines: "list[str]", machine: Machine, n_rows: int,
            given: "dict[str, Any]") -> "list[DatasetShape]":
    """``shapes`` with their transforms' times a call and a row (``_train.transforms.price``), timed only where the
    readers can turn on them: by default, or where an ``n_procs`` given is shared among datasets by which pay
    (``_plan.costs.split_readers``); each against what makes its readers pay (``_plan.readers.transform_stake``)."""
    n_procs = given.get("n_procs")
    turns = n_procs is None or (n_procs > 0 and len(shapes) > 1)
    block_size = plan_batches(shapes, engines, machine, n_rows=n_rows, **given).block_size  # the arguments checked first
    out = []
    for shape, node, engine, transform in zip(shapes, nodes, engines, transforms):
        if transform is not None:
            stake = transform_stake(shape, engine, machine, block_size) if turns else None
            call_s, row_s = price(options, node, transform, stake, n_rows, -(-n_rows // block_size))
            shape = replace(shape, transform_call_s=call_s, transform_row_s=row_s)
        out.append(shape)
    return out


#: Room for what a block table may hold unclaimed, over two epochs' pieces: a few pieces more or less per epoch.
_TABLE_SLACK = 16


@dataclass(frozen=True, eq=False)  # compared as objects: pieces are arrays
class EpochPieces:
    """What a rank's epoch reads from one of its pieces on: the file rows of each, and which of them it keeps.

    ``starts``/``stops``: file rows of pieces ``first, first + 1, ...`` (a
    piece's span of file rows, for a subset), read-only int64 arrays (views of
    the plan's: NOTE [pieces as arrays] in ``_plan.epoch``); ``selections``:
    for a subset, the rows of each span the epoch takes (NOTE [subsets] in
    ``_plan.subset``), else None.
    """

    epoch: int
    first: int
    starts: np.ndarray
    stops: np.ndarray
    selections: "Selections | None"
    most_rows: int  # rows of the largest piece: what a slot must hold

    @classmethod
    def of(cls, plan: RankEpoch, first: int, rows: "np.ndarray | None") -> "EpochPieces":
        """The pieces of ``plan`` from piece ``first`` on; ``rows``: the file rows of the epoch's positions (None: all)."""
        starts, stops = plan.starts[first:], plan.stops[first:]
        if rows is None:
            return cls(plan.epoch, first, starts, stops, None, _largest(plan.sizes[first:]))
        spans = piece_spans(rows, starts, stops)
        return cls(plan.epoch, first, spans.starts, spans.stops, spans.selections, _largest(spans.stops - spans.starts))

    def since(self, first: int) -> "EpochPieces":
        """These pieces from piece ``first`` on (``first >= self.first``), without making them again (a subset's spans
        took an epoch's first batch 0.2-0.6 ms on the 2-core VM: ``benchmarks/epoch_start.py --sampling weights``).
        ``most_rows`` stays these pieces' largest: what the slots were checked for when they were published."""
        k = first - self.first
        if k == 0:
            return self
        selections = None if self.selections is None else self.selections[k:]
        return EpochPieces(self.epoch, first, self.starts[k:], self.stops[k:], selections, self.most_rows)


def _largest(sizes: np.ndarray) -> int:
    return int(sizes.max()) if len(sizes) else 1


class _Published:
    """The pieces published to the queues and not yet taken, in order, as runs of consecutive pieces of an epoch.

    An epoch's pieces are published in order, so what is published is a run
    or two (this epoch's rest, the next's): what an epoch asks for is
    compared with it without a loop over its pieces (a Python loop over an
    epoch's 128 keys cost its first batch 50 us on the 2-core VM).
    """

    def __init__(self) -> None:
        self._runs: "deque[list[int]]" = deque()  # [epoch, first piece, piece after the last]
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def extend(self, epoch: int, first: int, stop: int) -> None:
        """Pieces ``first .. stop - 1`` of ``epoch`` published after the others."""
        if first >= stop:
            return
        last = self._runs[-1] if self._runs else None
        if last is not None and last[0] == epoch and last[2] == first:
            last[2] = stop
        else:
            self._runs.append([epoch, first, stop])
        self._n += stop - first

    def next(self) -> "tuple[int, int]":
        """The epoch and piece taken next."""
        return self._runs[0][0], self._runs[0][1]

    def popleft(self) -> None:
        run = self._runs[0]
        run[1] += 1
        self._n -= 1
        if run[1] == run[2]:
            self._runs.popleft()

    def clear(self) -> None:
        self._runs.clear()
        self._n = 0

    def leading(self, epoch: int, first: int, stop: int) -> int:
        """How many of pieces ``first .. stop - 1`` of ``epoch`` are, in order, the first published."""
        if not self._runs or self._runs[0][:2] != [epoch, first]:
            return 0
        return min(self._runs[0][2], stop) - first


class Feed:
    """One growing queue per dataset, made when first needed and kept until :meth:`close` (or until it is dropped).

    ``planning``: what :attr:`reading` is planned from; a slot holds a
    block, or the largest piece asked for.
    """

    def __init__(self, planning: FeedPlan, transforms: Sequence[Any]) -> None:
        self._planning, self._options, self._nodes = planning, planning.options, list(planning.nodes)
        self._engines, self._reading = planning.at()
        self._transforms = list(transforms)
        self._epochs_here = 0  # epochs read to their end with a dataset the default reads here (NOTE [readers bought])
        self._queues: "list[Queue] | None" = None
        self._opened_in = 0  # the process that started the queues' readers
        self._pending = _Published()  # published, not yet taken: the same on every queue
        self._slot_rows = 0
        self._table = 0

    @property
    def queues(self) -> "list[Queue]":
        """The queues, one per dataset (empty before the first :meth:`provide`)."""
        return list(self._queues or [])

    @property
    def reading(self) -> BatchPlan:
        """Readers per dataset, block size and read-ahead (``_plan.readers.plan_batches``)."""
        return self._reading

    @property
    def engines(self) -> "list[str]":
        """The engine reading each dataset."""
        return list(self._engines)

    @property
    def epochs_here(self) -> int:
        """Epochs read to their end with a dataset the default reads in this process (a ``state_dict`` records it)."""
        return self._epochs_here

    def epoch_read(self) -> bool:
        """An epoch was read to its end. Where the default reads a dataset in this process, the readers are priced
        over the epochs so read (NOTE [readers bought]); whether they pay now: then the caller closes the feed
        (:meth:`close`, having given back what it holds), and the next :meth:`provide` starts them."""
        if not self._planning.by_default or all(self._reading.n_procs):
            return False
        return self._price(self._epochs_here + 1)

    def resume(self, epochs_here: int) -> bool:
        """A run restored from a state whose loop had read ``epochs_here`` epochs in its training process: they count
        as if read here (what the loop paid is evidence of how long it runs), and whether readers pay now, as for
        :meth:`epoch_read`. A count below this feed's own changes nothing: readers bought stay."""
        if not self._planning.by_default or all(self._reading.n_procs) or epochs_here <= self._epochs_here:
            return False
        return self._price(epochs_here)

    def _price(self, epochs_here: int) -> bool:
        self._epochs_here = epochs_here
        engines, reading = self._planning.at(epochs_here)
        if reading.n_procs == self._reading.n_procs or any(k < n for k, n in zip(reading.n_procs, self._reading.n_procs)):
            return False
        assert (reading.block_size, reading.window) == (self._reading.block_size, self._reading.window), "rows moved"
        self._engines, self._reading = engines, reading
        return True

    def provide(self, pieces: EpochPieces, held: float = 0.0) -> None:
        """Make :meth:`get` give ``pieces`` next, in order; readers start here the first time, their rings with room
        for a share ``held`` of their slots held at once by the caller (``Staging.held``)."""
        n = len(pieces.starts)
        if self._queues is not None and self._opened_in != os.getpid() and not multiprocessing.current_process().daemon:
            self.close()  # a fork's copy: the readers stay the parent's (NOTE [forked children]); it starts its own
        if self._queues is None or pieces.most_rows > self._slot_rows or 2 * n + _TABLE_SLACK > self._table:
            self.close()
            self._open(pieces, held)
            return
        same = self._pending.leading(pieces.epoch, pieces.first, pieces.first + n)
        if same < min(len(self._pending), n):  # they part: what is published is not what comes next
            for queue in self._queues:
                queue.rewind()
            self._pending.clear()
            same = 0
        if same < n:
            self._publish(pieces, same)

    def fits(self, pieces: EpochPieces) -> bool:
        """Whether ``pieces`` can be published after what is published: they fit the slots and the table."""
        if self._queues is None or pieces.most_rows > self._slot_rows:
            return False
        return len(self._pending) + len(pieces.starts) + _TABLE_SLACK <= self._table

    def follow(self, pieces: EpochPieces, done: int = 0, most: "int | None" = None) -> "int | None":
        """Publish ``pieces`` after what is published, if they :meth:`fit <fits>`: from piece ``done`` on (those
        before it published by an earlier call), ``most`` of them (None: all). How many are published now; None where
        they do not fit. Never in a fork of the process that started the readers: they are its parent's, whose next
        epochs would get them twice."""
        if self._opened_in != os.getpid() or (done == 0 and not self.fits(pieces)):
            return None
        stop = len(pieces.starts) if most is None else min(len(pieces.starts), done + most)
        self._publish(pieces, done, stop)
        return stop

    def get(self) -> "list[Guard]":
        """The next piece's block of every dataset, as guards (release each when done with it)."""
        assert self._queues is not None and self._pending, "get() beyond what was provided"
        guards = []
        try:
            for queue in self._queues:
                guard = queue.get()
                if guard is QueueClosed:  # pragma: no cover - a queue closed under its feed
                    raise RuntimeError("a queue of the batches was closed while an epoch read from it")
                guards.append(guard)
        except BaseException:
            for guard in guards:
                guard.release()
            raise
        self._pending.popleft()
        return guards

    def close(self) -> None:
        """Stop every reader (idempotent); the next :meth:`provide` starts new ones."""
        queues, self._queues = self._queues, None
        self._pending.clear()
        error: "BaseException | None" = None
        for queue in queues or []:
            try:
                queue.close()
            except BaseException as exc:  # noqa: BLE001 - every queue is closed; the first error is raised after
                error = error or exc
        if error is not None:
            raise error

    def _open(self, pieces: EpochPieces, held: float) -> None:
        """The queues, sized for ``pieces`` with room to grow, with ``pieces`` published before their readers start."""
        n = len(pieces.starts)
        # Slots for a little more than the largest piece (a weighted draw's spans vary from epoch to epoch),
        # a table for two epochs of pieces: this one's and the next one's, published while this one is read.
        most = max(pieces.most_rows, self._reading.block_size)
        self._slot_rows = most if pieces.selections is None else int(most * 1.25) + 1
        self._table = 2 * n + 2 * _TABLE_SLACK
        queues: "list[Queue]" = []
        try:
            for node, engine, n_procs, transform in zip(self._nodes, self._engines, self._reading.n_procs, self._transforms):
                blocks = GrowingPlan(self._slot_rows)
                blocks.extend(pieces.starts, pieces.stops)
                queues.append(
                    self._options.queue_over(
                        node, engine, blocks, n_procs, self._reading.read_ahead, transform, table=self._table, most_blocks=n,
                        held=held,
                    )
                )
        except BaseException as exc:
            for queue in queues:
                queue.close()
            if type(exc) is OSError and exc.errno == errno.EMFILE:  # the table filled up dataset by dataset
                raise self._too_many_open(exc, len(queues)) from exc
            raise
        self._queues, self._opened_in = queues, os.getpid()
        self._pending.clear()
        self._pending.extend(pieces.epoch, pieces.first, pieces.first + n)

    def _too_many_open(self, exc: OSError, i: int) -> OSError:
        """EMFILE at the open of dataset ``i``, said with what holds the descriptors and the ways out."""
        n, node = len(self._nodes), self._nodes[i]
        # NOTE [shared descriptors] in ``_io.chunks.descriptors``: files cost one descriptor each, whatever the datasets.
        holds = (f"batches over {n} datasets keep descriptors open while they last: one per file that this process reads "
                 f"(shared by its datasets), and pipes to each dataset's reader processes")
        said = fd_limit(exc, "this process", holds, ", or read fewer datasets at once")
        return OSError(errno.EMFILE, f"could not open dataset {i + 1} of {n}, {node.path!r}, for batches: "
                                     f"{exc.strerror or exc}{said}", node.filename)

    def _publish(self, pieces: EpochPieces, skip: int, stop: "int | None" = None) -> None:
        """Publish ``pieces`` from ``skip`` to ``stop`` (None: their end)."""
        stop = len(pieces.starts) if stop is None else stop
        if skip >= stop:
            return
        starts, stops = pieces.starts[skip:stop], pieces.stops[skip:stop]
        for queue in self._queues or []:
            queue.extend(starts, stops)
        self._pending.extend(pieces.epoch, pieces.first + skip, pieces.first + stop)


#: The most pieces a batch publishes before the current epoch's last window (NOTE [the next epoch in steps]).
PUBLISH_PIECES = 1024


class NextEpoch:
    """The readers going on with ``epoch`` once the current one's first batch is out (NOTE [readers across epochs]),
    made ready over the batches that follow (NOTE [the next epoch in steps]): its plan and pieces made on a copier's
    thread, then published after the current epoch's where they fit, a shuffled epoch's first window pulled during
    the current epoch's last (``source``'s)."""

    def __init__(self, feed: Feed, rows: "DrawsAhead", settings: "EpochSettings", rank: int, epoch: int,
                 source: "Windows") -> None:
        self._feed, self._rows, self._settings, self._rank, self._epoch = feed, rows, settings, rank, epoch
        self._source = source
        self._made: "Future[tuple[RankEpoch, EpochPieces]] | None" = None
        self._published: "int | None" = None  # its pieces published so far, once it is known that they fit
        self._pid = os.getpid()

    def step(self, early: bool, copier: "Copier") -> bool:
        """After a batch went out: what can be done now, the plan made on ``copier``'s thread (where not ``early``,
        in the current epoch's last window, all that is left, waiting for what runs still); whether all is done.

        In a fork of the process that made it, nothing, and done: the readers and the thread are that process's (a
        child publishing to its parent's queues would give the parent's next epochs rows twice, and waiting for the
        parent's thread would wait for ever); the iteration goes no further there (``windows.cut`` refuses it)."""
        if self._pid != os.getpid():
            return True
        if self._made is None:
            self._rows.draw_ahead(self._epoch)  # a weighted draw: on a thread, taken once drawn
            if not self._rows.ready(self._epoch) and early:
                return False
            self._made = copier.later(_next_pieces, self._settings, self._epoch, self._rank, self._rows.of(self._epoch))
            if early:
                return False
        if early and not self._made.done():
            return False
        plan, pieces = self._made.result()
        first = self._published is None
        published = self._feed.follow(pieces, self._published or 0, PUBLISH_PIECES if early else None)
        if published is None:  # they do not fit, and the next epoch starts its readers afresh; or a fork's
            return True
        if first and self._settings.shuffle:  # pulled during the current epoch's last window, all published by then
            self._source.then((plan, pieces))
        self._published = published
        return published == len(pieces.starts)


def _next_pieces(settings: "EpochSettings", epoch: int, rank: int,
                 rows: "np.ndarray | None") -> "tuple[RankEpoch, EpochPieces]":
    """Rank ``rank``'s plan of ``epoch``, and its pieces (``rows``: the file rows of its positions, None: all)."""
    plan = settings.rank_epoch(epoch, rank)
    return plan, EpochPieces.of(plan, 0, rows)
