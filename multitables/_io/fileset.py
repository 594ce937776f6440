"""Several files as one dataset: the rows of each file in turn, read as the rows of one node.

NOTE [file sets]
    Real datasets are sharded (``train-000.h5 ... train-511.h5``) and are one
    dataset to their user. A list of files, or a glob, names a *set*; every
    access mode reads a node of it as one node whose rows are the files'
    rows in order. The set is checked up front, in the consumer, one file
    at a time, each opened once (described, checked by the chunk engine
    where it leads, its layout learned, closed): every file must hold the
    node, with the same delivered dtype (of variable-length rows, the base
    type too) and row shape as the first; a file that differs is refused
    with its name, before any process starts. Files whose node has no rows
    are allowed (a last shard may be empty) and take no part; the set must
    have rows. A file named twice is a part twice: its rows come twice.

    The set's :class:`~multitables._io.node.NodeInfo` describes the whole
    (rows, dtype, the union of the files' filters) and lists its *parts*:
    each file's own ``NodeInfo``, its first row in the set and its identity.
    :class:`SetSource` is the one place that knows a node spans files: it
    splits a read at file boundaries and reads each piece through the
    file's own engine source, so blocks never mix two files' bytes, and
    everything above it (plans, rings, stages, shuffles, shards) sees rows.

    Open files are bounded: a source keeps at most ``MAX_OPEN`` files open
    (least recently read closed first), so thousands of small files cost one
    pool of processes and a handful of descriptors per process. A shuffled
    epoch comes back to a file once per block; with the chunk engine that
    costs a stat and an ``open`` (NOTE [layout cache] in ``_io.chunks.storage``), and
    the files' sources share one read buffer.

    The file identity check (NOTE [file identity] in ``files``) is per file:
    each file's identity is taken when the set is inspected, and compared in
    the process that reads, after opening a file and after every read from
    it, before the rows go anywhere.

    A set of objects (``s3://bucket/train-*.h5`` lists the bucket's prefix;
    a list of URLs) is the same, with two differences: the objects are
    looked at together, several requests in flight, since each look waits
    for the server; and an object's identity is its ETag, which each
    request for it checks (NOTE [object identity] in ``_io.objects.reader``).
"""

from __future__ import annotations

import errno
import threading
from bisect import bisect_right
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from ..errors import EmptyDatasetError, NotHDF5Error
from .._sys.forks import renew_lock_in_children
from .files import (STREAMED, FileSignature, GrowingFile, check_file_unchanged, check_regular, file_signature, settled,
                    will_need_file)
from .node import NodeInfo, Part, check_file, close_dataset, open_node, refuse_empty
from .objects.config import Store, make_store
from .objects.hdf5 import check_hdf5
from .objects.identity import ObjectIdentity
from .objects.urls import is_url, shown
from .sums import unsummed, with_sum
from .vlen import row_dtype, vlen_refusal

if TYPE_CHECKING:  # imported where a URL is read: NOTE [objects on demand] in ``_io.objects``
    from .objects.reader import ObjectReader

#: Files a :class:`SetSource` keeps open at once in one process.
MAX_OPEN = 4

class _Described:
    """Nodes described lately, each with its files' identities then: used again while every file keeps its
    identity, with no HDF5 open (kept only where every file was settled: NOTE [file identity] in ``files``).

    A training loop asks for its node every epoch: inspecting a set of a thousand files takes ~0.4 s, checking
    their identities ~3 ms. A loop over small files, each a stream, describes each file anew: an HDF5 open and
    ~90 us, more than h5py's whole read of a file of a few KiB; a stat is 1-2 us.
    """

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._nodes: "OrderedDict[tuple[Any, ...], tuple[tuple[Any, ...], NodeInfo]]" = OrderedDict()
        self._lock = threading.Lock()
        renew_lock_in_children(self.__dict__, "_lock")  # a reader resolves a set's node through it (``SetRef``)

    def recall(self, key: "tuple[Any, ...]", identities: "tuple[FileSignature | ObjectIdentity, ...] | None") -> "NodeInfo | None":
        """The node kept under ``key`` if its files still have ``identities`` (their identities now), else None."""
        if identities is None:
            return None
        with self._lock:
            seen = self._nodes.get(key)
            if seen is None or seen[0] != identities:
                return None
            self._nodes.move_to_end(key)
        return seen[1]

    def remember(self, key: "tuple[Any, ...]", identities: "tuple[FileSignature | GrowingFile | ObjectIdentity, ...] | None",
                 node: NodeInfo) -> None:
        """Keep ``node``, described from files whose identities were ``identities`` (taken before it was), if every
        file was settled then (an object's identity is checked by every request for it; a file read with ``swmr=True``
        is never settled: NOTE [file identity])."""
        if identities is None or not all(isinstance(i, ObjectIdentity) or (isinstance(i, tuple) and settled(i))
                                         for i in identities):
            return
        with self._lock:
            self._nodes[key] = (identities, node)
            self._nodes.move_to_end(key)
            while len(self._nodes) > self._kept:
                self._nodes.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._nodes.clear()


