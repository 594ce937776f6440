"""Reading engines: the registry, which engine reads a node, and opening one to read rows into a caller's buffer.

Three engines read HDF5 here, one object each in :data:`REGISTRY`
(the :class:`Engine` protocol), in the order of their measured speed:

* ``chunks`` (:mod:`multitables._io.chunks.engine`): reads the stored chunks
  itself (``os.pread``, or ``O_DIRECT`` with ``cache="direct"``) and
  decodes them with faster codecs than HDF5's, straight into the block.
  ``auto`` prefers it where it is measured faster and can read the node;
  elsewhere (an unknown filter, a type h5py converts...) :func:`resolve_engine`
  answers ``h5py``, so the stream reports the engine that really reads.
* ``h5py`` (:mod:`multitables._io.h5py_engine`): HDF5's own reads with
  hdf5plugin's filters. Measured on this project's machine it decodes zlib
  ~1.8x and blosc ~2.3x faster per core than the PyTables wheel (see
  BENCHMARKS.md), so ``auto`` prefers it to PyTables.
* ``tables`` (:mod:`multitables._io.tables_engine`): PyTables' ``read(out=)``.
  Used for ``auto`` when PyTables open options are given (``DRIVER=...``),
  or when neither engine above reads the node (a filter h5py lacks, an
  element type h5py has no numpy type for).

Every engine delivers what h5py's ``dataset[()]`` gives, row by row along
axis 0: each engine's ``problem`` (:func:`engine_problem` for a name) says,
before any reader starts, why it cannot, and :func:`resolve_engine` refuses
the node (naming each engine's reason, or the missing filter) where none
can. An engine opens a :class:`Source` for streaming (:func:`open_source`)
and a :class:`Rows` for random access (:func:`open_rows`); a set of files
(NOTE [file sets] in ``fileset``) is read through each file's own.

A new engine is an object with :class:`Engine`'s members, placed in
:data:`REGISTRY` by its speed; ``tests/test_engine_conformance.py`` runs the
suite every engine must pass on each registered one.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Callable, ContextManager, Protocol, Sequence

import numpy as np

from ..errors import MissingFilterError, NodeTypeError
from .chunks.engine import ENGINE as CHUNKS
from .chunks.transport import ScratchBuffer
from .files import REQUESTED, STREAMED
from .fileset import SetSource
from .h5filters import filter_label, h5py_lacks
from .h5py_engine import ENGINE as H5PY
from .node import NodeInfo, Unsupported, close_dataset
from .outside import lacking_sources
from .scattered import GroupRows
from .tables_engine import ENGINE as TABLES, probed_together


class Source(Protocol):
    """One open node in one process, read in row ranges (for streaming)."""

    #: The engine that reads it (``chunks`` opens as ``h5py`` where it cannot read the node).
    engine: str

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Read rows ``[start, stop)`` into ``out`` (C-contiguous, ``stop - start`` rows, delivered dtype)."""

    def prefetch(self, start: int, stop: int) -> None:
        """Hint that rows ``[start, stop)`` will be read soon; returns at once, and may do nothing."""

    def fetch(self, spans: "list[tuple[int, int]]") -> None:
        """The rows of ``spans`` (``(start, stop)`` each: a block's pieces) are read next, by this process: fetch what
        they need now where that pays (an object's bytes, one round trip for them all); may do nothing."""

    def close(self) -> None:
        """Release the file."""


class Rows(Protocol):
    """One open node in one process, read at given rows (for random access)."""

    def read(self, rows: "np.ndarray | range", out: np.ndarray, stopped: Callable[[], bool]) -> None:
        """Read rows ``rows`` (sorted integers: an array, or a range) into ``out`` (C-contiguous, ``len(rows)`` rows, delivered dtype).

        Calls ``stopped()`` between reads, and raises
        :class:`~multitables._io.scattered.Stopped` once it says so.
        """

    def close(self) -> None:
        """Release the file."""


