"""Batches from several sources in given proportions: a seeded schedule picks the source of each batch.

NOTE [mixing]
    Each step takes its whole batch from one source, drawn with the given
    proportions from a generator of ``(seed, step // SCHEDULE_STEPS)``, as
    tf.data's ``sample_from_datasets`` does batch by batch. The schedule is a
    function of the seed and the step alone, never of the machine or of
    ``n_procs``, and every source keeps its own position (its own epochs,
    shuffled by its own seed), so a position is the step and the sources'
    positions: a resumed run draws the same sources from the same step on.
    A source that ends an epoch goes on with its next one; a mix has no
    epochs of its own.

    With ``per="row"`` each batch holds rows of every source instead, as
    MosaicML streaming's batches and ``sample_from_datasets`` over rows do:
    each step's count of rows from each source is a multinomial draw of the
    batch size with the proportions, from a generator of ``(seed, step //
    SCHEDULE_STEPS)``, and the rows are interleaved in an order drawn from
    ``(seed, step)``. Rows are taken from each source's batches in turn, so
    a source batch may be split between two steps; a position then also
    holds, per source, where its held batch began and how many of its rows
    were taken, and a resumed run reads that batch again and skips them.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, Sequence, cast

import numpy as np

from .._plan.epoch import rng
from .._sys.checks import check_int
from .batch import BatchT
from .iteration import Closing
from .resume import check_identity

if TYPE_CHECKING:
    from ..batches import Batches  # bound at run time: NOTE [annotations from above] in ``multitables/__init__.py``

#: Steps whose sources are drawn at once (one generator each): the unit of the schedule.
SCHEDULE_STEPS = 1024
#: Spawn-key tags of the schedule, the rows' counts and their order, apart from the epoch plan's and the weighted draws' (0, 1, 2).
_MIX, _MIX_ROWS, _MIX_ORDER = 3, 4, 5
#: How a mix takes from its sources: whole batches, or rows of every source in each batch.
PER = ("batch", "row")
#: Why training batches (and a mix of them) are neither pickled nor copied, with what to do instead.
NOT_COPIED = ("a {} holds reader processes, shared memory and one position, so it is neither pickled nor copied: "
              "save its position with state_dict() and load_state_dict() it into batches made anew (get_batches "
              "again for a second, independent one)")


def row_counts(proportions: np.ndarray, batch_size: int, seed: int, step: int) -> np.ndarray:
    """How many of step ``step``'s ``batch_size`` rows come from each source: a function of its arguments alone."""
    block, offset = divmod(step, SCHEDULE_STEPS)
    return rng(seed, block, _MIX_ROWS).multinomial(batch_size, proportions, size=SCHEDULE_STEPS)[offset]


def schedule(proportions: np.ndarray, seed: int, first: int, n: int) -> np.ndarray:
    """The source of each step ``first .. first + n - 1``: a pure function of the proportions, seed and step."""
    out = np.empty(n, np.int64)
    step = first
    while step < first + n:
        block, offset = divmod(step, SCHEDULE_STEPS)
        drawn = rng(seed, block, _MIX).choice(len(proportions), size=SCHEDULE_STEPS, p=proportions)
        take = min(SCHEDULE_STEPS - offset, first + n - step)
        out[step - first : step - first + take] = drawn[offset : offset + take]
        step += take
    return out


