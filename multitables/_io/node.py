"""Inspecting the node to stream: every check on the user's input that needs the file.

Runs in the consumer before any process starts, so bad input fails early with
an error that names the file, the path and the argument.

NOTE [external links]
    A path may be an external link into another file (a detector's master file links to its data files). HDF5
    follows it, and h5py and PyTables read what it leads to, but the chunk engine reads chunks by their addresses,
    which are the other file's: read in the named file they gave that file's bytes (wrong rows, silently). So the
    inspection asks HDF5 which file holds the dataset (``NodeInfo.linked_file``) and the chunk engine reads that
    one. An object's links out are refused: they would lead to local files. The identity watched for changes stays
    the named file's (NOTE [file identity] in ``files``); the layout cache keys on the linked one.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .._sys.signals import raised_by_handler
from ..errors import (
    EmptyDatasetError, FileChangedError, MultitablesError, NodeTypeError, NoSuchFieldError, NotHDF5Error, no_such_node,
)
from .fields import field_of, field_path
from .files import FileSignature, GrowingFile, as_filename, check_opened, check_regular, file_signature
from .handles import check_intent, raise_if_busy, refresh_swmr
from .objects.config import Store, make_store
from .objects.hdf5 import checked_identity, open_file_id
from .objects.identity import ObjectIdentity
from .objects.urls import is_url, shown
from .strings import StringPad, find_string_pads
from .vlen import vlen_refusal
from .writers import column_hint, group_hint, matlab_empty, netcdf_dimension, reference_hint

if TYPE_CHECKING:  # imported where a URL is read: NOTE [objects on demand] in ``_io.objects``
    from .objects.reader import ObjectReader, RemoteObject

class Unsupported(Exception):
    """An engine does not read this node as h5py delivers it; the message says why (the chunk engine raises it at open)."""


@dataclass(frozen=True)
class NodeInfo:
    """What the readers and the consumer need to know about one streamed node.

    ``dtype`` and ``row_shape`` describe the rows as delivered, as h5py's
    ``dataset[()]`` has them: for a ``field`` of a table whose column is a
    sub-array, or for a dataset of HDF5 array elements (PyTables'
    multidimensional atoms), the sub-array's shape is part of ``row_shape``
    and ``dtype`` is its element type. ``file_dtype`` is one stored element.
    """

    filename: str
    path: str
    field: "str | None"
    n_rows: int
    row_shape: tuple[int, ...]
    dtype: np.dtype
    file_dtype: np.dtype
    chunk_rows: "int | None"
    filter_ids: tuple[int, ...]
    is_table: bool
    #: The filters' names as the file gives them, in the order of ``filter_ids``.
    filter_names: tuple[str, ...] = ()
    #: Strings in a stored element that h5py converts (see :func:`deliver_strings`).
    string_pads: tuple[StringPad, ...] = ()
    #: HDF5 writes nothing where storage was never allocated and the fill value is
    #: undefined or never written: readers zero those rows first, as h5py does.
    zero_first: bool = False
    #: Why h5py cannot read the element type (None: it can); PyTables then describes the node.
    h5py_problem: "str | None" = None
    #: A node spread over several files (``_io.fileset``): its parts in row order; empty for one file,
    #: whose ``filename`` is then the file (else a description of the set).
    parts: "tuple[Part, ...]" = ()
    #: Where the file is an object (``s3://``, ``http(s)://``): how to read it, and what it was when inspected.
    remote: "RemoteObject | None" = None
    #: The whole chunk's shape, rows first (None: not chunked, or a set).
    chunk_shape: "tuple[int, ...] | None" = None
    #: The file that holds the data where ``path`` is an external link into it (None: ``filename`` does).
    linked_file: "str | None" = None
    #: A virtual dataset: its rows, and how many, come from other files (whose identities are not this file's).
    virtual: bool = False
    #: Its raw data lies in external files (HDF5's external storage): NOTE [data outside the file] in ``outside``.
    external: bool = False
    #: The identity of the local file that was described, from the descriptor HDF5 read it through (not the name,
    #: which can mean another file a moment later): what a stream checks the file against, and what is learned of
    #: it is kept under, so that a file replaced after its description is not read as described (None: an object; a
    #: :class:`~.files.GrowingFile` for a file open for SWMR reading, which may grow, and of which nothing is kept).
    identity: "FileSignature | GrowingFile | None" = None
    data_sum: "int | None" = None  # its data's sum, where the inspection was asked for it (NOTE [data sums] in ``sums``)

    @property
    def data_file(self) -> str:
        """The file whose bytes hold the dataset: what the chunk engine reads (one file)."""
        return self.linked_file or self.filename

    @property
    def files(self) -> "str | tuple[str, ...]":
        """What to inspect again to get this node: the file, or the set's files in order."""
        return tuple(p.node.filename for p in self.parts) if self.parts else self.filename

    @property
    def vlen(self) -> bool:
        """Whether its rows are variable-length, read as objects (NOTE [variable-length rows] in ``_io.vlen``)."""
        return self.dtype.kind == "O"

    @property
    def row_nbytes(self) -> int:
        """Bytes in one delivered row."""
        # math.prod, not np.prod: ~0.3 us against ~15 us, asked twice per stream.
        return math.prod(self.row_shape) * self.dtype.itemsize

    @property
    def field_read_dtype(self) -> "np.dtype | None":
        """A one-field compound that selects ``field`` in an HDF5 read (None without a field); for a column of a
        nested compound (``'outer/inner'``), one-field compounds nested as deep."""
        if self.field is None:
            return None
        read = field_of(self.file_dtype, self.field)[0]
        for name in reversed(field_path(self.file_dtype, self.field)):
            read = np.dtype([(name, read)])
        return read

    @property
    def delivered_pads(self) -> tuple[int, tuple[StringPad, ...]]:
        """The bytes of one delivered element (the field's, with a field), and :attr:`string_pads` within it."""
        if self.field is None:
            return self.file_dtype.itemsize, self.string_pads
        fdt, foff = field_of(self.file_dtype, self.field)
        return fdt.itemsize, tuple((o - foff, n, c, p) for o, n, c, p in self.string_pads if foff <= o < foff + fdt.itemsize)


