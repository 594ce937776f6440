"""An object opened by HDF5 (through h5py): a file object over its bytes, for what HDF5 itself reads.

HDF5 reads a file's metadata (node inspection, the storage layout) and, for
the datasets the chunk engine leaves to h5py, their chunks. On an object it
reads them through :class:`~multitables._io.objects.fileobj.RangeFile`, whose
first bytes were fetched when the object was looked at, and whose small reads
go through a block cache: a few requests for the metadata. PyTables cannot
read a file object, so it reads local files only.

What the HDF5 side (node inspection, file sets, the h5py engine) calls for an
object, imported at their top: the object client comes in with the first
call (NOTE [objects on demand] in ``_io.objects``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import NotHDF5Error
from .config import Store
from .identity import ObjectIdentity

if TYPE_CHECKING:
    from .fileobj import RangeFile
    from .reader import ObjectReader, RemoteObject

#: HDF5's signature, at byte 0 of a file or after a user block of 512, 1024, 2048... bytes.
SIGNATURE = b"\x89HDF\r\n\x1a\n"


def check_hdf5(reader: ObjectReader) -> None:
    """Raise :class:`~multitables.errors.NotHDF5Error` unless the object ``reader`` reads starts as an HDF5 file does
    (its first bytes, fetched already when it was looked at)."""
    at = 0
    while at + 8 <= reader.size:
        if bytes(reader.read(at, 8)) == SIGNATURE:
            return
        at = 512 if at == 0 else 2 * at
    raise NotHDF5Error(f"{reader.shown!r} is not an HDF5 file")


def checked_identity(url: str, store: Store) -> ObjectIdentity:
    """The identity of the object at ``url`` (looked at with one request) once its first bytes show an HDF5 file;
    else :class:`~multitables.errors.NotHDF5Error`."""
    from .reader import ObjectReader

    with ObjectReader(url, store) as reader:
        check_hdf5(reader)
        return reader.identity


def open_file_id(reader: ObjectReader, check: bool = False) -> Any:
    """HDF5's file id of the object ``reader`` reads, opened read-only through a file object, with no chunk cache
    (as ``_io.node.open_node`` opens local files); ``check``: refuse what is not HDF5 first. The file id owns
    ``reader`` (closed with it)."""
    import h5py

    from .fileobj import RangeFile

    fileobj = RangeFile(reader)
    try:
        if check:
            check_hdf5(reader)
        fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
        _mdc, slots, _nbytes, w0 = fapl.get_cache()
        fapl.set_cache(0, slots, 0, w0)
        fapl.set_fileobj_driver(h5py.h5fd.fileobj_driver, fileobj)
        return h5py.h5f.open(repr(fileobj).encode("ascii", "replace"), h5py.h5f.ACC_RDONLY, fapl)
    except BaseException:
        fileobj.close()
        raise


def file_object(remote: RemoteObject) -> RangeFile:
    """A file object over the object ``remote``, for ``h5py.File``; closing it closes its reader."""
    from .fileobj import RangeFile

    return RangeFile(remote.open())


def check_options(remote: RemoteObject, open_kwargs: "dict[str, Any]") -> None:
    """Raise, naming the object, where h5py would refuse the open options ``open_kwargs`` for it or ignore them:
    through a file object (how an object is read) h5py hands keywords it does not name to no driver, so a typo, or
    PyTables' ``DRIVER=``, would change nothing and say nothing; ``swmr=True`` fails on this driver."""
    import inspect

    import h5py

    known = set(inspect.signature(h5py.File).parameters) - {"name", "mode", "kwds"}
    unknown = sorted(k for k in open_kwargs if k not in known)
    if unknown:
        raise TypeError(f"h5py takes no open options {unknown} for {remote.shown!r}: an object is read through a "
                        f"file object, and h5py would ignore them there (its options: {', '.join(sorted(known))})")
    fileobj = file_object(remote)
    try:
        h5py.File(fileobj, "r", **open_kwargs).close()
    except (OSError, ValueError, TypeError) as exc:
        kind = OSError if isinstance(exc, OSError) else ValueError if isinstance(exc, ValueError) else TypeError
        raise kind(f"h5py refuses the open options {sorted(open_kwargs)} for {remote.shown!r}, read through a file "
                   f"object: {exc}") from exc
    finally:
        fileobj.close()
