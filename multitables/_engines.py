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
  options are given (``DRIVER=...``), or when neither engine above reads the
  node (a filter h5py lacks, an element type h5py has no numpy type for).

Every engine delivers what h5py's ``dataset[()]`` gives, row by row along
axis 0: :func:`engine_problem` says, before any reader starts, why an engine
cannot, and :func:`resolve_engine` refuses the node (naming each engine's
reason, or the missing filter) where none can.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import numpy as np

from ._chunks import CACHES  # noqa: F401  (re-exported: where chunk bytes come from, "page" or "direct")
from ._node import NodeInfo, close_dataset, deliver_strings
from .errors import MissingFilterError, NodeTypeError

ENGINES = ("auto", "h5py", "tables", "chunks")


def check_engine(engine: Any) -> str:
    """``engine`` if it names an engine (or ``auto``), else ``ValueError``: the one place engine names are checked."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not one of {ENGINES}")
    return engine


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


def _h5py_lacks(node: NodeInfo) -> list[int]:
    """The filters of ``node`` that h5py's HDF5 (with hdf5plugin's filters) cannot decode."""
    import h5py
    import hdf5plugin  # noqa: F401  (registers blosc, blosc2, bzip2, lz4, zstd, bitshuffle...)

    return [fid for fid in node.filter_ids if not h5py.h5z.filter_avail(fid)]


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


#: What provides HDF5 filters that are not always installed, by filter id.
_FILTER_PROVIDERS = {
    4: "an HDF5 built with szip or libaec",
    305: "PyTables built with LZO, or an HDF5 LZO plugin",
    307: "the hdf5plugin package",
    32000: "h5py (LZF)",
    32001: "the hdf5plugin package",
    32004: "the hdf5plugin package",
    32008: "the hdf5plugin package",
    32013: "the hdf5plugin package",
    32015: "the hdf5plugin package",
    32017: "the hdf5plugin package",
    32019: "the HDF5 JPEG plugin",
    32022: "netCDF-C's or the Community Codec Repository's HDF5 plugins (BitGroom)",
    32023: "netCDF-C's or the Community Codec Repository's HDF5 plugins (Granular BitRound)",
    32024: "the hdf5plugin package",
    32026: "the hdf5plugin package",
}


def engine_problem(engine: str, node: NodeInfo, open_kwargs: "dict[str, Any]", dataset: Any = None) -> "str | None":
    """Why the concrete ``engine`` cannot read ``node`` as h5py delivers it (None: it can); starts nothing.

    ``tables`` is tried for real: the file is opened with PyTables and the
    first row read, here, since what PyTables fails on (netCDF-4 groups, object
    references, filters its HDF5 lacks) shows no sooner.
    """
    if engine == "chunks":
        if open_kwargs:
            return f"it takes no open options (PyTables'), got {sorted(open_kwargs)}"
        return chunks_problem(node, dataset)
    if engine == "h5py":
        if node.h5py_problem:
            return node.h5py_problem
        lacks = _h5py_lacks(node)
        if lacks:
            return "its HDF5 cannot decode filter " + ", ".join(_filter_name(node, fid) for fid in lacks)
        return None
    if engine == "tables":
        if _nested_gaps(node.file_dtype):
            # PyTables 3.11 packs nested members and then writes past its buffer (a crash at exit).
            return "PyTables misreads compounds nested with gaps between their members"
        if open_kwargs:  # the user's PyTables options: a bad one raises PyTables' own error
            _TablesSource(node, open_kwargs).close()
        return _tables_problem_apart(node, open_kwargs)
    raise ValueError(f"engine={engine!r} is not a concrete engine")


#: Seconds a forked PyTables probe may take (it opens the file and reads one row).
PROBE_TIMEOUT = 60.0


def _tables_problem(node: NodeInfo, open_kwargs: "dict[str, Any]") -> "str | None":
    """Open ``node`` with PyTables and read its first row: why that fails, or None."""
    source = None
    try:
        source = _TablesSource(node, open_kwargs)
        source.read_into(0, 1, np.empty((1,) + node.row_shape, node.dtype))
    except Exception as exc:
        return f"PyTables fails on it ({type(exc).__name__}: {_gist(str(exc))})"
    finally:
        if source is not None:
            source.close()
    return None


def _tables_probe_child(conn: Any, node: NodeInfo, open_kwargs: "dict[str, Any]") -> None:
    from ._signals import ignore_sigint

    ignore_sigint()
    conn.send(_tables_problem(node, open_kwargs))
    conn.close()


def _tables_problem_apart(node: NodeInfo, open_kwargs: "dict[str, Any]") -> "str | None":
    """:func:`_tables_problem`, in a forked child where there is fork.

    PyTables can crash (SIGSEGV) on a damaged file's metadata, where h5py
    reads it or fails cleanly; a crash of the probe is a refusal, not the
    death of the user's process. The fork costs a few milliseconds, paid only
    where PyTables is a candidate.
    """
    import multiprocessing
    import signal

    if "fork" not in multiprocessing.get_all_start_methods():  # pragma: no cover - not Linux
        return _tables_problem(node, open_kwargs)
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_tables_probe_child, args=(send, node, open_kwargs), name="multitables-probe", daemon=True)
    try:
        proc.start()
        send.close()
        answered = recv.poll(PROBE_TIMEOUT)
        try:
            if answered:
                return recv.recv()
        except EOFError:
            pass  # it died before answering
        proc.join(PROBE_TIMEOUT if answered else 0)
        if proc.exitcode is None:
            return f"PyTables did not open it within {PROBE_TIMEOUT:.0f} s"
        how = f"exit code {proc.exitcode}"
        if proc.exitcode < 0:
            how = f"signal {signal.Signals(-proc.exitcode).name}"
        return f"PyTables crashed on it ({how})"
    finally:
        send.close()
        recv.close()
        if proc.is_alive():
            proc.kill()
        if proc.pid is not None:
            proc.join()
            proc.close()


def _gist(message: str) -> str:
    """One line of an error message: of an HDF5 back trace, the step that names a filter, else the deepest step."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return "no message"
    steps = [line for line in message.splitlines() if line.startswith("    ")]
    if lines[0] == "HDF5 error back trace" and steps:
        named = [line.strip() for line in steps if "filter" in line]
        return (named or [steps[-1].strip()])[0][:200]
    return lines[0][:200]