@dataclass(frozen=True)
class Part:
    """One file's part of a node spread over several files: rows ``[offset, offset + node.n_rows)`` of the set."""

    node: NodeInfo
    offset: int
    #: The file's identity when it was inspected; see NOTE [file identity] in ``files``.
    signature: "FileSignature | GrowingFile | ObjectIdentity"


def _has_object(dt: np.dtype) -> bool:
    if dt.names:
        return any(_has_object(dt[n]) for n in dt.names)
    if dt.subdtype is not None:
        return _has_object(dt.subdtype[0])
    return dt.kind in "OV" or dt.hasobject


def inspect_node(filename: "str | os.PathLike[str]", path: str, field: "str | None" = None, store: "Store | None" = None) -> NodeInfo:
    """Open ``filename`` read-only, check ``path`` (and ``field``) can be streamed, describe it."""
    node, dataset = open_node(filename, path, field, store=store)
    close_dataset(dataset)
    if node.vlen:
        raise vlen_refusal(f"{path!r} in {filename!r}")
    return node


def check_file(filename: str, store: "Store | None" = None) -> "FileSignature | ObjectIdentity":
    """Raise the builtin-compatible error for a missing file, a directory, a FIFO or device, or a file that is not HDF5;
    else return the file's identity (an object's is looked at with one request)."""
    import h5py

    if is_url(filename):
        return checked_identity(filename, store or make_store(None))
    check_regular(filename, readable=True)
    if not h5py.is_hdf5(os.fsencode(filename)):
        raise NotHDF5Error(f"{filename!r} is not an HDF5 file")
    return file_signature(filename)