class MixedBatches(Closing, Generic[BatchT]):
    """Batches drawn from several :class:`~multitables.batches.Batches` in given proportions (NOTE [mixing]).

    Get one with :func:`multitables.mix_batches`. Iterating is endless (stop
    the loop when you like, or give ``steps``): each batch is the next batch
    of the source the schedule picks for that step, as that source gives it
    (its arrays, tuple or dict). :meth:`state_dict` and
    :meth:`load_state_dict` save and restore the step and every source's
    position.
    """

    def __init__(
        self, sources: "Sequence[Batches[BatchT]]", proportions: Sequence[float], seed: int = 0, steps: "int | None" = None,
        per: str = "batch",
    ) -> None:
        self._sources = list(sources)
        if len(self._sources) < 2:
            raise ValueError("mix_batches needs at least two sources")
        seen: "dict[int, int]" = {}
        for i, source in enumerate(self._sources):
            if seen.setdefault(id(source), i) != i:  # one position, taken from by two schedules
                raise ValueError(f"sources {seen[id(source)]} and {i} are the same Batches; give it once, with the "
                                 f"sum of their proportions (or make a second Batches over the same files)")
        if per not in PER:
            raise ValueError(f"per={per!r} is not one of {PER}")
        self._per = per
        sizes = {source.batch_size for source in self._sources}
        if per == "row" and len(sizes) > 1:
            raise ValueError(f"per='row' mixes rows into batches of one size; the sources' batch sizes differ: {sorted(sizes)}")
        if per == "row":  # rows of one kind, known now: refused before any reader starts
            kinds = {tuple((np.dtype(d), tuple(shape)) for d, shape in source.row_types) for source in self._sources}
            if len(kinds) > 1:
                listed = "; ".join(sorted(", ".join(f"{d} rows of shape {shape}" for d, shape in k) for k in kinds))
                raise TypeError(f"per='row' mixes rows of one kind; the sources' rows differ: {listed}")
        self._batch_size = sizes.pop() if len(sizes) == 1 else 0
        # per="row": each source's batch being taken from, its position before it, and rows taken of it.
        self._held: "list[tuple[dict[str, Any], Any, int] | None]" = [None] * len(self._sources)
        self._skip = [0] * len(self._sources)  # rows of the next batch already delivered (after a load)
        p = np.asarray(proportions, dtype=np.float64)
        if p.shape != (len(self._sources),):
            raise ValueError(f"give one proportion per source ({len(self._sources)}), not {list(proportions)}")
        if not np.isfinite(p).all() or (p < 0).any() or not p.any():
            raise ValueError(f"proportions must be finite, not negative and not all 0: {list(proportions)}")
        self._proportions = p / p.sum()
        self._seed = check_int("seed", seed, 0, allow_none=False)
        self._steps = check_int("steps", steps, 1)
        self._step = 0
        self._iters: "list[Iterator[Any] | None]" = [None] * len(self._sources)
        self._running: "weakref.ref[Iterator[Any]] | None" = None  # the last iteration's generator
        self._closing = False  # close() was called in the middle of a step: NOTE [closed mid-step] in .iteration

    @property
    def sources(self) -> "tuple[Batches[BatchT], ...]":
        """The batches mixed, in the order of :attr:`proportions`."""
        return tuple(self._sources)

    @property
    def proportions(self) -> list[float]:
        """Each source's proportion of the steps (normalised)."""
        return self._proportions.tolist()

    @property
    def steps(self) -> "int | None":
        """Steps a pass over the mix gives, or None when it is endless."""
        return self._steps

    @property
    def step(self) -> int:
        """Batches delivered so far."""
        return self._step

    def _next_of(self, i: int, convert: "Callable[[Any], Any] | None" = None) -> BatchT:
        """Source ``i``'s next batch (made ``convert(batch)`` before it counts); at the end of its epoch, the first of
        its next. ``_Closed`` where a close came in the middle of the step."""
        for _ in range(2):
            it = self._iters[i]
            if it is None:
                if self._closing:
                    raise _Closed
                it = self._iters[i] = self._sources[i].iter_into(convert=convert)
            try:
                return next(it)
            except StopIteration:
                self._iters[i] = None  # its position has moved to the next epoch
        raise RuntimeError(f"source {i} gives no batch in an epoch")  # pragma: no cover - Batches always gives one

    @property
    def per(self) -> str:
        """How a batch is made, ``"batch"`` (whole, from one source) or ``"row"`` (of rows of every source)."""
        return self._per

    def _rows_of(self, i: int, n: int) -> "list[Any]":
        """The next ``n`` rows of source ``i``, as pieces of its batches."""
        pieces = []
        while n > 0:
            held = self._held[i]
            if held is None or held[2] == _length(held[1]):
                before = self._sources[i].state_dict()
                batch = self._next_of(i)
                held = (before, batch, self._skip[i])
                self._skip[i] = 0
            before, batch, used = held
            take = min(n, _length(batch) - used)
            if take:
                pieces.append(_rows(batch, used, used + take))
            self._held[i] = (before, batch, used + take)
            n -= take
        return pieces

    def _mixed(self, step: int) -> BatchT:
        counts = row_counts(self._proportions, self._batch_size, self._seed, step)
        pieces = [piece for i, n in enumerate(counts.tolist()) for piece in self._rows_of(i, n)]
        order = rng(self._seed, step, _MIX_ORDER).permutation(self._batch_size)
        return cast(BatchT, _join(pieces, order))

    def __iter__(self) -> Iterator[BatchT]:
        """The batches from the current step on; leaving the loop early (``break``) keeps the position, and every
        source's readers wait, idle, for the next iteration (as a source's own do): :meth:`close` stops them."""
        return self.iter_as()

    def iter_as(self, convert: "Callable[[Any], Any] | None" = None) -> Iterator[Any]:
        """As ``iter(mix)``, each batch given as ``convert(batch)`` (tensors, say), made before it counts as delivered
        (NOTE [delivered batches] in ``multitables._train.iteration``; per batch, by the source that makes it)."""
        it = self._steps_on(convert)
        self._running = weakref.ref(it)
        return it

    def _steps_on(self, convert: "Callable[[Any], Any] | None") -> Iterator[Any]:
        self._closing = False
        try:
            if self._per == "row":
                while self._steps is None or self._step < self._steps:
                    batch = self._mixed(self._step)
                    if convert is not None:
                        batch = convert(batch)
                    if self._closing:  # NOTE [closed mid-step]
                        return
                    self._step += 1
                    yield batch
                return
            while self._steps is None or self._step < self._steps:
                first = self._step
                n = SCHEDULE_STEPS if self._steps is None else min(SCHEDULE_STEPS, self._steps - first)
                for i in schedule(self._proportions, self._seed, first, n).tolist():
                    batch = self._next_of(i, convert)
                    if self._closing:
                        return
                    self._step += 1
                    yield batch
        except _Closed:
            return
        finally:
            self._end_iteration()
            if self._closing:  # a close came in the middle of a step: the sources close now, none in a step
                self._closing = False
                for source in self._sources:
                    source.close()

    def state_dict(self) -> dict[str, Any]:
        """The step, what fixes the schedule, and every source's position; small, picklable, JSON-able."""
        state = {"step": self._step, "seed": self._seed, "proportions": self.proportions}
        if self._per == "batch":
            return {**state, "sources": [source.state_dict() for source in self._sources]}
        # A source batch partly taken: where it began, and how many of its rows were taken.
        sources = [held[0] if held else source.state_dict() for held, source in zip(self._held, self._sources)]
        taken = [held[2] if held else skip for held, skip in zip(self._held, self._skip)]
        return {**state, "per": "row", "sources": sources, "taken": taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go to the position of ``state``; ``ValueError`` if it was saved with another schedule or other sources, or on
        other data (NOTE [resumed data] in ``_train.resume``), before any source moves."""
        self.check_state_dict(state)
        skip = [int(n) for n in state["taken"]] if self._per == "row" else [0] * len(self._sources)
        step = int(state["step"])
        for source, saved in zip(self._sources, state["sources"]):
            source.load_state_dict(saved)
        self._iters = [None] * len(self._sources)
        self._held = [None] * len(self._sources)
        self._skip, self._step = skip, step

    def check_state_dict(self, state: dict[str, Any]) -> None:
        """Raise the ``ValueError`` :meth:`load_state_dict` would raise on ``state``, moving nothing."""
        if state.get("seed") != self._seed or not np.allclose(state.get("proportions", []), self._proportions) \
                or len(state.get("sources", [])) != len(self._sources) or state.get("per", "batch") != self._per:  # fmt: skip
            raise ValueError(
                f"the state was saved for another mix (seed {state.get('seed')!r}, proportions "
                f"{state.get('proportions')!r}, {len(state.get('sources', []))} sources, per={state.get('per', 'batch')!r})"
            )
        # Every source's state checked before any source moves (as NOTE [resumed data] asks of one source).
        for i, (source, saved) in enumerate(zip(self._sources, state["sources"])):
            _check(i, source, saved)

    def __reduce__(self) -> Any:
        raise TypeError(NOT_COPIED.format(type(self).__name__))

    def close(self) -> None:
        """Stop every source's readers and free their buffers (the positions stay). From a signal's handler in the
        middle of a step, the loop ends at that step and closes then (NOTE [closed mid-step])."""
        running = None if self._running is None else self._running()
        if running is not None and running.gi_running:  # type: ignore[attr-defined]  # _steps_on's generator
            self._closing = True
            for source in self._sources:  # one in its step ends it uncounted (and closes then); the rest close now
                source.close()
            return
        self._closing = False
        self._end_iteration()
        for source in self._sources:
            source.close()

    def _end_iteration(self) -> None:
        """Stop the sources' iterations, their readers with them; the next iteration goes on from the same step."""
        if self._per == "row":  # the held batches are read again from where they began
            self._skip = [held[2] if held else skip for held, skip in zip(self._held, self._skip)]
            for i, held in enumerate(self._held):
                if held is not None:
                    self._sources[i].load_state_dict(held[0])
            self._held = [None] * len(self._sources)
        iters, self._iters = self._iters, [None] * len(self._sources)
        for it in iters:
            if it is not None:
                it.close()  # type: ignore[attr-defined]  # a source's generator

    def __repr__(self) -> str:
        shares = ", ".join(f"{p:.3g}" for p in self._proportions)
        return f"<multitables.MixedBatches of {len(self._sources)} sources ({shares}, per {self._per}) at step {self._step}>"


def _check(i: int, source: "Batches[Any]", saved: Any) -> None:
    """``ValueError`` naming source ``i`` where it may not load its ``saved`` state; moves nothing."""
    check_identity(saved.get("identity"), source.state_dict()["identity"], f"source {i}")
    try:
        source.check_state_dict(saved)
    except ValueError as e:
        raise ValueError(f"source {i} refuses its state: {e}") from e


class _Closed(Exception):
    """A source's iteration ended by a close in the middle of a step (NOTE [closed mid-step])."""


def _length(batch: Any) -> int:
    if isinstance(batch, dict):
        return len(next(iter(batch.values())))
    return len(batch) if isinstance(batch, np.ndarray) else len(batch[0])


def _rows(batch: Any, a: int, b: int) -> Any:
    """Rows ``a..b`` of a batch (an array, a tuple of arrays or a dict of columns), as views."""
    if isinstance(batch, dict):
        return {name: array[a:b] for name, array in batch.items()}
    if isinstance(batch, np.ndarray):
        return batch[a:b]
    return tuple(array[a:b] for array in batch)


def _join(pieces: "list[Any]", order: np.ndarray) -> Any:
    """The pieces' rows in one batch of the same kind, row ``k`` the ``order[k]``-th of the pieces' rows; fresh arrays."""

    def one(arrays: "list[np.ndarray]", what: str) -> np.ndarray:
        kinds = {(a.dtype, a.shape[1:]) for a in arrays}
        if len(kinds) > 1:
            listed = ", ".join(sorted(f"{dt} rows of shape {shape}" for dt, shape in kinds))
            raise TypeError(f"per='row' mixes rows of one kind; the sources' {what} differ: {listed}")
        return np.concatenate(arrays)[order]

    first = pieces[0]
    if isinstance(first, dict):
        return {name: one([p[name] for p in pieces], f"columns {name!r}") for name in first}
    if isinstance(first, np.ndarray):
        return one(pieces, "batches")
    return tuple(one([p[k] for p in pieces], f"arrays #{k}") for k in range(len(first)))


def mix_batches(
    sources: "Sequence[Batches[BatchT]]", proportions: Sequence[float], *, seed: int = 0, steps: "int | None" = None,
    per: str = "batch",
) -> "MixedBatches[BatchT]":
    """Batches from several sources in ``proportions``, drawn by a seeded schedule.

    ``sources``: :class:`Batches` (of any files and datasets; each keeps its
    own epochs, shuffle and position). ``per="batch"``: each step's batch
    comes whole from one source. ``per="row"``: each batch holds rows of
    every source, about ``proportions`` of them, interleaved (the sources
    must have one batch size, and rows of one dtype and shape). The schedule
    depends on ``seed`` and the step only, not on ``n_procs``; iteration is
    endless unless ``steps`` is given. See
    :class:`~multitables.MixedBatches` and NOTE [mixing] in
    ``multitables._train.mix``.
    """
    return MixedBatches(sources, proportions, seed=seed, steps=steps, per=per)
