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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from .._plan.epoch import rng
from .checks import check_int

if TYPE_CHECKING:
    from ..batches import Batch, Batches

#: Steps whose sources are drawn at once (one generator each): the unit of the schedule.
SCHEDULE_STEPS = 1024
#: Spawn-key tag of the schedule, apart from the epoch plan's and the weighted draws' (0, 1, 2).
_MIX = 3


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


class MixedBatches:
    """Batches drawn from several :class:`~multitables.batches.Batches` in given proportions (NOTE [mixing]).

    Get one with :func:`multitables.mix_batches`. Iterating is endless (stop
    the loop when you like, or give ``steps``): each batch is the next batch
    of the source the schedule picks for that step, as that source gives it
    (its arrays, tuple or dict). :meth:`state_dict` and
    :meth:`load_state_dict` save and restore the step and every source's
    position.
    """

    def __init__(self, sources: "Sequence[Batches]", proportions: Sequence[float], seed: int = 0, steps: "int | None" = None) -> None:
        self._sources = list(sources)
        if len(self._sources) < 2:
            raise ValueError("mix_batches needs at least two sources")
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

    @property
    def sources(self) -> "tuple[Batches, ...]":
        """The batches mixed, in the order of :attr:`proportions`."""
        return tuple(self._sources)

    @property
    def proportions(self) -> list[float]:
        """Each source's share of the steps (normalised)."""
        return self._proportions.tolist()

    @property
    def steps(self) -> "int | None":
        """Steps a pass over the mix gives (None: endless)."""
        return self._steps

    @property
    def step(self) -> int:
        """Batches delivered so far."""
        return self._step

    def _next_of(self, i: int) -> "Batch":
        """Source ``i``'s next batch; at the end of its epoch, the first of its next."""
        for _ in range(2):
            it = self._iters[i]
            if it is None:
                it = self._iters[i] = iter(self._sources[i])
            try:
                return next(it)
            except StopIteration:
                self._iters[i] = None  # its position has moved to the next epoch
        raise RuntimeError(f"source {i} gives no batch in an epoch")  # pragma: no cover - Batches always gives one

    def __iter__(self) -> "Iterator[Batch]":
        while self._steps is None or self._step < self._steps:
            first = self._step
            n = SCHEDULE_STEPS if self._steps is None else min(SCHEDULE_STEPS, self._steps - first)
            for i in schedule(self._proportions, self._seed, first, n).tolist():
                batch = self._next_of(i)
                self._step += 1
                yield batch

    def state_dict(self) -> dict[str, Any]:
        """The step, what fixes the schedule, and every source's position; small, picklable, JSON-able."""
        return {
            "step": self._step,
            "seed": self._seed,
            "proportions": self.proportions,
            "sources": [source.state_dict() for source in self._sources],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go to the position of ``state``; ``ValueError`` if it was saved with another schedule or other sources."""
        if state.get("seed") != self._seed or not np.allclose(state.get("proportions", []), self._proportions) \
                or len(state.get("sources", [])) != len(self._sources):  # fmt: skip
            raise ValueError(
                f"the state was saved for another mix (seed {state.get('seed')!r}, proportions "
                f"{state.get('proportions')!r}, {len(state.get('sources', []))} sources)"
            )
        for source, saved in zip(self._sources, state["sources"]):
            source.load_state_dict(saved)
        self._iters = [None] * len(self._sources)
        self._step = int(state["step"])

    def close(self) -> None:
        """Stop every source's readers (the positions stay)."""
        self._iters = [None] * len(self._sources)
        for source in self._sources:
            source.close()

    def __repr__(self) -> str:
        shares = ", ".join(f"{p:.3g}" for p in self._proportions)
        return f"<MixedBatches of {len(self._sources)} sources ({shares}) at step {self._step}>"


def mix_batches(
    sources: "Sequence[Batches]", proportions: Sequence[float], *, seed: int = 0, steps: "int | None" = None
) -> "MixedBatches":
    """Batches from several sources in ``proportions``: each step's batch comes from one source, drawn by a seeded schedule.

    ``sources``: :class:`Batches` (of any files and datasets; each keeps its
    own epochs, shuffle and position). The schedule depends on ``seed`` and
    the step only, not on ``n_procs``; iteration is endless unless ``steps``
    is given. See :class:`~multitables.batches.MixedBatches` and NOTE
    [mixing] in ``multitables._api.mix``.
    """
    return MixedBatches(sources, proportions, seed=seed, steps=steps)
