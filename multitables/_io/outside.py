"""Rows a dataset keeps outside its file: its external raw files, a virtual dataset's sources; each read once up front.

NOTE [data outside the file]
    HDF5 reads an external dataset's raw bytes from files named in its header (relative to the working directory)
    and a virtual dataset's rows from source datasets in other files, each with its own filters. Neither shows in
    the node's own description: a raw file that cannot be opened, or a source compressed with a filter an engine
    lacks, failed only once a reader reached those rows, mid-stream. So an engine's check reads one element of
    each piece (:func:`places`: an external file, a source dataset) as it will read the rows: h5py's in
    ``_io.h5py_engine``, PyTables' in its probe (``_io.tables_engine``), each refusal naming the piece. Of the
    sources stored alike (layout, element type, filters: each source's header, kept per file version in the
    process) one is read: a read a source cost 0.6 ms, 1.3 s for a virtual dataset over 2,000 files, a header
    0.13 ms. A filter no engine decodes is a MissingFilterError naming the source (:func:`lacking_sources`). A
    source file that is missing is no failure: HDF5 gives the virtual dataset's fill value there, and so does
    every engine. The chunk engine reads neither layout (``_io.chunks.storage``), and leaves them to the others.
"""

from __future__ import annotations

import functools
import math
import os
import stat
from typing import Any, Iterator

import numpy as np

from .._sys.signals import raised_by_handler
from .h5filters import register_filters
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


def _located(vds: str, name: str) -> "tuple[str, tuple[int, int, int, int]] | None":
    """The file HDF5 opens for a virtual source named ``name`` in virtual dataset file ``vds``, and what tells its
    version from another (None: none is there). HDF5's order of tries (H5F_prefix_open_file): the name if absolute,
    HDF5_VDS_PREFIX's folders (``${ORIGIN}``: the virtual dataset file's), its folder, the working directory."""
    origin = os.path.dirname(vds)
    tries = [vds] if name == "." else [name] if os.path.isabs(name) else []
    base = os.path.basename(name) if os.path.isabs(name) else name
    prefixes = [p.replace("${ORIGIN}", origin) for p in os.environ.get("HDF5_VDS_PREFIX", "").split(os.pathsep) if p]
    for path in tries + [os.path.join(p, base) for p in prefixes] + [os.path.join(origin, base), base]:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            return path, (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    return None


@functools.lru_cache(maxsize=65536)
def _kind(path: str, dset: str, version: "tuple[int, int, int, int]") -> Any:
    """How source ``dset`` of file ``path`` (``version``: :func:`_located`'s, the cache's key) is stored: its layout,
    element type and filters (id, flags, parameters, name), what decides whether an engine decodes it; None where
    HDF5 does not open it, or it keeps rows outside its own file too (a read decides: NOTE [data outside the file])."""
    import h5py

    try:
        fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY)
    except Exception:
        return None
    try:
        dsid = h5py.h5d.open(fid, dset.encode())
        dcpl = dsid.get_create_plist()
        if dcpl.get_layout() == getattr(h5py.h5d, "VIRTUAL", None) or dcpl.get_external_count():
            return None
        filters = tuple((int(f[0]), int(f[1]), tuple(f[2]), f[3].decode("utf-8", "replace"))
                        for f in map(dcpl.get_filter, range(dcpl.get_nfilters())))
        return dcpl.get_layout(), dsid.dtype, filters
    except Exception:
        return None
    finally:
        fid.close()


#: :func:`_mappings` answered, by virtual dataset file, version (:func:`_located`'s) and dataset path: a few only.
_MAPPINGS: "dict[tuple[str, Any, str], tuple[tuple[tuple[int, ...], str, str], ...]]" = {}


def _mappings(dataset: Any, key: "tuple[str, Any, str] | None") -> "tuple[tuple[tuple[int, ...], str, str], ...]":
    """Each mapping of the open virtual ``h5py.Dataset`` that selects a point of it: that point, the source's file
    and dataset names; kept under ``key`` (None: not kept), since 2,000 mappings take 30 ms to list."""
    if key in _MAPPINGS:
        return _MAPPINGS[key]
    dcpl = dataset.id.get_create_plist()
    shape = tuple(int(n) for n in dataset.id.shape or ())
    found = []
    for i in range(dcpl.get_virtual_count()):
        at = _first_selected(dcpl.get_virtual_vspace(i))
        if at is not None and all(a < n for a, n in zip(at, shape)):
            found.append((at, dcpl.get_virtual_filename(i), dcpl.get_virtual_dsetname(i)))
    if key is not None:
        if len(_MAPPINGS) >= 16:
            _MAPPINGS.clear()
        _MAPPINGS[key] = tuple(found)
    return tuple(found)


def _sources(dataset: Any) -> "Iterator[tuple[tuple[int, ...], str, Any]]":
    """Each source of the open virtual ``h5py.Dataset`` that gives a point of it: that point, how messages name the
    source, and how it is stored (:func:`_kind`; None: not known without a read)."""
    filename = dataset.file.filename
    vds = os.path.abspath(filename) if isinstance(filename, str) else ""  # an object's: no local sources to look at
    known = _located(vds, ".") if vds else None
    for at, name, dset in _mappings(dataset, (vds, known[1], dataset.name) if known else None):
        where = _located(vds, name) if known is not None else None
        yield at, f"virtual source {dset!r} in {name!r}", _kind(where[0], dset, where[1]) if where else None


def places(dataset: Any) -> "list[tuple[tuple[int, ...], str]]":
    """One element of each piece of the open ``h5py.Dataset`` kept outside its file (NOTE [data outside the file]):
    its coordinates, and how messages name the piece. Empty for a dataset held in its file.

    Of a virtual dataset's sources, one of each way of storage (:func:`_kind`: filters, element type) and each one
    whose way is not known without a read: thousands of sources written alike cost a read, not one each."""
    import h5py

    dcpl = dataset.id.get_create_plist()
    shape = tuple(int(n) for n in dataset.id.shape or ())
    found: "dict[str, tuple[int, ...]]" = {}
    if dcpl.get_layout() == getattr(h5py.h5d, "VIRTUAL", None):
        kinds = set()
        for at, label, kind in _sources(dataset):
            if kind is not None and kind in kinds:
                continue
            kinds.add(kind)
            found.setdefault(label, at)
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


def lacking_sources(node: NodeInfo) -> "list[tuple[int, str, str]]":
    """The filters of ``node``'s virtual sources that h5py's HDF5 (with hdf5plugin's) cannot decode: each filter's
    id, how messages name it, and the source that has it (the first); empty for a node that is not virtual."""
    import h5py

    if not node.virtual or node.remote is not None:
        return []
    register_filters()
    dataset = reopen_dataset(node)
    try:
        found: "dict[int, tuple[int, str, str]]" = {}
        for _at, label, kind in _sources(dataset):
            for fid, _flags, _values, fname in kind[2] if kind is not None else ():
                if fid not in found and not h5py.h5z.filter_avail(fid):
                    found[fid] = (fid, f"{fname or 'unnamed'!r} (id {fid})", label)
        return list(found.values())
    finally:
        close_dataset(dataset)


def node_places(node: NodeInfo) -> "list[tuple[tuple[int, ...], str]]":
    """:func:`places` of ``node`` (opened for it), for another library's read; empty at once for a node whose rows
    are all in its file."""
    if not (node.virtual or node.external):
        return []
    dataset = reopen_dataset(node)
    try:
        return places(dataset)
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