#: Sets inspected lately (a set's node lists every file's).
_SETS = _Described(16)
#: Single files' nodes described lately: a loop over thousands of files, epoch after epoch, finds them here.
_FILES = _Described(4096)


def forget_learned() -> None:
    """Forget what this process learned of files, their nodes and chunk layouts, as a process that never read them:
    the benchmark times each pass as a first read of its file."""
    from .chunks.engine import forget_verdicts
    from .chunks.storage import forget_layouts

    _SETS.clear()
    _FILES.clear()
    forget_layouts()
    forget_verdicts()


def describe_files(files: "Sequence[str]") -> str:
    """How errors and reprs name a set: its size, first and last file (URLs as shown)."""
    return f"{len(files)} files: {shown(files[0])} .. {shown(files[-1])}"


def own_flags(open_kwargs: "dict[str, Any]") -> "dict[str, Any]":
    """What h5py's open options in ``open_kwargs`` ask of the library's own opens of the file too (:func:`open_files`):
    SWMR reading (``swmr=True``), and HDF5's file locking (``locking=``, as h5py takes it)."""
    return {"swmr": bool(open_kwargs.get("swmr")), "locking": open_kwargs.get("locking")}


#: Called with each file's node and open ``h5py.Dataset`` (left open) by a set's inspection: ``_io.engines.set_look``.
Look = Callable[[NodeInfo, Any], Any]

def open_files(
    files: "str | tuple[str, ...]", path: str, field: "str | None" = None, store: "Store | None" = None,
    swmr: bool = False, allow_empty: bool = False, locking: Any = None, vlen: bool = False, look: "Look | None" = None,
    summed: bool = False,
) -> "tuple[NodeInfo, Any]":
    """The node at ``path`` of one file (with its open ``h5py.Dataset``, as :func:`~.node.open_node`) or of a set (None).

    The dataset is None too where the node was described before and its files kept their identities (no open at all:
    ``_Described``).

    For a set, every file is checked in turn (NOTE [file sets]): ``KeyError``
    naming the file that lacks the node, ``ValueError`` naming the file whose
    rows differ from the first file's, :class:`EmptyDatasetError` if no
    file has rows. ``store``: how URLs are read (None: the environment's settings). ``swmr``: open local files for
    SWMR reading, as h5py's ``swmr=True`` (HDF5 refuses a second open of a file with the other flag); ``locking``:
    HDF5's file locking, as h5py's ``locking=`` (None: HDF5's default). ``look``: called with each file of a set with
    rows as it is inspected (not where the set was described before).
    ``allow_empty``: a node of 0 rows is given, not refused (random access takes it, as 2.x did); for a set, the first
    file's. ``vlen``: a node of variable-length rows is given (for batches' transforms), not refused (NOTE
    [variable-length rows] in ``vlen``). ``summed``: each local file's node has its ``data_sum``, taken while the
    inspection has it open (NOTE [data sums] in ``sums``; a node kept without one is described again).
    """
    node, dataset = _open_files(files, path, field, store, swmr, allow_empty, locking, look, summed)
    if node.vlen and not vlen:
        close_dataset(dataset)
        raise vlen_refusal(f"{node.path!r} in {node.filename!r}")
    return node, dataset


