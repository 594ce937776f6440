"""Where each chunk of a dataset lies, read from HDF5's version-1 chunk B-tree ourselves, one leaf at a time, as it is needed.

NOTE [chunk index in file order]
    HDF5's ``chunk_iter`` lists a dataset's chunk index by walking its
    B-tree, and the leaves of that tree lie all through the file: HDF5
    writes each new leaf where the file ends when the last one fills, so a
    leaf lies among the chunks it indexes (one leaf per ~57 chunks: 3.4 MB
    apart in a file of 64 KiB chunks). Listing them at open reads one leaf per
    seek before the first block (~40 seeks, 0.3 s on a disk, the whole gap
    to one h5py process on a RAID 0 of two disks; BENCHMARKS.md). One
    h5py process reads a leaf only when its read reaches the leaf's chunks,
    where the disk's head already is. So does this index: at open it reads
    the object header and the tree's inner nodes (a few reads, at the
    tree's start), which say where each leaf is and which chunks it holds;
    a leaf is read by the first lookup of one of its chunks, in the reader
    that is about to read that stretch of the file.

What it reads is the format of HDF5's default file layout (object header
version 1, layout message version 3, B-tree version 1, 8-byte addresses),
which PyTables and h5py write unless asked for the newest format;
:func:`open_btree_index` returns None for anything else, and the caller
lists the index through HDF5 (:class:`~multitables._io.chunks.storage.ChunkIndex`).
What does not parse as the format says at open goes to HDF5 too; a leaf
read later that does not, or whose chunks lie outside what its parent said,
raises :class:`IndexCorrupt` naming the file and the node's address, before
any row is delivered from it.
"""

from __future__ import annotations

import bisect
import enum
import math
import struct
from typing import TYPE_CHECKING, Any, Final, Iterable, cast

import numpy as np

from .grid import ChunkGrid
from .hdf5lib import chunk_address_base
from .transport import Transport, open_transport
from ...errors import FileChangedError, MultitablesError

if TYPE_CHECKING:
    from ..objects.reader import RemoteObject

#: Bytes read for a node at once (a node of 64 entries of a 2-D dataset is 2.6 KiB); more if it needs more.
NODE_READ = 4096
#: Chunk entries this index holds at most; beyond, the leaves read so far are dropped and read again when needed.
ENTRIES_HELD = 1 << 18

_UNDEFINED = (1 << 64) - 1
_MESSAGE_LAYOUT = 0x0008
_MESSAGE_CONTINUATION = 0x0010


class _Unread(enum.Enum):
    """The type of :data:`UNREAD`: an enum of one, so that ``is UNREAD`` narrows a type checker's union."""

    UNREAD = "UNREAD"

    def __repr__(self) -> str:
        return "UNREAD"


#: What :meth:`BTreeIndex.peek` answers for a chunk whose leaf is not read yet.
UNREAD: Final = _Unread.UNREAD


class _Unusual(Exception):
    """A tree this module could read but leaves to HDF5."""


class IndexCorrupt(MultitablesError, OSError):
    """The chunk index in the file is not what HDF5's format says it should be (the message says where)."""


def _entry_dtype(ndims: int) -> np.dtype:
    """A key of a raw-data B-tree node (chunk size, filter mask, ``ndims`` offsets) and the child after it."""
    return np.dtype([("size", "<u4"), ("mask", "<u4"), ("offset", "<u8", (ndims,)), ("child", "<u8")])


def _open(filename: str, remote: "RemoteObject | None") -> Transport:
    """The file opened for reading nodes: no readahead (a node is a few KiB; the stream's own reads fetch the rest)."""
    return open_transport(filename, random=True, remote=remote)


def _read(file: Transport, offset: int, n: int) -> bytearray:
    """Bytes ``[offset, offset + n)`` of ``file``, fewer where the file ends first."""
    data = bytearray(n)
    del data[file.read_into(offset, data) :]
    return data


def _layout_btree(file: Transport, header: int, base: int) -> "tuple[int, int] | None":
    """(B-tree address, dimensionality) from a version-1 object header at ``header``; None if another format."""
    prefix = _read(file, base + header, 16)
    if len(prefix) < 16 or prefix[0] != 1:
        return None  # version 2 headers ("OHDR") come with the newest format
    blocks = [(header + 16, struct.unpack_from("<I", prefix, 8)[0])]
    seen = 0
    while blocks and seen < 64:
        start, size = blocks.pop(0)
        seen += 1
        data = _read(file, base + start, size)
        p = 0
        while p + 8 <= len(data):
            kind, n, flags = struct.unpack_from("<HHB", data, p)
            body = data[p + 8 : p + 8 + n]
            if kind == _MESSAGE_CONTINUATION and len(body) >= 16:
                blocks.append(struct.unpack_from("<QQ", body))
            elif kind == _MESSAGE_LAYOUT:
                # Version 3, class 2 (chunked): dimensionality, B-tree address. Shared or older: not ours.
                if flags & 0x02 or len(body) < 11 or body[0] != 3 or body[1] != 2:
                    return None
                return struct.unpack_from("<Q", body, 3)[0], body[2]
            p += 8 + n
    return None