class Engine(Protocol):
    """One way of reading HDF5 nodes, as :data:`REGISTRY` holds it.

    Its methods take one file's node (never a set's: :func:`open_source`
    and :func:`engine_problem` read a set through each file's own) and
    ``open_kwargs``, the user's open options.
    """

    #: Its name, as ``engine=`` takes it.
    name: str
    #: How messages name it ("the chunk engine").
    title: str
    @property
    def caches(self) -> "tuple[str, ...]":
        """The ``cache=`` values it reads with (:func:`open_source` refuses the others)."""
    @property
    def options(self) -> "str | None":
        """Whose open options it takes: :data:`AUTO_OPTIONS`, another library's (passed on), or None (refused)."""
    #: Named, it reads what it can and leaves the rest to ``auto``'s walk (True), or it reads the node or refuses (False).
    falls_back: bool

    def preferred(self, node: NodeInfo, in_set: bool = False, readers: bool = False, opened: bool = False,
                  requests: bool = False) -> bool:
        """Whether ``auto`` takes it ahead of the engines that are not (measured faster), for ``node`` (``in_set``: a file
        of a set; ``readers``: read by reader processes, or a Reader's requests wherever they are read, not a stream
        in the consumer; ``opened``: its dataset was opened here just now to describe it, a first look at the file in
        this process)."""

    def problem(self, node: NodeInfo, open_kwargs: "dict[str, Any]", dataset: Any = None) -> "str | None":
        """Why it cannot read ``node`` as h5py delivers it (None: it can, and its opens work); starts nothing.

        ``dataset``: the node's open ``h5py.Dataset``, which it may use to
        spare an open and leaves open.
        """

    def open(self, node: NodeInfo, open_kwargs: "dict[str, Any]", plan: Any = None, dataset: Any = None, *,
             cache: str = "page", scratch: "ScratchBuffer | None" = None) -> Source:
        """A :class:`Source` of ``node``, tuned for reading ``plan``'s blocks (None: any reads); the caller closes it.

        ``dataset``: the node's open ``h5py.Dataset``, which it takes over (and
        closes, even when it raises). ``cache``: one of :attr:`caches`.
        ``scratch``: a buffer for stored bytes, shared by the sources of a set.
        Raises :class:`~multitables._io.node.Unsupported` where it finds at
        open what it cannot read.
        """

    def open_rows(self, node: NodeInfo, open_kwargs: "dict[str, Any]") -> Rows:
        """A :class:`Rows` of ``node``, for random access; the caller closes it. Raises as :meth:`open`."""


#: The engines, in the order of measured speed: ``auto`` walks those it prefers for a node in
#: this order, then the others in this order (:func:`resolve_engine`).
REGISTRY: "tuple[Engine, ...]" = (CHUNKS, H5PY, TABLES)
#: What ``engine=`` takes: ``auto`` and each registered engine's name.
ENGINES = ("auto",) + tuple(e.name for e in REGISTRY)
#: Every ``cache=`` some engine reads with.
CACHES = tuple(dict.fromkeys(c for e in REGISTRY for c in e.caches))
#: Whose open options the established API passes on (``DRIVER=...``): with any given,
#: ``auto`` walks only the engines that take these.
AUTO_OPTIONS = "PyTables'"
#: Open options only h5py takes (``swmr=True``: a file an SWMR writer holds; ``locking=``, HDF5's file locking):
#: given them, ``auto`` takes h5py.
H5PY_ONLY_OPTIONS = frozenset({"swmr", "locking"})
_BY_NAME = {e.name: e for e in REGISTRY}