def open_node(
    filename: "str | os.PathLike[str]", path: str, field: "str | None" = None, *, allow_empty: bool = False,
    store: "Store | None" = None, reader: "ObjectReader | None" = None, swmr: bool = False,
    identity: "FileSignature | None" = None, locking: Any = None,
) -> "tuple[NodeInfo, Any]":
    """As :func:`inspect_node`, but also return the open ``h5py.Dataset``: the caller closes it with :func:`close_dataset`.

    ``allow_empty``: describe a node of 0 rows (a shard of a set may be
    empty) rather than raise :class:`EmptyDatasetError`. A node of
    variable-length rows is described (:attr:`NodeInfo.vlen`): its callers
    refuse it where no transform reads it (NOTE [variable-length rows] in ``vlen``).

    The file is opened without a chunk cache (see :func:`_file_access`), and
    no file id is kept: the dataset holds the file open. A URL is read through
    a file object over its bytes (``_io.objects.fileobj``), with ``store``'s
    settings (None: the environment's); ``reader``: the object already
    looked at (a set looks at its objects together); ``swmr``: a local file opened for SWMR reading; ``identity``: the
    local file's, taken just before by the caller's check of the name (the node's is that of the file HDF5 opened:
    :attr:`NodeInfo.identity`); ``locking``: HDF5's file locking as h5py's ``locking=`` takes it (None: HDF5's).
    """
    import h5py

    filename = as_filename(filename)
    if not isinstance(path, str):
        raise TypeError(f"path must be a str naming a node in the file, not {type(path).__name__}")
    if not path:
        raise ValueError(f"path is empty: name the node to read in {shown(filename)!r}, such as '/data'")
    if field is not None and not isinstance(field, str):
        raise TypeError(f"field must be a str naming a table column, not {type(field).__name__}")
    remote = None
    held: "FileSignature | GrowingFile | None" = None
    if is_url(filename):
        from .objects.reader import ObjectReader

        reader = reader or ObjectReader(filename, store or make_store(None))  # missing, forbidden: says so
        remote = reader.remote
        filename = remote.shown  # what messages call it: a presigned URL's query is never shown
        try:
            fid = open_file_id(reader, check=True)
        except OSError as exc:
            _raise_named(exc, filename)
    else:
        if identity is None:
            check_regular(filename)  # else the caller's identity came from this check (``_io.fileset.open_files``)
        try:
            flags = h5py.h5f.ACC_RDONLY | (h5py.h5f.ACC_SWMR_READ if swmr else 0)
            fid = h5py.h5f.open(os.fsencode(filename), flags, _file_access(locking))
        except OSError as exc:
            check_file(filename)  # the error a user expects: missing, a directory, not HDF5
            _raise_named(exc, filename)  # else permissions, a damaged file: HDF5's words, named
        held = file_signature(fid.get_vfd_handle())  # the file opened, whatever the name means now
        held = GrowingFile(held) if swmr else held  # one that may grow (NOTE [file identity] in ``files``)
    try:
        if remote is None:
            check_intent(fid, filename)  # not a file this process writes (NOTE [files written here] in ``handles``)
        try:
            oid = h5py.h5o.open(fid, path.encode())
        except KeyError as exc:
            link = _external_link(fid, path)
            if link is not None and remote is not None:
                raise _link_out(path, filename, link[0]) from None
            if link is not None:
                raise KeyError(f"{path!r} in {filename!r} is an external link to {link[1]!r} in {link[0]!r}, which "
                               f"HDF5 cannot open: {exc}") from None
            # h5py says KeyError for a damaged file too; only these messages mean "no such node".
            if "doesn't exist" in str(exc) or "not found" in str(exc):
                raise no_such_node(f"no node {path!r} in {filename!r}") from None
            raise OSError(f"cannot open {path!r} in {filename!r}; the file may be damaged: {exc}") from exc
        if swmr and isinstance(oid, h5py.h5d.DatasetID):
            refresh_swmr(oid, None, "")  # its rows as flushed last (NOTE [swmr extent] in ``handles``)
        if not isinstance(oid, h5py.h5d.DatasetID):
            kind = "a Group" if isinstance(oid, h5py.h5g.GroupID) else "a named Datatype"
            hint = group_hint(h5py.Group(oid), path) if isinstance(oid, h5py.h5g.GroupID) else ""
            raise NodeTypeError(f"{path!r} in {filename!r} is {kind}; only array datasets (Array, CArray, EArray) "
                                f"and Tables can be streamed{hint}")
        node = h5py.Dataset(oid)
        info = _describe(filename, path, field, node, allow_empty, remote is not None, held)
        # Another file's where path is an external link. fileno, not a file id of its own: closing that cost 25 us.
        linked = None if oid.fileno == fid.fileno else os.path.abspath(os.fsdecode(h5py.h5f.get_name(oid)))
        if linked is not None and remote is not None:
            raise _link_out(path, filename, linked)
        if remote is not None or linked is not None:
            info = replace(info, remote=remote, linked_file=linked)
        return info, node
    except BaseException:
        h5py.File(fid).close()  # closes what is open in it too, which a bare H5Fclose (weak) leaves to the collector
        raise


