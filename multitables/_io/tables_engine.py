"""The ``tables`` engine: PyTables' ``read(out=)``, made to deliver what h5py's ``dataset[()]`` gives.

:data:`ENGINE` is the engine in the registry (:mod:`multitables._io.engines`).
:func:`tables_problem` says whether PyTables reads a node by trying it (open
the file, read an element, of a table a row) in a forked child, as PyTables can crash on a
damaged file where h5py fails cleanly; within :func:`probed_together`, many
nodes (a set's files, a batches' datasets) are tried in one child.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from typing import Any, Iterable, Iterator, cast

import numpy as np

from .._sys.forks import renew_lock_in_children
from .._sys.signals import raised_by_handler
from ..errors import FileBusyError, FileChangedError
from .apart import Died, each_apart
from .fields import field_of, select_field
from .files import check_opened, file_signature, settled
from .handles import raise_if_busy
from .node import NodeInfo, close_dataset, raise_if_switched
from .outside import node_places
from .strings import deliver_strings
from .scattered import GroupRows
from .vlen import VLEN_PROBLEM


def tables_problem(node: NodeInfo, open_kwargs: "dict[str, Any]") -> "str | None":
    """Why PyTables cannot read ``node`` as h5py delivers it (None: it can), tried for real (with other nodes, within
    :func:`probed_together`).

    A bad PyTables open option in ``open_kwargs`` raises PyTables' own error.
    """
    known = _known_problem(node)
    if known is not None:
        return known
    if open_kwargs:  # the user's PyTables options: a bad one raises PyTables' own error (the file's open only: a
        _open_file(node, open_kwargs).close()  # node PyTables fails on is a problem, as without options)
    key = _answer_key(node, open_kwargs)
    if key in _ANSWERS:
        return _ANSWERS[key]
    group = getattr(_TOGETHER, "group", None)
    answer = group.answer(node, open_kwargs) if group is not None else _UNGROUPED
    why = _first_row_problem_apart(node, open_kwargs) if answer is _UNGROUPED else cast("str | None", answer)
    if key is not None and why != _TIMED_OUT and _still_settled(node):
        with _ANSWERS_LOCK:  # streams made in several threads
            while len(_ANSWERS) >= ANSWERS_KEPT:
                del _ANSWERS[next(iter(_ANSWERS))]  # the oldest
            _ANSWERS[key] = why
    return why


#: PyTables' answers for settled files, by node and open options (NOTE [file identity] in ``files``: what is learned
#: of a file is kept under its identity, which the node holds): a loop of streams with ``engine="tables"``, as 2.x
#: code with ``DRIVER=`` options writes, would fork a probe per stream (~20 ms each).
_ANSWERS: "dict[tuple[NodeInfo, tuple[tuple[str, Any], ...]] | None, str | None]" = {}
#: How many answers are kept (the oldest goes first).
ANSWERS_KEPT = 64
_ANSWERS_LOCK = threading.Lock()
renew_lock_in_children(globals(), "_ANSWERS_LOCK")


def _known_problem(node: NodeInfo) -> "str | None":
    """Why PyTables cannot read ``node``, known without trying it (None: only a try tells)."""
    if node.remote is not None:
        return REMOTE
    if node.vlen:
        return VLEN_PROBLEM
    if _nested_gaps(node.file_dtype):
        # PyTables 3.11 packs nested members and then writes past its buffer (a crash at exit, or at once).
        return "PyTables misreads compounds with gaps between their members that are nested or hold nested ones"
    if _big_endian_complex_arrays(node.file_dtype):
        return "PyTables misreads big-endian complex sub-arrays in a compound (wrong values)"
    return None


@contextlib.contextmanager
def probed_together(nodes: "Iterable[NodeInfo]", open_kwargs: "dict[str, Any]") -> Iterator[None]:
    """Within it (in this thread), the first of ``nodes`` PyTables is tried on is tried with all of them not yet
    answered, in one forked probe (:func:`_first_row_problems_apart`); each answer is given when its node is asked.

    A batches' 300 datasets of 4 files forked 1,200 probes, 0.23 s each. Inside another, the nodes join the outer group.
    """
    outer = getattr(_TOGETHER, "group", None)
    if outer is not None:
        outer.add(nodes, open_kwargs)
        yield
        return
    _TOGETHER.group = _Group(open_kwargs)
    _TOGETHER.group.add(nodes, open_kwargs)
    try:
        yield
    finally:
        _TOGETHER.group = None


_TOGETHER = threading.local()
#: :meth:`_Group.answer` for a node not in the group.
_UNGROUPED = object()


class _Group:
    """The nodes of :func:`probed_together` with the same open options, and PyTables' answers on those tried."""

    def __init__(self, open_kwargs: "dict[str, Any]") -> None:
        self._options = _options_key(open_kwargs)
        self._waiting: "dict[NodeInfo, None]" = {}  # in the order given
        self._answers: "dict[NodeInfo, Any]" = {}

    def add(self, nodes: "Iterable[NodeInfo]", open_kwargs: "dict[str, Any]") -> None:
        if self._options is None or _options_key(open_kwargs) != self._options:
            return  # other options: their nodes are tried alone
        for node in nodes:
            if _hashable(node) and node not in self._answers and _known_problem(node) is None:
                self._waiting[node] = None

    def answer(self, node: NodeInfo, open_kwargs: "dict[str, Any]") -> Any:
        """PyTables' answer on ``node`` (the probe's exception raised), trying every node waiting with it;
        :data:`_UNGROUPED` where ``node`` is not in the group."""
        if not _hashable(node) or _options_key(open_kwargs) != self._options:
            return _UNGROUPED
        if node not in self._answers:
            if node not in self._waiting:
                return _UNGROUPED
            tried = [node] + [n for n in self._waiting if n != node and _answer_key(n, open_kwargs) not in _ANSWERS]
            self._waiting.clear()  # ``node`` first: a crash there is its own, told at once
            self._answers.update(zip(tried, _first_row_problems_apart(tried, open_kwargs)))
        said = self._answers[node]
        if isinstance(said, BaseException):
            raise said
        return said