def check_engine(engine: Any) -> str:
    """``engine`` if it names an engine (or ``auto``), else ``ValueError``: the one place engine names are checked."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not one of {ENGINES}")
    return engine


def check_open_options(engine: str, open_kwargs: "dict[str, Any]", stacklevel: int) -> None:
    """Warn of open options that PyTables, which takes them with ``engine`` ``auto`` or ``tables`` (as the established
    API passed them to ``tables.open_file``; ``auto`` given only :data:`H5PY_ONLY_OPTIONS` takes h5py), would ignore
    without a word: a typo, or h5py's ``rdcc_nbytes``.

    A warning, not an error: 2.x ran such code, and PyTables ignores them as it did. ``stacklevel`` points it at the
    caller of the public call."""
    if engine not in ("auto", "tables") or not open_kwargs:
        return
    if engine == "auto" and open_kwargs.keys() <= H5PY_ONLY_OPTIONS:
        return  # auto takes h5py for h5py's own (swmr=, locking=), which checks them
    import tables

    known = {k for k in vars(tables.parameters) if k.isupper() and not k.startswith("_")} | {"TITLE", "ROOT_UEP", "FILTERS"}
    unknown = sorted(k for k in open_kwargs if not isinstance(k, str) or k.upper() not in known)
    if unknown:
        warnings.warn(
            f"open options {unknown} are none of PyTables' (tables.parameters): with engine={engine!r}, open options "
            f"go to PyTables, as in the established API, and PyTables ignores these without a word. h5py's (driver=, "
            f"rdcc_nbytes=, ...) are taken with engine='h5py'",
            stacklevel=stacklevel + 1,
        )


def registered(engine: str) -> Engine:
    """The registered engine named ``engine``; ``ValueError`` for ``auto`` or an unknown name."""
    found = _BY_NAME.get(engine)
    if found is None:
        raise ValueError(f"engine={engine!r} is not a concrete engine")
    return found


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

    The registered engine's ``problem`` (:class:`Engine`); ``tables`` is
    tried for real (:func:`~multitables._io.tables_engine.tables_problem`),
    since what PyTables fails on shows no sooner. For a set, the first
    file's problem, named.
    """
    if node.parts:
        for part in node.parts:
            why = engine_problem(engine, part.node, open_kwargs)
            if why is not None:
                return f"{part.node.filename!r}: {why}"
        return None
    return registered(engine).problem(node, open_kwargs, dataset)


def _refuse(node: NodeInfo, problems: "dict[str, str]", open_kwargs: "dict[str, Any]", dataset: Any) -> Exception:
    """The error for a node that none of the engines in ``problems`` reads (each with its reason): names an engine that
    does, if one does; a filter h5py's HDF5 cannot decode, of the node or a virtual source, makes it a
    :class:`~multitables.MissingFilterError`."""
    where = f"{node.path!r} in {node.filename!r}"
    other = next((e.name for e in REGISTRY if e.name not in problems and _reads(e, node, open_kwargs, dataset)), None)
    plain = None
    if other is None and open_kwargs:  # the options may be what stops the others (PyTables' DRIVER= is no h5py option)
        plain = next((e.name for e in REGISTRY if e.name not in problems and _reads(e, node, {}, dataset)), None)
    reasons = "; ".join(f"{engine}: {why}" for engine, why in problems.items())
    # h5py's HDF5, with hdf5plugin's filters, is what says which filters are installed; of a virtual source's too.
    lacking = [(fid, filter_label(node, fid), "") for fid in h5py_lacks(node)] if not node.h5py_problem else []
    if not lacking and other is None and plain is None:  # NOTE [data outside the file]
        lacking = [(fid, name, f" (its {label})") for fid, name, label in lacking_sources(node)]
    if other is not None:
        message = f"engine={'/'.join(problems)!r} cannot read {where} ({reasons}); engine={other!r} (or 'auto') reads it"
    elif plain is not None:
        message = (f"engine={'/'.join(problems)!r} cannot read {where} ({reasons}); engine={plain!r} (or 'auto') reads "
                   f"it without the open options {sorted(open_kwargs)}")
    elif lacking:
        named = ", ".join(name + whose for _, name, whose in lacking)
        provide = "; ".join(f"{name}: {_FILTER_PROVIDERS.get(fid, 'an HDF5 plugin for it')}" for fid, name, _ in lacking)
        message = (f"{where} was written with filter {named}, which no engine here decodes ({reasons}). "
                   f"Install what provides it ({provide}) and point HDF5_PLUGIN_PATH at its plugin folder")
    else:
        message = f"no engine reads {where} as h5py would: {reasons}"
    if lacking:
        err = MissingFilterError(message)
        err.filter_ids = tuple(fid for fid, _, _ in lacking)
        return err
    return NodeTypeError(message)


