"""What the file says about a dataset's storage, for the chunk engine: its layout, filters and fill value, and where each chunk lies.

Asked of HDF5 through h5py once, at open. :func:`inspect_storage` refuses
(:class:`Unsupported`, naming why) what the chunk engine cannot read, and
:func:`chunks_problem` asks the same before any reader starts, so a stream
never fails over midway; :class:`ChunkIndex` answers where each stored chunk
is in the file.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._plan.chunkgrid import ChunkGrid
from .codecs.base import FilterSpec, UnsupportedFilter, filters_of
from .codecs.registry import build_pipeline
from .node import NodeInfo

#: Datasets with more chunks than this are indexed lazily, one lookup per chunk read
#: (``chunk_iter`` lists ~100-400k chunks/s; a lookup costs ~3x a listed chunk).
INDEX_ALL_LIMIT = 1 << 17


class Unsupported(Exception):
    """The chunk engine does not read this dataset; the message says why."""


@dataclass(frozen=True)
class Storage:
    """How a dataset is stored, as far as the chunk engine needs to know."""

    shape: tuple[int, ...]
    #: None for contiguous storage.
    chunks: "tuple[int, ...] | None"
    filters: tuple[FilterSpec, ...]
    #: File offset of contiguous storage.
    offset: "int | None"
    #: One element of the fill value, as stored bytes.
    fill: bytes


def _type_problem(tid: Any, dt: np.dtype) -> "str | None":
    """Why the stored bytes of HDF5 type ``tid`` are not the bytes h5py delivers as ``dt`` (None: they are).

    Fixed-length strings are the one conversion the engine repeats
    (:func:`~multitables._io.node.deliver_strings`), from the node's ``string_pads``.
    """
    import h5py

    h5t = h5py.h5t
    size = tid.get_size()
    if size != dt.itemsize:
        return f"its {size}-byte stored elements are converted to {dt.itemsize}-byte {dt}"
    cls = tid.get_class()
    order = {h5t.ORDER_LE: "<", h5t.ORDER_BE: ">"}
    if cls == h5t.BITFIELD:  # PyTables stores booleans as 8-bit bitfields; h5py delivers their bytes as unsigned ints
        if dt.kind not in "ub" or (size > 1 and order.get(tid.get_order()) != dt.str[0]):
            return f"its bitfields are converted to {dt}"
        return None
    if cls == h5t.INTEGER:
        if dt.kind not in "iub" or tid.get_precision() != 8 * size or tid.get_offset() != 0:
            return f"its integers (precision {tid.get_precision()}, offset {tid.get_offset()}) are converted to {dt}"
        if size > 1 and order.get(tid.get_order()) != dt.str[0]:
            return f"its integers are converted to the byte order of {dt}"
        return None
    if cls == h5t.FLOAT:
        ieee = {2: h5t.IEEE_F16LE, 4: h5t.IEEE_F32LE, 8: h5t.IEEE_F64LE}.get(size)
        if dt.kind != "f" or ieee is None or tid.get_fields() != ieee.get_fields() or tid.get_offset() != 0:
            return f"its floats are not IEEE {8 * size}-bit ones numpy holds as {dt}"
        if order.get(tid.get_order()) != dt.str[0]:
            return f"its floats are converted to the byte order of {dt}"
        return None
    if cls == h5t.ENUM:
        return _type_problem(tid.get_super(), dt if dt.kind != "b" else np.dtype("i1"))
    if cls == h5t.STRING:
        if tid.is_variable_str() or dt.kind != "S":
            return "it holds variable-length strings"
        return None
    if cls == h5t.ARRAY:
        if dt.subdtype is None or tuple(tid.get_array_dims()) != dt.subdtype[1]:
            return f"its array elements do not match {dt}"
        return _type_problem(tid.get_super(), dt.subdtype[0])
    if cls == h5t.COMPOUND:
        n = tid.get_nmembers()
        if dt.kind == "c":
            half = np.dtype(f"{dt.str[0]}f{dt.itemsize // 2}")
            if n != 2 or tid.get_member_offset(1) != dt.itemsize // 2:
                return "its complex numbers are stored in an unusual layout"
            return _type_problem(tid.get_member_type(0), half) or _type_problem(tid.get_member_type(1), half)
        if dt.names is None or len(dt.names) != n:
            return f"its compound members do not match {dt}"
        for i in range(n):
            name = tid.get_member_name(i).decode("utf-8", "replace")
            if name != dt.names[i]:
                return f"its compound member {name!r} is delivered as {dt.names[i]!r}"
            field_dt, field_offset = dt.fields[name][:2]
            if tid.get_member_offset(i) != field_offset:
                return f"its compound member {name!r} moves from offset {tid.get_member_offset(i)} to {field_offset}"
            problem = _type_problem(tid.get_member_type(i), field_dt)
            if problem:
                return f"member {name!r}: {problem}"
        return None
    if cls == getattr(h5t, "COMPLEX", object()) and dt.kind == "c":
        half = np.dtype(f"{dt.str[0]}f{dt.itemsize // 2}")
        return _type_problem(tid.get_super(), half)
    return f"its element type (HDF5 class {cls}) is converted by h5py"


@functools.lru_cache(maxsize=1)
def _hdf5_library() -> "ctypes.CDLL | None":
    """The HDF5 library h5py runs on (already loaded), for the one call h5py does not wrap.

    Looked up once per process: scanning /proc/self/maps costs ~3 ms, as much
    as reading a 4 MiB file.
    """
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "libhdf5-" in line or "libhdf5.so" in line})
    except OSError:  # pragma: no cover - not Linux
        return None
    for path in paths:
        if "hdf5_hl" in path:
            continue
        try:
            lib = ctypes.CDLL(path)
            fn = lib.H5Pget_chunk_opts
        except (OSError, AttributeError):  # pragma: no cover
            continue
        fn.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_uint)]
        fn.restype = ctypes.c_int
        return lib
    return None  # pragma: no cover


def _leaves_edge_chunks_unfiltered(dcpl: Any) -> bool:
    """Whether the dataset was written with ``H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS`` (not visible through h5py)."""
    lib = _hdf5_library()
    if lib is None:  # pragma: no cover - assume HDF5's default
        return False
    opts = ctypes.c_uint(0)
    if lib.H5Pget_chunk_opts(dcpl.id, ctypes.byref(opts)) < 0:  # pragma: no cover
        return False
    return bool(opts.value & 0x0002)


def inspect_storage(ds: Any, node: NodeInfo) -> Storage:
    """The storage of the open ``h5py.Dataset`` ``ds``; raises :class:`Unsupported` naming what the engine cannot read."""
    import h5py

    dsid = ds.id
    dcpl = dsid.get_create_plist()
    if node.h5py_problem:
        raise Unsupported(node.h5py_problem)
    problem = _type_problem(dsid.get_type(), np.dtype(node.file_dtype))
    if problem:
        raise Unsupported(problem)
    if dcpl.get_external_count():
        raise Unsupported("its data lives in external files")
    layout = dcpl.get_layout()
    shape = tuple(int(s) for s in dsid.shape)
    # Where HDF5 writes no fill value (undefined, or never written), h5py's reads give zeros.
    fill = np.zeros(1, node.file_dtype)
    if dcpl.fill_value_defined() != h5py.h5d.FILL_VALUE_UNDEFINED and dcpl.get_fill_time() != h5py.h5d.FILL_TIME_NEVER:
        try:
            dcpl.get_fill_value(fill)
        except (TypeError, ValueError, RuntimeError) as exc:  # e.g. array elements, which h5py converts
            raise Unsupported(f"its fill value cannot be read as {node.file_dtype} ({exc})") from None
    filters = filters_of(dcpl)
    if layout == h5py.h5d.CONTIGUOUS:
        offset = dsid.get_offset()
        if offset is None:
            raise Unsupported("its storage was never written (it reads as fill values)")
        return Storage(shape, None, filters, int(offset), fill.tobytes())
    if layout != h5py.h5d.CHUNKED:
        raise Unsupported("its layout is compact or virtual")
    chunks = tuple(int(c) for c in ds.chunks)
    if _leaves_edge_chunks_unfiltered(dcpl):
        raise Unsupported("it stores partial edge chunks unfiltered (H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS)")
    try:
        build_pipeline(filters, int(np.prod(chunks)) * node.file_dtype.itemsize, node.file_dtype.itemsize)
    except UnsupportedFilter as exc:
        raise Unsupported(str(exc)) from None
    return Storage(shape, chunks, filters, None, fill.tobytes())


def chunks_problem(node: NodeInfo, dataset: Any = None) -> "str | None":
    """Why the chunk engine cannot read ``node`` (None: it can); opens the file briefly unless given its ``dataset``."""
    import h5py

    if dataset is not None:
        try:
            inspect_storage(dataset, node)
        except Unsupported as exc:
            return str(exc)
        return None
    with h5py.File(node.filename, "r") as f:
        return chunks_problem(node, f[node.path])


# ---------------------------------------------------------------------------
# Where each chunk is
# ---------------------------------------------------------------------------


class ChunkIndex:
    """Where each stored chunk of a dataset is: ``lookup(index)`` gives ``(offset, size, filter_mask)`` or None.

    Lists every chunk once (``chunk_iter``) up to ``limit`` chunks; beyond,
    asks HDF5 per chunk as it is needed, remembering the answers.
    """

    def __init__(self, dsid: Any, grid: ChunkGrid, limit: int = INDEX_ALL_LIMIT) -> None:
        self._grid = grid
        self._dsid = dsid
        self._lazy: "dict[tuple[int, ...], tuple[int, int, int] | None] | None" = None
        n = int(np.prod(grid.counts, dtype=np.int64))
        if n > limit or not hasattr(dsid, "chunk_iter"):
            self._lazy = {}
            return
        # Python lists: a lookup per chunk read, and list items are Python ints already.
        self._where: "list[tuple[int, int, int] | None]" = [None] * n
        found: list[Any] = []
        dsid.chunk_iter(found.append)
        where = self._where
        if grid.per_chunk_row == 1:
            # Chunks of whole rows (PyTables' and most layouts): the position is the first
            # coordinate alone. Listing 2,048 chunks takes 1.7 ms so, 3.3 ms through the
            # grid's methods: time every reader's start and every small file's read pays.
            c0 = grid.chunks[0]
            for info in found:
                where[info.chunk_offset[0] // c0] = (int(info.byte_offset), int(info.size), int(info.filter_mask))
        else:
            for info in found:
                k = grid.linear(grid.index_of(info.chunk_offset))
                where[k] = (int(info.byte_offset), int(info.size), int(info.filter_mask))

    @property
    def listed(self) -> bool:
        """Whether every chunk was listed at open (then no lookup needs the h5py handle)."""
        return self._lazy is None

    def lookup(self, index: tuple[int, ...]) -> "tuple[int, int, int] | None":
        if self._lazy is not None:
            if index not in self._lazy:
                info = self._dsid.get_chunk_info_by_coord(self._grid.origin(index))
                found = info.byte_offset is not None
                self._lazy[index] = (int(info.byte_offset), int(info.size), int(info.filter_mask)) if found else None
            return self._lazy[index]
        return self._where[self._grid.linear(index)]

    def release(self) -> None:
        """Drop the h5py handle (the answers already listed stay)."""
        if self._lazy is None:
            self._dsid = None