def _open_files(files: "str | tuple[str, ...]", path: str, field: "str | None", store: "Store | None", swmr: bool,
                allow_empty: bool, locking: Any, look: "Look | None", summed: bool = False) -> "tuple[NodeInfo, Any]":
    """:func:`open_files`, whatever the rows."""
    if isinstance(files, str):
        if is_url(files) or swmr:  # an object is looked at by the open; a file open for SWMR grows
            return open_node(files, path, field, store=store, swmr=swmr, allow_empty=allow_empty, locking=locking)
        key: "tuple[Any, ...]" = (files, path, field)
        identity = (check_regular(files),)  # missing, a directory, a FIFO: said here, as the open would
        node = _FILES.recall(key, identity)
        dataset = None  # an engine opens the file only where it needs HDF5 (NOTE [layout cache])
        if node is None or (summed and unsummed(node)):
            node, dataset = open_node(files, path, field, identity=identity[0], allow_empty=True, locking=locking)
            try:
                node = with_sum(node, dataset) if summed else node
            except BaseException:
                close_dataset(dataset)  # its file too, not left open with the error (a set's are, below)
                raise
            if not _elsewhere(node) and node.identity is not None:  # kept under the file described: the name may
                _FILES.remember(key, (node.identity,), node)  # mean another since the stat; its identity is taken
        if not allow_empty and not node.n_rows:
            close_dataset(dataset)
            refuse_empty(node)
        return node, dataset
    if any(is_url(name) for name in files):
        store = store or make_store(None)
    key = (files, path, field, store, swmr)
    identities = _identities(files, store)
    node = _SETS.recall(key, identities)
    if node is None or (summed and any(unsummed(part.node) for part in node.parts)):
        signatures, node = _inspect_set(files, path, field, store, swmr, locking, look, identities, summed)
        if not _elsewhere(node) and not any(_elsewhere(part.node) for part in node.parts):
            _SETS.remember(key, signatures, node)
    if not allow_empty and not node.n_rows:
        where = describe_files(files)
        raise EmptyDatasetError(f"{node.path!r} has no rows in any of the {where}; there is nothing to stream")
    return node, None


def _elsewhere(node: NodeInfo) -> bool:
    """Whether ``node``'s rows lie in a file other than its own, whose identity was not taken (an external link, a
    virtual dataset, external raw files): a description of it is not kept."""
    return node.linked_file is not None or node.virtual or node.external


def _look_all(urls: "list[str]", store: Store) -> "list[ObjectReader]":
    """An open reader of each of ``urls``, looked at together (:func:`~multitables._io.objects.reader.look_all`)."""
    from .objects.reader import look_all

    return look_all(urls, store)


def _objects(files: "tuple[str, ...]") -> "list[str]":
    """The URLs of ``files``, each once: a set may name a file twice (its rows come twice, an object's as a local
    file's), and one look at it serves every check, while a reader of it is taken by one open only."""
    return list(dict.fromkeys(name for name in files if is_url(name)))


def _identities(files: "tuple[str, ...]", store: "Store | None") -> "tuple[FileSignature | ObjectIdentity, ...] | None":
    """Every file's identity now (objects looked at together), or None where one cannot be had or a file is no regular
    one (the inspection then says which, in its turn)."""
    urls = _objects(files)
    try:
        looked = {}
        if urls:
            assert store is not None
            readers = _look_all(urls, store)
            looked = {name: r.identity for name, r in zip(urls, readers)}
            for r in readers:
                r.close()
        return tuple(looked[name] if name in looked else check_regular(name) for name in files)
    except (OSError, NotHDF5Error):
        return None