class BTreeIndex:
    """Where each stored chunk of a dataset is, from its version-1 B-tree: ``lookup(index)`` gives ``(offset, size, filter_mask)`` or None.

    Built by :func:`open_btree_index`. Holds no open file: a leaf is read by
    opening the file by name (its transport, :func:`~multitables._io.chunks.transport.open_transport`),
    so that a forked reader can use the index it
    inherits; a file that is not the one opened then (NOTE [file identity])
    raises :class:`~multitables.errors.FileChangedError`.
    """

    def __init__(self, filename: str, signature: Any, base: int, ndims: int, grid: ChunkGrid,
                 leaves: list[tuple[int, int]], end: int, remote: "RemoteObject | None" = None) -> None:
        self._filename = filename
        self._remote = remote
        self._signature = signature
        self._base = base
        self._ndims = ndims
        self._grid = grid
        #: Each leaf's first chunk (C-order position on the grid) and address, in order; ``end``: past the last chunk.
        self._firsts = [first for first, _ in leaves]
        self._addrs = [addr for _, addr in leaves]
        self._end = end
        self._loaded = bytearray(len(leaves))
        self._where: dict[int, tuple[int, int, int]] = {}
        self._stored = 0  # bytes of the chunks in ``_where``
        self._ends = [0] * len(leaves)  # where each leaf read last has its chunks end in the file
        self._entry = _entry_dtype(ndims)

    @property
    def n_listed(self) -> int:
        """Chunk entries held (those of the leaves read so far)."""
        return len(self._where)

    @property
    def needs_handle(self) -> bool:
        """Whether lookups need the dataset's h5py handle (never: this index reads the file itself)."""
        return False

    @property
    def mean_size(self) -> "int | None":
        """Mean stored bytes of the chunks listed so far (None before any)."""
        return self._stored // len(self._where) if self._where else None

    @property
    def n_chunks(self) -> int:
        """Chunks of the dataset's grid, stored or not."""
        return self._end

    @property
    def n_leaves(self) -> int:
        return len(self._addrs)

    def peek(self, index: tuple[int, ...]) -> "tuple[int, int, int] | None | _Unread":
        """What :meth:`lookup` of chunk ``index`` answers, or :data:`UNREAD` where that needs a leaf not read yet."""
        k = self._grid.linear(index)
        found = self._where.get(k)
        if found is not None:
            return found
        leaf = bisect.bisect_right(self._firsts, k) - 1
        if leaf < 0 or k >= self._end or self._loaded[leaf]:
            return None  # never written
        return UNREAD

    def guess_offset(self, index: tuple[int, ...]) -> "int | None":
        """Where chunk ``index``, whose leaf is not read, probably starts: for a hint, never for a read.

        A file written in order holds a leaf's chunks after the leaf before's:
        so the end of those (if that leaf was read) plus a mean chunk for each
        chunk between. None where that leaf was not read either.
        """
        k = self._grid.linear(index)
        leaf = bisect.bisect_right(self._firsts, k) - 1
        mean = self.mean_size
        if leaf < 1 or not self._loaded[leaf - 1] or mean is None:
            return None
        return self._ends[leaf - 1] + (k - self._firsts[leaf]) * mean

    def lookup(self, index: tuple[int, ...]) -> "tuple[int, int, int] | None":
        found = self.peek(index)
        if found is not UNREAD:
            return found
        k = self._grid.linear(index)
        self._load(bisect.bisect_right(self._firsts, k) - 1)
        return self._where.get(k)

    def release(self) -> None:
        """Nothing to release (the protocol of :class:`~multitables._io.chunks.storage.ChunkIndex`)."""

    def load_first(self) -> None:
        """Read the first leaf, if not read yet."""
        if self._addrs and not self._loaded[0]:
            self._load(0)

    def first_listed(self) -> "tuple[tuple[int, ...], tuple[int, int, int]] | None":
        """The element coordinates and entry of the first chunk of the leaves read (None if they list none)."""
        if not self._where:
            return None
        k = min(self._where)
        index = np.unravel_index(k, self._grid.counts) if len(self._grid.counts) > 1 else (k,)
        return self._grid.origin(tuple(int(i) for i in index)), self._where[k]

    def load_all(self) -> None:
        """Read every leaf not read yet (what ``chunk_iter`` does at open), together."""
        unread = [leaf for leaf in range(len(self._addrs)) if not self._loaded[leaf]]
        if unread:
            self._load(*unread)

    def load_for(self, chunks: "Iterable[tuple[int, ...]]", ahead: int = 0) -> None:
        """Read, together, the leaves not read yet that ``chunks`` need, and up to ``ahead`` more after the last of those
        not read yet (on an object: one request each, in flight at once, a round trip for them all)."""
        leaves = {bisect.bisect_right(self._firsts, self._grid.linear(c)) - 1 for c in chunks if self.peek(c) is UNREAD}
        if leaves:
            after = [k for k in range(max(leaves) + 1, len(self._addrs)) if not self._loaded[k]][:ahead]
            self._load(*sorted(leaves), *after)

    def _load(self, *leaves: int) -> None:
        if len(self._where) > ENTRIES_HELD:
            self._where.clear()
            self._loaded = bytearray(len(self._addrs))
            self._stored = 0
        file = _open(self._filename, self._remote)
        try:
            if file.identity() != self._signature:
                raise FileChangedError(
                    f"{self._filename!r} changed since its chunk index was opened: the rest of the index "
                    f"could describe other data, so it is not read"
                )
            addrs = [self._base + self._addrs[leaf] for leaf in leaves]
            heads = [bytearray(NODE_READ) for _ in leaves]
            if len(leaves) == 1:  # one node: as the index's other nodes are read (an object's, through its block cache)
                got = [file.read_into(addrs[0], heads[0])]
            else:
                got = file.read_ranges(addrs, heads)
            nodes = [read_node(file, self._base, self._addrs[leaf], self._entry, self._filename, head[:n])
                     for leaf, head, n in zip(leaves, heads, got)]
        finally:
            file.close()
        for leaf, (level, entries) in zip(leaves, nodes):
            self._take(leaf, level, entries)

    def _take(self, leaf: int, level: int, entries: np.ndarray) -> None:
        """Note where the chunks of ``leaf`` (read: its ``level`` and ``entries``) are."""
        lo = self._firsts[leaf]
        hi = self._firsts[leaf + 1] if leaf + 1 < len(self._firsts) else self._end
        where = self._where
        where_node = self._base + self._addrs[leaf]
        if level != 0:
            raise IndexCorrupt(f"{self._filename!r}: chunk B-tree node at byte {where_node} is at level {level}, expected a leaf")
        linear, inside = positions(self._grid, entries["offset"][:-1], self._filename, where_node)
        for k, ok, entry in zip(linear, inside, entries[:-1].tolist()):
            if not ok:
                continue  # a chunk past the extent (a dataset shrunk): never read
            if not lo <= k < hi:
                raise IndexCorrupt(f"{self._filename!r}: chunk B-tree leaf at byte {where_node} lists a chunk "
                                   f"outside the range its parent gives it")
            size, mask, _, child = entry
            if k not in where:
                self._stored += size
            where[k] = (self._base + child, size, mask)
            self._ends[leaf] = max(self._ends[leaf], self._base + child + size)
        self._loaded[leaf] = 1