def _options_key(open_kwargs: "dict[str, Any]") -> "tuple[tuple[str, Any], ...] | None":
    """``open_kwargs`` as a key (None: an option is not hashable)."""
    key = tuple(sorted(open_kwargs.items()))
    return key if _hashable(key) else None


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _still_settled(node: NodeInfo) -> bool:
    """Whether ``node``'s file is still the one described, and settled (what is learned of it may be kept)."""
    try:
        now = file_signature(node.filename)
    except OSError:
        return False
    return now == node.identity and settled(now)


def _answer_key(node: NodeInfo, open_kwargs: "dict[str, Any]") -> "tuple[NodeInfo, tuple[tuple[str, Any], ...]] | None":
    """Where :data:`_ANSWERS` keeps PyTables' answer on ``node`` (None: not kept). Not for a node whose rows lie in
    other files (an external link, a virtual dataset, external raw files: their identities are not the node's), nor
    for unhashable options."""
    if not isinstance(node.identity, tuple) or node.linked_file is not None or node.virtual or node.external:
        return None
    key = (node, tuple(sorted(open_kwargs.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


#: Why PyTables does not read an object (``s3://``, ``http(s)://``).
REMOTE = "PyTables reads local files only (it cannot read through a file object); engine='chunks' or 'h5py' read URLs"

#: Seconds a forked PyTables probe may take (it opens the file and reads an element).
PROBE_TIMEOUT = 60.0
#: The probe's answer when it took longer (a slow disk, not the file: not kept).
_TIMED_OUT = f"PyTables did not open it within {PROBE_TIMEOUT:.0f} s"


#: Chunks looked at for one that went through every filter where HDF5 cannot list them (see :func:`_filtered_chunk`).
FILTERED_LOOKS = 64


def _filtered_chunk(node: NodeInfo) -> "tuple[int, ...]":
    """Where the first chunk stored through every filter begins, an index per leading axis, the rest 0 (else 0;
    where HDF5 cannot list chunks, among the first :data:`FILTERED_LOOKS` along axis 0).

    A filter that may be skipped (lzf, deflate) leaves a chunk that did not
    shrink stored as it was: an element read from there would not show that
    PyTables lacks the filter, which fails later, mid-stream.
    """
    if not node.filter_ids or not node.chunk_rows:
        return (0,)
    import h5py

    with h5py.File(node.filename, "r") as f:
        dsid = f[node.path].id
        if hasattr(dsid, "chunk_iter"):
            # Every stored chunk in the index's order, up to the first one filtered: chunks never written, or
            # stored unfiltered, may lead by any number (a dataset written in parts, data that did not shrink).
            found = dsid.chunk_iter(lambda info: info.chunk_offset if info.filter_mask == 0 else None)
            return (0,) if found is None else tuple(int(i) for i in found)
        for row in range(0, min(node.n_rows, FILTERED_LOOKS * node.chunk_rows), node.chunk_rows):
            info = dsid.get_chunk_info_by_coord((row,) + (0,) * (dsid.rank - 1))
            if info.byte_offset is not None and info.filter_mask == 0:
                return (row,)
    return (0,)


def _first_row_problem(node: NodeInfo, open_kwargs: "dict[str, Any]") -> "str | None":
    """Open ``node`` with PyTables and read one element of it (of a table, a row), in a chunk every filter decoded
    (:func:`_filtered_chunk`), and of each piece outside the file (NOTE [data outside the file]): why that fails, or None."""
    source, label = None, ""
    try:
        places = [(_filtered_chunk(node), ""), *node_places(node)]
        source = TablesSource(node, open_kwargs)
        for at, label in places if node.n_rows else ():  # a Reader takes a node of no rows: its open is the whole check
            source.read_element(at)
    except (FileChangedError, FileBusyError):
        raise  # no fault of PyTables': the name came to mean another file, or a program writes it
    except Exception as exc:
        if raised_by_handler(exc):
            raise  # the user's own (a probe in this process): NOTE [a handler's exception]
        raise_if_switched(exc, node.filename)  # PyTables' words for it: an HDF5ExtError
        return f"PyTables fails on {'its ' + label if label else 'it'} ({type(exc).__name__}: {_gist(str(exc))})"
    finally:
        if source is not None:
            source.close()
    return None


def _first_row_problem_apart(node: NodeInfo, open_kwargs: "dict[str, Any]") -> "str | None":
    """:func:`_first_row_problem`, in a forked child (:func:`_first_row_problems_apart`)."""
    said = _first_row_problems_apart([node], open_kwargs)[0]
    if isinstance(said, BaseException):
        raise said
    return said


def _first_row_problems_apart(nodes: "list[NodeInfo]", open_kwargs: "dict[str, Any]") -> "list[Any]":
    """:func:`_first_row_problem` of each of ``nodes``, all in one forked child where there is fork and this process
    may start one (``_io.apart.each_apart``): each node's answer, or the :class:`FileChangedError` or
    :class:`FileBusyError` to raise for it.

    PyTables can crash (SIGSEGV) on a damaged file's metadata, where h5py
    reads it or fails cleanly; a crash of the probe is a refusal of the node
    it crashed on, not the death of the user's process.
    """
    def here(node: NodeInfo) -> Any:
        try:
            return _first_row_problem(node, open_kwargs)
        except (FileChangedError, FileBusyError) as exc:  # no verdict on PyTables: the caller's to raise
            return exc

    importlib.import_module("tables")  # here, not in each child: the import was 0.27 s of a probe's 0.33 s

    said = each_apart(here, nodes, PROBE_TIMEOUT)
    return [(_TIMED_OUT if s.how is None else f"PyTables crashed on it ({s.how})") if isinstance(s, Died) else s
            for s in said]


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
    """Whether a compound inside compound ``dt``, or one holding another, leaves bytes between or after its members."""
    if dt.subdtype is not None:
        return _nested_gaps(dt.subdtype[0], nested)
    if dt.names is None:
        return False
    members = [dt[name] for name in dt.names]
    holds = any((m.subdtype[0] if m.subdtype is not None else m).names for m in members)
    if (nested or holds) and dt.itemsize != sum(m.itemsize for m in members):
        return True
    return any(_nested_gaps(m, True) for m in members)


def _big_endian_complex_arrays(dt: np.dtype, in_compound: bool = False) -> bool:
    """Whether a member of a compound in ``dt`` is a sub-array of big-endian complex numbers."""
    if dt.subdtype is not None:
        base = dt.subdtype[0]
        return (in_compound and base.kind == "c" and base.byteorder == ">") or _big_endian_complex_arrays(base, in_compound)
    return dt.names is not None and any(_big_endian_complex_arrays(dt[name], True) for name in dt.names)


class TablesSource:
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

        self._file = _open_file(node, open_kwargs)
        try:
            if self._file.params.get("DRIVER") in (None, "H5FD_SEC2"):  # a descriptor of its own (as open_file chose)
                check_opened(node.filename, self._file.fileno(), node.identity)  # the file described, not one named so now
            leaf = self._file.get_node(node.path)
            if not isinstance(leaf, tables.Leaf) or isinstance(leaf, tables.VLArray):
                raise TypeError(f"PyTables opens it as a {type(leaf).__name__}, not a leaf of fixed-size rows")
            self._node = leaf
            self._field, self._inner = node.field, ""
            if node.field is not None and node.field not in getattr(leaf, "coldtypes", {}) \
                    and node.field not in (leaf.dtype.names or ()):
                # PyTables reads a column or an innermost one ('outer/mid/inner'), not one between ('outer/mid'):
                # the outer column is read, and the rest of the path taken out of it.
                self._field, self._inner = node.field.split("/", 1)
            self._element_nbytes, self._pads = node.delivered_pads
            self._zero_first = node.zero_first
            self._row_shape, self._dtype = node.row_shape, node.dtype
            if node.field is not None:  # coldtypes names the innermost columns only ('y/p', not 'y')
                read = field_of(np.dtype(leaf.dtype), node.field)[0]
            elif isinstance(leaf, tables.Table):
                read = np.dtype(leaf.dtype)
            else:
                read = np.dtype(leaf.atom.dtype)
            base = read.subdtype[0] if read.subdtype is not None else read
            whole = np.dtype(leaf.dtype) if isinstance(leaf, tables.Table) else np.dtype(leaf.atom.dtype)
            wrong = _element_size_problem(whole, node.file_dtype)  # a column is read through the whole record type
            if wrong is not None:  # reading it would write past PyTables' buffer (an HDF5 bitfield read as its bools)
                raise TypeError(f"PyTables reads {wrong}")
            # PyTables sizes ``out=`` of a nested column by the whole row: such a column is copied in.
            # A table's whole rows, where PyTables' row type is the delivered one member for member, read in too.
            whole_rows = node.field is None and base.names is not None and base.names == node.dtype.names
            self._into_out = (getattr(leaf, "maindim", 0) == 0 and leaf.flavor == "numpy" and base == node.dtype
                              and (base.names is None or whole_rows) and not self._inner)
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
                if self._inner:
                    got = select_field(np.asarray(got), self._inner)
            else:
                got = self._node[start:stop]  # along axis 0, whatever PyTables' main dimension
            _copy_by_name(out, np.asarray(got).reshape(out.shape))
        deliver_strings(out, self._pads, self._element_nbytes)

    def read_element(self, at: "tuple[int, ...]") -> np.ndarray:
        """The element at ``at`` (an index per leading axis, the rest 0) as delivered, in a new array; of a table, the
        row (a row of an array in (1 M, 1) chunks decodes every chunk: the PyTables probe reads an element)."""
        if self._field is not None or self._node.ndim < 2:  # a table's too (PyTables' tables have one axis)
            out = np.empty((1,) + self._row_shape, self._dtype)
            self.read_into(at[0], at[0] + 1, out)
            return out
        at = (tuple(at) + (0,) * self._node.ndim)[:self._node.ndim]
        # A point (as np.where gives) keeps HDF5's words in an error; PyTables' points miss an element's own axes.
        got = self._node[tuple(slice(i, i + 1) if self._node.atom.shape else np.array([i]) for i in at)]
        out = np.zeros((1,) * len(at) + self._row_shape[len(at) - 1:], self._dtype)
        _copy_by_name(out, np.asarray(got).reshape(out.shape))
        deliver_strings(out, self._pads, self._element_nbytes)
        return out

    def prefetch(self, start: int, stop: int) -> None:
        pass  # HDF5 reads its chunks itself; see the chunk engine

    def fetch(self, spans: "list[tuple[int, int]]") -> None:
        pass  # HDF5 reads its chunks itself

    def close(self) -> None:
        self._file.close()


def pytables_options(open_kwargs: "dict[str, Any]") -> "dict[str, Any]":
    """``open_kwargs`` as ``tables.open_file`` takes them without a ``DeprecationWarning``: the names of
    ``tables.parameters`` in lower case (``DRIVER=`` becomes ``driver=``).

    The established API documents them in upper case; PyTables 3.10+ warns of upper-case keywords (an error in a
    program run with ``-W error``) and upper-cases every keyword itself, so both spellings open the file alike. Other
    names (``TITLE``, ``ROOT_UEP``, a typo) are passed as given."""
    import tables

    names = {k for k in vars(tables.parameters) if k.isupper() and not k.startswith("_")}
    return {k.lower() if isinstance(k, str) and k.isupper() and k in names else k: v for k, v in open_kwargs.items()}


def _open_file(node: NodeInfo, open_kwargs: "dict[str, Any]") -> Any:
    """``node``'s file opened by PyTables with ``open_kwargs``; a file that changed, or that a program writes, is
    said so."""
    import tables

    tables.set_blosc_max_threads(1)
    try:
        return tables.open_file(node.filename, "r", **pytables_options(open_kwargs))
    except Exception as exc:
        raise_if_switched(exc, node.filename)
        raise_if_busy(exc, node.filename)  # "already opened" too where this process writes it in PyTables
        if open_kwargs and isinstance(exc, (ValueError, TypeError)):  # an option PyTables refuses: h5py's, often
            kind = ValueError if isinstance(exc, ValueError) else TypeError
            raise kind(
                f"PyTables refuses the open options {sorted(open_kwargs)} given for {node.filename!r}: {exc}. Open "
                f"options go to PyTables with engine='auto' or 'tables', as in the established API "
                f"(DRIVER='H5FD_CORE'); h5py's (driver='core', rdcc_nbytes=...) are taken with engine='h5py'"
            ) from exc
        raise


def _element_size_problem(pytables: np.dtype, delivered: np.dtype, where: str = "") -> "str | None":
    """Where PyTables' element type for a node holds elements of another size than h5py's (None: nowhere): PyTables
    reads HDF5 bitfields of any size as 1-byte bools, so a 16-bit one fills twice its buffer."""
    if pytables.subdtype is not None:
        pytables = pytables.subdtype[0]
    if delivered.subdtype is not None:
        delivered = delivered.subdtype[0]
    if delivered.names is not None or pytables.names is not None:
        if delivered.names is None or pytables.names is None:
            return None  # a flavor or layout of PyTables' own: copied member by member, checked there
        for name in delivered.names:
            if name in pytables.names:
                problem = _element_size_problem(pytables[name], delivered[name], f"{where}{name}/")
                if problem is not None:
                    return problem
        return None
    if pytables.itemsize != delivered.itemsize and pytables.kind == "b":
        at = f" in column {where[:-1]!r}" if where else ""
        return f"the {delivered.itemsize}-byte elements{at} (h5py: {delivered}) as 1-byte bools"
    return None


def _copy_by_name(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src``, compound members matched by name (numpy matches them by position, and PyTables may reorder them).

    PyTables' bools (an HDF5 8-bit bitfield) where h5py delivers the bitfield's bytes (``uint8``) are copied as the
    bytes they hold, as h5py gives them, not as truth values (a stored 2 stays 2).
    """
    if dst.dtype.names is None or src.dtype.names is None:
        if src.dtype.kind == "b" and dst.dtype.kind == "u" and dst.dtype.itemsize == 1:
            src = src.view(np.uint8)
        dst[...] = src
        return
    for name in dst.dtype.names:
        _copy_by_name(dst[name], src[name])


class TablesEngine:
    """The PyTables engine in the registry (:class:`~multitables._io.engines.Engine`).

    Slower per core than h5py (zlib ~1.8x, blosc ~2.3x; BENCHMARKS.md), so
    ``auto`` takes it last; but the open options of the established API are
    PyTables' (``DRIVER=...``), and with them ``auto`` takes it alone.
    """

    name = TablesSource.engine
    title = "PyTables"
    caches = ("page",)
    options = "PyTables'"
    falls_back = False

    def preferred(self, node: NodeInfo, in_set: bool = False, readers: bool = False, opened: bool = False,
                  requests: bool = False) -> bool:
        return False

    def problem(self, node: NodeInfo, open_kwargs: "dict[str, Any]", dataset: Any = None) -> "str | None":
        """:func:`tables_problem`: PyTables tried for real, in a forked child."""
        return tables_problem(node, open_kwargs)

    def open(self, node: NodeInfo, open_kwargs: "dict[str, Any]", plan: Any = None, dataset: Any = None, *,
             cache: str = "page", scratch: Any = None) -> "TablesSource":
        if dataset is not None:
            close_dataset(dataset)  # PyTables opens the file itself
        return TablesSource(node, open_kwargs, plan)

    def open_rows(self, node: NodeInfo, open_kwargs: "dict[str, Any]") -> GroupRows:
        return GroupRows(TablesSource(node, open_kwargs), node)


#: The PyTables engine.
ENGINE = TablesEngine()
