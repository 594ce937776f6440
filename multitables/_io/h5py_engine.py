"""The ``h5py`` engine: HDF5 reads, with hdf5plugin's filters, straight into the caller's buffer.

:data:`ENGINE` is the engine in the registry (:mod:`multitables._io.engines`).
:class:`H5pySource` is the one place a dataset is opened with h5py for
reading rows (the chunk engine asks h5py only about storage): row ranges
for the streams (:meth:`~H5pySource.read_into`), runs of sorted rows for
random access (:meth:`~H5pySource.read_runs`, read by :class:`H5pyRows`).
Both go through the low-level ``DatasetID.read``: h5py's ``read_direct``
adds ~0.1 ms a call.

NOTE [blosc chunks as stored]
    HDF5 decodes a filtered chunk into a buffer of its own and then copies it into the caller's. Where a node's
    chunks hold whole rows of plain numbers stored as the very type h5py reads them into (so HDF5 converts nothing)
    and blosc is their only filter, :meth:`H5pySource.read_into` takes chunks of at least
    :data:`STORED_CHUNK_MIN_BYTES` as stored (``H5Dread_chunk``, h5py's ``read_direct_chunk``) and decodes them
    straight into the block with the chunk engine's blosc codec: blosc's header names its own shuffle and codec, so
    nothing more about the node is looked up. Of a chunk the block needs only part of, only the blosc blocks that
    hold those rows are decoded (``blosc2_getitem``; 256 KiB each in the benchmark's files), where HDF5 decodes the
    whole chunk. Any chunk HDF5 will not hand over as stored or the codec cannot decode, and every row after it,
    HDF5 reads as before (its own error, where the chunk is damaged). Random access reads each run of rows so where
    no two runs share a chunk (a row of a 1 MiB chunk: one 256 KiB blosc block, not the chunk); runs that share one
    HDF5 reads, decoding the chunk once for all. Smaller chunks lose what they save to a call per chunk: three files
    of 64 KiB chunks read 1.19x h5py's time this way against 1.33x through HDF5's pipeline (BENCHMARKS.md, issue 29).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Literal, Sequence

import numpy as np

from .._plan.requests import ReadRows, effective_chunk_rows, rows_array, run_bounds
from .._sys.signals import raised_by_handler
from .._sys.spares import spare_bytes
from .chunks.codecs.base import BLOSC, ChunkDecodeError
from .chunks.codecs.blosc import Blosc
from .chunks.hdf5lib import leaves_edge_chunks_unfiltered
from .chunks.pread import resident, will_need
from .chunks.storage import Layout, known_layout, learn_layout
from .files import GrowingFile, check_opened
from .h5filters import filter_label, h5py_lacks, register_filters
from .handles import HeldOpen, refresh_swmr
from .node import NodeInfo, Unsupported, close_dataset, reopen_dataset
from .objects.hdf5 import check_options, file_object
from .outside import h5py_outside_problem
from .scattered import RowSpans, Stopped, read_progression, rows_decoded_bytes
from .strings import deliver_strings, find_string_pads, stored_strings_type
from .vlen import read_objects


def _chunk_cache_bytes(node: NodeInfo, plan: Any) -> int:
    """Bytes of HDF5 chunk cache for a reader that reads ``plan``'s blocks.

    Measured (h5py, 4 MiB blocks of whole 256 KiB chunks): without a chunk cache HDF5 decodes straight into the
    caller's buffer, 1.8x faster on uncompressed data and 1.2x on blosc than with the default 1 MiB cache, the same
    on zlib. Blocks that cut chunks need the cache, or the chunk they share with the next block is decoded twice:
    keep two chunk-rows. Chunks narrower than a row are scattered over the caller's rows: with no cache HDF5 moves an
    uncompressed one an element at a time (BENCHMARKS.md).
    """
    if node.chunk_rows is None or plan is None:
        return 1 << 20
    spans_rows = node.chunk_shape is None or tuple(node.chunk_shape[1:]) == tuple(node.row_shape)
    if spans_rows and whole_chunks(plan, node.n_rows, node.chunk_rows):
        return 0
    chunk_row_bytes = node.chunk_rows * max(node.file_dtype.itemsize, 1) * math.prod(node.row_shape)
    return max(1 << 20, 2 * chunk_row_bytes + (chunk_row_bytes >> 3))


def _memory_type(dtype: np.dtype) -> Any:
    """HDF5's memory type for reading into ``dtype`` (``h5t.py_create``); a plain number's made once per process.

    ~8 us a call with cold caches, which a 1 MB file's pass notices. Kept per dtype, so only those without h5py's
    metadata: numpy's equality ignores it (an enum of int8 equals int8)."""
    import h5py

    if dtype.metadata is None and dtype.names is None and dtype.subdtype is None and dtype.kind in "biufc":
        return _plain_memory_type(dtype)
    return h5py.h5t.py_create(dtype)