def _taking(open_kwargs: "dict[str, Any]") -> str:
    """Whose open options ``open_kwargs`` are (:attr:`Engine.options`): h5py's where only h5py takes them, else the
    established API's (PyTables')."""
    return H5PY.options if open_kwargs.keys() <= H5PY_ONLY_OPTIONS else AUTO_OPTIONS


def _reads(engine: "Engine", node: NodeInfo, open_kwargs: "dict[str, Any]", dataset: Any) -> bool:
    """Whether ``engine`` reads ``node`` with ``open_kwargs``: options it does not take (PyTables' ``DRIVER=`` given
    to h5py, which on a URL no open of h5py's would show) are a no."""
    if open_kwargs and engine.options != _taking(open_kwargs):
        return False
    try:
        return engine.problem(node, open_kwargs, dataset) is None
    except (TypeError, ValueError):
        return False


def _auto_walk(node: NodeInfo, open_kwargs: "dict[str, Any]", in_set: bool = False, readers: bool = False,
               opened: bool = False, requests: bool = False) -> "list[Engine]":
    """The engines ``auto`` tries for ``node``, in order: those it prefers, then the others, each in :data:`REGISTRY`'s order.

    Given open options, only the engines that take the established API's (:data:`AUTO_OPTIONS`), or h5py's where only
    h5py takes them (:data:`H5PY_ONLY_OPTIONS`).
    """
    walk = [e for e in REGISTRY if e.preferred(node, in_set, readers, opened, requests)]
    walk += [e for e in REGISTRY if e not in walk]
    if open_kwargs:
        walk = [e for e in walk if e.options == _taking(open_kwargs)]
    return walk


def _walk(engine: str, node: NodeInfo, open_kwargs: "dict[str, Any]", in_set: bool = False, readers: bool = False,
          opened: bool = False, requests: bool = False) -> "list[Engine]":
    """The engines to try, in order, for ``engine`` on ``node``: ``auto``'s walk, a named engine alone, or first where it falls back."""
    if engine == "auto":
        return _auto_walk(node, open_kwargs, in_set, readers, opened, requests)
    named = registered(engine)
    if open_kwargs and named.options is None:
        raise ValueError(
            f"engine={engine!r} reads the file itself and takes no open options (the 'h5py' and 'tables' engines do), got {sorted(open_kwargs)}"
        )
    if not named.falls_back:
        return [named]
    return [named] + [e for e in _auto_walk(node, open_kwargs, in_set, readers, requests=requests) if e is not named]


def resolve_engine(engine: str, node: NodeInfo, open_kwargs: dict[str, Any], dataset: Any = None, readers: bool = False,
                   requests: bool = False) -> str:
    """The concrete engine that reads ``node`` for ``engine`` (``auto`` picks); raises before any reader starts.

    ``auto`` takes the first engine that reads the node, in the order of
    measured speed (:data:`REGISTRY`, those preferred for the node first:
    the chunk engine where it pays, h5py, the chunk engine where it does
    not, PyTables); only PyTables when PyTables open options are given
    (the established API's). ``chunks`` does the same, trying itself first.
    A named ``h5py`` or ``tables`` that cannot read the node raises. Where
    no engine reads it: a :class:`~multitables.MissingFilterError` for a
    filter nothing here decodes, else a :class:`~multitables.NodeTypeError`
    with each engine's reason. ``ValueError`` for unknown names.
    ``readers``: the node is read by reader processes (the plan says so),
    or by a Reader's requests (in reader processes or in this process),
    where some engines are measured faster than in a stream's consumer.
    ``requests``: by a Reader's requests (with ``readers``), which read rows here and there.
    """
    check_engine(engine)
    if node.parts:
        with checked_together(engine, [node], open_kwargs):  # one PyTables probe for the files, not one a file
            try:
                return _resolve_set_again(engine, node, tuple(sorted(open_kwargs.items())))
            except TypeError:  # an open option that is not hashable
                return _resolve_set(engine, node, open_kwargs)
    return _resolve(engine, node, open_kwargs, dataset, readers=readers, requests=requests)


