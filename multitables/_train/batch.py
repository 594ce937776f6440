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
