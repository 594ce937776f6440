"""Batches for training loops: rows of several datasets in lock-step, shuffled, sharded and resumable.

Which rows go where is planned in :mod:`multitables._plan.epoch` (pure; see NOTE [epoch plan] there). This
module executes a plan: one ordered queue per dataset over the same
:class:`~multitables._plan.blocks.RangePlan`, so block ``k`` of every queue holds the same rows; the blocks of a
shuffle window are copied out of their slots into a buffer this object owns, and each batch is gathered from it
in the window's permuted order into fresh arrays that belong to the caller (NOTE [window pipelining] in
``_train.windows``).
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, Sequence, cast, overload

import numpy as np

from ._io.blockread import delivered
from ._io.fields import check_columns
from ._plan.epoch import ORDER_KEYS, EpochSettings, read_state, rest_of_epoch
from ._plan.subset import EpochRows, epoch_rows
from ._stream.options import StreamOptions
from ._sys.checks import check_bool, check_fields, check_int, check_same_rows, rank_and_world
from ._train.batch import Batch, BatchT, batch_maker
from ._train.mix import NOT_COPIED, MixedBatches, mix_batches
from ._train.resume import check_identity, data_identity
from ._train.transforms import infer_transforms
from ._train.feed import EpochPieces, Feed, NextEpoch, plan_feed
from ._train.buffers import WindowMemory
from ._train.draws import DrawsAhead
from ._train.iteration import NEWER, Closing, Current, run_epochs
from ._train.windows import Alloc, Carry, NoWindows, Staging, Windows, cut, epoch_windows

if TYPE_CHECKING:
    # The streamer makes batches; bound at run time: NOTE [annotations from above] in ``multitables/__init__.py``.
    from .streamer import Streamer

__all__ = ["Batches", "MixedBatches", "mix_batches"]


class Batches(Closing, Generic[BatchT]):
    """Batches of rows of one or more datasets of equal length, for training loops.

    Get one with :meth:`Streamer.get_batches <multitables.Streamer.get_batches>`. Iterating gives the batches of one
    epoch: a tuple with one numpy array per path (the same rows of each), or a single array when ``paths`` is one
    string (a dict of columns with ``fields``): a type checker sees a ``Batches[tuple[np.ndarray, ...]]``,
    ``Batches[np.ndarray]`` or ``Batches[dict[str, np.ndarray]]``. The arrays are fresh copies that belong to you
    (safe to keep, write to, or hand to ``torch.from_numpy``). Every batch holds ``batch_size`` rows except, with
    ``drop_last=False``, a rank's last one.

    An iteration goes on from where the last one stopped, and finishing an epoch moves to the next;
    :meth:`set_epoch` moves to the start of another epoch. :meth:`state_dict` and :meth:`load_state_dict` save and
    restore the position, so a restarted job goes on with the next batch.

    Parameters
    ----------
    stream : Streamer
        The file.
    paths : str or sequence of str
        The datasets, all with the same number of rows.
    batch_size : int
        Rows per batch (per rank).
    shuffle : bool
        Visit the blocks in a random order and shuffle the rows within each
        window of ``window`` blocks; the order depends only on ``(seed,
        epoch)`` (and the rank's part), never on the machine or ``n_procs``.
    seed : int
        Seed of the shuffle; the same on every rank.
    drop_last : bool
        Drop the rows that cannot make a full batch on every rank (fewer than
        ``world_size * batch_size`` per epoch). Otherwise every row is
        delivered once per epoch and each rank's last batch may be short,
        or empty where the last step has fewer rows than ranks (warned of).
    n_procs : int, optional
        Reader processes in all. Default: the CPUs this process may use,
        shared between the datasets in proportion to their size; datasets
        too small for processes to pay are read in this process (both as
        :meth:`Streamer.get_queue <multitables.Streamer.get_queue>` says).
    rank, world_size : int, optional
        This process's part for data-parallel training: the ranks of an
        epoch together get every row once, and the same number of batches.
        Default: ``torch.distributed``'s when it is initialised, else 0 and 1.
    block_size : int, optional
        Rows per block, the unit read and shuffled (keep it whole chunks).
        Default: whole chunks of the largest dataset, near 4 MiB. Smaller
        blocks mix better and read slower.
    window : int, optional
        Blocks whose rows are shuffled together. Default: as many as fit in
        256 MiB (over all datasets); the whole dataset when it is smaller.
    read_ahead : int, optional
        Slots in each dataset's ring (see :meth:`Streamer.get_queue
        <multitables.Streamer.get_queue>`; the default's slots fit in half of
        the shared memory free, the blocks never change).
    field : str, optional
        With one path, a table (or compound dataset): batches of this column
        only, one array each, as :meth:`Streamer.get_queue
        <multitables.Streamer.get_queue>`'s ``field``.
    fields : sequence of str, optional
        With one path, a table: batches as a dict of one array per column,
        in this order. The table's rows are read once and the columns copied
        out of each batch, each into an array of its own.
    indices : integer array, slice or boolean mask, optional
        Train on these rows only (a train/validation split, a class subset):
        an epoch holds each of them once, shuffled and sharded as a whole
        dataset of that many rows would be. Rows are named once each (numpy's
        negative indices count from the end). Rows between them are read
        and dropped where they share a block (NOTE [subsets] in
        ``multitables._plan.subset``).
    weights : array of numbers, optional
        One weight per row of the file: each epoch draws ``num_samples`` rows
        with replacement, row ``i`` in proportion to ``weights[i]`` (as
        PyTorch's ``WeightedRandomSampler``), from ``(seed, epoch)``, the same
        on every rank; for class balancing. The copies of a row drawn
        several times come within one shuffle window. Not with ``indices``
        (give the rows outside a weight of 0).
    num_samples : int, optional
        Rows drawn per epoch with ``weights``; default: the file's rows.
    transform : callable, or dict of path to callable, optional
        A function of a block's rows (a numpy array, rows first) returning an array of as many rows (module-level,
        picklable, for the ``spawn`` and ``forkserver`` start methods), run in the readers on each block as it is
        read, so per-sample work (augmentation, decoding bytes stored per row) runs in parallel as decoding does
        (NOTE [transforms] in ``multitables._io.blockread``). One function for one path; a dict for several (paths
        left out stay as read). Its output's dtype and row shape are learnt on the first rows, before readers start,
        and its times a call and a row on them count in the default ``n_procs``: it is called here, on copies of the
        first rows, once to six times (docs/training.rst, "Work per sample in the readers"). Not with ``fields``.
    epochs : int or None
        Epochs one iteration runs through, from the current position (the
        rest of the current epoch counts as one). ``None``: endless, for
        step-based training: epoch follows epoch, each with its own seeded
        order, until the loop stops; :meth:`state_dict` records the epoch,
        the batch in it, and the ``step`` (batches since epoch 0 began).
    """

    # What a type checker sees: the kind of batch follows from the arguments. (The keywords are __init__'s below.)
    # fmt: off
    @overload
    def __init__(self: Batches[np.ndarray], stream: Streamer, paths: str, batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, n_procs: int | None = None, rank: int | None = None,
                 world_size: int | None = None, block_size: int | None = None, window: int | None = None,
                 read_ahead: int | None = None, field: str | None = None, fields: None = None, indices: Any = None,
                 weights: Any = None, num_samples: int | None = None, epochs: int | None = 1, transform: Any = None) -> None: ...
    @overload
    def __init__(self: Batches[dict[str, np.ndarray]], stream: Streamer, paths: str, batch_size: int, *,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, n_procs: int | None = None,
                 rank: int | None = None, world_size: int | None = None, block_size: int | None = None,
                 window: int | None = None, read_ahead: int | None = None, field: None = None, fields: Sequence[str],
                 indices: Any = None, weights: Any = None, num_samples: int | None = None, epochs: int | None = 1,
                 transform: Any = None) -> None: ...
    @overload
    def __init__(self: Batches[tuple[np.ndarray, ...]], stream: Streamer, paths: Sequence[str], batch_size: int, *,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, n_procs: int | None = None,
                 rank: int | None = None, world_size: int | None = None, block_size: int | None = None,
                 window: int | None = None, read_ahead: int | None = None, field: None = None, fields: None = None,
                 indices: Any = None, weights: Any = None, num_samples: int | None = None, epochs: int | None = 1,
                 transform: Any = None) -> None: ...
    @overload  # one path, fields= a variable that may be None. fields= with several paths matches no overload
    def __init__(self: Batches[np.ndarray | dict[str, np.ndarray]], stream: Streamer, paths: str, batch_size: int, *,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, n_procs: int | None = None,
                 rank: int | None = None, world_size: int | None = None, block_size: int | None = None,
                 window: int | None = None, read_ahead: int | None = None, field: None = None,
                 fields: Sequence[str] | None = None, indices: Any = None, weights: Any = None,
                 num_samples: int | None = None, epochs: int | None = 1, transform: Any = None) -> None: ...
    # fmt: on

    def __init__(
        self, stream: "Streamer", paths: "str | Sequence[str]", batch_size: int, *, shuffle: bool = True, seed: int = 0,
        drop_last: bool = False, n_procs: "int | None" = None, rank: "int | None" = None,
        world_size: "int | None" = None, block_size: "int | None" = None, window: "int | None" = None,
        read_ahead: "int | None" = None, field: "str | None" = None, fields: "Sequence[str] | None" = None,
        indices: Any = None, weights: Any = None, num_samples: "int | None" = None, epochs: "int | None" = 1,
        transform: Any = None,
    ) -> None:
        if not isinstance(getattr(stream, "options", None), StreamOptions):  # a Streamer: what batches read through
            raise TypeError(f"stream must be a multitables.Streamer (for a file: Streamer(path)), not {type(stream).__name__}")
        self._single = isinstance(paths, (str, os.PathLike))
        path_list = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
        if not path_list:
            raise ValueError("paths is empty; give at least one dataset")
        self._field, self._columns = check_fields(path_list, self._single, field, fields)
        batch_size = check_int("batch_size", batch_size, 1, allow_none=False)
        shuffle, drop_last = check_bool("shuffle", shuffle), check_bool("drop_last", drop_last)
        seed = check_int("seed", seed, 0, allow_none=False)
        n_procs, block_size = check_int("n_procs", n_procs, 0), check_int("block_size", block_size, 1)
        window, read_ahead = check_int("window", window, 1), check_int("read_ahead", read_ahead, 1)
        self._epochs = check_int("epochs", epochs, 1)
        self._rank, world = rank_and_world(rank, world_size)

        # The files are looked at once, here: a later epoch's readers check that each is still the file seen now.
        nodes = [stream.options.inspect(p, self._field, vlen=True, summed=True) for p in path_list]  # NOTE [data sums]
        if self._columns is not None:
            check_columns(nodes[0], self._columns)
        check_same_rows(path_list, [n.n_rows for n in nodes])
        subset, row_weights, n_rows = epoch_rows(nodes[0].n_rows, indices, weights, num_samples)
        self._transforms = infer_transforms(stream, path_list, nodes, transform, self._columns is not None)
        # The readers, across epochs (NOTE [readers across epochs]); holding nothing of this object, dropped with it.
        self._feed = Feed(plan_feed(
            stream.options, nodes, self._transforms, n_rows=n_rows, n_procs=n_procs, block_size=block_size,
            read_ahead=read_ahead, window=window, shuffle=shuffle,
        ), self._transforms)  # fmt: skip
        self._settings = EpochSettings(
            n_rows=n_rows, block_size=self._feed.reading.block_size, batch_size=batch_size, world_size=world,
            shuffle=shuffle, seed=seed, drop_last=drop_last, window=self._feed.reading.window,
        )  # fmt: skip
        self._rows = DrawsAhead(EpochRows(subset, row_weights, n_rows, self._settings.seed))  # each epoch's file rows
        if self._settings.empty_last_batch:
            warnings.warn(
                f"{n_rows} rows over {world} ranks in batches of {batch_size}: the last batch of some ranks "
                f"is empty each epoch (docs/training.rst, 'Several GPUs'); use drop_last=True or another batch_size",
                stacklevel=3)
        self._stream, self._paths, self._identity = stream, path_list, data_identity(nodes)  # NOTE [resumed data]
        #: (dtype, row shape) of each dataset's delivered rows: the transform's output where there is one.
        self._row_types = [delivered(n, t) for n, t in zip(nodes, self._transforms)]
        self._epoch, self._batch = 0, 0  # the epoch, and batches delivered in it
        self._step = 0  # batches delivered since epoch 0 began, at whatever world sizes
        #: The current epoch's parts run at other world sizes: (world_size, batches), NOTE [elastic resume].
        self._elastic: list[tuple[int, int]] = []
        self._current = Current()  # the iteration in progress
        self._memory: "WindowMemory | None" = None  # see _window_memory
        self._carry: "Carry | None" = None  # the next epoch's first window, pulled already (NOTE [window pipelining])
        self._looping = False  # a loop of epochs (set_epoch called, or an epoch delivered to its end): read ahead
        self._closing = False  # close() was called in the middle of a step: NOTE [closed mid-step] in _train.iteration

    # -- what the batches are ------------------------------------------------

    @property
    def paths(self) -> list[str]:
        """The datasets, in the order of each batch's arrays."""
        return list(self._paths)

    @property
    def n_rows(self) -> int:
        """Rows an epoch holds, each dataset's (or the subset's, with ``indices``)."""
        return self._settings.n_rows

    @property
    def batch_size(self) -> int:
        """Rows per batch (on each rank)."""
        return self._settings.batch_size

    @property
    def rank(self) -> int:
        """This process's part of each epoch, out of :attr:`world_size`."""
        return self._rank

    @property
    def world_size(self) -> int:
        """How many ranks share each epoch."""
        return self._settings.world_size

    @property
    def block_size(self) -> int:
        """Rows per block, the unit read (and visited in random order when shuffled)."""
        return self._settings.block_size

    @property
    def window(self) -> int:
        """Blocks whose rows are shuffled together."""
        return self._settings.window

    @property
    def shuffle(self) -> bool:
        """Whether the blocks are visited in random order and the rows shuffled within each window."""
        return self._settings.shuffle

    @property
    def n_procs(self) -> list[int]:
        """Reader processes per dataset, 0 where a dataset is read in this process (by default, until the epochs read
        so far, their decoding and a transform's timed work, would have paid for readers: NOTE [readers bought] in
        ``multitables._train.feed``)."""
        return list(self._feed.reading.n_procs)

    @property
    def engines(self) -> list[str]:
        """The engine reading each dataset, ``"chunks"``, ``"h5py"`` or ``"tables"`` (what ``auto`` chose, as ``Queue.engine``)."""
        return self._feed.engines

    @property
    def reader_pids(self) -> list[int]:
        """Process ids of the reader processes running now (none before the first batch, after close, or in-process)."""
        return [pid for queue in self._feed.queues for pid in queue.reader_pids]

    @property
    def epoch(self) -> int:
        """The epoch of the position, the next batch's (or that of an epoch's last batch taken), as in state_dict()."""
        return self._epoch

    @property
    def epochs(self) -> "int | None":
        """Epochs one iteration runs through, or None for endless ones."""
        return self._epochs

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        return self._settings.n_batches

    def __repr__(self) -> str:
        paths = ", ".join(repr(p) for p in self._paths)
        return (f"<multitables.Batches {paths} of {self._stream.options.named!r}: {len(self)} batches of "
                f"{self._settings.batch_size} rows an epoch (rank {self._rank} of {self._settings.world_size}), "
                f"epoch {self._epoch}>")

    # -- position ------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch``; nothing changes when already in it, so the usual ``set_epoch(epoch)`` at the
        top of the epoch loop keeps a position restored by :meth:`load_state_dict` in the middle of it."""
        epoch = check_int("epoch", epoch, 0, allow_none=False)
        self._looping = True  # set_epoch is what an epoch loop calls: read ahead into the next one
        if epoch != self._epoch:
            self._current.end(by=f"set_epoch({epoch})")
            self._epoch, self._batch, self._elastic = epoch, 0, []
            self._step = epoch * self._settings.n_batches  # as if every epoch before ran at this world size

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch, batches delivered in it), what fixes the order, and the epochs read in this process
        (``epochs_here``: a restored loop buys readers as this one would, NOTE [readers bought] in ``_train.feed``);
        small, picklable, JSON-able.

        All ranks are at the same position after the same number of steps, so rank 0's state loads on every rank.
        """
        s = self._settings
        return {
            "epoch": self._epoch,
            "batch": self._batch,
            "step": self._step,
            "rank": self.rank,
            "subset": self._rows.rows.key(),
            "elastic": [list(segment) for segment in self._elastic],
            "epochs_here": self._feed.epochs_here, "identity": [dict(d) for d in self._identity],  # NOTE [resumed data]
            **{key: getattr(s, key) for key in ORDER_KEYS},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go to the position of ``state``: the next batch is the one after the last delivered before it was saved.

        Raises ``ValueError`` if ``state`` was saved with settings that give a different order (seed, batch size,
        block size, shuffle, subset, ...), or on other data (a copy of the files resumes: NOTE [resumed data] in
        ``multitables._train.resume``). A state saved at another world size goes on with the rows of that epoch no
        rank delivered yet, shared among this world's ranks (NOTE [elastic resume] in ``multitables._plan.epoch``).
        """
        position = self._position_of(state)
        self._current.end(by="load_state_dict")
        self._carry = None  # its epoch's plan may differ now (an elastic resume)
        self._epoch, self._batch, self._step, self._elastic, epochs_here = position
        self._buy_readers(self._feed.resume(epochs_here))

    def check_state_dict(self, state: dict[str, Any]) -> None:
        """Raise the ``ValueError`` :meth:`load_state_dict` would raise on ``state``, moving nothing: a checkpoint
        checked before anything resumes (a mix checks every source's so before any source moves)."""
        self._position_of(state)

    def _position_of(self, state: dict[str, Any]) -> "tuple[int, int, int, list[tuple[int, int]], int]":
        """Where ``state`` goes (``read_state``'s answer); ``ValueError`` where it may not be loaded here."""
        check_identity(state.get("identity"), self._identity, self._stream.options.named)
        return read_state(state, self._settings, self._rows.rows.key())

    def __reduce__(self) -> Any:  # a copy would share the feed and position; pickle would fail on a weakref
        raise TypeError(NOT_COPIED.format(type(self).__name__))

    def close(self) -> None:
        """Stop the readers, free the window buffers, end the copy threads (idempotent); dropping does the same.

        The position stays: iterating again goes on from it, with new readers. From a signal's handler in the middle
        of a step, the loop ends at that step, the batch uncounted, and closes then (NOTE [closed mid-step])."""
        if self._current.close_after_step(self.close):
            self._closing = True  # the step stops at its next look, whose clean-up closes all
            return
        self._current.end()
        self._release()

    def _release(self) -> None:
        """What :meth:`close` frees once no step runs: the readers, the draws, the windows' memory and threads."""
        self._closing = False
        self._close_feed()
        self._rows.close()
        memory, self._memory, self._carry = self._memory, None, None
        if memory is not None:
            memory.close()

    def _close_feed(self) -> None:
        """Stop the readers; a staging first gives back the guards it holds (NOTE [slots on a device])."""
        try:
            if self._memory is not None:
                self._memory.let_go()
        finally:
            self._feed.close()

    def _window_memory(self) -> WindowMemory:
        """The windows' copier and buffers (for the largest window), kept from epoch to epoch."""
        if self._memory is None:
            self._memory = WindowMemory(self._settings.window * self._settings.block_size, self._row_types)
        return self._memory

    def _epoch_plan(self, epoch: int) -> "tuple[EpochSettings | None, np.ndarray | None]":
        """How ``epoch`` is planned, and the file rows of its positions (None: every row, in order); after an
        elastic resume, the rest of the current epoch (NOTE [elastic resume]): settings None when nothing is left."""
        return rest_of_epoch(self._settings, epoch, self._elastic if epoch == self._epoch else [], self._rows.of(epoch))

    # -- iteration -----------------------------------------------------------

    def __iter__(self) -> Iterator[BatchT]:
        """The batches left in the current epoch (and ``epochs - 1`` more, or endless); each epoch's end moves the position on."""
        return self.iter_into()

    def iter_into(self, alloc: "Callable[[int], Sequence[Any]] | None" = None, staging: "Staging | None" = None, *,
                  convert: "Callable[[Any], Any] | None" = None) -> Iterator[Any]:
        """As ``iter(batches)``, each batch's rows written straight into ``alloc(rows)``'s arrays, and given as ``convert(batch)``.

        ``alloc(n)`` gives one C-contiguous array of ``n`` rows per path, of the rows' dtype and shape (see
        :attr:`row_types`), for example views of page-locked memory that a GPU copies from. A batch is those
        arrays, or their first rows for a short last batch (with ``fields``: each column copied out of them).
        The arrays are the caller's: nothing here writes to them after their batch. ``staging``: how shuffled
        windows' rows reach them (NOTE [staging] in ``_train.windows``; None: gathered on the host). ``convert``
        makes of each batch what the loop gets (tensors, say), before the batch counts as delivered, so a signal's
        handler that raises leaves none counted that the loop did not get (NOTE [delivered batches]).
        """
        self._current.end(by=NEWER)  # an older iteration ends here: its position is this one's start
        arrays = (lambda n: list(alloc(n))) if alloc else lambda n: [np.empty((n,) + s, d) for d, s in self._row_types]  # noqa: E731
        made = batch_maker(self._single, self._columns, convert)
        if self._epochs == 1:
            # Whether another epoch follows is not said: read ahead into it in a loop of epochs (set_epoch was
            # called, or an epoch went by); a batches made for one pass never reads an epoch it does not deliver.
            it = self._iterate(self._epoch, self._batch, arrays, made, self._looping, staging)
        else:
            one = lambda more: self._iterate(self._epoch, self._batch, arrays, made, more, staging)  # noqa: E731
            it = run_epochs(self._epochs, one, lambda: self._closing, self._failed)
        return self._current.start(it)

    @property
    def fields(self) -> "list[str] | None":
        """The columns of each batch's dict (``fields``), in order; None where a batch is arrays."""
        return None if self._columns is None else list(self._columns)

    @property
    def row_types(self) -> "list[tuple[np.dtype, tuple[int, ...]]]":
        """The dtype and row shape of each path's delivered rows (a transform's output, where there is one)."""
        return list(self._row_types)

    def _iterate(self, epoch: int, start: int, alloc: Alloc, made: "Callable[[list[np.ndarray]], Any]", ahead: bool,
                 staging: "Staging | None") -> Iterator[Batch]:
        """The batches of ``epoch`` from batch ``start``, each ``made`` of its arrays; ``ahead``: readers go on to the next."""
        s, rows = self._epoch_plan(epoch)
        if s is None:  # an elastic resume found the epoch done
            self._epoch, self._batch, self._elastic = epoch + 1, 0, []
            return
        carry, self._carry = self._carry, None
        plan = carry.plan if carry is not None and carry.epoch == epoch and s is self._settings else None
        plan = plan or s.rank_epoch(epoch, self.rank)  # no carry, or one for another epoch or plan: planned now
        w0, skip = plan.locate(start * s.batch_size)
        if carry is not None and (carry.epoch != epoch or w0 != 0 or not carry.good_for(staging)):
            carry = None  # NOTE [window pipelining]: good for that epoch from its first window only
        try:
            if carry is None and self._memory is not None:  # the queues may be rewound: held slots go back first
                self._memory.let_go()
            source: "Windows" = NoWindows()
            if w0 < plan.n_windows:
                rest = carry.rest if carry is not None and carry.plan is plan else None  # as published: not made again
                pieces = rest or EpochPieces.of(plan, plan.bounds[w0] if carry is None else carry.pulled, rows)
                self._feed.provide(pieces, 0.0 if staging is None else staging.held)
                source = epoch_windows(plan, w0, self._feed, pieces, self._window_memory(), carry, staging)
            k, following = start, cast("NextEpoch | None", None)
            last = plan.window_offsets[max(0, plan.n_windows - 1)] // s.batch_size  # the last window's first batch
            for arrays in (cutting := cut(source, skip, s.batch_size, alloc)):
                batch, k = made(arrays), k + 1  # made (tensors too), then counted: NOTE [delivered batches]
                if self._closing:  # closed under the step: not counted, closed at the chain's end, NOTE [closed mid-step]
                    return
                self._batch, self._step = k, self._step + 1
                yield batch
                if ahead:  # once the first batch is out, the next epoch is made ready: NOTE [the next epoch in steps]
                    following = following or NextEpoch(self._feed, self._rows, self._settings, self.rank, epoch + 1, source)
                    ahead = not following.step(k < last, self._window_memory().copier)
            while k < s.n_batches:  # see NOTE [epoch plan]: empty last batches
                batch, k = made(alloc(0)), k + 1
                if self._closing:
                    return
                self._batch, self._step = k, self._step + 1
                yield batch
            self._epoch, self._batch, self._elastic, self._looping = epoch + 1, 0, [], True
            self._carry = getattr(source, "carry", None)
            self._buy_readers(self._feed.epoch_read())
        except GeneratorExit:
            if k == s.n_batches:  # left after the epoch's last batch: the epoch is done, the next comes next
                self._epoch, self._batch, self._elastic, self._looping = epoch + 1, 0, [], True
                cutting.close()  # read to its end all the same (islice(batches, len(batches))): the windows let go,
                self._buy_readers(self._feed.epoch_read())  # and the epoch counts towards readers
            raise  # the loop was left: the readers stay for the next iteration
        except BaseException:
            self._failed()  # a reader failed, or the loop body raised: start afresh next time
            raise

    def _failed(self) -> None:  # after an error the readers stop; all of it where a close was asked for mid-step
        self._release() if self._closing else self._close_feed()

    def _buy_readers(self, pay: bool) -> None:
        """Where readers pay now (an epoch read to its end, or a restored loop's: NOTE [readers bought] in
        ``_train.feed``), the feed closes, with what the carry pulled, and the next epoch starts them."""
        if pay:
            self._carry = None
            self._close_feed()
