"""Inspecting the node to stream: every check on the user's input that needs the file.

Runs in the consumer before any process starts, so bad input fails early with
an error that names the file, the path and the argument.
"""

from __future__ import annotations

import errno
import functools
import math
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
        # math.prod, not np.prod: ~0.3 us against ~15 us, asked twice per stream.
        return math.prod(self.row_shape) * self.dtype.itemsize

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
    close_dataset(dataset)
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
    """As :func:`inspect_node`, but also return the open ``h5py.Dataset``: the caller closes it with :func:`close_dataset`.

    The file is opened without a chunk cache (see :func:`_file_access`), and
    no file id is kept: the dataset holds the file open.
    """
    import h5py

    filename = os.fspath(filename)
    if not isinstance(path, str):
        raise TypeError(f"path must be a str naming a node in the file, not {type(path).__name__}")
    if field is not None and not isinstance(field, str):
        raise TypeError(f"field must be a str naming a table column, not {type(field).__name__}")
    try:
        fid = h5py.h5f.open(filename.encode(), h5py.h5f.ACC_RDONLY, _file_access())
    except OSError:
        check_file(filename)  # the error a user expects: missing, a directory, not HDF5
        raise  # something else (permissions, a damaged superblock): HDF5's own words
    try:
        try:
            oid = h5py.h5o.open(fid, path.encode())
        except KeyError as exc:
            # h5py says KeyError for a damaged file too; only these messages mean "no such node".
            if "doesn't exist" in str(exc) or "not found" in str(exc):
                raise KeyError(f"no node {path!r} in {filename!r}") from None
            raise OSError(f"cannot open {path!r} in {filename!r}; the file may be damaged: {exc}") from exc
        if not isinstance(oid, h5py.h5d.DatasetID):
            kind = "a Group" if isinstance(oid, h5py.h5g.GroupID) else "a named Datatype"
            raise NodeTypeError(
                f"{path!r} in {filename!r} is {kind}; only array datasets (Array, CArray, EArray) "
                f"and Tables can be streamed"
            )
        node = h5py.Dataset(oid)
        return _describe(filename, path, field, node), node
    except BaseException:
        h5py.File(fid).close()  # closes what is open in it too, which a bare H5Fclose (weak) leaves to the collector
        raise


def close_dataset(dataset: Any) -> None:
    """Close a dataset from :func:`open_node`, and with it its file.

    :func:`open_node` keeps no file id, and HDF5 (weak close degree) closes
    a file with the last object open in it, so closing the dataset closes
    the file, unless the caller opened more objects there (it closes those
    too). h5py's ``File.close`` would first list every object open in the
    file, a cost a small file's read notices.
    """
    dataset.id.close()


@functools.lru_cache(maxsize=1)
def _file_access() -> Any:
    """The file-access list of :func:`open_node`: no chunk cache.

    HDF5's high-level open (``h5py.File``, then ``f[path]``) costs ~0.2 ms
    more than these two library calls, a tenth of reading a 1 MB file. With
    no chunk cache, h5py decodes whole chunks straight into the caller's
    buffer (1.2-1.8x faster, ``_engines._h5py_cache_bytes``); a reader that
    needs a cache opens the dataset again with one.
    """
    import h5py

    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    _mdc, slots, _nbytes, w0 = fapl.get_cache()
    fapl.set_cache(0, slots, 0, w0)
    return fapl


def _describe(filename: str, path: str, field: "str | None", ds: Any) -> NodeInfo:
    import h5py

    where = f"{path!r} in {filename!r}"
    dt: np.dtype = ds.dtype
    # Asked once: h5py's ``Dataset.shape`` asks HDF5 for the dataspace on every
    # call (~20 us), a cost a 1 MB file notices.
    shape = ds.shape
    if shape is None or len(shape) == 0:
        raise NodeTypeError(f"{where} is a scalar; only datasets with rows can be streamed")
    if _has_object(dt):
        raise NodeTypeError(
            f"{where} has dtype {dt}, which is variable-length or opaque; only fixed-size numeric, "
            f"string and compound rows can be streamed"
        )
    n_rows = int(shape[0])
    if n_rows == 0:
        raise ValueError(f"{where} is empty (0 rows); there is nothing to stream")
    row_shape = tuple(int(s) for s in shape[1:])
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
    chunks = plist.get_chunk() if plist.get_layout() == h5py.h5d.CHUNKED else None
    return NodeInfo(
        filename=filename,
        path=path if path.startswith("/") else "/" + path,
        field=field,
        n_rows=n_rows,
        row_shape=row_shape,
        dtype=np.dtype(out_dtype),
        file_dtype=dt,
        chunk_rows=int(chunks[0]) if chunks else None,
        filter_ids=filter_ids,
        is_table=dt.names is not None,
    )
