"""What the file says about a dataset's storage, for the chunk engine: its layout, filters and fill value, and where each chunk lies.

Asked of HDF5 through h5py once, at open. :func:`inspect_storage` refuses
(:class:`Unsupported`, naming why) what the chunk engine cannot read, and
:func:`chunks_problem` asks the same before any reader starts, so a stream
never fails over midway; :class:`~multitables._io.chunks.btree.BTreeIndex` (where
the file's format allows) or :class:`ChunkIndex` answers where each stored
chunk is in the file. :func:`learn_layout` asks both and remembers the answer.

NOTE [layout cache]
    Opening a dataset for the chunk engine (the HDF5 open, its storage,
    listing its chunk index) costs ~0.4 ms, which a set of files pays once
    per file per reader per epoch: 64 shards, two datasets, a shuffled epoch
    of 0.23 s paid 0.05 s of it. So a process remembers the layouts it
    learned, keyed by the file's identity (NOTE [file identity]: device,
    inode, size, times) and the dataset's path, up to ``LAYOUT_ENTRIES_KEPT``
    chunk entries, least recently used forgotten first. The consumer learns
    them when it checks that the chunk engine can read each file; readers
    started by ``fork`` inherit them, and a later epoch finds them there.
    A stream's readers started otherwise (spawn, forkserver: Python 3.14's
    default) are sent the layout of a single file's node with their settings
    (``learned_layouts``): each reopened the file with HDF5 and learned it
    again, 2 ms before its first block here.
    A file rewritten has another identity, so a stale layout is never used;
    a layout is kept only where the file was settled when it was learned
    (``_io.files.settled``: the gap the identity alone leaves, NOTE [file
    identity]). Files just written are learned again.
    Nor is a layout kept whose file changed while it was learned, or an index
    not listed (more than ``INDEX_ALL_LIMIT`` chunks; it needs its handle).
    An object's identity is its ETag, size and version as the consumer saw
    them (NOTE [object identity] in ``_io.objects.reader``): its layout is
    keyed by those with no request, and every read of it checks them.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Container

import numpy as np

from .grid import ChunkGrid, Extent, chunk_indices
from .btree import UNREAD, BTreeIndex, open_btree_index
from .codecs.base import FilterSpec, UnsupportedFilter, filters_of
from .codecs.registry import build_pipeline
from .hdf5lib import chunk_address_base, header_address, leaves_edge_chunks_unfiltered
from ..files import FileSignature, file_signature, settled
from ...errors import FileChangedError
from ..node import NodeInfo, Unsupported, close_dataset, reopen_dataset
from ..._sys.forks import renew_lock_in_children

#: Datasets with more chunks than this are indexed lazily, one lookup per chunk read
#: (``chunk_iter`` lists ~100-400k chunks/s; a lookup costs ~3x a listed chunk).
INDEX_ALL_LIMIT = 1 << 17
#: An object's chunk index is read whole when it is learned if it has at most this many leaves (in the consumer, 64 in
#: flight: 16 round trips at most; readers started by fork then read none). A larger one is read as the rows reach it,
#: by every reader: each reads nearly every leaf, its blocks' and those after them (``LEAVES_AHEAD`` in ``source``), so
#: with n readers the leaves cost about n requests each. 1024 leaves list some 60,000 chunks (15 GB of 256 KiB chunks).
REMOTE_LEAVES_AT_OPEN = 1024
#: Read the chunk index from the dataset's B-tree ourselves where its format allows
#: (NOTE [chunk index in file order] in ``btree``); tests turn it off to reach ``ChunkIndex``.
READ_BTREE = True
#: Chunks up to which a local dataset's index is listed by HDF5 at open instead: ~5 us and ~0.8 us a chunk, where
#: reading the B-tree costs ~150 us (its inner nodes, and a check against HDF5), a first read of a small file's whole
#: cost. A leaf holds ~57 chunks, so the listing reads at most three leaves, those the rows' first reads reach.
LIST_CHUNKS_UP_TO = 128


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
    (:func:`~multitables._io.strings.deliver_strings`), from the node's ``string_pads``.
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
        if dt.names is None or (fields := dt.fields) is None or len(dt.names) != n:
            return f"its compound members do not match {dt}"
        for i in range(n):
            name = tid.get_member_name(i).decode("utf-8", "replace")
            if name != dt.names[i]:
                return f"its compound member {name!r} is delivered as {dt.names[i]!r}"
            field_dt, field_offset = fields[name][:2]
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
    if layout == h5py.h5d.CONTIGUOUS:  # no filters, and every byte is in its storage once written: no fill read
        offset = dsid.get_offset()
        if offset is None:
            raise Unsupported("its storage was never written (it reads as fill values)")
        return Storage(shape, None, (), int(offset), bytes(node.file_dtype.itemsize))
    # Where HDF5 writes no fill value (undefined, or never written), h5py's reads give zeros.
    fill = np.zeros(1, node.file_dtype)
    if dcpl.fill_value_defined() != h5py.h5d.FILL_VALUE_UNDEFINED and dcpl.get_fill_time() != h5py.h5d.FILL_TIME_NEVER:
        try:
            dcpl.get_fill_value(fill)
        except (TypeError, ValueError, RuntimeError) as exc:  # e.g. array elements, which h5py converts
            raise Unsupported(f"its fill value cannot be read as {node.file_dtype} ({exc})") from None
    filters = filters_of(dcpl)
    if layout != h5py.h5d.CHUNKED:
        raise Unsupported("its layout is compact or virtual")
    chunks = tuple(int(c) for c in dcpl.get_chunk())  # not ds.chunks: h5py would ask HDF5 for this list again
    if leaves_edge_chunks_unfiltered(dcpl):
        raise Unsupported("it stores partial edge chunks unfiltered (H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS)")
    try:
        build_pipeline(filters, math.prod(chunks) * node.file_dtype.itemsize, node.file_dtype.itemsize)
    except UnsupportedFilter as exc:
        raise Unsupported(str(exc)) from None
    return Storage(shape, chunks, filters, None, fill.tobytes())


def chunks_problem(node: NodeInfo, dataset: Any = None) -> "str | None":
    """Why the chunk engine cannot read ``node`` (None: it can); opens the file briefly unless given its ``dataset``."""
    if known_layout(node) is not None:
        return None
    if dataset is not None:
        try:
            learn_layout(dataset, node)  # remembered for the readers (NOTE [layout cache])
        except Unsupported as exc:
            return str(exc)
        return None
    dataset = reopen_dataset(node)
    try:
        return chunks_problem(node, dataset)
    finally:
        close_dataset(dataset)


# ---------------------------------------------------------------------------
# Where each chunk is
# ---------------------------------------------------------------------------


class ChunkIndex:
    """Where each stored chunk of a dataset is: ``lookup(index)`` gives ``(offset, size, filter_mask)`` or None.

    Lists every chunk once (``chunk_iter``) up to ``limit`` chunks; beyond,
    asks HDF5 per chunk as it is needed, remembering the answers.
    """

    def __init__(self, dsid: Any, grid: ChunkGrid, limit: int = INDEX_ALL_LIMIT) -> None:
        self._grid, self._dsid = grid, dsid
        self._lazy: "dict[tuple[int, ...], tuple[int, int, int] | None] | None" = None
        self._base = base = chunk_address_base(dsid)  # HDF5 before 1.14.4 lists addresses past the userblock
        n = math.prod(grid.counts)
        if n > limit or not hasattr(dsid, "chunk_iter"):
            self._lazy = {}
            return
        self._where: "list[tuple[int, int, int] | None]" = [None] * n  # a lookup per chunk read, of Python ints
        found: list[Any] = []
        dsid.chunk_iter(found.append)  # in index order; past the extent: what a SWMR writer flushed since ``dsid``'s look
        if found and found[-1].chunk_offset[0] >= grid.shape[0]:
            found = [info for info in found if info.chunk_offset[0] < grid.shape[0]]  # rows never read through it
        where = self._where
        if grid.per_chunk_row == 1:
            # Chunks of whole rows (PyTables' and most layouts): the position is the first coordinate alone. Listing
            # 2,048 chunks takes 1.7 ms so, 3.3 ms through the grid's methods: every reader's start pays it.
            c0 = grid.chunks[0]
            for info in found:
                where[info.chunk_offset[0] // c0] = (int(info.byte_offset) + base, int(info.size), int(info.filter_mask))
        else:
            for info in found:
                k = grid.linear(grid.index_of(info.chunk_offset))
                where[k] = (int(info.byte_offset) + base, int(info.size), int(info.filter_mask))

    @property
    def n_listed(self) -> int:
        """Chunk entries held (every chunk's where listed, else those looked up so far)."""
        return len(self._where) if self._lazy is None else len(self._lazy)

    @property
    def needs_handle(self) -> bool:
        """Whether lookups need the dataset's h5py handle (chunks not listed at open are asked of HDF5)."""
        return self._lazy is not None

    def lookup(self, index: tuple[int, ...]) -> "tuple[int, int, int] | None":
        if self._lazy is not None:
            if index not in self._lazy:
                info = self._dsid.get_chunk_info_by_coord(self._grid.origin(index))
                found = info.byte_offset is not None
                self._lazy[index] = (int(info.byte_offset) + self._base, int(info.size), int(info.filter_mask)) if found else None
            return self._lazy[index]
        return self._where[self._grid.linear(index)]

    #: What :meth:`lookup` answers; never ``UNREAD`` (HDF5's lookups read through its own cache).
    peek = lookup

    def release(self) -> None:
        """Drop the h5py handle (the answers already listed stay)."""
        if self._lazy is None:
            self._dsid = None


# ---------------------------------------------------------------------------
# Layouts learned (NOTE [layout cache])
# ---------------------------------------------------------------------------

#: Chunk entries of the layouts a process keeps (a listed entry is ~150 bytes): about 40 MB.
LAYOUT_ENTRIES_KEPT = 1 << 18
#: A layout's least count of entries: its own objects (~0.8 KB a contiguous one, over 40,000 files); 32,768 at most.
LAYOUT_MIN_ENTRIES = 8


@dataclass(frozen=True)
class Layout:
    """A dataset's storage and, where chunked, its chunk grid and index (shared, read only)."""

    storage: Storage
    grid: "ChunkGrid | None"
    index: "ChunkIndex | BTreeIndex | None"

    @property
    def entries(self) -> int:
        return LAYOUT_MIN_ENTRIES if self.index is None else max(LAYOUT_MIN_ENTRIES, self.index.n_listed)

    def chunks(self, start: int, stop: int) -> "list[tuple[int, ...]]":
        """The grid indices of the chunks that hold rows ``[start, stop)``, in C order."""
        assert self.grid is not None
        return list(chunk_indices(self.grid, start, stop)[1])

    def find(self, start: int, stop: int, ahead: int = 0) -> None:
        """Read the leaves of the chunk index that rows ``[start, stop)`` need and it has not read, and up to ``ahead``
        leaves after them (an index that answers without reading, HDF5's, is not asked)."""
        index = self.index
        if isinstance(index, BTreeIndex) and start < stop:
            index.load_for(self.chunks(start, stop), ahead)

    def hint(self, start: int, stop: int, row_nbytes: int, will_need: Callable[[list[Extent]], None],
             skip: "Container[tuple[int, ...]]" = (), resident: "Callable[[int, int], bool] | None" = None) -> None:
        """Pass ``will_need`` the file byte ranges that store rows ``[start, stop)`` (``row_nbytes`` bytes a row), in file order.

        Chunks in ``skip`` are left out. Reads no more of the chunk index than
        the leaf of the first chunk (NOTE [chunk index in file order]).
        ``resident(a, b)``: whether the page cache holds the file's bytes
        ``[a, b)``; where it holds those from the rows' first stored byte to
        their last, nothing is hinted (NOTE [hints on cached bytes] in ``pread``).
        """
        if self.grid is None:
            assert self.storage.offset is not None
            offset, nbytes = self.storage.offset + start * row_nbytes, (stop - start) * row_nbytes
            if nbytes and not (resident is not None and resident(offset, offset + nbytes)):
                will_need([Extent(offset, nbytes, 0)])
            return
        assert self.index is not None
        index = self.index
        assert self.grid is not None
        count, indices = chunk_indices(self.grid, start, stop)
        asked = False
        if resident is not None and count:  # the chunks' ends known: asked before working out the extents
            # The bytes from the first chunk's to the last's hold the others where the file stores them in order
            # (rows written in order); a file stored otherwise may miss a hint, never a row.
            c0, trailing = self.grid.chunks[0], self.grid.trailing  # C order: the first's trailing index and the last's
            first, last = index.peek((start // c0, *trailing[0][0])), index.peek(((stop - 1) // c0, *trailing[-1][0]))
            if isinstance(first, tuple) and isinstance(last, tuple):
                if resident(first[0], last[0] + last[1]):
                    return
                asked = True
        extents: list[Extent] = []
        for n, chunk in enumerate(indices):
            if chunk in skip:
                continue
            found = index.peek(chunk)
            if found is UNREAD:
                assert isinstance(index, BTreeIndex)  # the one index that reads as it goes
                # The rest needs a leaf of the index not read yet, which lies among these chunks
                # (NOTE [chunk index in file order]). Reading it now would send the disk there and
                # back, and hold this hint back behind the queue while other readers hint later
                # blocks. Hint on from the last chunk known instead, as many bytes as the rest holds
                # and a quarter more: chunks' sizes vary, and a tail left out is read after later
                # blocks' hints, a jump back (blosc: 46 seeks a pass on the RAID 0 model, 4 with it).
                mean = index.mean_size
                frontier = max(e.offset + e.size for e in extents) if extents else index.guess_offset(chunk)
                if mean and frontier is not None:
                    extents.append(Extent(frontier, mean * (count - n + 1) * 5 // 4, 0))
                    break
                if extents:
                    break
                found = index.lookup(chunk)
            if found is not None:
                extents.append(Extent(found[0], found[1], 0))
        if extents and not (resident is not None and not asked
                            and resident(min(e.offset for e in extents), max(e.offset + e.size for e in extents))):
            will_need(extents)


_LAYOUTS: "OrderedDict[tuple[Any, str], Layout]" = OrderedDict()
_LAYOUTS_LOCK = threading.Lock()
_layout_entries = 0

renew_lock_in_children(globals(), "_LAYOUTS_LOCK")


def _identity(node: NodeInfo) -> "FileSignature | tuple[str, str, str] | None":
    """The identity ``node``'s layout is kept under: the file described, which each open is checked against."""
    if node.remote is not None:  # no request: every read checks it (NOTE [object identity])
        return (node.remote.url, node.remote.store.endpoint or "", node.remote.identity.key)
    if isinstance(node.identity, tuple) and node.linked_file is None:  # not a GrowingFile: nothing of it is kept
        return node.identity
    return _named(node)


def _held(ds: Any, node: NodeInfo) -> "FileSignature | tuple[str, str, str] | None":
    """The identity of the file the open ``ds`` reads, not of what its name means a moment later (a symlink switched):
    every open of a described file is checked against its node's (``files.check_opened``); a linked one's is HDF5's."""
    import h5py
    if node.remote is not None or (isinstance(node.identity, tuple) and node.linked_file is None):
        return _identity(node)
    fid = h5py.h5i.get_file_id(ds.id)  # ~20 us with its close: not for every file
    try:
        if fid.get_access_plist().get_driver() == h5py.h5fd.SEC2:  # a descriptor of its own (a user's driver: none)
            return file_signature(fid.get_vfd_handle())
    finally:
        fid.close()  # the dataset holds the file
    return _named(node)


def _named(node: NodeInfo) -> "FileSignature | tuple[str, str, str] | None":
    """The identity of the file ``node``'s name means now (an object's: its own; None: the next open says why)."""
    try:
        return _identity(node) if node.remote is not None else file_signature(node.data_file)
    except OSError:
        return None


def known_layout(node: NodeInfo) -> "Layout | None":
    """The layout of ``node`` learned in this process, if its file is still the file it was learned from."""
    identity = _identity(node)
    if identity is None:
        return None
    key = (identity, node.path)
    with _LAYOUTS_LOCK:
        layout = _LAYOUTS.get(key)
        if layout is not None:
            _LAYOUTS.move_to_end(key)
    return layout


def learned_layouts(node: NodeInfo) -> "tuple[tuple[Any, Layout], ...]":
    """``((key, layout),)`` for ``node``'s layout as learned in this process (none if not learned): what
    :func:`adopt_layout` takes in a reader that does not inherit it (spawn, forkserver; NOTE [layout cache])."""
    identity = _identity(node)
    key = (identity, node.path)
    with _LAYOUTS_LOCK:
        layout = _LAYOUTS.get(key) if identity is not None else None
    return () if layout is None else ((key, layout),)


def adopt_layout(key: Any, layout: Layout) -> None:
    """Remember a layout another process learned under ``key`` (its file's identity then, and the path): used
    only while the file still has that identity, as any layout kept here (NOTE [layout cache])."""
    _remember(key, layout)


def learn_layout(ds: Any, node: NodeInfo, index_limit: int = INDEX_ALL_LIMIT) -> Layout:
    """The layout of the open ``h5py.Dataset`` ``ds`` (:func:`inspect_storage`, its chunk index), remembered.

    Raises :class:`Unsupported` as :func:`inspect_storage`. An index not
    that needs its handle keeps ``ds``'s id for its lookups: the caller keeps ``ds`` open
    while it uses the layout.
    """
    before = _held(ds, node)
    storage = inspect_storage(ds, node)
    grid = None if storage.chunks is None else ChunkGrid(storage.shape, storage.chunks)
    index: "ChunkIndex | BTreeIndex | None" = None
    if grid is not None:
        listed = node.remote is None and math.prod(grid.counts) <= LIST_CHUNKS_UP_TO
        header = header_address(ds.id) if READ_BTREE and not listed else None
        index = None if header is None else open_btree_index(ds, grid, node.data_file, header, node.remote)
        if index is None:
            index = _listed(ds, grid, index_limit, node, before)
        elif node.remote is not None and index.n_leaves <= REMOTE_LEAVES_AT_OPEN:
            index.load_all()  # a few round trips here, none in the readers this process forks
    layout = Layout(storage, grid, index)
    keep = before is not None and (node.remote is not None or settled(before))  # type: ignore[arg-type]  # a file's, not remote
    if (index is None or not index.needs_handle) and keep and before == _named(node):  # unchanged while listed
        if index is not None:
            index.release()
        _remember((before, node.path), layout)
    return layout


def _listed(ds: Any, grid: ChunkGrid, index_limit: int, node: NodeInfo, before: Any) -> "ChunkIndex":
    """HDF5's listing of ``ds``'s chunks (:class:`ChunkIndex`); a file that changed while it was listed (HDF5 then
    lists chunks past the extent it gave) is a :class:`~multitables.errors.FileChangedError`, not the listing's error."""
    try:
        return ChunkIndex(ds.id, grid, index_limit)
    except Exception as exc:
        if before is None or _named(node) == before:
            raise
        raise FileChangedError(
            f"{node.data_file!r} changed while the chunk index of {node.path!r} was listed; read it again once it is "
            f"written"
        ) from exc


def forget_layouts() -> None:
    """Forget every layout learned in this process: the benchmark times each pass as a first read of its file."""
    global _layout_entries
    with _LAYOUTS_LOCK:
        _LAYOUTS.clear()
        _layout_entries = 0


def _remember(key: "tuple[Any, str]", layout: Layout) -> None:
    global _layout_entries
    if layout.entries > LAYOUT_ENTRIES_KEPT:
        return
    with _LAYOUTS_LOCK:
        old = _LAYOUTS.pop(key, None)
        if old is not None:
            _layout_entries -= old.entries
        _LAYOUTS[key] = layout
        _layout_entries += layout.entries
        while _layout_entries > LAYOUT_ENTRIES_KEPT:
            _layout_entries -= _LAYOUTS.popitem(last=False)[1].entries