def _inspect_set(
    files: "tuple[str, ...]", path: str, field: "str | None", store: "Store | None", swmr: bool = False,
    locking: Any = None, look: "Look | None" = None,
    identities: "tuple[FileSignature | ObjectIdentity, ...] | None" = None, summed: bool = False,
) -> "tuple[tuple[FileSignature | GrowingFile | ObjectIdentity, ...], NodeInfo]":
    """Check every file of a set in turn (NOTE [file sets]); every file's identity (of the file described, or an
    object's as looked at first), and the set's node. ``look``, ``summed``: as :func:`open_files`; ``identities``:
    every file's, from :func:`_identities` just now (each local file found regular then: not looked at again)."""
    urls = _objects(files)
    readers = dict(zip(urls, _look_all(urls, store))) if urls and store is not None else {}
    try:
        looked: "list[FileSignature | GrowingFile | ObjectIdentity]" = list(identities) if identities is not None else [
            readers[name].identity if name in readers else _signature(name) for name in files]
        parts: list[Part] = []
        first: "NodeInfo | None" = None
        offset = 0
        for i, name in enumerate(files):
            checked = None if identities is None or is_url(name) else looked[i]
            reader = readers.pop(name, None)  # None for an object named again: its open looks at it again
            node, dataset = open_node(name, path, field, allow_empty=True, store=store, reader=reader,
                                      swmr=swmr, locking=locking, identity=checked)  # type: ignore[arg-type]  # a file's or None
            try:
                node = with_sum(node, dataset) if summed else node
                signature = looked[i] = node.identity or looked[i]  # the file described (a name may mean another since)
                if first is None:
                    first = node
                elif (node.dtype, node.row_shape, row_dtype(node)) != (first.dtype, first.row_shape, row_dtype(first)):
                    raise ValueError(
                        f"{node.filename!r} does not match the other files of the set: its {node.path!r} has rows of "
                        f"shape {node.row_shape} and dtype {row_dtype(node)}, {first.filename!r}'s have shape "
                        f"{first.row_shape} and dtype {row_dtype(first)}"
                    )
                if node.n_rows:
                    if look is not None:
                        look(node, dataset)  # the file open here: the engine's check opens it no second time
                    parts.append(Part(node, offset, signature))
                    offset += node.n_rows
            finally:
                close_dataset(dataset)
    finally:
        for reader in readers.values():  # those not reached (a file before them failed)
            reader.close()
    assert first is not None
    signatures = tuple(looked)
    if not parts:  # the first file's node stands for a set of no rows (random access takes it; streams refuse it)
        return signatures, first
    return signatures, set_node(describe_files(files), first, parts, offset)


def inspect_files(
    files: "str | tuple[str, ...]", path: str, field: "str | None" = None, store: "Store | None" = None,
    swmr: bool = False, allow_empty: bool = False, locking: Any = None, vlen: bool = False, look: "Look | None" = None,
    summed: bool = False,
) -> NodeInfo:
    """As :func:`open_files`, without the open dataset."""
    node, dataset = open_files(files, path, field, store, swmr, allow_empty, locking, vlen, look, summed)
    if dataset is not None:
        close_dataset(dataset)
    return node


def check_files(files: "tuple[str, ...]", store: "Store | None" = None) -> None:
    """Raise the error :func:`~.node.check_file` raises for the first file of ``files`` that is missing or not HDF5
    (objects looked at together)."""
    urls = _objects(files)
    readers = dict(zip(urls, _look_all(urls, store or make_store(None)))) if urls else {}
    try:
        for name in files:
            if name in readers:
                check_hdf5(readers[name])
            else:
                check_file(name)
    finally:
        for reader in readers.values():
            reader.close()


def _signature(name: str) -> FileSignature:
    try:
        return file_signature(name)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "No such HDF5 file", name) from None


def set_node(where: str, first: NodeInfo, parts: "list[Part]", n_rows: int) -> NodeInfo:
    """The node of a set: its rows, and what every part shares or any part has."""
    nodes = [p.node for p in parts]
    filters: dict[int, str] = {}
    for node in nodes:
        filters.update(zip(node.filter_ids, node.filter_names))
    chunk_rows = {node.chunk_rows for node in nodes}
    # A size hint for planning (block size, pacing); each part reads its own chunks.
    hint = None if chunk_rows == {None} else max(c for c in chunk_rows if c is not None)
    return NodeInfo(
        filename=where,
        path=first.path,
        field=first.field,
        n_rows=n_rows,
        row_shape=first.row_shape,
        dtype=first.dtype,
        file_dtype=first.file_dtype,
        chunk_rows=hint,
        filter_ids=tuple(filters),
        is_table=first.is_table,
        filter_names=tuple(filters.values()),
        zero_first=any(node.zero_first for node in nodes),
        h5py_problem=next((node.h5py_problem for node in nodes if node.h5py_problem), None),
        parts=tuple(parts),
    )


