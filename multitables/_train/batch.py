"""What a batch is: one array, a tuple of arrays (one per path), or a dict of a table's columns.

A :class:`~multitables.Batches` is generic in the kind it yields, so that a
user's type checker knows ``for x, y in stream.get_batches(["/x", "/y"], 32)``
gives arrays: :data:`BatchT` is that kind, and the overloads of
``Batches.__init__`` (and of ``get_batches``) pick it from the arguments.
"""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Any, Callable, Sequence, Union

import numpy as np

from .._io.fields import select_field

#: A batch: one array per dataset (a single one when one path was given), or a dict of columns with ``fields``.
Batch = Union[np.ndarray, tuple[np.ndarray, ...], dict[str, np.ndarray]]

# The kind of batch a Batches (or a mix of them) yields. Its default makes a bare ``Batches`` in an annotation mean
# ``Batches[Batch]``; typing's TypeVar takes a default from Python 3.13, typing_extensions' is for type checkers only.
if TYPE_CHECKING:
    from typing_extensions import TypeVar

    BatchT = TypeVar("BatchT", covariant=True, default=Batch)
else:
    from typing import TypeVar

    BatchT = TypeVar("BatchT", covariant=True)


def as_batch(arrays: Sequence[np.ndarray], single: bool, columns: "list[str] | None") -> Batch:
    """A batch as the caller asked for it: one array (``single``), a tuple of them, or a dict of ``columns``."""
    if columns is not None:
        # Each column memory of its own: a copy, as ascontiguousarray keeps a one-row view's strides (torch refuses).
        return {name: select_field(arrays[0], name).copy() for name in columns}
    return arrays[0] if single else tuple(arrays)


def batch_maker(
    single: bool, columns: "list[str] | None", convert: "Callable[[Any], Any] | None" = None
) -> "Callable[[list[np.ndarray]], Any]":
    """What makes each batch of its arrays in the batches' own loop: :func:`as_batch` with these settings, then
    ``convert`` (the caller's kind of batch: tensors), so a batch is whole before it is counted (NOTE [delivered
    batches] in ``_train.iteration``). Without columns or ``convert`` it is a C call, no frame of its own."""
    if columns is not None:
        make: "Callable[[list[np.ndarray]], Any]" = functools.partial(as_batch, single=single, columns=columns)
    else:
        make = operator.itemgetter(0) if single else tuple
    if convert is None:
        return make
    return lambda arrays: convert(make(arrays))


#: ``DataLoader`` keywords ``get_batches`` does not take, each with what does its work here (docs/training.rst, "Coming
#: from DataLoader"): code moved over keyword by keyword is told where each one went, not only that it is unknown.
_DATALOADER_KEYWORDS = {
    "num_workers": "the rows are read in multitables' own reader processes: n_procs= (default: the CPUs this process "
                   "may use)",
    "persistent_workers": "the readers live from epoch to epoch already; leave it out",
    "prefetch_factor": "read_ahead= (blocks read ahead per reader)",
    "sampler": "shuffle= and seed= order the rows, rank= and world_size= share them (DistributedSampler), indices= "
               "picks some (SubsetRandomSampler), weights= and num_samples= draw them (WeightedRandomSampler)",
    "batch_sampler": "batch_size=, shuffle=, drop_last=, rank= and world_size= make the batches",
    "generator": "seed= (an int: the order depends on (seed, epoch) alone)",
    "collate_fn": "each batch is made already (a tuple of one array per path); per-row work goes in transform= (run "
                  "in the readers), the rest in your loop",
    "worker_init_fn": "no reader runs your code but transform=; set up what it needs lazily, in the transform's module",
    "pin_memory": "multitables.torch.get_batches(..., pin_memory=True), or TorchBatches(batches, pin_memory=True)",
    "multiprocessing_context": "Streamer(..., start_method=...)",
    "timeout": "a reader that stops is reported by itself (docs/failures.rst); leave it out",
}


def refuse_dataloader_keywords(kwargs: "dict[str, Any]") -> None:
    """Raise ``TypeError`` for a ``DataLoader`` keyword in ``kwargs`` (``get_batches``' keywords), saying what takes
    its place."""
    found = [name for name in kwargs if name in _DATALOADER_KEYWORDS]
    if found:
        told = "; ".join(f"{name}: {_DATALOADER_KEYWORDS[name]}" for name in found)
        raise TypeError(f"get_batches() takes no {', '.join(found)} (DataLoader's keywords). {told}. "
                        f"Each DataLoader option's place: (docs/training.rst, 'Coming from DataLoader')")
