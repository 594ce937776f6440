"""Reading engines: open a node once, then read row ranges straight into a caller's buffer.

Three engines read HDF5 here, behind one small protocol:

* ``chunks``: reads the stored chunks itself (``os.pread``, or ``O_DIRECT``
  with ``cache="direct"``) and decodes them with faster codecs than HDF5's,
  straight into the block (:mod:`multitables._chunks`). ``auto`` prefers it
  where it can read the node; where it cannot (an unknown filter, a type
  h5py converts...), ``resolve_engine`` answers ``h5py`` instead, so the
  stream reports the engine that really reads.

* ``h5py``: ``Dataset.read_direct`` with hdf5plugin's filters. Measured on this
  project's machine it decodes zlib ~1.8x and blosc ~2.3x faster per core
  than the PyTables wheel (see BENCHMARKS.md), so ``auto`` prefers it to
  PyTables where the chunk engine does not apply.
* ``tables``: PyTables' ``read(out=)``. Used for ``auto`` when PyTables open
  options are given (``DRIVER=...``), or when h5py lacks a filter the node uses.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import numpy as np

from ._chunks import CACHES  # noqa: F401  (re-exported: where chunk bytes come from, "page" or "direct")
from ._node import NodeInfo, close_dataset

ENGINES = ("auto", "h5py", "tables", "chunks")


class Source(Protocol):
    """One open node in one process."""

    #: The engine that reads it (``chunks`` opens as ``h5py`` where it cannot read the node).
    engine: str

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Read rows ``[start, stop)`` into ``out`` (C-contiguous, ``stop - start`` rows, delivered dtype)."""

    def prefetch(self, start: int, stop: int) -> None:
        """Hint that rows ``[start, stop)`` will be read soon; returns at once, and may do nothing."""

    def close(self) -> None:
        """Release the file."""


