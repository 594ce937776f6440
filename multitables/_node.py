"""Inspecting the node to stream: every check on the user's input that needs the file.

Runs in the consumer before any process starts, so bad input fails early with
an error that names the file, the path and the argument.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import NodeTypeError, NotHDF5Error


@dataclass(frozen=True)
class NodeInfo:
    """What the readers and the consumer need to know about one streamed node.

    ``dtype`` and ``row_shape`` describe the rows as delivered: for a ``field``
    of a table whose column is a sub-array, the sub-array's shape is part of
    ``row_shape`` and ``dtype`` is its element type.
    """

    filename: str
    path: str
    field: "str | None"
    n_rows: int
    row_shape: tuple[int, ...]
    dtype: np.dtype
    file_dtype: np.dtype
    chunk_rows: "int | None"
    filter_ids: tuple[int, ...]
    is_table: bool

    @property
    def row_nbytes(self) -> int:
        """Bytes in one delivered row."""
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def field_read_dtype(self) -> "np.dtype | None":
        """A one-field compound that selects ``field`` in an HDF5 read (None without a field)."""
        if self.field is None:
            return None
        return np.dtype([(self.field, self.file_dtype.fields[self.field][0])])


def _has_object(dt: np.dtype) -> bool:
    if dt.names:
        return any(_has_object(dt.fields[n][0]) for n in dt.names)
    if dt.subdtype is not None:
        return _has_object(dt.subdtype[0])
    return dt.kind in "OV" or dt.hasobject


def inspect_node(filename: "str | os.PathLike[str]", path: str, field: "str | None" = None) -> NodeInfo:
    """Open ``filename`` read-only, check ``path`` (and ``field``) can be streamed, describe it."""
    node, dataset = open_node(filename, path, field)
    dataset.file.close()
    return node


def check_file(filename: str) -> None:
    """Raise the builtin-compatible error for a missing file, a directory, or a file that is not HDF5."""
    import h5py

    if not os.path.exists(filename):
        raise FileNotFoundError(errno.ENOENT, "No such HDF5 file", filename)
    if os.path.isdir(filename):
        raise IsADirectoryError(errno.EISDIR, "Expected an HDF5 file, got a directory", filename)
    if not h5py.is_hdf5(filename):
        raise NotHDF5Error(f"{filename!r} is not an HDF5 file")


def open_node(filename: "str | os.PathLike[str]", path: str, field: "str | None" = None) -> "tuple[NodeInfo, Any]":
    """As :func:`inspect_node`, but also return the open ``h5py.Dataset`` (the caller closes its ``.file``)."""
    import h5py

    filename = os.fspath(filename)
    if not isinstance(path, str):
        raise TypeError(f"path must be a str naming a node in the file, not {type(path).__name__}")
    if field is not None and not isinstance(field, str):
        raise TypeError(f"field must be a str naming a table column, not {type(field).__name__}")
    check_file(filename)
    f = h5py.File(filename, "r")
    try:
        try:
            node = f[path]
        except KeyError as exc:
            # h5py says KeyError for a damaged file too; only these messages mean "no such node".
            if "doesn't exist" in str(exc) or "not found" in str(exc):
                raise KeyError(f"no node {path!r} in {filename!r}") from None
            raise OSError(f"cannot open {path!r} in {filename!r}; the file may be damaged: {exc}") from exc
        if not isinstance(node, h5py.Dataset):
            kind = "a Group" if isinstance(node, h5py.Group) else type(node).__name__
            raise NodeTypeError(
                f"{path!r} in {filename!r} is {kind}; only array datasets (Array, CArray, EArray) "
                f"and Tables can be streamed"
            )
        return _describe(filename, path, field, node), node
    except BaseException:
        f.close()
        raise


def _describe(filename: str, path: str, field: "str | None", ds: Any) -> NodeInfo:
    where = f"{path!r} in {filename!r}"
    dt: np.dtype = ds.dtype
    if ds.shape is None or len(ds.shape) == 0:
        raise NodeTypeError(f"{where} is a scalar; only datasets with rows can be streamed")
    if _has_object(dt):
        raise NodeTypeError(
            f"{where} has dtype {dt}, which is variable-length or opaque; only fixed-size numeric, "
            f"string and compound rows can be streamed"
        )
    n_rows = int(ds.shape[0])
    if n_rows == 0:
        raise ValueError(f"{where} is empty (0 rows); there is nothing to stream")
    row_shape = tuple(int(s) for s in ds.shape[1:])
    out_dtype = dt
    if field is not None:
        if dt.names is None:
            raise KeyError(f"field={field!r} given, but {where} is not a table (its rows have no fields)")
        if field not in dt.names:
            raise KeyError(f"{where} has no field {field!r}; its fields are {list(dt.names)}")
        fdt = dt.fields[field][0]
        if fdt.subdtype is not None:
            out_dtype, sub = fdt.subdtype
            row_shape = row_shape + tuple(sub)
        else:
            out_dtype = fdt
    plist = ds.id.get_create_plist()
    filter_ids = tuple(int(plist.get_filter(i)[0]) for i in range(plist.get_nfilters()))
    return NodeInfo(
        filename=filename,
        path=path if path.startswith("/") else "/" + path,
        field=field,
        n_rows=n_rows,
        row_shape=row_shape,
        dtype=np.dtype(out_dtype),
        file_dtype=dt,
        chunk_rows=int(ds.chunks[0]) if ds.chunks else None,
        filter_ids=filter_ids,
        is_table=dt.names is not None,
    )