@functools.lru_cache(maxsize=32)
def _plain_memory_type(dtype: np.dtype) -> Any:
    import h5py

    return h5py.h5t.py_create(dtype)


#: The smallest chunk :meth:`H5pySource.read_into` decodes itself, in bytes (NOTE [blosc chunks as stored]).
STORED_CHUNK_MIN_BYTES = 512 << 10
#: The most a blosc buffer adds to the bytes it holds (c-blosc's ``BLOSC_MAX_OVERHEAD``).
BLOSC_OVERHEAD = 16


def stored_chunk_bytes(node: NodeInfo) -> int:
    """Bytes in one chunk of ``node`` where :meth:`H5pySource.read_into` may decode its chunks itself (NOTE [blosc
    chunks as stored]; the source also checks that HDF5 would convert nothing); 0 where HDF5 decodes them."""
    dt, chunks = node.file_dtype, node.chunk_shape
    if (
        node.filter_ids != (BLOSC,) or chunks is None or node.field is not None or node.zero_first
        or node.remote is not None or node.dtype != dt or dt.metadata is not None or dt.kind not in "iufc"
        or tuple(chunks[1:]) != node.row_shape
    ):
        return 0
    nbytes = chunks[0] * node.row_nbytes
    return nbytes if nbytes >= STORED_CHUNK_MIN_BYTES else 0


def whole_chunks(plan: Any, n_rows: int, chunk_rows: int) -> bool:
    """Whether no two blocks of ``plan`` share a chunk: each starts and ends on a chunk boundary (or at the end), or there is one."""
    if getattr(plan, "cyclic", False):
        return False
    if plan.n_blocks == 1:  # no other block can share its chunks
        return True
    if hasattr(plan, "starts"):
        return all(a % chunk_rows == 0 and (b % chunk_rows == 0 or b == n_rows) for a, b in zip(plan.starts, plan.stops))
    return plan.block_size % chunk_rows == 0


def _dataset_access(cache_bytes: int, chunk_cache: "int | None") -> Any:
    """A dataset access list with a chunk cache of ``cache_bytes``: set on the dataset, not the file, so that a file
    opened elsewhere gets the cache this source wants. ``chunk_cache`` given: requests' rows, in any order (h5py's
    own default slots and policy); else a plan's blocks, where a chunk read whole is not read again."""
    import h5py

    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    if chunk_cache is None:
        dapl.set_chunk_cache(521, cache_bytes, 1.0)
    else:
        dapl.set_chunk_cache(8191, cache_bytes, 0.75)
    return dapl


