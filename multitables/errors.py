"""Errors and the end-of-stream sentinel.

Library errors subclass both :class:`MultitablesError` and the builtin a user
would already catch (``KeyError``, ``ValueError``, ...), so existing
``except`` clauses keep working.
"""

from __future__ import annotations

import copyreg
import enum
import functools
from typing import Any, Final

__all__ = [
    "QueueClosed",
    "MultitablesError",
    "NotHDF5Error",
    "NoSuchNodeError",
    "NoSuchFieldError",
    "NodeTypeError",
    "EmptyDatasetError",
    "MissingFilterError",
    "ReaderError",
    "StreamClosedError",
    "ReleasedResourceError",
    "ShmSpaceError",
    "SharedMemoryError",
    "FileChangedError",
    "FileBusyError",
    "ObjectStorageError",
    "SubprocessException",
    "QueueClosedException",
]


class QueueClosedType(enum.Enum):
    """Type of the :data:`QueueClosed` singleton (2.x's ``multitables.signals.QueueClosedType``).

    An enum of one member, so that a type checker narrows ``guard is QueueClosed`` (``Queue.get()`` is typed
    ``Guard | Literal[QueueClosedType.QueueClosed]``) and a pickle or copy is the same object.
    """

    QueueClosed = "QueueClosed"

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "multitables.QueueClosed"

    __str__ = __repr__


#: Returned by ``Queue.get()`` once the pass is over (compare with ``is``).
QueueClosed: Final = QueueClosedType.QueueClosed


class _ErrorClass(type):
    """The class of our error classes: one made at run time (a ``Reader<Name>``, PyTables' ``NoSuchNodeError``) pickles
    as the call that makes it again. A DataLoader's worker pickles the *class* of the error it sends home (PyTorch's
    ``ExceptionWrapper``), and one that does not pickle is lost there: the main process waits for ever."""


#: The classes made at run time, each with the call that makes it (for pickle).
_MADE: "dict[type, tuple[Any, tuple[Any, ...]]]" = {}


def _pickle_class(cls: type) -> Any:
    return _MADE.get(cls, cls.__qualname__)  # a str: by name, as pickle takes any class


copyreg.pickle(_ErrorClass, _pickle_class)


class MultitablesError(Exception, metaclass=_ErrorClass):
    """Base class of every error this library raises itself."""


class NotHDF5Error(MultitablesError, ValueError):
    """The file exists but is not an HDF5 file."""


class NoSuchNodeError(MultitablesError, KeyError):
    """No node at that path in the file (the file exists and is HDF5).

    Raised as an instance of PyTables' ``tables.NoSuchNodeError`` too (an
    ``AttributeError`` and ``LookupError``): what the established (2.x) API
    raised for it.
    """

    def __reduce__(self) -> Any:
        return no_such_node, self.args


@functools.lru_cache(maxsize=None)
def _as_pytables() -> type:
    # Made at the first missing node: importing PyTables costs a tenth of a second, which `import multitables` spares.
    try:
        import tables
    except ImportError:  # pragma: no cover - PyTables is a dependency
        return NoSuchNodeError
    kind = type("NoSuchNodeError", (NoSuchNodeError, tables.NoSuchNodeError), {"__module__": __name__})
    _MADE[kind] = (_as_pytables, ())
    return kind


def no_such_node(message: str) -> NoSuchNodeError:
    """A :class:`NoSuchNodeError` that PyTables' ``except tables.NoSuchNodeError`` catches too."""
    return _as_pytables()(message)


class NoSuchFieldError(MultitablesError, KeyError, ValueError, IndexError, NameError):
    """No column of that name (``field=``, ``fields=``, a request's column), or a column asked of rows without any.

    A ``KeyError``, as every missing name in this library; also what the
    established (2.x) API raised for it, so its ``except`` clauses still
    hold: a stream's ``ValueError`` (numpy's, for a missing column of a
    table) or ``IndexError`` (a column of an array), a request's ``NameError``.
    """


class NodeTypeError(MultitablesError, TypeError, RuntimeError):
    """The node is not something that can be streamed (a Group, a VLArray...).

    Also a ``RuntimeError``: what the established (2.x) API raised for it.
    """


class EmptyDatasetError(MultitablesError, ValueError, RuntimeError):
    """The dataset has no rows: there is nothing to stream or request.

    Also a ``RuntimeError``: what the established (2.x) API raised for it.
    """


class MissingFilterError(MultitablesError, OSError):
    """No engine here can decode a filter the dataset was written with.

    Raised before any reader starts. The message names the filter (name and
    HDF5 id), the dataset, and what would provide it.

    Attributes
    ----------
    filter_ids : tuple of int
        The filters no engine can decode.
    """

    filter_ids: "tuple[int, ...]" = ()


class StreamClosedError(MultitablesError, RuntimeError):
    """The queue or reader was used after ``close()``, or a request was pending when its Reader stopped."""


#: The established (2.x) name of :class:`StreamClosedError`.
QueueClosedException = StreamClosedError


class ReleasedResourceError(StreamClosedError):
    """Data lent by ``future.get_proxy()`` was used after its ``with`` ended (2.x's name, in
    ``multitables.resource_wrapper`` too)."""


class ShmSpaceError(MultitablesError, MemoryError):
    """The ring does not fit in the free space of the shared-memory filesystem."""


class SharedMemoryError(MultitablesError, ValueError):
    """A request's result does not fit in the stage it was given (the established API's name).

    Raised by :meth:`Reader.request` before any reader is involved where the
    size is known up front; for a query whose size only the read tells
    (``Dataset.where``), by the future's ``get``, as a :class:`ReaderError`
    that is also a ``SharedMemoryError``.
    """