def limit_threads() -> None:
    """Keep compressors and BLAS to one thread, so N readers use N cores and no more.

    Set before the codecs are imported where possible (spawn, forkserver);
    under fork they are already loaded, so the runtime setters are called too.
    """
    for var in ("BLOSC_NTHREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[var] = "1"
    import sys

    if "tables" in sys.modules:
        sys.modules["tables"].set_blosc_max_threads(1)
    if "blosc2" in sys.modules:
        sys.modules["blosc2"].set_nthreads(1)


def _h5py_can_read(node: NodeInfo) -> bool:
    import h5py
    import hdf5plugin  # noqa: F401  (registers blosc, blosc2, bzip2, lz4, zstd, bitshuffle...)

    return all(h5py.h5z.filter_avail(fid) for fid in node.filter_ids)


def chunks_problem(node: NodeInfo, dataset: Any = None) -> "str | None":
    """Why the ``chunks`` engine cannot read ``node`` (None: it can); ``dataset``: its open h5py.Dataset, if any."""
    from ._chunks import chunks_problem

    return chunks_problem(node, dataset)


#: Filters whose pipelines the chunk engine decodes clearly faster than h5py
#: (one core, same run): deflate + shuffle 2.1-2.3x (2.7x in the benchmark's
#: warm run, BENCHMARKS.md), deflate alone 1.55x,
#: lzf + shuffle 2.3x. With blosc, lz4, zstd and bitshuffle it was 1.0-1.2x
#: on large files and 0.5-0.6x on 4 MB ones (its set-up costs more than
#: HDF5's), so ``auto`` leaves those to h5py.
_CHUNKS_WIN_FILTERS = frozenset({1, 32000})


def _chunks_pays(node: NodeInfo) -> bool:
    """Whether ``auto`` should read ``node`` with the chunk engine (when it can)."""
    if node.chunk_rows is None:
        return True  # contiguous: one pread into the block, 1.37x h5py
    return bool(_CHUNKS_WIN_FILTERS.intersection(node.filter_ids))


def resolve_engine(engine: str, node: NodeInfo, open_kwargs: dict[str, Any], dataset: Any = None) -> str:
    """The concrete engine for ``engine`` (``auto`` picks); raises ValueError for unknown names.

    ``chunks`` resolves to ``h5py`` (or ``tables``, as ``auto`` would) for a
    node it cannot read: see :func:`chunks_problem` for why.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not one of {ENGINES}")
    if engine == "chunks" and open_kwargs:
        raise ValueError(
            f"engine='chunks' reads the file itself and takes no open options (PyTables'), got {sorted(open_kwargs)}"
        )
    if engine not in ("auto", "chunks"):
        return engine
    if open_kwargs:
        return "tables"  # the open options are PyTables' (the established API)
    if (engine == "chunks" or _chunks_pays(node)) and chunks_problem(node, dataset) is None:
        return "chunks"
    return "h5py" if _h5py_can_read(node) else "tables"


def _h5py_cache_bytes(node: NodeInfo, plan: Any) -> int:
    """Bytes of HDF5 chunk cache for a reader that reads ``plan``'s blocks.

    Measured (h5py, 4 MiB blocks of whole 256 KiB chunks): without a chunk
    cache HDF5 decodes straight into the caller's buffer, 1.8x faster on
    uncompressed data and 1.2x on blosc than with the default 1 MiB cache,
    the same on zlib. Blocks that cut chunks need the cache, or the chunk
    they share with the next block is decoded twice: keep two chunk-rows.
    """
    if node.chunk_rows is None or plan is None:
        return 1 << 20
    if whole_chunks(plan, node.n_rows, node.chunk_rows):
        return 0
    chunk_row_bytes = node.chunk_rows * max(node.file_dtype.itemsize, 1) * int(np.prod(node.row_shape, dtype=np.int64))
    return max(1 << 20, 2 * chunk_row_bytes + (chunk_row_bytes >> 3))


def whole_chunks(plan: Any, n_rows: int, chunk_rows: int) -> bool:
    """Whether no two blocks of ``plan`` share a chunk: each starts and ends on a chunk boundary (or at the end), or there is one."""
    if getattr(plan, "cyclic", False):
        return False
    if plan.n_blocks == 1:  # no other block can share its chunks
        return True
    if hasattr(plan, "starts"):
        return all(a % chunk_rows == 0 and (b % chunk_rows == 0 or b == n_rows) for a, b in zip(plan.starts, plan.stops))
    return plan.block_size % chunk_rows == 0


class _H5pySource:
    engine = "h5py"

    def __init__(self, node: NodeInfo, open_kwargs: dict[str, Any], plan: Any = None, dataset: Any = None) -> None:
        import h5py
        import hdf5plugin  # noqa: F401

        cache_bytes = _h5py_cache_bytes(node, plan)
        # close() closes the file opened here, or else the dataset ids: the
        # checks' file closes with its last object (_node.close_dataset).
        self._file = None
        if dataset is None:
            self._file = h5py.File(node.filename, "r", **open_kwargs)
        if dataset is not None and cache_bytes == 0:
            dsid = dataset.id  # reuse the checks' open: a second open costs ~10% of reading a 4 MiB file
        else:
            # The chunk cache is set on this dataset's access list, not the file's,
            # so a file opened elsewhere gets the cache this plan wants.
            dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
            dapl.set_chunk_cache(521, cache_bytes, 1.0)
            if dataset is None:
                dsid = h5py.h5d.open(self._file.id, node.path.encode(), dapl)
            else:
                # Opening a dataset that is open already gives the first open's
                # chunk cache (none, from open_node): close it first, holding
                # the file by an id meanwhile.
                fid = h5py.h5i.get_file_id(dataset.id)
                try:
                    close_dataset(dataset)
                    dsid = h5py.h5d.open(fid, node.path.encode(), dapl)
                finally:
                    fid.close()  # the new dataset holds the file now
        self._dsid = dsid
        self._fspace = dsid.get_space()
        self._file_row_shape = self._fspace.shape[1:]
        self._field_dtype = node.field_read_dtype
        out_dtype = self._field_dtype if self._field_dtype is not None else node.file_dtype
        # HDF5 converts compounds by member name: a one-field memory type reads one column.
        self._mtype = h5py.h5t.py_create(out_dtype)

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)`` into ``out`` with HDF5's own calls: h5py's ``read_direct`` adds ~0.1 ms a call."""
        import h5py

        if not out.flags.c_contiguous:  # a reshape would copy, and the rows would land in the copy
            raise ValueError("the h5py engine reads into C-contiguous arrays only")
        n = stop - start
        if self._field_dtype is not None:
            out = np.ndarray((n,), dtype=self._field_dtype, buffer=out)
        else:
            out = out.reshape((n,) + self._file_row_shape)
        shape = (n,) + self._file_row_shape
        self._fspace.select_hyperslab((start,) + (0,) * len(self._file_row_shape), shape)
        self._dsid.read(h5py.h5s.create_simple(shape), self._fspace, out, self._mtype)

    def prefetch(self, start: int, stop: int) -> None:
        pass  # HDF5 reads its chunks itself; see the chunk engine

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        elif self._dsid.valid:
            self._dsid.close()


class _TablesSource:
    engine = "tables"

    def __init__(self, node: NodeInfo, open_kwargs: dict[str, Any], plan: Any = None) -> None:
        import tables

        tables.set_blosc_max_threads(1)
        self._file = tables.open_file(node.filename, "r", **open_kwargs)
        self._node = self._file.get_node(node.path)
        self._field = node.field

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._field is not None:
            self._node.read(start, stop, field=self._field, out=out)
        else:
            self._node.read(start, stop, out=out)

    def prefetch(self, start: int, stop: int) -> None:
        pass  # HDF5 reads its chunks itself; see the chunk engine

    def close(self) -> None:
        self._file.close()


def open_source(
    engine: str, node: NodeInfo, open_kwargs: dict[str, Any], plan: Any = None, dataset: Any = None, *, cache: str = "page"
) -> Source:
    """Open ``node`` with a concrete engine (``chunks``, ``h5py`` or ``tables``), tuned for reading ``plan``'s blocks.

    ``dataset``: the ``h5py.Dataset`` of ``node`` from :func:`~multitables._node.open_node`,
    whose file the h5py and chunk engines take over (and close), sparing a second open.
    ``cache="direct"`` (chunk engine only) reads past the page cache with ``O_DIRECT``.
    A node the chunk engine cannot read opens with h5py (or PyTables) instead:
    the source's ``engine`` attribute says which.
    """
    if cache not in CACHES:
        raise ValueError(f"cache={cache!r} is not one of {CACHES}")
    if engine == "chunks":
        from ._chunks import ChunkSource, Unsupported

        try:
            return ChunkSource(node, cache, dataset)
        except Unsupported:
            engine = "h5py" if _h5py_can_read(node) else "tables"
            dataset = None  # closed by the failed open
    if cache != "page":
        raise ValueError(f"cache={cache!r} needs the chunk engine; {engine!r} reads through the page cache")
    if engine == "h5py":
        return _H5pySource(node, open_kwargs, plan, dataset)
    if dataset is not None:
        close_dataset(dataset)
    if engine == "tables":
        return _TablesSource(node, open_kwargs, plan)
    raise ValueError(f"engine={engine!r} is not a concrete engine")