class H5pySource:
    """One dataset opened with h5py for reading rows (the :class:`~multitables._io.engines.Source` protocol).

    ``open_kwargs``: passed to ``h5py.File`` (without any, the file is opened as the checks open it,
    :func:`~multitables._io.node.reopen_dataset`). ``plan``: the blocks it will read, which size its chunk cache
    (None: HDF5's default 1 MiB), unless ``chunk_cache`` gives its bytes. ``dataset``: the ``h5py.Dataset`` of
    ``node`` from :func:`~multitables._io.node.open_node`, whose file it takes over (and closes), sparing a second
    open. Rows of variable length are read as h5py reads them, into object arrays (NOTE [variable-length rows])."""

    engine = "h5py"

    def __init__(self, node: NodeInfo, open_kwargs: dict[str, Any], plan: Any = None, dataset: Any = None,
                 chunk_cache: "int | None" = None) -> None:
        import h5py

        register_filters()
        cache_bytes = _chunk_cache_bytes(node, plan) if chunk_cache is None else chunk_cache
        # close() closes the file opened here, or else the dataset ids: the
        # checks' file closes with its last object (node.close_dataset).
        self._file = None
        self._fileobj: Any = None
        if dataset is not None and open_kwargs:  # the checks' open had none of the caller's options
            close_dataset(dataset)
            dataset = None
        if dataset is None and not open_kwargs and node.remote is None:
            # As the checks open it (~0.1 ms less than h5py.File and f[path]), with this plan's chunk cache.
            dsid = reopen_dataset(node, _dataset_access(cache_bytes, chunk_cache) if cache_bytes else None).id
        elif dataset is None:
            # An object is read through a file object over its bytes: slower than the chunk engine, but right.
            self._fileobj = None if node.remote is None else file_object(node.remote)
            try:
                self._file = h5py.File(self._fileobj or node.filename, "r", **open_kwargs)
                if self._fileobj is None and self._file.driver == "sec2":  # the file described, not one named so now
                    check_opened(node.filename, self._file.id.get_vfd_handle(), node.identity)
            except BaseException:
                if self._file is not None:
                    self._file.close()
                if self._fileobj is not None:
                    self._fileobj.close()
                raise
            dsid = h5py.h5d.open(self._file.id, node.path.encode(), _dataset_access(cache_bytes, chunk_cache))
            refresh_swmr(dsid, node.n_rows, f"{node.path!r} in {node.filename!r}")  # NOTE [swmr extent] in ``handles``
        elif cache_bytes == 0:
            dsid = dataset.id  # reuse the checks' open: a second open costs ~10% of reading a 4 MiB file
        else:
            # Opening a dataset that is open already gives the first open's
            # chunk cache (none, from open_node): close it first, holding
            # the file by an id meanwhile.
            fid = h5py.h5i.get_file_id(dataset.id)
            name = h5py.h5i.get_name(dataset.id)  # its path in fid: not node.path where that links to fid
            try:
                close_dataset(dataset)
                dsid = h5py.h5d.open(fid, name, _dataset_access(cache_bytes, chunk_cache))
            finally:
                fid.close()  # the new dataset holds the file now
        self._h5s = h5py.h5s
        self._dsid = dsid
        self._fspace = dsid.get_space()
        self._mspace: Any = None  # the memory space of the last read, and its shape: a read of the same shape reuses it
        self._mshape: "tuple[int, ...] | None" = None
        self._file_row_shape = self._fspace.shape[1:]
        self._zeros = (0,) * len(self._file_row_shape)
        self._field_dtype = node.field_read_dtype
        # HDF5 converts compounds by member name: a one-field memory type reads one column.
        self._read_dtype = self._field_dtype if self._field_dtype is not None else node.file_dtype
        self._mtype = _memory_type(self._read_dtype)
        self._zero_first = node.zero_first
        self._node = node
        self._row_nbytes = math.prod(self._file_row_shape) * node.file_dtype.itemsize
        # For prefetch: the file's descriptor and the dataset's layout; None until asked, False where unknown.
        self._hints: "tuple[int, Layout] | None | Literal[False]" = None
        self._chunk_nbytes = stored_chunk_bytes(node)  # NOTE [blosc chunks as stored]; 0: HDF5 decodes
        if self._chunk_nbytes and not dsid.get_type().equal(self._mtype):
            self._chunk_nbytes = 0  # HDF5 converts the stored numbers (a precision or offset of their own)
        # Strings read as stored and converted here where HDF5 would convert them member by member (4x slower), not
        # in a column of variable-length rows (read as objects); never with blosc chunks as stored (fails the check above).
        strings = node.string_pads and (self._field_dtype is None or not node.vlen)
        stored = stored_strings_type(dsid.get_type(), self._mtype) if strings else None
        self._mtype, self._pads = (self._mtype, ()) if stored is None else (stored, tuple(find_string_pads(stored)))
        self._stored: "np.ndarray | None" = None  # one stored chunk, made at the first
        self._edge_filtered: "bool | None" = None  # see _edge_chunks_filtered
        if node.vlen:  # rows as objects, as h5py's reads give them (NOTE [variable-length rows]): decided once
            self._read_selected = functools.partial(read_objects, dsid, self._fspace, self._mtype)  # type: ignore[method-assign]  # once: vlen

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Read rows ``[start, stop)`` into ``out`` (C-contiguous, ``stop - start`` rows, the delivered dtype)."""
        if not out.flags.c_contiguous:  # a reshape would copy, and the rows would land in the copy
            raise ValueError("the h5py engine reads into C-contiguous arrays only")
        done = self._decode_chunks(start, stop, out) if self._chunk_nbytes else start
        if done < stop:
            self._fspace.select_hyperslab((done,) + self._zeros, (stop - done,) + self._file_row_shape)
            self._read_selected(stop - done, out[done - start :])
        if isinstance(self._hints, tuple):
            # HDF5 has just read this block's leaves of the index: read them too, from the page cache,
            # so that the next hint goes on from here instead of reading a leaf (NOTE [chunk index in file order]).
            self._hints[1].find(start, stop)

    def _decode_chunks(self, start: int, stop: int, out: np.ndarray) -> int:
        """Decode rows ``[start, stop)`` from their stored chunks into ``out``, from ``start`` on (NOTE [blosc chunks as
        stored]); return the row up to which ``out`` is filled (``start``: none; HDF5 reads the rest)."""
        c, row_nbytes, nbytes = self._chunk_nbytes // self._row_nbytes, self._row_nbytes, self._chunk_nbytes
        if self._stored is None:
            self._stored = spare_bytes(nbytes + BLOSC_OVERHEAD)
        flat = out.reshape(-1).view(np.uint8)
        a = start
        while a < stop:
            first = a - a % c  # the chunk's first row
            b = min(first + c, stop)
            if first + c > self._node.n_rows and not self._edge_chunks_filtered():
                return a
            dst = flat[(a - start) * row_nbytes : (b - start) * row_nbytes]
            at = (a - first) * row_nbytes  # where the rows start in the decoded chunk
            try:
                mask, stored = self._dsid.read_direct_chunk((first,) + self._zeros, out=self._stored)
                if mask & 1:  # stored unfiltered (the filter is optional, and blosc gained nothing)
                    if len(stored) != nbytes:
                        return a
                    dst[:] = np.frombuffer(stored, np.uint8)[at : at + len(dst)]
                elif len(dst) == nbytes:
                    _blosc().decode(stored, nbytes, dst)
                elif not _blosc().decode_part(stored, nbytes, at, dst):
                    return a
            except (ChunkDecodeError, ValueError, RuntimeError, OSError, KeyError) as exc:
                if raised_by_handler(exc):
                    raise  # the user's own: NOTE [a handler's exception]
                return a  # not allocated, larger than its chunk, damaged: HDF5 reads it, and says what is wrong
            a = b
        return a

    def _runs_apart(self, firsts: Sequence[int], lasts: Sequence[int]) -> bool:
        """Whether no two of the runs touch one chunk: then each run's chunks are read once, run by run (else HDF5 reads
        them, each chunk decoded once for every run in it)."""
        c = self._chunk_nbytes // self._row_nbytes
        before = -1
        for lo, last in zip(firsts, lasts):
            if lo // c <= before:
                return False
            before = last // c
        return True

    def _edge_chunks_filtered(self) -> bool:
        """Whether the partial chunk at the end was filtered as the others were (not written with
        ``H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS``, where its mask would not say so); asked once."""
        if self._edge_filtered is None:
            self._edge_filtered = not leaves_edge_chunks_unfiltered(self._dsid.get_create_plist())
        return self._edge_filtered

    def read_runs(self, firsts: Sequence[int], lasts: Sequence[int], out: np.ndarray) -> None:
        """Read each run of rows ``firsts[i]..lasts[i]`` (inclusive, sorted) into ``out``, one after another, in one HDF5 read.

        ``out``: C-contiguous, as many rows as the runs hold. HDF5 builds the
        union of the runs in quadratic time (256 runs: ~2 ms; 2560: ~120 ms),
        so a caller passes a few dozen at a time.
        """
        if self._chunk_nbytes and self._runs_apart(firsts, lasts):
            # Each run as a read of its own, from its stored chunk: a row of a large chunk decodes one blosc block
            # (NOTE [blosc chunks as stored]), where HDF5 decodes the whole chunk.
            at = 0
            for lo, last in zip(firsts, lasts):
                self.read_into(lo, last + 1, out[at : at + last + 1 - lo])
                at += last + 1 - lo
            return
        h5s, fs, row, zeros = self._h5s, self._fspace, self._file_row_shape, self._zeros
        op = h5s.SELECT_SET
        for lo, last in zip(firsts, lasts):
            fs.select_hyperslab((lo,) + zeros, (last + 1 - lo,) + row, op=op)
            op = h5s.SELECT_OR
        self._read_selected(len(out), out)

    @property
    def decodes_chunks(self) -> bool:
        """Whether this source decodes blosc chunks itself (NOTE [blosc chunks as stored])."""
        return bool(self._chunk_nbytes)

    def read_strided(self, rows: range, out: np.ndarray) -> None:
        """Rows ``rows`` (a range) into ``out`` (C-contiguous, ``len(rows)`` rows) in one HDF5 read of a strided selection."""
        ones = (1,) * len(self._file_row_shape)
        self._fspace.select_hyperslab((rows.start,) + self._zeros, (len(rows),) + ones, (rows.step,) + ones, (1,) + self._file_row_shape)
        self._read_selected(len(rows), out)

    def _read_selected(self, n: int, out: np.ndarray) -> None:
        """The ``n`` rows selected in the file space into ``out``."""
        if self._zero_first:  # HDF5 leaves unallocated storage untouched; h5py's reads give zeros
            out.reshape(-1).view(np.uint8).fill(0)
        shape = (n,) + self._file_row_shape
        # The same bytes as the file's elements (array elements and fields included): HDF5 reads by the memory type.
        dest = np.ndarray(shape, dtype=self._read_dtype, buffer=out)
        if shape != self._mshape:  # made anew, a memory space is a third of a small block's read (2-3 us)
            self._mspace, self._mshape = self._h5s.create_simple(shape), shape
        self._dsid.read(self._mspace, self._fspace, dest, self._mtype)
        if self._pads:
            deliver_strings(dest, self._pads)

    def prefetch(self, start: int, stop: int) -> None:
        """Hint the stored bytes of rows ``[start, stop)`` to the kernel (:func:`~multitables._io.chunks.pread.will_need`); returns at once.

        HDF5 reads a block chunk by chunk, so two readers' chunk reads
        alternate between two places in the file: on a spinning disk, a seek
        per chunk (0.20x one process on the benchmark's disk model). Hinted
        the block before, the kernel reads it in large requests in file order.
        Nothing is hinted for a dataset the chunk engine cannot describe.
        """
        if start >= stop or self._hints is False:
            return
        if self._hints is None:
            self._hints = self._open_hints()
            if self._hints is False:
                return
        fd, layout = self._hints
        layout.hint(start, stop, self._row_nbytes, functools.partial(will_need, fd), resident=functools.partial(resident, fd))

    def fetch(self, spans: "list[tuple[int, int]]") -> None:
        pass  # HDF5 reads its chunks itself

    def _open_hints(self) -> "tuple[int, Layout] | Literal[False]":
        import h5py

        if self._node.remote is not None:  # no page cache to warm
            return False
        layout = known_layout(self._node)
        if layout is None:
            try:
                layout = learn_layout(h5py.Dataset(self._dsid), self._node)
            except Unsupported:
                return False
        # HDF5's own descriptor, where its driver has one (the default, sec2): a file costs one descriptor.
        fid = h5py.h5i.get_file_id(self._dsid)
        try:
            if fid.get_access_plist().get_driver() != h5py.h5fd.SEC2:
                return False
            fd = int(fid.get_vfd_handle())
        finally:
            fid.close()
        return fd, layout

    @property
    def dataset_id(self) -> Any:
        return self._dsid

    def use_dataset(self, dsid: Any) -> None:
        """Read through ``dsid``, this dataset opened again, from now on (NOTE [swmr extent] in ``handles``)."""
        self._dsid, self._fspace, self._hints = dsid, dsid.get_space(), None
        if self._node.vlen:
            self._read_selected = functools.partial(read_objects, dsid, self._fspace, self._mtype)  # type: ignore[method-assign]  # once: vlen

    def close(self) -> None:
        self._hints = False  # HDF5's descriptor: closed with the file
        self._stored = None  # a spare again (NOTE [spare buffers] in ``_sys.spares``)
        if self._file is not None:
            self._file.close()
        elif self._dsid.valid:
            self._dsid.close()
        if self._fileobj is not None:
            self._fileobj.close()


class _GrowingSource(HeldOpen, H5pySource):
    """A source of a file read with ``swmr=True``, whose open another look may refresh (NOTE [swmr extent])."""


def _source(node: NodeInfo, *args: Any, **kwargs: Any) -> H5pySource:
    return (_GrowingSource if isinstance(node.identity, GrowingFile) else H5pySource)(node, *args, **kwargs)


@functools.cache
def _blosc() -> Blosc:
    """The codec that decodes blosc chunks, or parts of them, for :meth:`H5pySource.read_into` (NOTE [blosc chunks as
    stored]): made at the first, as it imports its library."""
    return Blosc()


#: Most runs of rows in one h5py read: HDF5 builds a union of hyperslabs in quadratic time (256 runs: ~2 ms; 2560:
#: ~120 ms), so longer lists are read in pieces.
RUNS_PER_READ = 64
#: Rows of a range apart, fewer than this many a chunk, are one strided HDF5 read; more, a read per chunk's span. HDF5
#: selects ~0.3 us a row, a span read costs ~25 us (16-byte rows, chunks of 4096 rows): [::1000] 3.5 ms strided, 5.4
#: by spans; [::3] 100 ms strided, 9 by spans.
STRIDED_BELOW = 64


class H5pyRows:
    """Reads sorted rows with h5py's low-level calls: one HDF5 read per up to ``RUNS_PER_READ`` runs (a :class:`~multitables._io.engines.Rows`);
    a slice's rows (a range) as :func:`~multitables._io.scattered.read_progression` reads them.

    The high-level ``read_direct`` costs ~100 us more per call than
    ``DatasetID.read``; a request of 256 scattered rows makes 256 runs.
    Owns ``source`` and closes it."""

    def __init__(self, source: H5pySource, node: NodeInfo) -> None:
        self._source = source
        self._chunk = effective_chunk_rows(node.chunk_rows, node.row_nbytes)
        self._span = RowSpans(node, self._chunk)

    def read(self, rows: ReadRows, out: np.ndarray, stopped: Callable[[], bool]) -> None:
        """Rows ``rows`` (sorted) into ``out``; :class:`~multitables._io.scattered.Stopped` where ``stopped()`` says so between reads."""
        if out.nbytes == 0:
            return
        if isinstance(rows, range) and not (self._source.decodes_chunks and rows.step > 1):
            if rows.step > 1 and len(rows) > 1 and self._chunk < STRIDED_BELOW * rows.step:
                self._source.read_strided(rows, out)
                if stopped():
                    raise Stopped
            else:
                read_progression(self._source.read_into, rows, out, self._chunk, self._span, stopped)
            return
        rows = rows_array(rows)  # rows apart in blosc chunks go run by run: read_runs decodes what each needs
        bounds = run_bounds(rows)
        firsts = rows[bounds[:-1]].tolist()
        lasts = rows[bounds[1:] - 1].tolist()
        idx = bounds.tolist()
        for r0 in range(0, len(firsts), RUNS_PER_READ):
            r1 = min(r0 + RUNS_PER_READ, len(firsts))
            self._source.read_runs(firsts[r0:r1], lasts[r0:r1], out[idx[r0] : idx[r1]])
            if stopped():
                raise Stopped

    def close(self) -> None:
        self._source.close()


class H5pyEngine:
    """The h5py engine in the registry (:class:`~multitables._io.engines.Engine`): HDF5's own reads.

    Measured on this project's machine it decodes zlib ~1.8x and blosc ~2.3x
    faster per core than the PyTables wheel (BENCHMARKS.md), so ``auto``
    prefers it to PyTables everywhere.
    """

    name = H5pySource.engine
    title = "h5py"
    caches = ("page",)
    options = "h5py.File's"
    falls_back = False

    def preferred(self, node: NodeInfo, *_: Any, **__: Any) -> bool:  # the chunk engine's arguments (in_set, ...)
        return True

    def problem(self, node: NodeInfo, open_kwargs: "dict[str, Any]", dataset: Any = None) -> "str | None":
        """Why h5py cannot deliver ``node`` (an element type it has no numpy type for, a filter its HDF5 lacks, a piece
        kept outside the file it cannot read); None: it can."""
        if node.h5py_problem:
            return node.h5py_problem
        lacks = h5py_lacks(node)
        if lacks:
            return "its HDF5 cannot decode filter " + ", ".join(filter_label(node, fid) for fid in lacks)
        outside = h5py_outside_problem(node, dataset)  # NOTE [data outside the file]
        if outside:
            return outside
        if open_kwargs and node.remote is not None:  # a bad option raises, naming the object, here
            check_options(node.remote, open_kwargs)
        elif open_kwargs and not node.parts:  # a bad option raises h5py's own error, here
            import h5py

            h5py.File(node.filename, "r", **open_kwargs).close()
        return None

    def open(self, node: NodeInfo, open_kwargs: "dict[str, Any]", plan: Any = None, dataset: Any = None, *,
             cache: str = "page", scratch: Any = None) -> "H5pySource":
        return _source(node, open_kwargs, plan, dataset)

    def open_rows(self, node: NodeInfo, open_kwargs: "dict[str, Any]") -> "H5pyRows":
        return H5pyRows(_source(node, open_kwargs, chunk_cache=rows_decoded_bytes(node) or None), node)


#: The h5py engine.
ENGINE = H5pyEngine()