def _nested_gaps(dt: np.dtype, nested: bool = False) -> bool:
    """Whether a compound inside compound ``dt`` leaves bytes between or after its members."""
    if dt.subdtype is not None:
        return _nested_gaps(dt.subdtype[0], nested)
    if dt.names is None:
        return False
    members = [dt.fields[name][0] for name in dt.names]
    if nested and dt.itemsize != sum(m.itemsize for m in members):
        return True
    return any(_nested_gaps(m, True) for m in members)


def _filter_name(node: NodeInfo, fid: int) -> str:
    names = dict(zip(node.filter_ids, node.filter_names))
    name = names.get(fid) or "unnamed"
    return f"{name!r} (id {fid})"


def _refuse(node: NodeInfo, problems: "dict[str, str]", open_kwargs: "dict[str, Any]", dataset: Any) -> Exception:
    """The error for a node that none of the engines in ``problems`` reads (each with its reason).

    Names an engine that does read it, if one does; a filter that h5py's HDF5
    cannot decode makes it a :class:`~multitables.MissingFilterError`.
    """
    where = f"{node.path!r} in {node.filename!r}"
    other = None
    for engine in ("chunks", "h5py", "tables"):
        if engine not in problems and not (engine == "chunks" and open_kwargs):
            if engine_problem(engine, node, open_kwargs, dataset) is None:
                other = engine
                break
    if len(problems) == 1:
        reasons = "{}: {}".format(*next(iter(problems.items())))
    else:
        reasons = "; ".join(f"{engine}: {why}" for engine, why in problems.items())
    lacking = _h5py_lacks(node) if not node.h5py_problem else []
    if other is not None:
        message = f"engine={'/'.join(problems)!r} cannot read {where} ({reasons}); engine={other!r} (or 'auto') reads it"
    elif lacking:
        named = ", ".join(_filter_name(node, fid) for fid in lacking)
        provide = "; ".join(f"{_filter_name(node, fid)}: {_FILTER_PROVIDERS.get(fid, 'an HDF5 plugin for it')}" for fid in lacking)
        message = (
            f"{where} was written with filter {named}, which no engine here decodes ({reasons}). "
            f"Install what provides it ({provide}) and point HDF5_PLUGIN_PATH at its plugin folder"
        )
    else:
        message = f"no engine reads {where} as h5py would: {reasons}"
    if lacking:
        err = MissingFilterError(message)
        err.filter_ids = tuple(lacking)
        return err
    return NodeTypeError(message)


