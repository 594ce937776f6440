"""Reading engines: open a node once, then read row ranges straight into a caller's buffer.

Three engines read HDF5 here, behind one small protocol:

* ``chunks``: reads the stored chunks itself (``os.pread``, or ``O_DIRECT``
  with ``cache="direct"``) and decodes them with faster codecs than HDF5's,
  straight into the block (:mod:`multitables._io.chunks.source`). ``auto`` prefers it
  where it can read the node; where it cannot (an unknown filter, a type
  h5py converts...), ``resolve_engine`` answers ``h5py`` instead, so the
  stream reports the engine that really reads.

* ``h5py``: HDF5's own reads with hdf5plugin's filters
  (:mod:`multitables._io.h5py_engine`). Measured on this project's machine it decodes zlib ~1.8x and blosc ~2.3x faster per core
  than the PyTables wheel (see BENCHMARKS.md), so ``auto`` prefers it to
  PyTables where the chunk engine does not apply.
* ``tables``: PyTables' ``read(out=)`` (:mod:`multitables._io.tables_engine`).
  Used for ``auto`` when PyTables open
  options are given (``DRIVER=...``), or when neither engine above reads the
  node (a filter h5py lacks, an element type h5py has no numpy type for).

Every engine delivers what h5py's ``dataset[()]`` gives, row by row along
axis 0: :func:`engine_problem` says, before any reader starts, why an engine
cannot, and :func:`resolve_engine` refuses the node (naming each engine's
reason, or the missing filter) where none can.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Protocol

import numpy as np

from ..errors import MissingFilterError, NodeTypeError
from .chunks.source import CACHES, ChunkSource
from .chunks.transport import ScratchBuffer
from .fileset import SetSource
from .h5py_engine import H5pySource, h5py_lacks
from .node import NodeInfo, close_dataset
from .chunks.storage import Unsupported, chunks_problem
from .tables_engine import TablesSource, tables_problem

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
    references, filters its HDF5 lacks) shows no sooner. For a set, the
    first file's problem, named.
    """
    if node.parts:
        for part in node.parts:
            why = engine_problem(engine, part.node, open_kwargs)
            if why is not None:
                return f"{part.node.filename!r}: {why}"
        return None
    if engine == "chunks":
        if open_kwargs:
            return f"it takes no open options (PyTables'), got {sorted(open_kwargs)}"
        return chunks_problem(node, dataset)
    if engine == "h5py":
        if node.h5py_problem:
            return node.h5py_problem
        lacks = h5py_lacks(node)
        if lacks:
            return "its HDF5 cannot decode filter " + ", ".join(_filter_name(node, fid) for fid in lacks)
        return None
    if engine == "tables":
        return tables_problem(node, open_kwargs)
    raise ValueError(f"engine={engine!r} is not a concrete engine")



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
    lacking = h5py_lacks(node) if not node.h5py_problem else []
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
    if node.parts:
        try:
            return _resolve_set_again(engine, node, tuple(sorted(open_kwargs.items())))
        except TypeError:  # an open option that is not hashable
            return _resolve_set(engine, node, open_kwargs)
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


@functools.lru_cache(maxsize=16)
def _resolve_set_again(engine: str, node: NodeInfo, open_options: "tuple[tuple[str, Any], ...]") -> str:
    """:func:`_resolve_set`, remembered: a set's node holds every file's identity, so an equal node is the same files
    (a training loop asks every epoch, and each file's chunk-engine check opens it)."""
    return _resolve_set(engine, node, dict(open_options))


def _resolve_set(engine: str, node: NodeInfo, open_kwargs: dict[str, Any]) -> str:
    """The one engine that reads every file of a set (NOTE [file sets]): each file's own choice where they agree.

    Where the files' choices differ (other filters in some shards), the
    first of h5py and PyTables that reads every file; else the refusal of
    the first file neither reads, naming it. ``auto`` prefers the chunk
    engine for every file it can read, whatever the filters: its check of
    each file here leaves the file's layout for the readers (NOTE [layout
    cache]), so a shuffled epoch reopens a file in a stat and an ``open``
    where h5py opens the HDF5 file again (blosc 3, 32 shards of 4 MiB, warm:
    shards read 1.00x one file with the chunk engine, 0.91x with h5py).
    """
    per_file = "chunks" if engine == "auto" and not open_kwargs else engine
    chosen = {resolve_engine(per_file, part.node, open_kwargs) for part in node.parts}  # each refusal names its file
    if len(chosen) == 1:
        return chosen.pop()
    for common in ("h5py", "tables"):
        if all(engine_problem(common, part.node, open_kwargs) is None for part in node.parts):
            return common
    raise _set_refusal(node, open_kwargs)


def _set_refusal(node: NodeInfo, open_kwargs: dict[str, Any]) -> Exception:
    """Why no one engine reads every file of the set ``node``."""
    for part in node.parts:
        problems = {e: engine_problem(e, part.node, open_kwargs) for e in ("h5py", "tables")}
        if all(problems.values()):
            return _refuse(part.node, {e: p for e, p in problems.items() if p}, open_kwargs, None)
    return NodeTypeError(f"no one engine reads every file of {node.filename!r}")


def open_source(
    engine: str, node: NodeInfo, open_kwargs: dict[str, Any], plan: Any = None, dataset: Any = None, *, cache: str = "page",
    scratch: "ScratchBuffer | None" = None,
) -> Source:
    """Open ``node`` with a concrete engine (``chunks``, ``h5py`` or ``tables``), tuned for reading ``plan``'s blocks.

    ``dataset``: the ``h5py.Dataset`` of ``node`` from :func:`~multitables._io.node.open_node`,
    whose file the h5py and chunk engines take over (and close), sparing a second open.
    ``cache="direct"`` (chunk engine only) reads past the page cache with ``O_DIRECT``.
    ``scratch``: the chunk engine's buffer for stored bytes (a set's files share one).
    A node the chunk engine cannot read opens with h5py (or PyTables) instead:
    the source's ``engine`` attribute says which.
    """
    if cache not in CACHES:
        raise ValueError(f"cache={cache!r} is not one of {CACHES}")
    if node.parts:  # NOTE [file sets]
        if dataset is not None:
            close_dataset(dataset)
        shared = ScratchBuffer()
        return SetSource(node, engine, lambda part: open_source(engine, part, open_kwargs, cache=cache, scratch=shared))
    if engine == "chunks":
        try:
            return ChunkSource(node, cache, dataset, scratch=scratch)
        except Unsupported:
            engine = "h5py" if engine_problem("h5py", node, open_kwargs) is None else "tables"
            dataset = None  # closed by the failed open
    if cache != "page":
        raise ValueError(f"cache={cache!r} needs the chunk engine; {engine!r} reads through the page cache")
    if engine == "h5py":
        return H5pySource(node, open_kwargs, plan, dataset)
    if dataset is not None:
        close_dataset(dataset)
    if engine == "tables":
        return TablesSource(node, open_kwargs, plan)
    raise ValueError(f"engine={engine!r} is not a concrete engine")
