"""Planning an epoch of batches: which rows each rank reads, in which order, cut into which batches. Pure, no I/O.

NOTE [epoch plan]
    An epoch is planned in four steps, each a pure function of the settings
    and ``(seed, epoch, rank)``, never of the machine, the CPU count or
    ``n_procs``:

    1. *Blocks*. The ``n_rows`` rows are cut into blocks of ``block_size``
       rows (whole chunks; the last block may be short). With ``shuffle`` the
       blocks are visited in a random order drawn from ``(seed, epoch)``;
       otherwise in on-disk order. Concatenating the visited blocks gives the
       epoch's *sequence* of rows.
    2. *Shards*. Rank ``r`` takes one contiguous run of that sequence, so it
       reads whole blocks except where its run starts or ends inside one.
       ``drop_last=False``: every row once; the runs hold ``n_rows //
       world_size`` or one more rows, and every rank gets ``B =
       ceil(n_rows / (world_size * batch_size))`` batches. ``drop_last=True``:
       every rank reads ``B * batch_size`` rows, ``B = n_rows // (world_size
       * batch_size)``; the last ``n_rows - world_size * B * batch_size``
       rows of the sequence (fewer than one global batch) are not read.
    3. *Windows*. A rank's run, as a list of *pieces* (a block or the part of
       one it reads), is cut into windows of ``window`` pieces; with
       ``shuffle`` the rows of each window are permuted with a generator
       drawn from ``(seed, epoch, rank, window index)``, so a window can be
       re-planned on its own when a job resumes.
    4. *Batches*. The permuted rows are cut into consecutive batches of
       ``batch_size`` rows, across window boundaries. With
       ``drop_last=False`` a rank's last batch holds what is left (1 to
       ``batch_size`` rows). When ``0 < n_rows % (world_size * batch_size) <
       world_size``, fewer rows are left for the last global batch than there
       are ranks; the ranks with ``n_rows // world_size`` rows then get an
       empty last batch (0 rows): with every row exactly once and equal batch
       counts, nothing else is possible. :attr:`EpochSettings.empty_last_batch`
       tells when.

NOTE [elastic resume]
    A position saved at one world size and loaded at another, in the middle
    of an epoch, goes on with the rows no rank has delivered yet: all ranks
    are at the same batch ``b`` when a state is saved, so the rows delivered
    are those of every rank's first ``b`` batches, known from the plan alone
    (:func:`consumed`). The rest of the epoch is planned afresh as a subset
    of those rows (NOTE [subsets] in ``subset``) with the new world size,
    from the same ``(seed, epoch)``; later epochs are planned as usual.
    Resumed again at yet another size, the segments replay in turn
    (:func:`remaining_after`). So no row is repeated and, with
    ``drop_last=False``, none is skipped; the resumed epoch has fewer
    batches. With ``drop_last=True``, rows a segment left out are still to
    come in the next; the last leaves out what cannot fill a batch on every
    rank.

NOTE [pieces as arrays]
    A plan's pieces (their rows and sizes; an epoch's pieces in
    ``_train.feed``) are read-only int64 arrays, and what is left of them
    after a carry is a view: an epoch of 100 GiB has 25,600 pieces of 4 MiB,
    and as tuples of Python ints (an object per piece) slicing the pieces
    left after a carry and freeing the last epoch's took 1 ms of an epoch's
    first batch (1.4 ms) on the 2-core VM. What is looked up one at a time
    stays Python ints: a window's bounds and offsets, and the sizes of the
    pieces that a window pulls (a list made per window).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

import numpy as np

from .._sys.checks import check_int

#: Spawn-key tags that keep the block-order and window generators independent.
_BLOCKS, _WINDOW = 0, 1
#: Keys of a Batches' ``state_dict`` that fix the order of an epoch: a state only loads into batches that agree on all.
ORDER_KEYS = ("seed", "world_size", "batch_size", "n_rows", "shuffle", "drop_last", "block_size", "window")


def rng(seed: int, epoch: int, *key: int) -> np.random.Generator:
    """The generator for ``(seed, epoch, *key)``: PCG64 from a SeedSequence, the same on every machine."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(epoch, *key)))