def resolve_engine(engine: str, node: NodeInfo, open_kwargs: dict[str, Any], dataset: Any = None) -> str:
    """The concrete engine that reads ``node`` for ``engine`` (``auto`` picks); raises before any reader starts.

    ``auto`` takes the first engine that reads the node, in the order of
    measured speed: the chunk engine where it pays (:func:`_chunks_pays`),
    h5py, the chunk engine where it does not, PyTables; only PyTables when
    PyTables open options are given (the established API's). ``chunks``
    does the same, trying itself first. A named ``h5py`` or ``tables`` that
    cannot read the node raises. Where no engine reads it: a
    :class:`~multitables.MissingFilterError` for a filter nothing here
    decodes, else a :class:`~multitables.NodeTypeError` with each engine's
    reason. ``ValueError`` for unknown names.
    """
    check_engine(engine)
    if engine == "chunks" and open_kwargs:
        raise ValueError(
            f"engine='chunks' reads the file itself and takes no open options (PyTables'), got {sorted(open_kwargs)}"
        )
    if engine in ("h5py", "tables"):
        candidates = [engine]
    elif open_kwargs:
        candidates = ["tables"]  # the open options are PyTables' (the established API)
    elif engine == "chunks" or _chunks_pays(node):
        candidates = ["chunks", "h5py", "tables"]
    else:
        candidates = ["h5py", "chunks", "tables"]
    problems: dict[str, str] = {}
    for candidate in candidates:
        why = engine_problem(candidate, node, open_kwargs, dataset)
        if why is None:
            return candidate
        problems[candidate] = why
    raise _refuse(node, problems, open_kwargs, dataset)


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
        # HDF5 converts compounds by member name: a one-field memory type reads one column.
        self._read_dtype = self._field_dtype if self._field_dtype is not None else node.file_dtype
        self._mtype = h5py.h5t.py_create(self._read_dtype)
        self._zero_first = node.zero_first

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)`` into ``out`` with HDF5's own calls: h5py's ``read_direct`` adds ~0.1 ms a call."""
        import h5py

        if not out.flags.c_contiguous:  # a reshape would copy, and the rows would land in the copy
            raise ValueError("the h5py engine reads into C-contiguous arrays only")
        n = stop - start
        if self._zero_first:  # HDF5 leaves unallocated storage untouched; h5py's reads give zeros
            out.reshape(-1).view(np.uint8).fill(0)
        shape = (n,) + self._file_row_shape
        # The same bytes as the file's elements (array elements and fields included): HDF5 reads by the memory type.
        dest = np.ndarray(shape, dtype=self._read_dtype, buffer=out)
        self._fspace.select_hyperslab((start,) + (0,) * len(self._file_row_shape), shape)
        self._dsid.read(h5py.h5s.create_simple(shape), self._fspace, dest, self._mtype)

    def prefetch(self, start: int, stop: int) -> None:
        pass  # HDF5 reads its chunks itself; see the chunk engine

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        elif self._dsid.valid:
            self._dsid.close()


class _TablesSource:
    """PyTables' ``read``, made to deliver what h5py's ``dataset[()]`` gives.

    PyTables reads into ``out`` only along its main dimension (an h5py
    dataset extendable along axis 1 has main dimension 1), in the ``numpy``
    flavor, and in its own element layout (native byte order, packed
    compounds); otherwise it reads along axis 0 into a new array, copied
    into ``out`` field by field. Strings come back as stored, and are then
    converted as h5py converts them.
    """

    engine = "tables"

    def __init__(self, node: NodeInfo, open_kwargs: dict[str, Any], plan: Any = None) -> None:
        import tables

        tables.set_blosc_max_threads(1)
        self._file = tables.open_file(node.filename, "r", **open_kwargs)
        try:
            leaf = self._file.get_node(node.path)
            if not isinstance(leaf, tables.Leaf) or isinstance(leaf, tables.VLArray):
                raise TypeError(f"PyTables opens it as a {type(leaf).__name__}, not a leaf of fixed-size rows")
            self._node = leaf
            self._field = node.field
            self._element_nbytes, self._pads = node.delivered_pads
            self._zero_first = node.zero_first
            if node.field is not None:
                read = np.dtype(leaf.coldtypes[node.field])
            elif isinstance(leaf, tables.Table):
                read = np.dtype(leaf.dtype)
            else:
                read = np.dtype(leaf.atom.dtype)
            base = read.subdtype[0] if read.subdtype is not None else read
            self._into_out = getattr(leaf, "maindim", 0) == 0 and leaf.flavor == "numpy" and base == node.dtype
        except BaseException:
            self._file.close()
            raise

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._zero_first:
            out.reshape(-1).view(np.uint8).fill(0)
        if self._into_out:
            if self._field is not None:
                self._node.read(start, stop, field=self._field, out=out)
            else:
                self._node.read(start, stop, out=out)
        else:
            if self._field is not None:
                got = self._node.read(start, stop, field=self._field)
            else:
                got = self._node[start:stop]  # along axis 0, whatever PyTables' main dimension
            _copy_by_name(out, np.asarray(got).reshape(out.shape))
        deliver_strings(out, self._pads, self._element_nbytes)

    def prefetch(self, start: int, stop: int) -> None:
        pass  # HDF5 reads its chunks itself; see the chunk engine

    def close(self) -> None:
        self._file.close()


def _copy_by_name(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src``, compound members matched by name (numpy matches them by position, and PyTables may reorder them)."""
    if dst.dtype.names is None or src.dtype.names is None:
        dst[...] = src
        return
    for name in dst.dtype.names:
        _copy_by_name(dst[name], src[name])


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
            engine = "h5py" if engine_problem("h5py", node, open_kwargs) is None else "tables"
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
