"""A table's columns: named, nested, selected (PyTables' ``'outer/inner'`` paths, h5py's names with a ``/``)."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

import numpy as np

from ..errors import NoSuchFieldError
from .writers import stored_column_hint

if TYPE_CHECKING:
    from .node import NodeInfo


def field_path(dt: np.dtype, field: str) -> list[str]:
    """The names that lead to column ``field`` of rows of ``dt``: ``field`` itself where a column has that name
    (h5py may name one ``'a/b'``), else its parts (PyTables' path into nested columns, ``'outer/inner'``)."""
    # dt.fields, a mapping, not dt.names: a tuple, whose search made a batch of 2,000 columns quadratic in them
    return [field] if _column(dt, field) is not None else field.split("/")


def _column(dt: np.dtype, name: str) -> "tuple[np.dtype, int] | None":
    """The dtype and offset of column ``name`` of rows of ``dt``; None where it has none (a title, which ``dt.fields``
    holds too, names none)."""
    entry = None if dt.fields is None else dt.fields.get(name)
    return None if entry is None or (len(entry) > 2 and entry[2] == name) else (entry[0], entry[1])


def field_of(dt: np.dtype, field: str, where: str = "the rows") -> "tuple[np.dtype, int]":
    """The dtype of column ``field`` of rows of ``dt``, and its offset in a row (bytes).

    ``field`` is a column's name, or, in a nested compound, PyTables' path to
    one (``'outer/inner'``, as ``Table.col`` takes it; :func:`field_path`); a
    name that is not there is a ``KeyError`` naming what is.
    """
    parts, offset = field_path(dt, field), 0
    if "" in parts:
        raise NoSuchFieldError(f"{where} has no field {field!r}: a path names a column at each step, 'outer/inner', none empty")
    for depth, name in enumerate(parts):
        column = _column(dt, name)
        if column is None:
            names = dt.names or ()
            at = "/".join(parts[:depth])
            there = f"its fields are {_listing(names, name)}" if not at else \
                f"the fields of {at!r} are {_listing(names, name)}" if names else f"{at!r} has no fields"
            if at and dt.subdtype is not None and dt.subdtype[0].names:
                there = f"{at!r} is an array of records (shape {dt.subdtype[1]}): read {at!r}, then take {name!r} of it"
            raise NoSuchFieldError(f"{where} has no field {field!r}; {there}")
        dt, at_offset = column
        offset += at_offset
    return dt, offset


#: Names an error lists in full; of more, the first few and those nearest to the name asked for.
_LISTED = 20


def _listing(names: "tuple[str, ...]", wanted: str) -> str:
    """``names`` for an error about ``wanted``: all of them, or, of a wide table's, the first few and the nearest
    (a message of 2,000 names hid the one meant)."""
    if len(names) <= _LISTED:
        return str(list(names))
    nearest = difflib.get_close_matches(wanted, names, n=3, cutoff=0.6)
    near = f"; the nearest to {wanted!r}: {nearest}" if nearest else ""
    return f"{len(names):,} names, {', '.join(map(repr, names[:4]))} ... {names[-1]!r}{near}"


def check_columns(node: NodeInfo, columns: list[str]) -> None:
    """``KeyError`` naming the table's columns unless each of ``columns`` is one (:func:`field_of`'s paths too)."""
    where, names = f"{node.path!r} in {node.filename!r}", node.dtype.names
    if names is None:
        raise NoSuchFieldError(f"fields={columns!r} given, but {where} is not a table (its rows have no fields)")
    missing = [c for c in columns if _column(node.dtype, field_path(node.dtype, c)[0]) is None]
    if missing:
        hint = stored_column_hint(node, missing)  # a pandas DataFrame's columns: which fields hold them
        raise NoSuchFieldError(
            f"{where} has no column {', '.join(map(repr, missing))}; its columns: {_listing(names, missing[0])}{hint}")
    for column in columns:  # a path into a nested column
        field_of(node.dtype, column, where)


def select_field(rows: np.ndarray, field: str) -> np.ndarray:
    """Column ``field`` of ``rows`` (a view), a path through nested compounds as :func:`field_of` takes it."""
    for name in field_path(rows.dtype, field):
        rows = rows[name]
    return rows