def raise_if_switched(exc: Exception, filename: str) -> None:
    """:class:`FileChangedError` where HDF5 saw the name come to mean another file while it opened it."""
    if "st_ino or st_dev fields changed" in str(exc):
        raise FileChangedError(f"{filename!r} was replaced by another file while it was opened: {exc}") from exc


_CUT_SHORT = re.compile(r"truncated file: eof = (\d+), .*stored_eof = (\d+)")


def _raise_named(exc: OSError, filename: str) -> None:
    """Raise ``exc`` naming ``filename`` (HDF5's open errors name none): the same type, errno and words, ``exc`` its
    cause; ``exc`` itself where it names the file already. A file open for writing is a :class:`FileBusyError`."""
    if not isinstance(exc, MultitablesError):
        raise_if_busy(exc, filename)
    if filename in str(exc) or isinstance(exc, MultitablesError):
        raise exc
    raise_if_switched(exc, filename)
    cut = _CUT_SHORT.search(str(exc))
    words = f"cannot open {filename!r} as HDF5 (the file may be damaged): {exc}"
    if cut is not None:
        words = (f"{filename!r} is cut short: it holds {int(cut[1]):,} bytes of the {int(cut[2]):,} its superblock "
                 f"names (a copy or download that did not finish, or a writer that did not close it): {exc}")
    try:
        named = type(exc)(words)
    except Exception:  # noqa: BLE001 - an OSError subclass with other arguments: keep it as it came
        raise exc
    named.errno = exc.errno
    raise named from exc


_EMPTY = "{} is empty (0 rows); there is nothing to stream"


def refuse_empty(node: NodeInfo) -> None:
    """Raise :class:`EmptyDatasetError` for a node of no rows (described with ``allow_empty``), as a stream does."""
    if node.n_rows == 0:
        raise EmptyDatasetError(_EMPTY.format(f"{node.path!r} in {node.filename!r}"))


def _external_link(fid: Any, path: str) -> "tuple[str, str] | None":
    """``(file, path)`` that ``path`` in the open file ``fid`` names as an external link (None: not one)."""
    import h5py

    try:
        link = h5py.File(fid).get(path, getlink=True)  # the link itself, not followed
    except Exception:  # noqa: BLE001 - a path HDF5 cannot walk is not a link we can name
        return None
    return (link.filename, link.path) if isinstance(link, h5py.ExternalLink) else None


def _link_out(path: str, filename: str, target: str) -> NodeTypeError:
    return NodeTypeError(f"{path!r} in {filename!r} is an external link to {target!r}: links out of an object are "
                         f"not followed; read that file itself")


def reopen_dataset(node: NodeInfo, access: Any = None) -> Any:
    """The ``h5py.Dataset`` of an inspected one-file ``node``, opened as :func:`open_node` opens it; close with :func:`close_dataset`.

    A reader's open of a file already checked: two library calls, no chunk
    cache (``access``: the dataset access list that gives one), no checks
    (``h5py.File`` then ``f[path]`` costs ~0.15 ms more, which a set of many
    small files pays per file).
    """
    import h5py

    if node.remote is not None:
        fid = open_file_id(node.remote.open())
    else:
        try:
            fid = h5py.h5f.open(os.fsencode(node.filename), h5py.h5f.ACC_RDONLY, _file_access())
        except OSError as exc:
            raise_if_switched(exc, node.filename)
            raise_if_busy(exc, node.filename)
            raise
    try:
        if node.remote is None:
            check_opened(node.filename, fid.get_vfd_handle(), node.identity)  # the file described, not one named so now
        path = node.path.encode()
        return h5py.Dataset(h5py.h5o.open(fid, path) if access is None else h5py.h5d.open(fid, path, access))
    except BaseException:
        h5py.File(fid).close()
        raise


