"""How a reader's failure travels to the consumer: one picklable report, one format for every reader.

See NOTE [failure reports] in ``pool``.
"""

from __future__ import annotations

import errno
import resource
import signal
import traceback
from dataclasses import dataclass

from .._shm.segment import interpreter_exiting
from ..errors import ReaderError

#: Longest traceback text a report carries (a report must fit the pipe comfortably).
MAX_TRACEBACK = 32_000


@dataclass(frozen=True)
class FailureReport:
    """A picklable report of an exception in a reader process; see NOTE [failure reports] in ``pool``.

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
    #: What the reader did, where no dataset is named: "serving" (a Reader's), or "starting to read" (before it had
    #: what it was sent).
    doing: str = "serving"

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        reader_index: int,
        pid: int,
        filename: str,
        path: str,
        rows: "tuple[int, int] | None",
        doing: str = "serving",
    ) -> "FailureReport":
        text = "".join(traceback.format_exception(exc))
        if len(text) > MAX_TRACEBACK:
            half = MAX_TRACEBACK // 2
            text = f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"
        message = str(exc) + fd_limit(exc)
        if len(message) > MAX_TRACEBACK:
            message = message[:MAX_TRACEBACK] + " [...]"
        return cls(
            exc_type_name=f"{type(exc).__module__}.{type(exc).__qualname__}",
            message=message,
            traceback=text,
            reader_index=reader_index,
            pid=pid,
            filename=filename,
            path=path,
            rows=rows,
            doing=doing,
        )

    def to_exception(self) -> ReaderError:
        """Build the exception raised in the consumer: a ReaderError that is also the original type.

        A ``reader_index`` below 0 is the consumer itself, reading without
        reader processes (a stream, or a Reader's requests, with
        ``n_procs=0``): its errors take the same form.
        """
        short_name = self.exc_type_name.rpartition(".")[2]
        where = f"rows {self.rows[0]}:{self.rows[1]} of " if self.rows else ""
        if self.reader_index >= 0:
            who = f"reader {self.reader_index} (pid {self.pid})"
            tail = f"\n\nOriginal traceback in the reader:\n{self.traceback}"
        else:  # its cause, chained, shows the traceback
            who, tail = f"this process (pid {self.pid}), which reads without reader processes,", ""
        what = f"reading {where}{self.path!r} in" if self.path or where else self.doing
        text = f"Caught {short_name} in {who} while {what} {self.filename!r}: {self.message}{tail}"
        exc = ReaderError.like(self.exc_type_name, text)
        exc.reader_index = self.reader_index
        exc.pid = self.pid
        exc.filename = self.filename
        exc.path = self.path
        exc.rows = self.rows
        exc.remote_traceback = self.traceback
        return exc


#: What holds a reader's descriptors, for :func:`fd_limit`.
_A_READER_HOLDS = "a reader holds its pipes, its shared memory and up to a few files of a set"


def fd_limit(exc: BaseException, who: str = "the process that read", holds: str = _A_READER_HOLDS,
             instead: str = "") -> str:
    """For a full fd table (EMFILE, whose words name no limit): the limit ``who`` reached, what ``holds`` its
    descriptors, and that the limit can be raised (or, with ``instead``, what else to do); "" for another error."""
    if not isinstance(exc, OSError) or exc.errno != errno.EMFILE:
        return ""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (f" [{who} reached its limit of {soft} open files: {holds}; raise the limit (`ulimit -n`, or "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ...) in Python, at most {hard} here){instead}]")


def died_error(reader_index: int, pid: int, exitcode: "int | None", filename: str, path: str) -> ReaderError:
    """The error for a reader that exited without reporting (killed, or crashed in C)."""
    how = f"exit code {exitcode}"
    if exitcode is not None and exitcode < 0:
        try:
            how += f" ({signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    what = f"reading {path!r} in {filename!r}" if path else f"of {filename!r}"
    if exitcode == 1:  # Python's own exit for an error no code of the reader's caught: before it could report
        how += (" before it could report an error: Python printed that error on this process's stderr (under spawn "
                "or forkserver, often what the reader could not unpickle or import, such as a function of __main__)")
    exc = ReaderError(f"Reader {reader_index} (pid {pid}) {what} died unexpectedly with {how}." if not interpreter_exiting()
                      else f"Reader {reader_index} (pid {pid}) {what} ended with {how}: the interpreter is exiting, and its "
                           f"exit handlers end every reader (a daemon thread that still uses them sees this).")
    exc.reader_index = reader_index
    exc.pid = pid
    exc.filename = filename
    exc.path = path
    exc.exitcode = exitcode
    return exc
