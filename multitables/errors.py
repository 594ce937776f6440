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


class NodeTypeError(MultitablesError, TypeError):
    """The node is not something that can be streamed (a Group, a VLArray...)."""


class StreamClosedError(MultitablesError, RuntimeError):
    """The queue or reader was used after ``close()``."""


class ShmSpaceError(MultitablesError, MemoryError):
    """The ring does not fit in the free space of the shared-memory filesystem."""


class ReaderError(MultitablesError):
    """A reader process failed or died; carries where and why.

    Attributes
    ----------
    reader_index, pid : int
        Which reader failed.
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
    path: str = ""
    rows: "tuple[int, int] | None" = None
    exitcode: "int | None" = None
    remote_traceback: str = ""


@dataclass(frozen=True)
class _ReaderFailure:
    """A picklable report of an exception in a reader process.

    Traceback objects do not pickle, so the traceback travels as a string and
    the consumer rebuilds an exception of the same type around it.
    """

    exc_type: type
    message: str
    traceback: str
    reader_index: int
    pid: int
    path: str
    rows: "tuple[int, int] | None"

    @classmethod
    def from_exception(
        cls, exc: BaseException, reader_index: int, pid: int, path: str, rows: "tuple[int, int] | None"
    ) -> "_ReaderFailure":
        exc_type = type(exc)
        try:  # a type defined in the reader's __main__ may not unpickle at home
            import pickle

            pickle.loads(pickle.dumps(exc_type))
        except Exception:
            exc_type = RuntimeError
        return cls(
            exc_type=exc_type,
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
            reader_index=reader_index,
            pid=pid,
            path=path,
            rows=rows,
        )

    def to_exception(self) -> ReaderError:
        """Build the exception raised in the consumer: a ReaderError that is also the original type."""
        where = f"rows {self.rows[0]}:{self.rows[1]} of " if self.rows else ""
        text = (
            f"Caught {self.exc_type.__name__} in reader {self.reader_index} (pid {self.pid}) "
            f"while reading {where}{self.path!r}: {self.message}\n\n"
            f"Original traceback in the reader:\n{self.traceback}"
        )
        exc: ReaderError
        try:
            if self.exc_type is ReaderError or issubclass(self.exc_type, ReaderError):
                raise TypeError
            kind = type(f"Reader{self.exc_type.__name__}", (ReaderError, self.exc_type), {})
            exc = kind(text)
            # KeyError's str() quotes its argument; keep the text readable.
            if isinstance(exc, KeyError):
                kind.__str__ = lambda self: str(self.args[0])  # type: ignore[method-assign]
        except Exception:
            exc = ReaderError(text)
        exc.reader_index = self.reader_index
        exc.pid = self.pid
        exc.path = self.path
        exc.rows = self.rows
        exc.remote_traceback = self.traceback
        return exc


def _reader_died(reader_index: int, pid: int, exitcode: "int | None", path: str) -> ReaderError:
    """The error for a reader that exited without reporting (killed, or crashed in C)."""
    import signal

    how = f"exit code {exitcode}"
    if exitcode is not None and exitcode < 0:
        try:
            how += f" ({signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    exc = ReaderError(f"Reader {reader_index} (pid {pid}) streaming {path!r} died unexpectedly with {how}.")
    exc.reader_index = reader_index
    exc.pid = pid
    exc.path = path
    exc.exitcode = exitcode
    return exc