def positions(grid: ChunkGrid, offsets: np.ndarray, filename: str, where: int) -> tuple[list[int], list[bool]]:
    """C-order grid positions of chunk keys (element offsets per axis, the element-size axis last), and which lie inside the extent."""
    chunks = np.asarray(grid.chunks, np.uint64)
    if len(offsets) and (offsets[:, -1].any() or (offsets[:, :-1] % chunks).any()):
        raise IndexCorrupt(f"{filename!r}: chunk B-tree node at byte {where} holds keys off the chunk grid")
    index = (offsets[:, :-1] // chunks).astype(np.int64)
    inside = (index < np.asarray(grid.counts, np.int64)).all(axis=1)
    linear = np.zeros(len(index), np.int64)
    for axis, count in enumerate(grid.counts):
        linear = linear * count + index[:, axis]
    return linear.tolist(), cast("list[bool]", inside.tolist())  # numpy's stubs: a bool array's list is Any


def read_node(file: Transport, base: int, addr: int, entry: np.dtype, filename: str,
              data: "bytearray | None" = None) -> tuple[int, np.ndarray]:
    """(level, entries) of the raw-data B-tree node at ``addr``: ``entries`` holds one more key than children (its last ``child`` is junk).

    ``data``: the node's first bytes, read already (else ``NODE_READ`` of them are read here).
    """
    data = _read(file, base + addr, NODE_READ) if data is None else data
    if len(data) < 24 or data[:4] != b"TREE" or data[4] != 1:
        raise IndexCorrupt(f"{filename!r}: no chunk B-tree node at byte {base + addr}")
    level, used = data[5], struct.unpack_from("<H", data, 6)[0]
    need = 24 + (used + 1) * entry.itemsize - 8  # keys and children alternate, a key last
    if len(data) < need:
        data += _read(file, base + addr + len(data), need - len(data))
        if len(data) < need:
            raise IndexCorrupt(f"{filename!r}: the chunk B-tree node at byte {base + addr} runs past the file's end")
    body = bytearray(data[24:need]) + bytes(8)  # room for the last key's missing child
    return level, np.frombuffer(bytes(body), entry, used + 1)


def open_btree_index(ds: Any, grid: ChunkGrid, filename: str, header: int, remote: "RemoteObject | None" = None) -> "BTreeIndex | None":
    """The chunk index of the open chunked ``h5py.Dataset`` ``ds``, read from its B-tree (its inner nodes now, leaves later).

    ``header``: the address of the dataset's object header (relative to the userblock);
    ``remote``: the object the file is, where it is one (read by ranged GETs).
    None when the dataset's metadata is in a format this module does not
    read (NOTE [chunk index in file order]): then ask HDF5.
    """
    fcpl = ds.file.id.get_create_plist()
    if fcpl.get_sizes() != (8, 8):
        return None
    base = int(fcpl.get_userblock())
    ndims = len(grid.shape) + 1
    entry = _entry_dtype(ndims)
    file = _open(filename, remote)
    try:
        signature = file.identity()
        found = _layout_btree(file, header, base)
        if found is None or found[1] != ndims:
            return None
        root, _ = found
        end = math.prod(grid.counts)
        leaves: list[tuple[int, int]] = []
        if root != _UNDEFINED:  # else no chunk was ever written
            _inner(file, base, root, entry, filename, grid, leaves, None)
    except (_Unusual, IndexCorrupt, struct.error):
        return None  # HDF5 lists it instead, and says what is wrong if something is
    finally:
        file.close()
    index = BTreeIndex(filename, signature, base, ndims, grid, leaves, end, remote)
    try:
        return index if _agrees(index, ds) else None
    except IndexCorrupt:
        return None


def _inner(file: Transport, base: int, addr: int, entry: np.dtype, filename: str, grid: ChunkGrid,
           leaves: list[tuple[int, int]], level_above: "int | None") -> None:
    """Walk the inner nodes under ``addr`` (depth first, so in key order), noting each leaf's first chunk and address."""
    level, entries = read_node(file, base, addr, entry, filename)
    if level_above is not None and level != level_above - 1:
        raise IndexCorrupt(f"{filename!r}: chunk B-tree node at byte {base + addr} is at level {level} under level {level_above}")
    firsts, inside = positions(grid, entries["offset"][:-1], filename, base + addr)
    if not all(inside):
        raise _Unusual  # a child starting past the extent (a dataset shrunk): left to HDF5
    if firsts != sorted(firsts) or (leaves and firsts and firsts[0] < leaves[-1][0]):
        raise IndexCorrupt(f"{filename!r}: chunk B-tree node at byte {base + addr} holds keys out of order")
    children = entries["child"][:-1].tolist()
    if level == 0:  # the root is a leaf: the node itself
        leaves.append((firsts[0] if firsts else 0, addr))
        return
    for first, child in zip(firsts, children):
        if level == 1:
            leaves.append((first, child))
        else:
            _inner(file, base, child, entry, filename, grid, leaves, level)


def _agrees(index: BTreeIndex, ds: Any) -> bool:
    """Whether HDF5 finds the first chunk listed where this index does: a check of the parse and the base address.

    A lookup by coordinate reads only the path to one leaf (one by position
    in the index, ``get_chunk_info(0)``, walks every leaf).
    """
    if index.n_leaves == 0:
        return True
    index.load_first()
    first = index.first_listed()
    if first is None:
        return True  # an empty leaf: nothing stored to find
    origin, found = first
    info = ds.id.get_chunk_info_by_coord(origin)
    at = None if info.byte_offset is None else int(info.byte_offset) + chunk_address_base(ds.id)
    return at is not None and found == (at, int(info.size), int(info.filter_mask))