def close_dataset(dataset: Any) -> None:
    """Close a dataset from :func:`open_node`, and with it its file (None: nothing to close).

    :func:`open_node` keeps no file id, and HDF5 (weak close degree) closes
    a file with the last object open in it, so closing the dataset closes
    the file, unless the caller opened more objects there (it closes those
    too). h5py's ``File.close`` would first list every object open in the
    file, a cost a small file's read notices.
    """
    if dataset is not None:  # a set keeps no dataset open (``_io.fileset``)
        dataset.id.close()


@functools.lru_cache(maxsize=4)
def _file_access(locking: Any = None) -> Any:
    """The file-access list of :func:`open_node`: no chunk cache.

    HDF5's high-level open (``h5py.File``, then ``f[path]``) costs ~0.2 ms
    more than these two library calls, a tenth of reading a 1 MB file. With
    no chunk cache, h5py decodes whole chunks straight into the caller's
    buffer (1.2-1.8x faster, ``h5py_source._chunk_cache_bytes``); a reader that
    needs a cache opens the dataset again with one.
    """
    import h5py

    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    _mdc, slots, _nbytes, w0 = fapl.get_cache()
    fapl.set_cache(0, slots, 0, w0)
    if locking is not None:  # as h5py.File's locking= (its values checked by h5py's own open, in the engine's check)
        on = locking in (True, "true", "best-effort")
        fapl.set_file_locking(on, ignore_when_disabled=locking == "best-effort")
    return fapl


def _tables_dtype(filename: str, path: str) -> np.dtype:
    """The element dtype PyTables reads ``path`` with: for types h5py has no numpy type for (HDF5 time, quad precision)."""
    import tables

    with tables.open_file(filename, "r") as f:
        leaf = f.get_node(path)
        if isinstance(leaf, tables.Table):
            return np.dtype(leaf.dtype)
        atom = getattr(leaf, "atom", None)
        if atom is None or isinstance(leaf, tables.VLArray):
            raise NodeTypeError(f"{path!r} in {filename!r} is a {type(leaf).__name__}; only rows of fixed size can be read")
        return np.dtype(atom.dtype)


