"""The iteration in progress over training batches, which a newer iteration of the same batches ends."""

from __future__ import annotations

import itertools
import os
import sys
import weakref
from typing import Any, Callable, Iterator, TypeVar


#: What :meth:`Current.end` is told when a newer iteration of the same batches ends the one in progress.
NEWER = "a newer iteration"

_Closes = TypeVar("_Closes", bound="Closing")


class Closing:
    """``with`` closes what iterates batches at its end (``close()``: readers, buffers, threads), as a Queue's and a
    Reader's ``with`` do."""

    def __enter__(self: _Closes) -> _Closes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # type: ignore[attr-defined]  # a mixin's: its class's close()


class Iteration(itertools.chain[Any]):  # of batches, whatever their kind
    """The batches of one iteration, until it ends or a newer iteration ends it (``ended_by``).

    A :class:`~multitables.batches.Batches` has one position, which every
    iteration goes on from; a second ``iter()`` takes it over. The older
    iteration then raises rather than stop as if the epoch were over: a loop
    nested in a loop over the same batches (each ``iter()`` of a
    ``DataLoader`` is a pass of its own) would otherwise end the outer loop
    without a word.

    NOTE [delivered batches]: the loop steps a chain (C) over the batches'
    generator itself, then :class:`_End`, which raises that error once the
    generator stopped, if something ended it. No Python frame of ours lies
    between the loop and the generator, which counts a batch delivered with
    no call between the count and its ``yield``: a signal's handler runs
    between two instructions, at a call or a loop's jump, so a handler that
    saves ``state_dict()`` counts the batch being delivered or not, as the
    loop gets it or not, and one that raises (a preemption's ``sys.exit``,
    Ctrl-C) never leaves a batch counted that the loop did not get. Nor does
    such a frame stay in the traceback the user handles, holding the batches
    and their readers.

    NOTE [closed mid-step]: a signal's handler may run in the middle of a
    step (the generator making a batch) and close the batches (a SIGTERM
    handler's clean-up). Closing the generator then would fail ("generator
    already executing"), and freeing the readers' memory, the windows or the
    copier's threads under the step would pull them from under its frames.
    So that close only marks the batches closing (:meth:`Current.close_after_step`)
    and returns: the step, at its next look at the mark (a batch made, not
    yet counted; between epochs), returns without counting it, and the chain
    steps :class:`_End`, which closes them, the generator's frames gone.
    The loop ends as after a close between steps, and the position counts
    the batches it got. A handler that raises after its close goes through
    the step's clean-up instead, which closes all of it there.
    """

    __slots__ = ("_it", "_end", "__weakref__")
    _it: Iterator[Any]
    _end: "_End"

    @classmethod
    def over(cls, it: Iterator[Any]) -> "Iteration":
        end = _End()
        iteration = cls(it, end)
        iteration._it, iteration._end = it, end
        return iteration

    @property
    def running(self) -> bool:
        """Whether a step is under way: what runs now was called from inside it (a signal's handler)."""
        return bool(self._it.gi_running)  # type: ignore[attr-defined]  # a generator, typed Iterator where made

    def after_step(self, then: "Callable[[], None]") -> None:
        """Call ``then`` once the generator, in the middle of a step, has ended (NOTE [closed mid-step])."""
        self._end.then = then

    @property
    def ended_by(self) -> "str | None":
        """What ended this iteration while it ran, which its next step then names (None: it was not)."""
        return self._end.ended_by

    @ended_by.setter
    def ended_by(self, value: "str | None") -> None:
        self._end.ended_by = value

    def close(self) -> None:
        self._it.close()  # type: ignore[attr-defined]  # a generator, as above


