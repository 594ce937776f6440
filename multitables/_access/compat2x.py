"""The established (2.x) API's names: which request class a request would have been, and its modules.

Code written for multitables 2.x checks requests with ``isinstance`` against
the classes of ``multitables.dataset_ops`` (``ReadOpTable``, ``CoordOp``...),
datasets against ``multitables.dataset.TableDataset`` and futures against
``multitables.request.Request``. Here there is one :class:`~multitables.Request`
class and one :class:`~multitables.Dataset` class; each request records the
name of the 2.x class that would have made it (``Request._op``, from
:func:`first_op` and :func:`next_op`, 2.x's rules), and the 2.x classes are
stand-ins whose ``isinstance`` asks that name. :func:`install` makes the 2.x
module names resolve (``import multitables.dataset_ops`` included).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np

# Each 2.x request class, and the 2.x classes it derived from.
_OP_BASES: dict[str, tuple[str, ...]] = {
    "OpBase": (),
    "IndexOp": ("OpBase",),
    "ColOp": ("OpBase",),
    "ReadOpBase": ("OpBase",),
    "ReadOpTable": ("ReadOpBase",),
    "ReadOpArray": ("ReadOpBase",),
    "ReadScalarOpBase": ("ReadOpBase",),
    "ReadScalarOpTable": ("ReadScalarOpBase", "ReadOpTable"),
    "ReadScalarOpArray": ("ReadScalarOpBase", "ReadOpArray"),
    "JoinedSlicesOp": ("OpBase",),
    "CoordOp": ("OpBase",),
    "SortOp": ("OpBase",),
    "WhereOp": ("OpBase",),
}


def _is_a(op: str, name: str) -> bool:
    return op == name or any(_is_a(base, name) for base in _OP_BASES.get(op, ()))


def _simple_slice(key: Any) -> bool:
    # 2.x: a tuple led by a slice, the rest Ellipsis (its test for ':' never matched).
    return isinstance(key, tuple) and len(key) > 0 and isinstance(key[0], slice) and all(k is Ellipsis for k in key[1:])


def _coords(key: Any) -> bool:
    return isinstance(key, list) or (isinstance(key, np.ndarray) and np.issubdtype(key.dtype, np.integer))


def first_op(table: bool, key: Any) -> str:
    """The 2.x class of ``dataset[key]`` (``key`` not a column name)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return "ReadScalarOpTable" if table else "ReadScalarOpArray"
    if isinstance(key, slice) or _simple_slice(key):
        return "ReadOpTable" if table else "ReadOpArray"
    if table and _coords(key):
        return "CoordOp"
    return "IndexOp"


def next_op(op: str, key: Any, no_column: bool) -> str:
    """The 2.x class of ``request[key]`` for a request of class ``op`` (``no_column``: it reads no column yet)."""
    if op == "ColOp" and not isinstance(key, str):
        if isinstance(key, int) and not isinstance(key, bool):
            return "ReadScalarOpTable"
        if isinstance(key, slice) or _simple_slice(key):
            return "ReadOpTable"
        if _coords(key):
            return "CoordOp"
    return op


#: The package's Request and Dataset classes, bound by install() (this module sits below them).
_BOUND: dict[str, type] = {}


class _OpMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _BOUND["Request"]) and _is_a(getattr(obj, "_op"), cls.__name__)  # a Request bound at run time

    def __subclasscheck__(cls, sub: Any) -> bool:
        return isinstance(sub, type) and issubclass(sub, _OpMeta) and _is_a(sub.__name__, cls.__name__)


class _DatasetMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        want = cls.__dict__.get("_table")
        return isinstance(obj, _BOUND["Dataset"]) and (want is None or getattr(obj, "is_table") == want)  # as above


def _module(name: str, doc: str, **members: Any) -> types.ModuleType:
    module = types.ModuleType(f"multitables.{name}", doc)
    for key, value in members.items():
        if isinstance(value, type) and value.__module__ == __name__:
            value.__module__ = module.__name__
        setattr(module, key, value)
    return module


def install(package: types.ModuleType) -> None:
    """Make ``multitables.dataset``, ``dataset_ops``, ``request``, ``stage``, ``signals``, ``shared_mem`` and
    ``resource_wrapper`` resolve.

    ``package`` is ``multitables`` itself, once it has imported its public names.
    """
    errors = package.errors
    Dataset, Future, RequestPool, Stage, StagePool = (
        package.Dataset, package.Future, package.RequestPool, package.Stage, package.StagePool
    )
    _BOUND.update(Request=package.Request, Dataset=Dataset)

    ops = {name: _OpMeta(name, (), {"__doc__": f"2.x's {name}: isinstance() tells whether a Request is one."})
           for name in _OP_BASES}
    datasets = {
        "DatasetBase": _DatasetMeta("DatasetBase", (), {"_table": None}),
        "Dataset": Dataset,
        "TableDataset": _DatasetMeta("TableDataset", (), {"_table": True}),
        "ArrayDataset": _DatasetMeta("ArrayDataset", (), {"_table": False}),
        # VLArrays are refused by get_dataset (docs/coming_from_2x.rst): no Dataset is one.
        "VLArrayDataset": type("VLArrayDataset", (), {"__doc__": "2.x's dataset class for VLArrays."}),
    }
    modules = {
        "dataset": _module("dataset", "2.x names of the dataset classes.", **datasets),
        "dataset_ops": _module("dataset_ops", "2.x names of the request classes.", **ops),
        "request": _module("request", "2.x names: a future was a Request.", Request=Future, RequestPool=RequestPool),
        "stage": _module("stage", "2.x names of the stages.", Stage=Stage, StagePool=StagePool),
        "signals": _module(
            "signals",
            "2.x names of the end-of-stream sentinel and the errors.",
            QueueClosed=errors.QueueClosed,
            QueueClosedType=errors.QueueClosedType,
            QueueClosedException=errors.QueueClosedException,
            SubprocessException=errors.SubprocessException,
        ),
        "shared_mem": _module("shared_mem", "2.x name of the stage-size error.", SharedMemoryError=errors.SharedMemoryError),
        "resource_wrapper": _module(
            "resource_wrapper",
            "2.x names of get_proxy()'s proxy and of the error its use after release raises.",
            ResourceWrapper=package.DataProxy,
            ReleasedResourceError=errors.ReleasedResourceError,
        ),
    }
    for name, module in modules.items():
        sys.modules.setdefault(module.__name__, module)
        setattr(package, name, sys.modules[module.__name__])