def checked_together(engine: str, nodes: "Sequence[NodeInfo]", open_kwargs: "dict[str, Any]") -> ContextManager[None]:
    """Within it, :func:`resolve_engine` of ``nodes`` tries PyTables on all their files in one forked probe where ``engine``
    tries it first (``tables``; ``auto`` given its options), not one a file (``tables_engine.probed_together``)."""
    files = [part.node for node in nodes for part in node.parts] + [node for node in nodes if not node.parts]
    # Never preferred, PyTables leads the walk for every node or none (the chunk engine's refuses PyTables' options).
    leads = engine != CHUNKS.name and bool(files) and _walk(engine, files[0], open_kwargs)[0] is TABLES
    return probed_together(files if leads else [], open_kwargs)


def set_look(engine: str, open_kwargs: "dict[str, Any]") -> "Callable[[NodeInfo, Any], Any] | None":
    """What :func:`resolve_engine` will ask of each file of a set that needs the file open, for the set's inspection to
    ask while it holds each file open (``look`` in :func:`~multitables._io.fileset.open_files`): one HDF5 open a file.

    The chunk engine's check, where ``engine`` walks it first for a file of a set: ``auto`` (which prefers it for every
    file of a set) or ``chunks``, with no open options (it takes none). Its verdicts are kept for the resolution. None
    where another engine leads: their checks need no open.
    """
    if open_kwargs or engine not in ("auto", CHUNKS.name):
        return None
    return lambda node, dataset: CHUNKS.problem(node, {}, dataset)


def readers_may_change(engine: str, node: NodeInfo, open_kwargs: "dict[str, Any]", opened: bool = False) -> bool:
    """Whether :func:`resolve_engine` with ``readers`` may answer otherwise than without for ``engine`` on ``node``: the
    engines' order changes (pure; no engine's check runs, which for an object reads its chunk index again).
    ``opened``: as :meth:`Engine.preferred`."""
    return not node.parts and (_walk(engine, node, open_kwargs, opened=opened)
                               != _walk(engine, node, open_kwargs, readers=True, opened=opened))


def _resolve(
    engine: str, node: NodeInfo, open_kwargs: "dict[str, Any]", dataset: Any = None, in_set: bool = False, readers: bool = False,
    requests: bool = False,
) -> str:
    """:func:`resolve_engine` for one file's ``node``."""
    problems: dict[str, str] = {}
    for candidate in _walk(engine, node, open_kwargs, in_set, readers, opened=dataset is not None, requests=requests):
        why = candidate.problem(node, open_kwargs, dataset)
        if why is None:
            return candidate.name
        problems[candidate.name] = why
    raise _refuse(node, problems, open_kwargs, dataset)


@functools.lru_cache(maxsize=16)
def _resolve_set_again(engine: str, node: NodeInfo, open_options: "tuple[tuple[str, Any], ...]") -> str:
    """:func:`_resolve_set`, remembered: a set's node holds every file's identity, so an equal node is the same files
    (a training loop asks every epoch, and each file's chunk-engine check opens it)."""
    return _resolve_set(engine, node, dict(open_options))


