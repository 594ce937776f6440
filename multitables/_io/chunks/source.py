"""The chunk engine's source: read a dataset's stored chunks through a transport and decode them ourselves.

HDF5 reads a compressed chunk through an ordinary inflate, its own shuffle and
a copy or two. This engine finds where each chunk lies (from the dataset's
B-tree, a leaf as the rows reach it, :mod:`~multitables._io.chunks.btree`; else
asking HDF5 at open), reads the stored bytes itself (through a transport,
:mod:`multitables._io.chunks.transport`: ``pread`` on a local file), and undoes the filters with the fastest
codecs it has (:mod:`multitables._io.chunks.codecs`) straight into the caller's block
where a chunk covers whole rows of it; :mod:`multitables._io.chunks.grid` says
which chunks a row range needs and where each lands. One core, warm cache,
PyTables' zlib-3 + shuffle float32 rows: 2.1-2.3x h5py's ``read_direct``;
blosc-3: 1.1-1.2x (its decoder is the same c-blosc).

What it reads, and what it leaves to h5py (:func:`~multitables._io.chunks.storage.chunks_problem`
says why, checked before any reader starts, so a stream never fails over midway):

* chunked datasets whose every filter :mod:`~multitables._io.chunks.codecs` decodes,
  and contiguous ones (read with one call into the block);
* element types whose stored bytes are the bytes h5py delivers: integers and
  IEEE floats of any byte order, booleans (PyTables' bitfields) and enums,
  complex, fixed-length strings (null-terminated and space-padded ones
  converted as h5py's conversion does, :func:`~multitables._io.strings.deliver_strings`),
  HDF5 array elements, and compounds and arrays of those;
* not compact, virtual or external storage, nor HDF5's option to leave
  partial edge chunks unfiltered.

Chunks never written read as the dataset's fill value, as in HDF5 (zeros
where HDF5 writes none, as h5py's reads give).

``cache="direct"`` reads the stored bytes with ``O_DIRECT`` (page-aligned
buffers, aligned file ranges; :mod:`multitables._io.chunks.pread`), past the
page cache, with the stock wheels: the cold-cache figure without rebuilding
HDF5 with its direct driver.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..._sys.spares import spare_bytes
from .grid import ChunkPart, Extent, ReadGroup, chunk_parts, coalesce
from .tiles import TileRows
from .codecs.base import ChunkDecodeError
from .decoded import DecodedChunks
from .codecs.pipeline import Pipeline
from .codecs.registry import build_pipeline
from ..fields import select_field
from ..files import check_opened
from ..node import NodeInfo, close_dataset, reopen_dataset
from ..strings import deliver_strings
from .btree import UNREAD
from .pread import CACHES
from .storage import INDEX_ALL_LIMIT, ChunkIndex, Layout, known_layout, learn_layout
from .transport import ScratchBuffer, Transport, open_transport


#: Leaves of the chunk index read ahead, with those a read needs, where a read waits a round trip (an object): a batch
#: of 16 leaves of 4 KiB covers some 900 chunks.
LEAVES_AHEAD = 16


class ChunkSource:
    """One open dataset read by the chunk engine (the :class:`~multitables._io.engines.Source` protocol).

    The layout and chunk index come from what this process learned of the
    file before (NOTE [layout cache] in ``storage``), else from ``dataset``,
    an open ``h5py.Dataset`` of the node (its file is closed here), else
    from the file opened briefly. ``scratch``: the buffer for stored bytes,
    shared with the other sources of a set (this source's own when None).
    ``decoded_bytes``: decoded chunks kept for reads of rows in them again
    (a request reader's; :mod:`~multitables._io.chunks.decoded`), 0 for none.
    Raises :class:`~multitables._io.chunks.storage.Unsupported` for what the engine
    cannot read.
    """

    engine = "chunks"

    def __init__(self, node: NodeInfo, cache: str = "page", dataset: Any = None, index_limit: int = INDEX_ALL_LIMIT,
                 scratch: "ScratchBuffer | None" = None, decoded_bytes: int = 0) -> None:
        if cache not in CACHES:
            raise ValueError(f"cache={cache!r} is not one of {CACHES}")
        self._node = node
        self._bytes: "Transport | None" = None
        self._h5file: Any = None
        self._decoded: "DecodedChunks | None" = None
        layout = known_layout(node)
        if layout is not None and isinstance(layout.index, ChunkIndex) and layout.index.n_listed > index_limit:
            layout = None  # a caller that asks for HDF5's lookups gets them
        if layout is None:
            if dataset is None:
                dataset = reopen_dataset(node)
            self._h5file = dataset.id  # closing it closes its file too (node.close_dataset)
        else:
            close_dataset(dataset)
        try:
            if layout is None:
                layout = learn_layout(dataset, node, index_limit)
                if layout.index is None or not layout.index.needs_handle:  # the file is no longer needed
                    self._h5file.close()
                    self._h5file = None
            self._setup(layout, cache, scratch, decoded_bytes)
        except BaseException:
            self.close()
            raise

    def _setup(self, layout: Layout, cache: str, scratch: "ScratchBuffer | None", decoded_bytes: int) -> None:
        node = self._node
        storage = layout.storage
        self._layout = layout
        self._storage = storage
        self._dtype = np.dtype(node.file_dtype)
        # Bytes are moved as opaque elements: numpy expands an array element type
        # (``('<f8', (3,))``) into axes, which the chunk selections do not have.
        self._edtype = self._dtype if self._dtype.subdtype is None else np.dtype((np.void, self._dtype.itemsize))
        self._pads = node.string_pads
        self._file_row_shape = storage.shape[1:]
        self._row_nbytes = math.prod(self._file_row_shape) * self._dtype.itemsize
        self._field = node.field
        self._rows: "np.ndarray | None" = None  # whole rows, for reading one field
        self._own_scratch = scratch is None
        self._scratch = ScratchBuffer() if scratch is None else scratch
        self._bytes = open_transport(node.data_file, cache, remote=node.remote)
        if node.remote is None and node.linked_file is None:  # the file whose layout this is, not one named so now
            check_opened(node.data_file, self._bytes.identity(), node.identity)
        self._kept: dict[tuple[int, ...], np.ndarray] = {}
        self._free: list[np.ndarray] = []
        self._fetched: "list[tuple[int, np.ndarray]]" = []  # (file offset, bytes) of the last fetch
        self._after: "int | None" = None  # the row after the last read, and whether this read starts there
        self._in_turn = True
        self._index = layout.index
        self._grid = layout.grid
        self._parts = False  # whether a part of a chunk can be decoded alone (see _decode_part)
        self._raw_parts = False
        self._tiles: "TileRows | None" = None
        if storage.chunks is None:
            return
        self._chunk_nbytes = math.prod(storage.chunks) * self._dtype.itemsize
        if decoded_bytes and layout.grid is not None:
            decoded = DecodedChunks(decoded_bytes)
            self._decoded = decoded if decoded.takes(self._chunk_nbytes) else None
        self._pipeline: Pipeline = build_pipeline(storage.filters, self._chunk_nbytes, self._dtype.itemsize)
        self._parts = layout.grid is not None and layout.grid.whole_rows and self._pipeline.decodes_parts
        # Chunks of whole rows stored as they are: a part of one is its rows' bytes in the file (_read_stored_parts).
        self._raw_parts = layout.grid is not None and layout.grid.whole_rows and self._bytes.align == 1
        self._fill = np.frombuffer(storage.fill, self._edtype)[0]
        if layout.grid is not None and not layout.grid.whole_rows:  # tiles: a chunk-row copied at a time
            self._tiles = TileRows(layout.grid, self._edtype, self._chunk_nbytes)

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
            column = select_field(rows, self._field)  # rows x file row shape x the field's sub-array shape
            np.copyto(out.reshape(column.shape), column)
            return
        if self._edtype is self._dtype:
            rows = out.reshape((n,) + self._file_row_shape)
        else:
            rows = out.reshape(-1).view(np.uint8).view(self._edtype).reshape((n,) + self._file_row_shape)
        self._read_rows(start, stop, rows)
        deliver_strings(rows, self._pads, self._dtype.itemsize)

    @property
    def reads_runs(self) -> bool:
        """Whether :meth:`read_runs` reads this dataset: contiguous, whole rows as stored, no alignment to keep."""
        transport = self._bytes
        return (self._grid is None and self._field is None and self._edtype is self._dtype and transport is not None
                and transport.align == 1 and self._storage.offset is not None)

    def read_runs(self, starts: Sequence[int], stops: Sequence[int], out: np.ndarray) -> None:
        """Rows ``[starts[i], stops[i])``, one run after another, into ``out`` (C-contiguous, their rows in all), with one
        call of the transport's ``read_ranges`` (where :attr:`reads_runs`).

        Random rows of a contiguous dataset are one run each: read so, a row costs one ``pread`` (or is in flight with
        the others, on an object), not a pass through :meth:`read_into`'s layers (which took half of a 4 KiB row's time).
        """
        if not out.flags.c_contiguous:
            raise ValueError("the chunk engine reads into C-contiguous arrays only")
        transport = self._bytes
        assert transport is not None and self._storage.offset is not None
        nbytes, base = self._row_nbytes, self._storage.offset
        out_bytes = out.reshape(-1).view(np.uint8)
        outs, offsets, at = [], [], 0
        for start, stop in zip(starts, stops):
            n = (stop - start) * nbytes
            outs.append(out_bytes[at : at + n])
            offsets.append(base + start * nbytes)
            at += n
        for got, o, start, stop in zip(transport.read_ranges(offsets, outs), outs, starts, stops):
            if got != len(o):
                raise ChunkDecodeError(f"{self._node.filename!r} ends before rows {start}:{stop} of {self._node.path!r} "
                                       f"(contiguous, from byte {base + start * nbytes})")
        deliver_strings(out, self._pads, self._dtype.itemsize)
        if stops:
            self._after = stops[-1]

    def prefetch(self, start: int, stop: int) -> None:
        """Start reading the stored bytes of rows ``[start, stop)`` into the page cache; returns at once.

        A reader calls it for the block it expects to read next, so that the
        disk works while this block decodes (a cold zlib-3 file read 1.6x
        faster by two readers; BENCHMARKS.md). Does nothing with ``O_DIRECT``.
        """
        transport = self._bytes
        if transport is None or not transport.hints or start >= stop:
            return
        self._layout.hint(start, stop, self._row_nbytes, transport.hint, self._kept, transport.resident)

    def fetch(self, spans: "list[tuple[int, int]]") -> None:
        """Where a read waits a round trip (an object): fetch the stored bytes of the chunks of ``spans`` (a block's
        pieces) now, every group in flight at once, and keep them until the next fetch.

        The reads of those rows then take their bytes from memory: a reader
        reads a block in timed pieces (NOTE [orphans] in ``_io.blockread``),
        and each piece would otherwise wait its own round trip.
        """
        transport, grid, index = self._bytes, self._grid, self._index
        self._fetched = []
        if transport is None or not transport.index_ahead or grid is None or index is None:
            return
        extents: list[Extent] = []
        for start, stop in spans:
            self._layout.find(start, stop, LEAVES_AHEAD)
            for chunk in self._layout.chunks(start, stop):
                found = None if chunk in self._kept else index.lookup(chunk)
                if found is not None:
                    extents.append(Extent(found[0], found[1], len(extents)))
        groups = coalesce(extents, transport.max_gap, transport.max_read)
        buffers = [np.empty(g.stop - g.start, np.uint8) for g in groups]
        got = transport.read_ranges([g.start for g in groups], buffers)
        self._fetched = [(g.start, b[:n]) for g, b, n in zip(groups, buffers, got)]

    def _from_fetched(self, start: int, n: int) -> "np.ndarray | None":
        """File bytes ``[start, start + n)`` as fetched by :meth:`fetch`, or None where it did not fetch them all."""
        for first, data in self._fetched:
            if first <= start and start + n <= first + len(data):
                return data[start - first : start - first + n]
        return None

    def _read_rows(self, start: int, stop: int, out: np.ndarray) -> None:
        if out.size == 0:
            return
        self._in_turn = self._after in (None, start)  # the first read, or one that goes on from the last
        self._after = stop
        out_bytes = out.reshape(-1).view(np.uint8)
        if self._grid is None:
            self._read_contiguous(start, stop, out_bytes)
            return
        pending: list[tuple[ChunkPart, int, int, int]] = []  # part, file offset, stored size, filter mask
        kept: dict[tuple[int, ...], np.ndarray] = {}
        index = self._index
        assert index is not None
        if self._bytes is not None and self._bytes.index_ahead:
            # An object's: the leaves these rows need and the next ones, one round trip for all.
            self._layout.find(start, stop, LEAVES_AHEAD)
        for part in chunk_parts(self._grid, start, stop):
            chunk = self._kept.pop(part.index, None)
            if chunk is not None:  # decoded for the previous block, which cut it
                self._place(part, chunk, out, kept, stop)
                continue
            chunk = None if self._decoded is None else self._decoded.get(part.index)
            if chunk is not None:  # decoded for an earlier read, and kept
                self._copy_part(part, chunk, out)
                continue
            found = index.peek(part.index)
            if found is UNREAD:
                # The index reads a leaf next, which lies among the chunks from here on
                # (NOTE [chunk index in file order]): read what comes before it, then hint
                # the rest of the block on from there, so that the disk reaches the leaf in file order.
                if pending:
                    self._read_pending(pending, out, kept, stop)
                    pending = []
                self.prefetch(start + part.rows[0], stop)
                found = index.lookup(part.index)
            if found is None:  # never written: the fill value, as HDF5 reads it
                out[part.out_sel] = self._fill
                continue
            pending.append((part, *found))
        self._recycle()
        self._kept = kept
        if pending:
            self._read_pending(pending, out, kept, stop)

    def _read_pending(self, pending: "list[tuple[ChunkPart, int, int, int]]", out: np.ndarray, kept: dict, stop: int) -> None:
        """Read the stored bytes of ``pending`` chunks (coalesced, in file order) and decode each into ``out``."""
        transport = self._bytes
        assert transport is not None
        out_bytes = out.reshape(-1).view(np.uint8)
        if self._raw_parts and not self._fetched:
            pending = self._read_stored_parts(pending, out_bytes)
        tiles = self._tiles if self._decoded is None else None
        if tiles is not None:  # all but the chunk-row kept for the next block (:meth:`_keeps`, the one holding row stop - 1)
            grid = self._grid
            assert grid is not None  # tiles are made for a chunked node only
            c0 = grid.chunks[0]
            kept_row = stop // c0 if stop % c0 and stop < grid.shape[0] else -1
            tiles.expect([part for part, *_ in pending], kept_row)
        extents = [Extent(offset, size, k) for k, (_, offset, size, _) in enumerate(pending)]
        for group in coalesce(extents, transport.max_gap, transport.max_read, transport.align):
            rows = self._stored_run(group, pending) if transport.align == 1 else None
            if rows is not None:
                # Stored as they are (no filter, or incompressible), back to back in the file as in the
                # block: one read straight into the block, no copy.
                a, b = rows
                dst = out_bytes[a * self._row_nbytes : b * self._row_nbytes]
                fetched = self._from_fetched(group.start, len(dst))
                if fetched is not None:
                    dst[:] = fetched
                elif transport.read_into(group.start, dst) != len(dst):
                    part, offset, size, _ = pending[group.members[-1].key]
                    raise self._error(part, offset, size, "the file ends before the chunk does")
                continue
            need = max(e.offset + e.size for e in group.members) - group.start
            buf = self._read_span(group.start, group.stop, need)
            for e in group.members:
                part, offset, size, mask = pending[e.key]
                raw = buf[e.offset - group.start : e.offset - group.start + size]
                if part.whole:
                    a, b = part.rows
                    self._decode(part, raw, offset, mask, out_bytes[a * self._row_nbytes : b * self._row_nbytes])
                elif self._decoded is not None:  # the whole chunk, kept for reads of its other rows
                    chunk = self._take()
                    self._decode(part, raw, offset, mask, chunk)
                    self._copy_part(part, chunk, out)
                    self._free.extend(self._decoded.put(part.index, chunk))
                elif tiles is not None and part.index[0] != kept_row:
                    self._decode(part, raw, offset, mask, tiles.into(part))
                    tiles.decoded(part, out)
                elif not (self._parts and self._decode_part(part, raw, offset, mask, out_bytes, stop)):
                    chunk = self._take()
                    self._decode(part, raw, offset, mask, chunk)
                    self._place(part, chunk, out, kept, stop)

    def _read_stored_parts(self, pending: "list[tuple[ChunkPart, int, int, int]]",
                           out_bytes: np.ndarray) -> "list[tuple[ChunkPart, int, int, int]]":
        """Read the parts of ``pending`` chunks stored as they are (no filter, or all skipped) straight from the file into
        ``out_bytes``, only their rows' bytes, all in one ``read_ranges``; returns the other chunks.

        A random row of an unfiltered dataset (PyTables' chunks of 128 rows of 4 KiB) read its whole chunk, 128 times
        its bytes, and copied it twice.
        """
        rest, offsets, outs, parts = [], [], [], []
        nbytes = self._row_nbytes
        for entry in pending:
            part, offset, size, mask = entry
            if part.whole or size != self._chunk_nbytes or not self._pipeline.is_identity(mask):
                rest.append(entry)
                continue
            a, b = part.rows
            offsets.append(offset + part.chunk_sel[0].start * nbytes)
            outs.append(out_bytes[a * nbytes : b * nbytes])
            parts.append(entry)
        if outs:
            assert self._bytes is not None
            for got, o, (part, offset, size, _) in zip(self._bytes.read_ranges(offsets, outs), outs, parts):
                if got != len(o):
                    raise self._error(part, offset, size, "the file ends before the chunk does")
        return rest

    def _stored_run(self, group: ReadGroup, pending: "list[tuple[ChunkPart, int, int, int]]") -> "tuple[int, int] | None":
        """The block's rows ``(a, b)`` that ``group`` fills as stored, if it is whole chunks stored as they are, one
        after another in the file and in the block; else None."""
        a = b = end = -1
        for e in group.members:
            part, offset, size, mask = pending[e.key]
            if not (part.whole and size == self._chunk_nbytes and self._pipeline.is_identity(mask)):
                return None
            if end >= 0 and (offset != end or part.rows[0] != b):
                return None
            if end < 0:
                a = part.rows[0]
                if offset != group.start:
                    return None
            b, end = part.rows[1], offset + size
        return (a, b) if end == group.stop else None

    def _decode(self, part: ChunkPart, raw: Any, offset: int, mask: int, dst: np.ndarray) -> None:
        try:
            self._pipeline.decode(raw, mask, dst)
        except ChunkDecodeError as exc:
            raise self._error(part, offset, len(raw), str(exc)) from None

    def _decode_part(self, part: ChunkPart, raw: Any, offset: int, mask: int, out_bytes: np.ndarray, stop: int) -> bool:
        """Decode only the rows ``part`` needs of its chunk straight into ``out_bytes`` (where chunks hold whole rows and
        blosc is the one filter: it decodes the blocks holding them, for a row of a 1 MiB chunk one 256 KiB block, and
        copies a chunk it left as it was); False where it did not
        (the caller decodes the whole chunk, and keeps it for a next block that starts inside it: :meth:`_place`).

        Reads that follow one another (one reader's stream) still decode and keep a chunk the block ends inside,
        for the next block (in this process: the two halves decoded apart took 1.13x the time). Reads that do not
        (random rows; one of several readers, whose next block starts elsewhere) decode only their part: random rows
        of 1 MiB blosc chunks ~1.5x faster, two readers on blocks that cut chunks 1.05-1.13x (BENCHMARKS.md)."""
        if self._in_turn and self._keeps(part, stop):
            return False
        a, b = part.rows
        dst = out_bytes[a * self._row_nbytes : b * self._row_nbytes]
        try:
            return self._pipeline.decode_part(raw, mask, part.chunk_sel[0].start * self._row_nbytes, dst)
        except ChunkDecodeError as exc:
            raise self._error(part, offset, len(raw), str(exc)) from None

    def _keeps(self, part: ChunkPart, stop: int) -> bool:
        """Whether the chunk of ``part`` is kept for the next block, which starts inside it (the block ends at ``stop``)."""
        assert self._grid is not None and self._storage.chunks is not None
        chunk_stop = (part.index[0] + 1) * self._storage.chunks[0]  # its origin's row, plus its rows
        return stop < min(chunk_stop, self._grid.shape[0])

    def _error(self, part: ChunkPart, offset: int, size: int, why: str) -> ChunkDecodeError:
        assert self._grid is not None
        where = ", ".join(str(o) for o in self._grid.origin(part.index))
        return ChunkDecodeError(
            f"chunk at ({where}) of {self._node.path!r} in {self._node.filename!r} "
            f"(file bytes {offset}..{offset + size}): {why}"
        )

    def _place(self, part: ChunkPart, chunk: np.ndarray, out: np.ndarray, kept: dict, stop: int) -> None:
        """Copy the part of a decoded chunk into ``out``; keep the chunk if the next block starts inside it."""
        self._copy_part(part, chunk, out)
        if self._keeps(part, stop):
            kept[part.index] = chunk
        else:
            self._free.append(chunk)

    def _copy_part(self, part: ChunkPart, chunk: np.ndarray, out: np.ndarray) -> None:
        assert self._storage.chunks is not None
        elements = chunk.view(self._edtype).reshape(self._storage.chunks)
        np.copyto(out[part.out_sel], elements[part.chunk_sel])

    def _take(self) -> np.ndarray:
        return self._free.pop() if self._free else spare_bytes(self._chunk_nbytes)  # NOTE [spare buffers]

    def _recycle(self) -> None:
        """Chunks kept for a block that did not come: back to the free list."""
        self._free.extend(self._kept.values())
        self._kept = {}

    def _read_span(self, start: int, stop: int, need: int) -> np.ndarray:
        """File bytes ``[start, stop)`` in the scratch buffer (aligned as the transport needs); at least ``need`` of them must exist."""
        transport = self._bytes
        assert transport is not None
        fetched = self._from_fetched(start, need)
        if fetched is not None:
            return fetched
        view = self._scratch.get(stop - start)
        got = transport.read_into(start, view)
        if got < need:
            raise ChunkDecodeError(f"{transport.name!r} ends at byte {start + got}; a chunk reaches byte {start + need}")
        return view

    def _read_contiguous(self, start: int, stop: int, out_bytes: np.ndarray) -> None:
        transport = self._bytes
        assert transport is not None and self._storage.offset is not None
        first = self._storage.offset + start * self._row_nbytes
        n = (stop - start) * self._row_nbytes
        align = transport.align
        if align == 1:
            got = transport.read_into(first, out_bytes)
        else:  # the block is not aligned: through the scratch buffer
            a = first - first % align
            b = -(-(first + n) // align) * align
            buf = self._read_span(a, b, first + n - a)
            out_bytes[:] = buf[first - a : first - a + n]
            got = n
        if got != n:
            raise ChunkDecodeError(
                f"{self._node.filename!r} ends before rows {start}:{stop} of {self._node.path!r} (contiguous, from byte {first})"
            )

    def close(self) -> None:
        """Release the file (idempotent)."""
        if self._bytes is not None:
            self._bytes.close()
            self._bytes = None
            if self._own_scratch:
                self._scratch.release()
        if self._h5file is not None:
            try:
                self._h5file.close()
            except Exception:  # pragma: no cover
                pass
            self._h5file = None
        self._kept = {}
        self._free = []
        self._fetched = []
        if self._decoded is not None:
            self._decoded.clear()