@dataclass(frozen=True)
class EpochSettings:
    """Everything that decides the order of an epoch (and nothing that does not)."""

    n_rows: int
    block_size: int
    batch_size: int
    world_size: int = 1
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    window: int = 1

    def __post_init__(self) -> None:
        for name in ("n_rows", "block_size", "batch_size", "world_size", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {self.seed}")
        if self.block_size > self.n_rows:
            raise ValueError(f"block_size={self.block_size} is larger than the datasets, which have {self.n_rows} rows")
        if self.drop_last and self.n_batches == 0:
            raise ValueError(
                f"drop_last=True leaves no batch: {self.n_rows} rows are fewer than one batch of "
                f"{self.batch_size} rows for each of {self.world_size} rank(s)"
            )

    @property
    def n_blocks(self) -> int:
        return -(-self.n_rows // self.block_size)

    @property
    def n_batches(self) -> int:
        """Batches per epoch, the same on every rank."""
        per_step = self.world_size * self.batch_size
        return self.n_rows // per_step if self.drop_last else -(-self.n_rows // per_step)

    def rank_rows(self, rank: int) -> int:
        """Rows rank ``rank`` reads per epoch."""
        if self.drop_last:
            return self.n_batches * self.batch_size
        q, rem = divmod(self.n_rows, self.world_size)
        return q + (rank < rem)

    def rank_offset(self, rank: int) -> int:
        """Where rank ``rank``'s run starts in the epoch's sequence of rows."""
        if self.drop_last:
            return rank * self.n_batches * self.batch_size
        q, rem = divmod(self.n_rows, self.world_size)
        return rank * q + min(rank, rem)

    @property
    def empty_last_batch(self) -> bool:
        """Whether some rank's last batch of an epoch holds no rows (see NOTE [epoch plan])."""
        return not self.drop_last and self.n_rows // self.world_size == (self.n_batches - 1) * self.batch_size

    def batch_rows(self, rank: int, k: int) -> int:
        """Rows in batch ``k`` of rank ``rank``."""
        return max(0, min(self.batch_size, self.rank_rows(rank) - k * self.batch_size))

    def block_order(self, epoch: int) -> np.ndarray:
        """The blocks in the order the epoch visits them."""
        if not self.shuffle:
            return np.arange(self.n_blocks, dtype=np.int64)
        return rng(self.seed, epoch, _BLOCKS).permutation(self.n_blocks).astype(np.int64)

    def rank_epoch(self, epoch: int, rank: int) -> "RankEpoch":
        """What rank ``rank`` reads in epoch ``epoch``, and in which order."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        if epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch}")
        order = self.block_order(epoch)
        starts = order * self.block_size
        sizes = np.minimum(self.block_size, self.n_rows - starts)
        ends = np.cumsum(sizes)  # position in the sequence just after each visited block
        lo = self.rank_offset(rank)
        hi = lo + self.rank_rows(rank)
        if hi == lo:
            return RankEpoch(self, epoch, rank, _NO_PIECES, _NO_PIECES, (0,))
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(ends, hi, side="left"))  # the block holding row hi - 1
        seq_start = ends[first : last + 1] - sizes[first : last + 1]
        piece_starts = starts[first : last + 1] + np.maximum(0, lo - seq_start)
        piece_stops = starts[first : last + 1] + np.minimum(sizes[first : last + 1], hi - seq_start)
        n_pieces = len(piece_starts)
        bounds = tuple(range(0, n_pieces, self.window)) + (n_pieces,)
        sizes = piece_stops - piece_starts
        offsets = np.concatenate([[0], np.cumsum(sizes)])[np.asarray(bounds)]
        for made in (piece_starts, piece_stops, sizes):  # this plan's own: taken as they are
            made.flags.writeable = False
        return RankEpoch(self, epoch, rank, piece_starts, piece_stops, bounds, sizes, tuple(offsets.tolist()))


#: No pieces: an empty plan's, and the default that makes ``RankEpoch.sizes`` from its starts and stops.
_NO_PIECES = np.empty(0, np.int64)
_NO_PIECES.flags.writeable = False


def piece_array(values: Any) -> np.ndarray:
    """``values`` as a read-only int64 array (NOTE [pieces as arrays]): a read-only one as it is, else a copy."""
    if isinstance(values, np.ndarray) and values.dtype == np.int64 and not values.flags.writeable:
        return values
    array = np.array(values, np.int64)
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class RankEpoch:
    """One rank's epoch: its pieces in read order, grouped into shuffle windows.

    Piece ``i`` is source rows ``[starts[i], stops[i])``; window ``w`` is
    pieces ``[bounds[w], bounds[w + 1])``. Equal plans read the same pieces
    in the same windows, for the same settings, epoch and rank.
    """

    settings: EpochSettings
    epoch: int
    rank: int
    # Per piece, read-only int64 arrays (NOTE [pieces as arrays]; any sequence is taken, and copied); per window,
    # Python ints, looked up one at a time (an epoch's first batch locates its window with bisect).
    starts: np.ndarray
    stops: np.ndarray
    bounds: tuple[int, ...]
    #: Rows of each piece.
    sizes: np.ndarray = field(default_factory=lambda: _NO_PIECES, repr=False)
    #: Where each window starts in the rank's delivered order, and (last) the rank's row count.
    window_offsets: "tuple[int, ...]" = field(default=(), repr=False)

    def __post_init__(self) -> None:
        starts, stops = piece_array(self.starts), piece_array(self.stops)
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "stops", stops)
        object.__setattr__(self, "sizes", piece_array(self.sizes) if len(self.sizes) == len(starts) else
                           piece_array(stops - starts))
        if len(self.window_offsets) != len(self.bounds):
            ends = np.concatenate([[0], np.cumsum(self.sizes)])
            object.__setattr__(self, "window_offsets", tuple(ends[np.asarray(self.bounds, np.intp)].tolist()))

    def __eq__(self, other: object) -> bool:
        if other is self:  # a carry's plan is the plan (ShuffledWindows): no piece compared
            return True
        if not isinstance(other, RankEpoch):
            return NotImplemented
        return ((self.settings, self.epoch, self.rank, self.bounds) == (other.settings, other.epoch, other.rank, other.bounds)
                and np.array_equal(self.starts, other.starts) and np.array_equal(self.stops, other.stops))

    def __hash__(self) -> int:
        return hash((self.settings, self.epoch, self.rank, self.bounds))

    @property
    def n_windows(self) -> int:
        return len(self.bounds) - 1

    @property
    def n_rows(self) -> int:
        return self.window_offsets[-1]

    def window_rows(self, w: int) -> int:
        return self.window_offsets[w + 1] - self.window_offsets[w]

    def window_perm(self, w: int) -> "np.ndarray | None":
        """The order of window ``w``'s rows (positions in the window as read), or None when not shuffled."""
        if not self.settings.shuffle:
            return None
        return rng(self.settings.seed, self.epoch, _WINDOW, self.rank, w).permutation(self.window_rows(w))

    def locate(self, row: int) -> tuple[int, int]:
        """The window holding position ``row`` of the rank's delivered order, and the position within it."""
        w = min(bisect.bisect_right(self.window_offsets, row) - 1, self.n_windows)
        return w, row - self.window_offsets[w]

    def window_order(self, w: int) -> np.ndarray:
        """Source rows of window ``w`` in delivered order."""
        lo, hi = self.bounds[w], self.bounds[w + 1]
        rows = np.concatenate([np.arange(a, b) for a, b in zip(self.starts[lo:hi], self.stops[lo:hi])])
        perm = self.window_perm(w)
        return rows if perm is None else rows[perm]

    def order(self) -> np.ndarray:
        """Source rows in the order this rank delivers them (for tests and small datasets)."""
        if not len(self.starts):
            return np.empty(0, np.int64)
        return np.concatenate([self.window_order(w) for w in range(self.n_windows)])

    def batches(self) -> Iterator[np.ndarray]:
        """Source rows of each batch, in delivered order (for tests and small datasets)."""
        order, bs = self.order(), self.settings.batch_size
        for k in range(self.settings.n_batches):
            yield order[k * bs : (k + 1) * bs]


def consumed(settings: EpochSettings, epoch: int, n_batches: int) -> np.ndarray:
    """A mask of the epoch's positions that every rank's first ``n_batches`` batches deliver together."""
    mask = np.zeros(settings.n_rows, bool)
    for rank in range(settings.world_size):
        plan = settings.rank_epoch(epoch, rank)
        w, skip = plan.locate(min(n_batches * settings.batch_size, plan.n_rows))
        for piece in range(plan.bounds[min(w, plan.n_windows)]):  # whole windows: their pieces
            mask[plan.starts[piece] : plan.stops[piece]] = True
        if w < plan.n_windows and skip:
            mask[plan.window_order(w)[:skip]] = True
    return mask


def remaining_after(settings: EpochSettings, epoch: int, segments: "list[tuple[int, int]]") -> np.ndarray:
    """The epoch's positions not yet delivered after ``segments`` of ``(world_size, batches)`` (NOTE [elastic resume]).

    Each segment is planned over what the ones before it left, as
    :class:`EpochSettings` with that world size (blocks no larger than
    what is left); the result indexes the epoch's positions, sorted.
    """
    left = np.arange(settings.n_rows, dtype=np.int64)
    for world_size, n_batches in segments:
        if not len(left):
            break
        part = replace(settings, n_rows=len(left), block_size=min(settings.block_size, len(left)), world_size=world_size)
        left = left[~consumed(part, epoch, n_batches)]
    return left


def rest_of_epoch(
    settings: EpochSettings, epoch: int, segments: "list[tuple[int, int]]", rows: "np.ndarray | None"
) -> "tuple[EpochSettings | None, np.ndarray | None]":
    """How ``epoch`` is planned after ``segments`` (NOTE [elastic resume]; none: as ``settings`` say), and the file
    rows of its positions (``rows``' part of them; None: every row, in order); settings None when nothing is left."""
    if not segments:
        return settings, rows
    left = remaining_after(settings, epoch, segments)
    if not len(left):
        return None, None
    rest = replace(settings, n_rows=len(left), block_size=min(settings.block_size, len(left)))
    return rest, left if rows is None else rows[left]


def read_state(
    state: "dict[str, Any]", settings: EpochSettings, subset: Any
) -> "tuple[int, int, int, list[tuple[int, int]], int]":
    """``(epoch, batch, step, elastic segments, epochs_here)`` where a Batches' saved ``state`` goes on, at the world
    size of ``settings`` (an epoch whose rows were all delivered: the next); ``ValueError`` unless it was saved with
    the order of ``settings`` (and of ``subset``, its key) at any world size (NOTE [elastic resume]), or where its
    batch is beyond its epoch. ``epochs_here`` (0 in a state without it) does not touch the order."""
    missing = [k for k in ("epoch", "batch", *ORDER_KEYS) if k not in state]
    if missing:
        raise ValueError(f"not a state of Batches: missing {missing}")
    mine = {"subset": subset, **{key: getattr(settings, key) for key in ORDER_KEYS}}
    # A state saved at another world size goes on with what no rank delivered yet (NOTE [elastic resume]).
    keys = tuple(k for k in ORDER_KEYS if k != "world_size") + ("subset",)
    differ = [f"{k}={state.get(k)!r} (here {mine[k]!r})" for k in keys if state.get(k) != mine[k]]
    if differ:
        raise ValueError("the state was saved with a different order: " + ", ".join(differ))
    epoch = check_int("epoch", state["epoch"], 0, allow_none=False)
    batch = check_int("batch", state["batch"], 0, allow_none=False)
    world = check_int("world_size", state["world_size"], 1, allow_none=False)
    assert epoch is not None and batch is not None and world is not None
    # A state without a step (written by hand): the one it would have recorded.
    saved_batches = replace(settings, world_size=world).n_batches
    step = check_int("step", state.get("step", epoch * saved_batches + batch), 0, allow_none=False)
    assert step is not None
    elastic = [(int(w), int(b)) for w, b in state.get("elastic", [])]
    for w, b in elastic:  # each a part of the epoch run at world size w, b batches in
        if w < 1 or not 0 <= b <= replace(settings, world_size=w).n_batches:
            raise ValueError(f"elastic segment {[w, b]} is not a part of an epoch: {b} batches at world_size={w}, "
                             f"of {replace(settings, world_size=max(w, 1)).n_batches}")
    epochs_here = check_int("epochs_here", state.get("epochs_here", 0), 0, allow_none=False)
    assert epochs_here is not None
    if world != settings.world_size:  # the rest of the epoch, shared among this world's ranks
        elastic, batch = elastic + [(world, batch)], 0
    rest, _ = rest_of_epoch(settings, epoch, elastic, None)
    if rest is None or batch == rest.n_batches:  # every row of the epoch was delivered: on to the next
        return epoch + 1, 0, step, [], epochs_here
    if batch > rest.n_batches:
        raise ValueError(f"batch={batch} is beyond the {rest.n_batches} batches of that epoch")
    return epoch, batch, step, elastic, epochs_here
