"""Errors and the end-of-stream sentinel.

Library errors subclass both :class:`MultitablesError` and the builtin a user
would already catch (``KeyError``, ``ValueError``, ...), so existing
``except`` clauses keep working.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

__all__ = [
    "QueueClosed",
    "MultitablesError",
    "NotHDF5Error",
    "NodeTypeError",
    "ReaderError",
    "StreamClosedError",
    "ShmSpaceError",
    "SharedMemoryError",
    "FileChangedError",
    "SubprocessException",
    "QueueClosedException",
]


class _QueueClosedType:
    """Type of the :data:`QueueClosed` singleton."""

    _instance: "_QueueClosedType | None" = None

    def __new__(cls) -> "_QueueClosedType":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self) -> tuple[Any, ...]:
        return (_QueueClosedType, ())

    def __copy__(self) -> "_QueueClosedType":
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> "_QueueClosedType":
        return self

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "multitables.QueueClosed"


#: Returned by ``Queue.get()`` once the pass is over (compare with ``is``).
QueueClosed = _QueueClosedType()


class MultitablesError(Exception):
    """Base class of every error this library raises itself."""


class NotHDF5Error(MultitablesError, ValueError):
    """The file exists but is not an HDF5 file."""


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


class ShmSpaceError(MultitablesError, MemoryError):
    """The ring does not fit in the free space of the shared-memory filesystem."""


class SharedMemoryError(MultitablesError, ValueError):
    """A request's result does not fit in the stage it was given (the established API's name).

    Raised by :meth:`Reader.request` before any worker is involved where the
    size is known up front; for a query whose size only the read tells
    (``Dataset.where``), by the future's ``get``, as a :class:`ReaderError`
    that is also a ``SharedMemoryError``.
    """


class FileChangedError(MultitablesError, OSError):
    """The file was modified, truncated, replaced or deleted while it was being streamed.

    Blocks read after the change could hold another file's bytes, so the
    stream stops instead (see NOTE [file identity] in ``_node``).
    """


class ReaderError(MultitablesError):
    """A reader process failed or died; carries where and why.

    When the reader raised an exception, the error raised in the consumer is
    also an instance of that exception's type (a ``ReaderOSError`` is a
    ``ReaderError`` and an ``OSError``), so ``except OSError`` still catches
    an I/O error that happened in a reader.

    Attributes
    ----------
    reader_index, pid : int
        Which reader failed.
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

    ``SubprocessException``, the established (2.x) name for an error carried
    home from a subprocess, is this class.
    """

    reader_index: int = -1
    pid: int = -1
    filename: str = ""
    path: str = ""
    rows: "tuple[int, int] | None" = None
    exitcode: "int | None" = None
    remote_traceback: str = ""

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


#: Longest traceback text a report carries (a report must fit the pipe comfortably).
_MAX_TRACEBACK = 32_000


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
            namespace: dict[str, Any] = {"__module__": __name__}
            if issubclass(exc_type, KeyError):  # KeyError's str() quotes its argument; keep the text readable
                namespace["__str__"] = lambda self: str(self.args[0]) if self.args else ""
            kind = type(f"Reader{exc_type.__name__}", (ReaderError, exc_type), namespace)
        except TypeError:  # e.g. a layout conflict between the two bases
            return None
        _READER_TYPES[exc_type] = kind
    return kind


@dataclass(frozen=True)
class _ReaderFailure:
    """A picklable report of an exception in a reader process; see NOTE [failure reports] in ``_readers``.

    Traceback objects do not pickle, and an exception's class may not
    unpickle in the consumer, so only strings travel: the class by name, the
    message, the formatted traceback. The consumer rebuilds an exception of
    the same type around them.
    """

    exc_type_name: str
    message: str
    traceback: str
    reader_index: int
    pid: int
    filename: str
    path: str
    rows: "tuple[int, int] | None"

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        reader_index: int,
        pid: int,
        filename: str,
        path: str,
        rows: "tuple[int, int] | None",
    ) -> "_ReaderFailure":
        text = "".join(traceback.format_exception(exc))
        if len(text) > _MAX_TRACEBACK:
            half = _MAX_TRACEBACK // 2
            text = f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"
        message = str(exc)
        if len(message) > _MAX_TRACEBACK:
            message = message[:_MAX_TRACEBACK] + " [...]"
        return cls(
            exc_type_name=_type_name(type(exc)),
            message=message,
            traceback=text,
            reader_index=reader_index,
            pid=pid,
            filename=filename,
            path=path,
            rows=rows,
        )

    def to_exception(self) -> ReaderError:
        """Build the exception raised in the consumer: a ReaderError that is also the original type."""
        short_name = self.exc_type_name.rpartition(".")[2]
        where = f"rows {self.rows[0]}:{self.rows[1]} of " if self.rows else ""
        text = (
            f"Caught {short_name} in reader {self.reader_index} (pid {self.pid}) "
            f"while reading {where}{self.path!r} in {self.filename!r}: {self.message}\n\n"
            f"Original traceback in the reader:\n{self.traceback}"
        )
        exc_type = _resolve_type(self.exc_type_name)
        kind = _reader_type(exc_type) if exc_type is not None else None
        exc: ReaderError
        try:
            exc = kind(text) if kind is not None else ReaderError(text)
        except Exception:  # a constructor that wants other arguments
            exc = ReaderError(text)
        exc.reader_index = self.reader_index
        exc.pid = self.pid
        exc.filename = self.filename
        exc.path = self.path
        exc.rows = self.rows
        exc.remote_traceback = self.traceback
        return exc


def _reader_died(reader_index: int, pid: int, exitcode: "int | None", filename: str, path: str) -> ReaderError:
    """The error for a reader that exited without reporting (killed, or crashed in C)."""
    import signal

    how = f"exit code {exitcode}"
    if exitcode is not None and exitcode < 0:
        try:
            how += f" ({signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    exc = ReaderError(
        f"Reader {reader_index} (pid {pid}) streaming {path!r} in {filename!r} died unexpectedly with {how}."
    )
    exc.reader_index = reader_index
    exc.pid = pid
    exc.filename = filename
    exc.path = path
    exc.exitcode = exitcode
    return exc