def _fill_may_leave_holes(dsid: Any, plist: Any) -> bool:
    """Whether HDF5 leaves parts of a read untouched: unallocated storage, and no fill value written there."""
    import h5py

    if plist.fill_value_defined() != h5py.h5d.FILL_VALUE_UNDEFINED and plist.get_fill_time() != h5py.h5d.FILL_TIME_NEVER:
        return False
    layout = plist.get_layout()
    if layout == h5py.h5d.CONTIGUOUS:
        return dsid.get_offset() is None
    if layout == h5py.h5d.CHUNKED:
        chunks = plist.get_chunk()
        expected = math.prod(-(-int(n) // int(c)) for n, c in zip(dsid.shape, chunks))
        return dsid.get_num_chunks() < expected
    return False


def _describe(filename: str, path: str, field: "str | None", ds: Any, allow_empty: bool = False, remote: bool = False,
              identity: "FileSignature | GrowingFile | None" = None) -> NodeInfo:
    import h5py

    where = f"{path!r} in {filename!r}"
    h5py_problem = None
    dsid = ds.id
    try:
        tid = dsid.get_type()  # once, for the dtype and the string pads: each HDF5 id costs ~5 us a 1 MB file notices
        dt: np.dtype = tid.dtype
    except (TypeError, ValueError) as exc:  # HDF5 time types, quad precision: PyTables maps them
        if raised_by_handler(exc):
            raise  # the user's own: NOTE [a handler's exception]
        h5py_problem = f"h5py has no numpy type for its elements ({exc})"
        if remote:
            raise NodeTypeError(f"{where} cannot be read: {h5py_problem}, and PyTables, which maps them, reads "
                                f"local files only") from None
        try:
            dt = _tables_dtype(filename, path if path.startswith("/") else "/" + path)  # PyTables' paths are absolute
        except Exception as texc:
            if raised_by_handler(texc) or isinstance(texc, NodeTypeError):
                raise
            raise NodeTypeError(f"{where} cannot be read: {h5py_problem}, and PyTables cannot open it ({texc})") from texc
    shape = dsid.shape  # asked once, of the id: ``Dataset.shape`` asks HDF5 every call (~20 us), which 1 MB files notice
    if shape is None or len(shape) == 0:
        empty = "empty: its dataspace is null (h5py.Empty)"
        raise NodeTypeError(f"{where} is {'a scalar' if shape is not None else empty}; only datasets with rows can be streamed")
    if _has_object(dt):
        if dt.kind == "O" and h5py.check_vlen_dtype(dt) is not None:  # a PyTables VLArray, an h5py vlen dataset
            if field is not None:  # described, for a transform (NOTE [variable-length rows]); refused by callers
                raise vlen_refusal(where)
        else:
            raise NodeTypeError(
                f"{where} has dtype {dt}, which is variable-length, opaque or references; only fixed-size numeric, "
                f"string and compound rows can be streamed{reference_hint(ds)}"
            )
    if (unread := matlab_empty(ds, dt, shape) or netcdf_dimension(ds, dt, shape)) is not None:
        raise NodeTypeError(f"{where} {unread}")
    n_rows = int(shape[0])
    if n_rows == 0 and not allow_empty:
        raise EmptyDatasetError(_EMPTY.format(where))
    row_shape = tuple(int(s) for s in shape[1:])
    out_dtype = dt
    if dt.subdtype is not None:  # HDF5 array elements: h5py delivers their axes after the dataset's
        out_dtype, sub = dt.subdtype
        row_shape = row_shape + tuple(sub)
    if field is not None:
        if dt.names is None:
            raise NoSuchFieldError(f"field={field!r} given, but {where} is not a table (its rows have no fields)")
        try:
            fdt = field_of(dt, field, where)[0]
        except NoSuchFieldError as exc:  # a pandas DataFrame's column: say which field holds it
            raise NoSuchFieldError(exc.args[0] + column_hint(ds.attrs, dt.names, [field])) from None
        if fdt.subdtype is not None:
            out_dtype, sub = fdt.subdtype
            row_shape = row_shape + tuple(sub)
        else:
            out_dtype = fdt
    plist = dsid.get_create_plist()
    filters = [plist.get_filter(i) for i in range(plist.get_nfilters())]
    filter_ids = tuple(int(f[0]) for f in filters)
    filter_names = tuple(f[3].decode("utf-8", "replace") if isinstance(f[3], bytes) else str(f[3]) for f in filters)
    pads = () if h5py_problem else tuple(find_string_pads(tid))
    layout = plist.get_layout()
    chunks = plist.get_chunk() if layout == h5py.h5d.CHUNKED else None
    return NodeInfo(
        filename=filename,
        path=path if path.startswith("/") else "/" + path,
        field=field,
        n_rows=n_rows,
        row_shape=row_shape,
        dtype=np.dtype(out_dtype),
        file_dtype=dt,
        chunk_rows=int(chunks[0]) if chunks else None,
        chunk_shape=tuple(int(c) for c in chunks) if chunks else None,
        filter_ids=filter_ids,
        is_table=dt.names is not None,
        filter_names=filter_names,
        string_pads=pads,
        zero_first=_fill_may_leave_holes(dsid, plist),
        h5py_problem=h5py_problem,
        virtual=layout == getattr(h5py.h5d, "VIRTUAL", None),
        external=plist.get_external_count() > 0,
        identity=identity,
    )