class _End:
    """What :class:`Iteration`'s chain steps once the batches' generator stopped: nothing more, or, where
    something ended the iteration, a ``RuntimeError`` naming it (the loop would otherwise end as at the epoch's end)."""

    __slots__ = ("ended_by", "then")

    def __init__(self) -> None:
        self.ended_by: "str | None" = None
        self.then: "Callable[[], None] | None" = None  # a close asked for in the middle of a step

    def __next__(self) -> Any:
        if self.then is not None:  # NOTE [closed mid-step]: the generator has ended; close now
            then, self.then = self.then, None
            then()
        return self._stop()

    def __iter__(self) -> "_End":
        return self

    def _stop(self) -> Any:
        if self.ended_by == NEWER:
            raise RuntimeError(
                "this iteration over the batches was ended by a newer one: a Batches has one position, which each "
                "iteration takes over, so iterate it in one loop at a time (get_batches again for another pass)"
            )
        if self.ended_by is not None:  # its loop would end early, as if the epoch were over
            raise RuntimeError(
                f"this iteration over the batches was ended by {self.ended_by}, which moved the position it goes on "
                f"from: move it between loops (set_epoch at the top of the epoch loop, load_state_dict before the "
                f"first), or break out of the loop first"
            )
        raise StopIteration


class Current:
    """The iteration in progress over one Batches, if any, held weakly.

    The iteration holds the batches (its frame's ``self``): a reference back
    would be a cycle that only the cycle collector frees, the readers running
    until then.
    """

    __slots__ = ("_ref", "_made_in")

    def __init__(self) -> None:
        self._ref: "weakref.ref[Iteration] | None" = None
        self._made_in = os.getpid()

    def start(self, it: Iterator[Any]) -> Iteration:
        """``it``'s batches as the iteration in progress (:meth:`end` the one before first).

        ``RuntimeError`` in one of several DataLoader workers that iterates a copy of batches made in another
        process: every worker would give every row (a user's ``IterableDataset`` over them, ``num_workers=2``).
        """
        if os.getpid() != self._made_in:
            _refuse_copies_in_workers(self._made_in)
        iteration = Iteration.over(it)
        self._ref = weakref.ref(iteration)
        return iteration

    def end(self, by: "str | None" = None) -> None:
        """End the iteration in progress, if any; ``by``: what moved its position (:data:`NEWER`, a newer
        iteration; ``"set_epoch(3)"``...), which its next ``next`` then names in a ``RuntimeError`` (None: it stops,
        as at its end: a close)."""
        active = None if self._ref is None else self._ref()
        self._ref = None
        if active is not None:
            active.ended_by = by
            active.close()

    def close_after_step(self, then: "Callable[[], None]") -> bool:
        """Where the iteration in progress is in the middle of a step (a signal's handler called this), have it call
        ``then`` once it has ended, and say so (NOTE [closed mid-step]); False: it is not."""
        active = None if self._ref is None else self._ref()
        if active is None or not active.running:
            return False
        active.after_step(then)
        return True


def run_epochs(epochs: "int | None", epoch: "Callable[[bool], Iterator[Any]]", closing: "Callable[[], bool]",
               failed: "Callable[[], None]") -> Iterator[Any]:
    """``epochs`` epochs (None: endless) from the current position, each the batches of ``epoch(more)`` (``more``:
    another follows, to read ahead into), until a close asked for in the middle of a step (``closing()``, NOTE
    [closed mid-step]); ``failed()`` cleans up after an error between two epochs (Ctrl-C), as within one."""
    done = 0
    try:
        while (epochs is None or done < epochs) and not closing():
            # The last epoch of the run has no next one to read ahead (a loop of iterations may, so one epoch does).
            yield from epoch(epochs is None or done + 1 < epochs)
            done += 1
    except GeneratorExit:
        raise  # the loop was left: the readers stay for the next iteration
    except BaseException:
        failed()
        raise


def _refuse_copies_in_workers(made_in: int) -> None:
    data = sys.modules.get("torch.utils.data")  # a DataLoader's worker has imported it
    info = None if data is None else data.get_worker_info()
    if info is None or info.num_workers < 2:
        return  # a fork of its own goes on with its copy (NOTE [forked children]); one worker gives each row once
    raise RuntimeError(
        f"these batches were made in process {made_in} and are iterated by a copy of them in DataLoader worker "
        f"{info.id} of {info.num_workers}: every worker would give every row, {info.num_workers} times each. Iterate "
        f"them in the main process (num_workers=0: the readers are the parallel work; multitables.torch.get_batches "
        f"wraps them for a DataLoader), or make them in each worker with rank=info.id and world_size=info.num_workers "
        f"(torch.utils.data.get_worker_info())"
    )