def node_signature(node: NodeInfo) -> "FileSignature | GrowingFile | ObjectIdentity | None":
    """The identity to check a one-file node's reads against: the one it was described under (for a file read with
    ``swmr=True``, one that may grow: NOTE [file identity]), where known; None for a set, whose source checks each
    file."""
    if node.parts:
        return None
    if node.remote is not None:
        return node.remote.identity
    return node.identity if node.identity is not None else file_signature(node.filename)


class SetSource:
    """Reads rows of a set (NOTE [file sets]) through one engine source per file, at most ``max_open`` open at once.

    ``open_part(node)`` opens a part's file and returns its ``Source``. ``since``: what a file found changed stops, in
    :func:`~.files.check_file_unchanged`'s words (a stream's reads; ``REQUESTED``: a Reader's requests). ``hints``:
    whether a file not open may be hinted whole by name (read through the page cache, not ``O_DIRECT``).
    """

    def __init__(self, node: NodeInfo, engine: str, open_part: "Callable[[NodeInfo], Any]", max_open: int = MAX_OPEN,
                 since: str = STREAMED, hints: bool = True) -> None:
        assert node.parts, "a SetSource reads a set"
        self._hints = hints
        self._since = since
        self.engine = engine
        self._parts = node.parts
        self._starts = [p.offset for p in node.parts]
        self._open_part = open_part
        self._max_open = max_open
        self._open: "OrderedDict[int, Any]" = OrderedDict()

    @property
    def open_files(self) -> int:
        """Files open now."""
        return len(self._open)

    def _source(self, i: int) -> Any:
        source = self._open.get(i)
        if source is not None:
            self._open.move_to_end(i)
            return source
        while len(self._open) >= self._max_open:
            self._open.popitem(last=False)[1].close()
        part = self._parts[i]
        try:
            source = self._open_part(part.node)
        except Exception:
            # A file cut short or deleted since the set was inspected fails its open, in HDF5's words without its name.
            check_file_unchanged(part.node.filename, part.signature, self._since)
            raise
        try:
            check_file_unchanged(part.node.filename, part.signature, self._since)
        except BaseException:
            source.close()
            raise
        self._open[i] = source
        return source

    def _pieces(self, start: int, stop: int) -> "Iterator[tuple[int, int, int]]":
        """``(part, a, b)``: rows ``a..b`` of part ``part``'s file, for rows ``start..stop`` of the set, in order."""
        i = bisect_right(self._starts, start) - 1
        while start < stop:
            part = self._parts[i]
            end = min(stop, part.offset + part.node.n_rows)
            yield i, start - part.offset, end - part.offset
            start = end
            i += 1

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``start..stop`` of the set into ``out``, each file's rows checked against its identity once read."""
        pos = 0
        for i, a, b in self._pieces(start, stop):
            part = self._parts[i]
            try:
                self._source(i).read_into(a, b, out[pos : pos + b - a])
            except Exception:
                # A file changed under the read explains its failure: say so, the read's error as context.
                check_file_unchanged(part.node.filename, part.signature, self._since)
                raise
            check_file_unchanged(part.node.filename, part.signature, self._since)
            pos += b - a

    def prefetch(self, start: int, stop: int) -> None:
        for i, a, b in self._pieces(start, stop):
            node = self._parts[i].node
            if self._hints and i not in self._open and b - a == node.n_rows and node.remote is None:
                # All its rows: the whole file, hinted by name. An HDF5 open for the hint would be closed (at most
                # max_open stay open) before a block over many small files is read, which opens each file again.
                will_need_file(node.filename)
                continue
            try:
                source = self._source(i)
            except Exception:  # noqa: BLE001 - a hint: the read of these rows opens the file again and says why, naming them
                continue
            source.prefetch(a, b)

    def fetch(self, spans: "list[tuple[int, int]]") -> None:
        by_file: "dict[int, list[tuple[int, int]]]" = {}
        for start, stop in spans:
            for i, a, b in self._pieces(start, stop):
                by_file.setdefault(i, []).append((a, b))
        for i, pieces in by_file.items():
            self._source(i).fetch(pieces)

    def close(self) -> None:
        while self._open:
            self._open.popitem(last=False)[1].close()