def _resolve_set(engine: str, node: NodeInfo, open_kwargs: dict[str, Any]) -> str:
    """The one engine that reads every file of a set (NOTE [file sets]): each file's own choice where they agree.

    Each file's choice is ``engine``'s walk for a file of a set (the chunk
    engine's check of a file leaves its layout for the readers, NOTE
    [layout cache], so ``auto`` prefers it for every file it reads,
    whatever the filters; :meth:`~multitables._io.chunks.engine.ChunkEngine.preferred`).
    Where the choices differ (other filters in some shards), the first
    engine after the walk's first that reads every file; else the refusal of
    the first file none of those reads, naming it.
    """
    chosen = {_resolve(engine, part.node, open_kwargs, in_set=True) for part in node.parts}  # each refusal names its file
    if len(chosen) == 1:
        return chosen.pop()
    # The choices differ only where the walk's first engine does not read every file.
    others = _walk(engine, node.parts[0].node, open_kwargs, in_set=True)[1:]
    for common in others:
        if all(common.problem(part.node, open_kwargs) is None for part in node.parts):
            return common.name
    raise _set_refusal(node, others, open_kwargs)


def _set_refusal(node: NodeInfo, engines: "list[Engine]", open_kwargs: dict[str, Any]) -> Exception:
    """Why none of ``engines`` reads every file of the set ``node``: the first file none reads, refused by name."""
    for part in node.parts:
        problems = {e.name: e.problem(part.node, open_kwargs) for e in engines}
        if all(problems.values()):
            return _refuse(part.node, {e: p for e, p in problems.items() if p}, open_kwargs, None)
    return NodeTypeError(f"no one engine reads every file of {node.filename!r}")


def _fallback(engine: Engine, node: NodeInfo, open_kwargs: "dict[str, Any]") -> Engine:
    """The engine that reads ``node`` where ``engine``, which falls back, found at open that it cannot.

    The next of ``auto``'s walk whose check passes; the last is taken
    unchecked (PyTables' check forks a probe; its open says what is wrong).
    """
    rest = [e for e in _auto_walk(node, open_kwargs) if e is not engine]
    return next((e for e in rest[:-1] if e.problem(node, open_kwargs) is None), rest[-1])


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
        return _open_set(engine, node, open_kwargs, cache)
    chosen = registered(engine)
    while True:
        if cache not in chosen.caches:
            offering = " or ".join(e.title for e in REGISTRY if cache in e.caches)
            raise ValueError(f"cache={cache!r} needs {offering}; {chosen.name!r} reads through the page cache")
        try:
            return chosen.open(node, open_kwargs, plan, dataset, cache=cache, scratch=scratch)
        except Unsupported:
            if not chosen.falls_back:
                raise
            chosen, dataset = _fallback(chosen, node, open_kwargs), None  # the failed open closed the dataset


def _open_set(engine: str, node: NodeInfo, open_kwargs: dict[str, Any], cache: str = "page",
              since: str = STREAMED) -> SetSource:
    """The source of the set ``node``: its files' sources, which share one buffer for stored bytes; ``since``: what a
    file found changed stops (as :class:`SetSource` takes it)."""
    shared = ScratchBuffer()
    return SetSource(node, engine, lambda part: open_source(engine, part, open_kwargs, cache=cache, scratch=shared),
                     since=since, hints=cache == "page")


def open_rows(engine: str, node: NodeInfo, open_kwargs: "dict[str, Any]") -> Rows:
    """Open ``node`` with the concrete ``engine`` for random access (its own :class:`Rows`); a set reads through its
    files' sources, a file of it found changed failing the Reader's requests (``REQUESTED``), as a single file does."""
    if node.parts:
        return GroupRows(_open_set(engine, node, open_kwargs, since=REQUESTED), node)
    chosen = registered(engine)
    try:
        return chosen.open_rows(node, open_kwargs)
    except Unsupported:
        if not chosen.falls_back:
            raise
        return _fallback(chosen, node, open_kwargs).open_rows(node, open_kwargs)
