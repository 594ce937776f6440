"""The chunk engine: read a dataset's stored chunks with ``os.pread`` and decode them ourselves.

HDF5 reads a compressed chunk through an ordinary inflate, its own shuffle and
a copy or two. This engine asks HDF5 only where each chunk lies (once, at
open), reads the stored bytes itself, and undoes the filters with the fastest
codecs it has (:mod:`multitables._filters`) straight into the caller's block
where a chunk covers whole rows of it; :mod:`multitables._chunkplan` says
which chunks a row range needs and where each lands. One core, warm cache,
PyTables' zlib-3 + shuffle float32 rows: 2.1-2.3x h5py's ``read_direct``;
blosc-3: 1.1-1.2x (its decoder is the same c-blosc).

What it reads, and what it leaves to h5py (:func:`chunks_problem` says why,
checked before any reader starts, so a stream never fails over midway):

* chunked datasets whose every filter :mod:`~multitables._filters` decodes,
  and contiguous ones (read with one ``pread`` into the block);
* element types whose stored bytes are the bytes h5py delivers: integers and
  IEEE floats of any byte order, booleans (PyTables' bitfields) and enums,
  complex, fixed-length strings (null-terminated and space-padded ones
  converted as h5py's conversion does, :func:`~multitables._node.deliver_strings`),
  HDF5 array elements, and compounds and arrays of those;
* not compact, virtual or external storage, nor HDF5's option to leave
  partial edge chunks unfiltered.

Chunks never written read as the dataset's fill value, as in HDF5 (zeros
where HDF5 writes none, as h5py's reads give).

``cache="direct"`` reads the stored bytes with ``O_DIRECT`` (page-aligned
buffers, aligned file ranges), past the page cache, with the stock wheels:
the cold-cache figure without rebuilding HDF5 with its direct driver.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ._chunkplan import ChunkGrid, ChunkPart, Extent, chunk_parts, coalesce
from ._filters import ChunkDecodeError, FilterSpec, Pipeline, UnsupportedFilter, build_pipeline, filters_of
from ._node import NodeInfo, deliver_strings

#: Where chunk bytes come from: the page cache, or the disk past it (``O_DIRECT``).
CACHES = ("page", "direct")
#: Stored chunks closer than this in the file are read with one call (the gap is read and dropped).
MAX_GAP = 64 << 10
#: The most bytes one read call covers.
MAX_READ = 16 << 20
#: ``O_DIRECT`` file offsets, lengths and buffers are aligned to this (the largest common logical block size).
DIRECT_ALIGN = 4096
#: Datasets with more chunks than this are indexed lazily, one lookup per chunk read
#: (``chunk_iter`` lists ~100-400k chunks/s; a lookup costs ~3x a listed chunk).
INDEX_ALL_LIMIT = 1 << 17


class Unsupported(Exception):
    """The chunk engine does not read this dataset; the message says why."""


# ---------------------------------------------------------------------------
# What the file says about the dataset's storage
# ---------------------------------------------------------------------------


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
    (:func:`~multitables._node.deliver_strings`), from the node's ``string_pads``.
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
        for info in found:
            k = grid.linear(grid.index_of(info.chunk_offset))
            self._where[k] = (int(info.byte_offset), int(info.size), int(info.filter_mask))

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


# ---------------------------------------------------------------------------
# Reading file bytes
# ---------------------------------------------------------------------------


class _FileReader:
    """Reads byte ranges of one file: ``os.preadv``, through the page cache or past it (``O_DIRECT``)."""

    def __init__(self, filename: str, cache: str) -> None:
        self.direct = cache == "direct"
        self.filename = filename
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        if self.direct:
            if not hasattr(os, "O_DIRECT"):  # pragma: no cover - not Linux
                raise ValueError("cache='direct' needs O_DIRECT, which this platform lacks")
            flags |= os.O_DIRECT
        try:
            self.fd = os.open(filename, flags)
        except OSError as exc:
            if self.direct and exc.errno == errno.EINVAL:
                raise OSError(exc.errno, f"cache='direct': the filesystem refuses O_DIRECT ({exc.strerror})", filename) from None
            raise
        self._buffer = np.empty(0, np.uint8)

    @property
    def align(self) -> int:
        return DIRECT_ALIGN if self.direct else 1

    def _scratch(self, n: int) -> np.ndarray:
        if len(self._buffer) < n:
            # Over-allocate by one alignment unit and start on a boundary, as O_DIRECT needs.
            raw = np.empty(max(n, 1 << 20) + DIRECT_ALIGN, np.uint8)
            skip = -raw.ctypes.data % DIRECT_ALIGN
            self._buffer = raw[skip : skip + len(raw) - DIRECT_ALIGN]
        return self._buffer[:n]

    def read(self, start: int, stop: int, need: int) -> np.ndarray:
        """File bytes ``[start, stop)`` (aligned for ``O_DIRECT``); at least ``need`` of them must exist."""
        view = self._scratch(stop - start)
        got = self.read_into(view, start)
        if got < need:
            raise ChunkDecodeError(f"{self.filename!r} ends at byte {start + got}; a chunk reaches byte {start + need}")
        return view

    def read_into(self, view: Any, offset: int) -> int:
        """Fill ``view`` from file ``offset``; returns the bytes read (fewer only at the end of the file)."""
        got, n = 0, len(view)
        while got < n:
            k = os.preadv(self.fd, [view[got:]], offset + got)
            if k == 0:
                break
            got += k
        return got

    def will_need(self, extents: Sequence[Extent]) -> None:
        """Start reading ``extents`` into the page cache in the background (``POSIX_FADV_WILLNEED``); a hint.

        Past the page cache (``O_DIRECT``) there is nothing to warm, so it does nothing.
        """
        if self.direct or not extents:
            return
        for group in coalesce(extents, MAX_GAP, MAX_READ):
            try:
                os.posix_fadvise(self.fd, group.start, group.stop - group.start, os.POSIX_FADV_WILLNEED)
            except OSError:  # pragma: no cover - a filesystem without readahead; reading works the same
                return

    def close(self) -> None:
        self._buffer = np.empty(0, np.uint8)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# ---------------------------------------------------------------------------
# The source
# ---------------------------------------------------------------------------


class ChunkSource:
    """One open dataset read by the chunk engine (the :class:`~multitables._engines.Source` protocol).

    ``dataset``: an open ``h5py.Dataset`` of the node to take the layout and
    chunk index from (its file is closed here); otherwise the file is opened
    briefly. Raises :class:`Unsupported` for what the engine cannot read.
    """

    engine = "chunks"

    def __init__(self, node: NodeInfo, cache: str = "page", dataset: Any = None, index_limit: int = INDEX_ALL_LIMIT) -> None:
        if cache not in CACHES:
            raise ValueError(f"cache={cache!r} is not one of {CACHES}")
        self._node = node
        self._reader: "_FileReader | None" = None
        self._h5file: Any = None
        import h5py

        if dataset is None:
            self._h5file = h5py.File(node.filename, "r")
            dataset = self._h5file[node.path]
        else:
            self._h5file = dataset.id  # closing it closes the checks' file (_node.close_dataset)
        try:
            self._setup(dataset, cache, index_limit)
        except BaseException:
            self.close()
            raise

    def _setup(self, ds: Any, cache: str, index_limit: int) -> None:
        node = self._node
        storage = inspect_storage(ds, node)
        self._storage = storage
        self._dtype = np.dtype(node.file_dtype)
        # Bytes are moved as opaque elements: numpy expands an array element type
        # (``('<f8', (3,))``) into axes, which the chunk selections do not have.
        self._edtype = self._dtype if self._dtype.subdtype is None else np.dtype((np.void, self._dtype.itemsize))
        self._pads = node.string_pads
        self._file_row_shape = storage.shape[1:]
        self._row_nbytes = int(np.prod(self._file_row_shape, dtype=np.int64)) * self._dtype.itemsize
        self._field = node.field
        self._rows: "np.ndarray | None" = None  # whole rows, for reading one field
        self._reader = _FileReader(node.filename, cache)
        self._kept: dict[tuple[int, ...], np.ndarray] = {}
        self._free: list[np.ndarray] = []
        if storage.chunks is None:
            self._grid = None
            self._index = None
            self._h5file.close()
            self._h5file = None
            return
        self._grid = ChunkGrid(storage.shape, storage.chunks)
        self._chunk_nbytes = int(np.prod(storage.chunks, dtype=np.int64)) * self._dtype.itemsize
        self._pipeline: Pipeline = build_pipeline(storage.filters, self._chunk_nbytes, self._dtype.itemsize)
        self._index = ChunkIndex(ds.id, self._grid, index_limit)
        if self._index._lazy is None:  # every chunk listed: the file is no longer needed
            self._index.release()
            self._h5file.close()
            self._h5file = None
        self._fill = np.frombuffer(storage.fill, self._edtype)[0]

    # -- reading -------------------------------------------------------------

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Read rows ``[start, stop)`` into ``out`` (C-contiguous, ``stop - start`` rows, the delivered dtype)."""
        n = stop - start
        if n <= 0:
            return
        if not out.flags.c_contiguous:  # a reshape would copy, and the rows would land in the copy
            raise ValueError("the chunk engine reads into C-contiguous arrays only")
        if self._field is not None:
            if self._rows is None or len(self._rows) < n:
                self._rows = np.empty((n,) + self._file_row_shape, self._dtype)
            rows = self._rows[:n]
            self._read_rows(start, stop, rows)
            deliver_strings(rows, self._pads, self._dtype.itemsize)
            column = rows[self._field]  # rows x file row shape x the field's sub-array shape
            np.copyto(out.reshape(column.shape), column)
            return
        if self._edtype is self._dtype:
            rows = out.reshape((n,) + self._file_row_shape)
        else:
            rows = out.reshape(-1).view(np.uint8).view(self._edtype).reshape((n,) + self._file_row_shape)
        self._read_rows(start, stop, rows)
        deliver_strings(rows, self._pads, self._dtype.itemsize)

    def prefetch(self, start: int, stop: int) -> None:
        """Start reading the stored bytes of rows ``[start, stop)`` into the page cache; returns at once.

        A reader calls it for the block it expects to read next, so that the
        disk works while this block decodes (a cold zlib-3 file read 1.6x
        faster by two readers; BENCHMARKS.md). Does nothing with ``O_DIRECT``.
        """
        reader = self._reader
        if reader is None or reader.direct or start >= stop:
            return
        if self._grid is None:
            assert self._storage.offset is not None
            first = self._storage.offset + start * self._row_nbytes
            reader.will_need([Extent(first, (stop - start) * self._row_nbytes, 0)])
            return
        assert self._index is not None
        extents = []
        for part in chunk_parts(self._grid, start, stop):
            if part.index in self._kept:
                continue
            found = self._index.lookup(part.index)
            if found is not None:
                extents.append(Extent(found[0], found[1], 0))
        reader.will_need(extents)

    def _read_rows(self, start: int, stop: int, out: np.ndarray) -> None:
        if out.size == 0:
            return
        out_bytes = out.reshape(-1).view(np.uint8)
        if self._grid is None:
            self._read_contiguous(start, stop, out_bytes)
            return
        parts = chunk_parts(self._grid, start, stop)
        pending: list[tuple[ChunkPart, int, int, int]] = []  # part, file offset, stored size, filter mask
        kept: dict[tuple[int, ...], np.ndarray] = {}
        reader = self._reader
        assert reader is not None and self._index is not None
        for part in parts:
            chunk = self._kept.pop(part.index, None)
            if chunk is not None:  # decoded for the previous block, which cut it
                self._place(part, chunk, out, kept, stop)
                continue
            found = self._index.lookup(part.index)
            if found is None:  # never written: the fill value, as HDF5 reads it
                out[part.out_sel] = self._fill
                continue
            offset, size, mask = found
            if part.whole and not reader.direct and self._pipeline.is_identity(mask) and size == self._chunk_nbytes:
                a, b = part.rows
                dst = out_bytes[a * self._row_nbytes : b * self._row_nbytes]
                if reader.read_into(dst, offset) != size:
                    raise self._error(part, offset, size, "the file ends before the chunk does")
                continue
            pending.append((part, offset, size, mask))
        self._recycle()
        self._kept = kept
        if not pending:
            return
        extents = [Extent(offset, size, k) for k, (_, offset, size, _) in enumerate(pending)]
        for group in coalesce(extents, MAX_GAP, MAX_READ, reader.align):
            need = max(e.offset + e.size for e in group.members) - group.start
            buf = reader.read(group.start, group.stop, need)
            for e in group.members:
                part, offset, size, mask = pending[e.key]
                raw = buf[e.offset - group.start : e.offset - group.start + size]
                if part.whole:
                    a, b = part.rows
                    self._decode(part, raw, offset, mask, out_bytes[a * self._row_nbytes : b * self._row_nbytes])
                else:
                    chunk = self._take()
                    self._decode(part, raw, offset, mask, chunk)
                    self._place(part, chunk, out, kept, stop)

    def _decode(self, part: ChunkPart, raw: Any, offset: int, mask: int, dst: np.ndarray) -> None:
        try:
            self._pipeline.decode(raw, mask, dst)
        except ChunkDecodeError as exc:
            raise self._error(part, offset, len(raw), str(exc)) from None

    def _error(self, part: ChunkPart, offset: int, size: int, why: str) -> ChunkDecodeError:
        assert self._grid is not None
        where = ", ".join(str(o) for o in self._grid.origin(part.index))
        return ChunkDecodeError(
            f"chunk at ({where}) of {self._node.path!r} in {self._node.filename!r} "
            f"(file bytes {offset}..{offset + size}): {why}"
        )

    def _place(self, part: ChunkPart, chunk: np.ndarray, out: np.ndarray, kept: dict, stop: int) -> None:
        """Copy the part of a decoded chunk into ``out``; keep the chunk if the next block starts inside it."""
        assert self._grid is not None and self._storage.chunks is not None
        elements = chunk.view(self._edtype).reshape(self._storage.chunks)
        np.copyto(out[part.out_sel], elements[part.chunk_sel])
        chunk_stop = self._grid.origin(part.index)[0] + self._storage.chunks[0]
        if stop < min(chunk_stop, self._grid.shape[0]):
            kept[part.index] = chunk
        else:
            self._free.append(chunk)

    def _take(self) -> np.ndarray:
        return self._free.pop() if self._free else np.empty(self._chunk_nbytes, np.uint8)

    def _recycle(self) -> None:
        """Chunks kept for a block that did not come: back to the free list."""
        self._free.extend(self._kept.values())
        self._kept = {}

    def _read_contiguous(self, start: int, stop: int, out_bytes: np.ndarray) -> None:
        reader = self._reader
        assert reader is not None and self._storage.offset is not None
        first = self._storage.offset + start * self._row_nbytes
        n = (stop - start) * self._row_nbytes
        if not reader.direct:
            got = reader.read_into(out_bytes, first)
        else:
            a = first - first % DIRECT_ALIGN
            b = -(-(first + n) // DIRECT_ALIGN) * DIRECT_ALIGN
            buf = reader.read(a, b, first + n - a)
            out_bytes[:] = buf[first - a : first - a + n]
            got = n
        if got != n:
            raise ChunkDecodeError(
                f"{self._node.filename!r} ends before rows {start}:{stop} of {self._node.path!r} (contiguous, from byte {first})"
            )

    def close(self) -> None:
        """Release the file (idempotent)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._h5file is not None:
            try:
                self._h5file.close()
            except Exception:  # pragma: no cover
                pass
            self._h5file = None
        self._kept = {}
        self._free = []
