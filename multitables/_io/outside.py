"""Rows a dataset keeps outside its file: its external raw files, a virtual dataset's sources; each read once up front.

NOTE [data outside the file]
    HDF5 reads an external dataset's raw bytes from files named in its header (relative to the working directory)
    and a virtual dataset's rows from source datasets in other files, each with its own filters. Neither shows in
    the node's own description: a raw file that cannot be opened, or a source compressed with a filter an engine
    lacks, failed only once a reader reached those rows, mid-stream. So an engine's check reads one element of
    each piece (:func:`places`: an external file, a source dataset) as it will read the rows: h5py's in
    ``_io.h5py_engine``, PyTables' in its probe (``_io.tables_engine``). A source file that is missing is no
    failure: HDF5 gives the virtual dataset's fill value there, and so does every engine. The chunk engine reads
    neither layout (``_io.chunks.storage``), and leaves them to the others.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._sys.signals import raised_by_handler
from .node import NodeInfo, close_dataset, reopen_dataset


def _first_selected(space: Any) -> "tuple[int, ...] | None":
    """The first point a virtual mapping's selection ``space`` (an ``h5py.h5s.SpaceID``) holds (None: none)."""
    import h5py

    kind = space.get_select_type()
    if kind == h5py.h5s.SEL_NONE:
        return None
    if kind == h5py.h5s.SEL_POINTS:
        return tuple(int(i) for i in space.get_select_elem_pointlist()[0])
    if kind == h5py.h5s.SEL_HYPERSLABS:
        if space.is_regular_hyperslab():  # an unlimited one too, which has no block list
            return tuple(int(i) for i in space.get_regular_hyperslab()[0])
        return tuple(int(i) for i in space.get_select_hyper_blocklist()[0][0])
    return (0,) * int(space.get_simple_extent_ndims())  # all


def places(dataset: Any) -> "list[tuple[tuple[int, ...], str]]":
    """One element of each piece of the open ``h5py.Dataset`` kept outside its file (NOTE [data outside the file]):
    its coordinates, and how messages name the piece. Empty for a dataset held in its file."""
    import h5py

    dcpl = dataset.id.get_create_plist()
    shape = tuple(int(n) for n in dataset.id.shape or ())
    found: "dict[str, tuple[int, ...]]" = {}
    if dcpl.get_layout() == getattr(h5py.h5d, "VIRTUAL", None):
        for i in range(dcpl.get_virtual_count()):
            at = _first_selected(dcpl.get_virtual_vspace(i))
            name = dcpl.get_virtual_filename(i), dcpl.get_virtual_dsetname(i)
            if at is not None and all(a < n for a, n in zip(at, shape)):
                found.setdefault(f"virtual source {name[1]!r} in {name[0]!r}", at)
    elif dcpl.get_external_count() and math.prod(shape):
        itemsize, start = dataset.id.get_type().get_size(), 0
        for i in range(dcpl.get_external_count()):
            name, _offset, size = dcpl.get_external(i)
            element = start // itemsize  # the one holding this file's first byte
            if element < math.prod(shape):
                at = tuple(int(a) for a in np.unravel_index(element, shape))
                found.setdefault(f"external file {name.decode('utf-8', 'replace')!r}", at)
            start += size
    return [(at, label) for label, at in found.items()]


def node_places(node: NodeInfo) -> "list[tuple[int, ...]]":
    """The coordinates of :func:`places` of ``node`` (opened for it), for another library's read; empty at once for
    a node whose rows are all in its file."""
    if not (node.virtual or node.external):
        return []
    dataset = reopen_dataset(node)
    try:
        return [at for at, _ in places(dataset)]
    finally:
        close_dataset(dataset)


def h5py_outside_problem(node: NodeInfo, dataset: Any = None) -> "str | None":
    """Why h5py cannot read a piece of ``node`` kept outside its file (None: it reads one element of each, or there
    are none); ``dataset``: its open ``h5py.Dataset``, left open (None: opened here)."""
    if not (node.virtual or node.external):
        return None
    ds = reopen_dataset(node) if dataset is None else dataset
    try:
        for at, label in places(ds):
            try:
                ds[tuple(slice(a, a + 1) for a in at)]
            except Exception as exc:  # HDF5's words, whatever the class
                if raised_by_handler(exc):
                    raise  # the user's own: NOTE [a handler's exception]
                return f"its {label} cannot be read ({type(exc).__name__}: {exc})"
        return None
    finally:
        if dataset is None:
            close_dataset(ds)