class FileChangedError(MultitablesError, OSError):
    """The file was modified, truncated, replaced or deleted while it was being streamed (or since a Reader was made).

    Blocks read after the change could hold another file's bytes, so the
    stream stops (a Reader's requests fail) instead; a file read with
    ``swmr=True`` may grow (see NOTE [file identity] in ``_io.files``).
    """


class FileBusyError(MultitablesError, BlockingIOError):
    """The file is open for writing: by this process (an ``h5py.File`` or PyTables file not in mode ``"r"``) or by
    another program (HDF5's file lock, or the mark a writer leaves in the file).

    A file written while it is read gives no whole version of its rows, and
    a writable open in this process is shared with every other open of the
    file here, reader processes forked from it included (NOTE [files written
    here] in ``_io.handles``). The message says how to read it: close the
    writer, or read a SWMR writer's file with ``swmr=True``.
    """


class ObjectStorageError(MultitablesError, OSError):
    """An object store or HTTP server refused a read, or failed it past the retries; the message names the URL and
    the byte range (never a credential).

    A missing object is also a ``FileNotFoundError``, a refusal of the
    credentials also a ``PermissionError``; a connection that failed past the
    retries (refused, reset, a name that does not resolve) also a
    ``ConnectionError``, one that timed out also a ``TimeoutError``.
    """


class ReaderError(MultitablesError):
    """A reader process failed or died; carries where and why.

    When the reader raised an exception, the error raised in the consumer is
    also an instance of that exception's type (a ``ReaderOSError`` is a
    ``ReaderError`` and an ``OSError``), so ``except OSError`` still catches
    an I/O error that happened in a reader. ``SubprocessException``, the
    established (2.x) name for an error carried home from a subprocess, is
    this class.

    Attributes
    ----------
    reader_index : int
        Which reader failed, by its place among the readers.
    pid : int
        Its process id.
    filename : str
        The file it was reading.
    path : str
        The dataset it was reading.
    rows : tuple of int or None
        The ``(start, stop)`` row range it was reading, if any.
    exitcode : int or None
        The process exit code, when the reader died without reporting.
    remote_traceback : str
        The reader's formatted traceback (empty when it died by a signal).
    """

    reader_index: int = -1
    pid: int = -1
    filename: str = ""
    path: str = ""
    rows: "tuple[int, int] | None" = None
    exitcode: "int | None" = None
    remote_traceback: str = ""

    @classmethod
    def like(cls, type_name: str, message: str) -> "ReaderError":
        """A ReaderError that is also the exception class named ``type_name`` (``module.qualname``).

        A plain ReaderError where that class cannot be found in this process
        or cannot be combined with ReaderError. Used to carry a reader's
        exception home (``_procs.failure``).
        """
        exc_type = _resolve_type(type_name)
        kind = _reader_type(exc_type) if exc_type is not None else None
        try:
            return kind(message) if kind is not None else cls(message)
        except Exception:  # a constructor that wants other arguments
            return cls(message)

    def __reduce__(self) -> tuple[Any, ...]:
        # The Reader<Name> classes are made at run time; pickle by the original type's name.
        original = next((b for b in type(self).__bases__ if b is not ReaderError), None)
        name = _type_name(original) if original is not None and type(self) is not ReaderError else ""
        return (_rebuild_reader_error, (name, self.args, dict(self.__dict__)))


#: The established (2.x) name of :class:`ReaderError`.
SubprocessException = ReaderError


def _rebuild_reader_error(original: str, args: tuple[Any, ...], attrs: dict[str, Any]) -> "ReaderError":
    exc_type = _resolve_type(original) if original else None
    kind = _reader_type(exc_type) if exc_type is not None else None
    try:
        exc = (kind or ReaderError)(*args)
    except Exception:
        exc = ReaderError(*args)
    exc.__dict__.update(attrs)
    return exc


def _type_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def _resolve_type(name: str) -> "type | None":
    """The exception class named ``module.qualname`` in this process, or None."""
    import importlib

    module_name, _, qualname = name.rpartition(".")
    while module_name:
        try:
            obj: Any = importlib.import_module(module_name)
        except Exception:
            module_name, _, head = module_name.rpartition(".")
            qualname = f"{head}.{qualname}"
            continue
        try:
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            return None
        return obj if isinstance(obj, type) and issubclass(obj, BaseException) else None
    return None


#: ``Reader<Name>`` classes made so far, one per original type.
_READER_TYPES: dict[type, type] = {}


def _reader_type(exc_type: type) -> "type | None":
    """A class that is both a ReaderError and ``exc_type`` (None where no such class can exist)."""
    if issubclass(exc_type, ReaderError) or not issubclass(exc_type, Exception):
        return None
    kind = _READER_TYPES.get(exc_type)
    if kind is None:
        try:
            # str() is the message made for it, which quotes the original's str() already: not the original type's
            # own __str__ (KeyError's quotes its argument; PyTables' HDF5ExtError puts the HDF5 error stack of the
            # process that makes it first, which read in this process is the original's own again, the context
            # then buried in the middle, and in the consumer a stale stack of an unrelated error, if any).
            namespace: dict[str, Any] = {"__module__": __name__, "__str__": BaseException.__str__}
            kind = type(f"Reader{exc_type.__name__}", (ReaderError, exc_type), namespace)
        except TypeError:  # e.g. a layout conflict between the two bases
            return None
        _READER_TYPES[exc_type] = kind
        _MADE[kind] = (_reader_class, (_type_name(exc_type),))
    return kind


def _reader_class(original: str) -> type:
    """The ``Reader<Name>`` class of the exception class named ``original``, made here (unpickled); ReaderError where
    there is none."""
    exc_type = _resolve_type(original)
    return (_reader_type(exc_type) if exc_type is not None else None) or ReaderError
