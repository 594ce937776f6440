"""Other projects' layouts (pandas' ``to_hdf``, anndata's ``.h5ad``, MATLAB's v7.3 ``.mat``, netCDF-4): where the rows a
user asked for are kept.

A user whose file another project wrote names what that project calls the
data: pandas' key (``'/df'``, a group), anndata's ``'/X'`` (a group where X
is sparse), a DataFrame's column (``field='b'``, kept inside a
``values_block_N`` field), a MATLAB variable (a sparse matrix is a group, a
cell array references). Refusing those is right; these helpers add to the
refusal what the node holds and which dataset or field to read instead. They
read attributes and a few small datasets, on the error path only, and never
fail: a layout they do not know is described by its members. The checks
off the error path, :func:`matlab_empty` and :func:`netcdf_dimension`, look at
tiny unsigned datasets and one-dimensional big-endian float32 ones only.
"""

from __future__ import annotations

import math
import pickletools
from typing import Any

import numpy as np

#: Members a group's description names before it says how many there are in all.
SHOWN = 8


def _text(value: Any) -> "str | None":
    """An attribute as text (PyTables writes bytes, anndata str); None for anything else."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _pickled_names(value: Any) -> list[str]:
    """The strings in a pickled list (pandas keeps a block's column names so), read without unpickling:
    only the opcodes are walked, so nothing in the file runs."""
    try:
        return [str(arg) for op, arg, _ in pickletools.genops(bytes(value)) if "UNICODE" in op.name or "STRING" in op.name]
    except Exception:  # noqa: BLE001 - not a pickle we can walk: no names
        return []


def pandas_columns(attrs: Any, fields: "tuple[str, ...]") -> "dict[str, tuple[str, int]]":
    """Where pandas' ``to_hdf(format='table')`` keeps each DataFrame column that is not a field of its own:
    ``{column: (field, index along the field's row)}`` (pandas 1.x to 3.x: attributes ``values_block_N_kind``)."""
    found: "dict[str, tuple[str, int]]" = {}
    for field in fields:
        if field.startswith("values_block_") and f"{field}_kind" in attrs:
            for i, name in enumerate(_pickled_names(attrs[f"{field}_kind"])):
                found.setdefault(name, (field, i))
    return found


def stored_column_hint(node: Any, missing: "list[str]") -> str:
    """:func:`column_hint` for the table ``node`` (a ``NodeInfo``) describes, its attributes read again from its
    (first) local file ('' for an object, or a file that cannot be read now)."""
    import h5py

    filename = node.parts[0].node.filename if node.parts else node.filename
    if node.remote is not None:
        return ""
    try:
        with h5py.File(filename, "r") as f:
            return column_hint(f[node.path].attrs, node.file_dtype.names or (), missing)
    except Exception:  # noqa: BLE001 - no hint
        return ""


def column_hint(attrs: Any, fields: "tuple[str, ...]", missing: "list[str]") -> str:
    """A sentence naming the ``values_block_N`` field and position of each of pandas' columns in ``missing``
    ('' where the table is not pandas' or none of them is one of its columns)."""
    try:
        where = pandas_columns(attrs, fields)
    except Exception:  # noqa: BLE001 - attributes we cannot read: no hint
        return ""
    known = [(name, where[name]) for name in missing if name in where]
    if not known:
        return ""
    said = ", ".join(f"{name!r} is {field}[:, {i}]" for name, (field, i) in known)
    return (f". pandas' to_hdf(format='table') keeps columns that are not data_columns in 'values_block_N' fields, "
            f"one column of the field per DataFrame column: {said} (stream the field, then take that column; or "
            f"write with data_columns=[...] to give a column a field of its own)")


def group_hint(group: Any, path: str) -> str:
    """What the h5py ``group`` at ``path`` holds, and which of its datasets to stream: a sentence starting with
    '. ' ('' where it cannot be read)."""
    try:
        return ". " + (_known_layout(group, path) or ("It holds " + _members(group, path) if len(group) else "It is empty"))
    except Exception:  # noqa: BLE001 - the refusal stands without a description
        return ""


def _child(path: str, name: str) -> str:
    return f"{path.rstrip('/')}/{name}"


def _known_layout(group: Any, path: str) -> "str | None":
    """A description of the pandas or anndata object ``group`` holds (None: neither)."""
    attrs = group.attrs
    pandas = _text(attrs.get("pandas_type"))
    if pandas is not None and "table" in group:
        return (f"It holds a pandas object written by to_hdf(format='table') ({pandas!r}): its rows are the Table "
                f"{_child(path, 'table')!r}; stream it, or one column of it with field=")
    if pandas == "series" and "values" in group:
        return f"It holds a pandas Series written by to_hdf(format='fixed'): its values are {_child(path, 'values')!r}"
    if pandas == "frame":
        blocks = []
        for i in range(int(attrs.get("nblocks", 0))):
            items = [_text(v) or str(v) for v in group[f"block{i}_items"][()]]
            blocks.append(f"{_child(path, f'block{i}_values')!r} holds {items}")
        return ("It holds a pandas DataFrame written by to_hdf(format='fixed'), its columns in blocks of one dtype, "
                "a row per DataFrame row: " + "; ".join(blocks))
    encoding = _text(attrs.get("encoding-type"))
    if encoding in ("csr_matrix", "csc_matrix"):
        shape = tuple(int(n) for n in attrs.get("shape", ()))
        named = ", ".join(repr(_child(path, name)) for name in ("data", "indices", "indptr"))
        return (f"It holds a sparse matrix (anndata's {encoding!r} encoding, shape {shape}) as the datasets {named}: "
                f"multitables streams the rows of a dense dataset, not a sparse matrix; read it with anndata or "
                f"scipy.sparse, or stream those datasets as flat arrays")
    if encoding == "categorical":
        return (f"It holds a categorical column (anndata's 'categorical' encoding): stream its codes "
                f"{_child(path, 'codes')!r}; its categories are {_child(path, 'categories')!r}")
    if encoding is not None and encoding.startswith("nullable"):
        return (f"It holds a column with a mask (anndata's {encoding!r} encoding): stream its values "
                f"{_child(path, 'values')!r}; its mask is {_child(path, 'mask')!r}")
    if encoding == "dataframe":
        return "It holds a data frame (anndata's 'dataframe' encoding), a member per column: " + _members(group, path)
    if encoding is not None:
        return f"It holds anndata's {encoding!r} encoding: " + _members(group, path)
    if "MATLAB_sparse" in attrs:
        parts = [f"{_child(path, name)!r} ({role})" for name, role in (
            ("data", "the nonzeros"), ("ir", "their rows"), ("jc", "where each column starts")) if name in group]
        said = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
        return (f"It holds a MATLAB sparse matrix ({int(attrs['MATLAB_sparse'])} rows) as compressed sparse columns, "
                f"the datasets {said}: multitables streams the rows of a dense dataset, not a sparse matrix; read it "
                f"with scipy.sparse.csc_matrix, or stream those datasets as flat arrays")
    return None


def reference_hint(dataset: Any) -> str:
    """For the h5py ``dataset`` of object references: a sentence starting with '. ' saying so, naming a MATLAB cell
    array's ``/#refs#`` ('' for any other dtype, or where it cannot be read)."""
    import h5py

    try:
        if h5py.check_ref_dtype(dataset.dtype) is None:
            return ""
        cell = _text(dataset.attrs.get("MATLAB_class")) == "cell"
    except Exception:  # noqa: BLE001 - the refusal stands without a description
        return ""
    return (". It holds HDF5 object references" + (" (a MATLAB cell array, whose elements are datasets in '/#refs#')"
                                                   if cell else "") + ": read the datasets they point to with h5py")


def matlab_empty(dataset: Any, dtype: np.dtype, shape: "tuple[int, ...]") -> "str | None":
    """Why the h5py ``dataset`` of ``dtype`` and ``shape`` holds no rows where it is MATLAB's empty array: MATLAB writes an empty
    matrix as its dimensions (unsigned, one per axis) with the attribute ``MATLAB_empty``; None for any other
    dataset. Only a tiny unsigned dataset's attributes are looked at (an attribute lookup costs microseconds)."""
    if dtype.kind != "u" or len(shape) > 2 or math.prod(shape) > 32 or "MATLAB_empty" not in dataset.attrs:
        return None
    dims = [int(n) for n in np.asarray(dataset[()]).ravel()]
    return (f"holds MATLAB's empty array (attribute MATLAB_empty): its values {dims} are the dimensions of an empty "
            f"matrix, not data, so it has no rows to read")


#: The start of the ``NAME`` netCDF-C and h5netcdf give the dimension scale that stands for a dimension without a
#: variable of its name (the rest is the length, ``%10d``).
NETCDF_DIMENSION = "This is a netCDF dimension but not a netCDF variable."
_NETCDF_SCALE = np.dtype(">f4")  # the placeholder's type in netCDF-C and h5netcdf (H5T_IEEE_F32BE)


def netcdf_dimension(dataset: Any, dtype: np.dtype, shape: "tuple[int, ...]") -> "str | None":
    """Why the h5py ``dataset`` of ``dtype`` and ``shape`` holds no rows where it is netCDF-4's placeholder for a
    dimension with no coordinate variable; None for any other dataset (a coordinate variable included). netCDF-C and
    h5netcdf write the placeholder as a dimension scale of big-endian float32 that nothing writes to: h5py reads zeros
    (or no rows at all for an unlimited dimension), which are not the dimension's values, and netCDF has no variable
    of that name. Only a one-dimensional big-endian float32 dataset's attributes are looked at."""
    if len(shape) != 1 or dtype != _NETCDF_SCALE or "NAME" not in dataset.attrs:
        return None
    if not (_text(dataset.attrs["NAME"]) or "").startswith(NETCDF_DIMENSION):
        return None
    users = ""
    try:  # the variables on the dimension, from the scale's back references (error path only)
        names = sorted({dataset.file[ref].name for ref, _ in dataset.attrs["REFERENCE_LIST"]})
        users = f"; stream the variables defined on it ({', '.join(repr(n) for n in names[:SHOWN])}" \
                f"{', ...' if len(names) > SHOWN else ''})" if names else ""
    except Exception:  # noqa: BLE001 - the refusal stands without them
        pass
    return (f"is netCDF-4's placeholder for a dimension with no coordinate variable (a dimension scale named "
            f"{NETCDF_DIMENSION!r}): it holds no data, so it has no rows to read{users}")


def _members(group: Any, path: str) -> str:
    """The first members of ``group`` by name and kind (a group of many is not walked to its end)."""
    import h5py

    total, said = len(group), list[str]()
    for name in group:
        if len(said) == SHOWN:
            break
        member = group.get(name, getlink=True)
        node = None if isinstance(member, (h5py.ExternalLink, h5py.SoftLink)) else group.get(name)  # a link: not followed
        kind = "an external link" if isinstance(member, h5py.ExternalLink) else "a soft link" \
            if isinstance(member, h5py.SoftLink) else "a group" if isinstance(node, h5py.Group) else \
            "a netCDF dimension, no data" if isinstance(node, h5py.Dataset) and \
            netcdf_dimension(node, node.dtype, node.shape) else "a dataset"
        said.append(f"{_child(path, name)!r} ({kind})")
    more = f", ... ({total} in all)" if total > len(said) else ""
    return f"{', '.join(said)}{more}"
