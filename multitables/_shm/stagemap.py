"""Request stages: shared-memory segments that a Reader's readers read requests into.

A stage segment holds a header (request id, the rows plan of NOTE [request
plan], which node to read, one status word per share), the explicit rows
read when the plan has them, then the data: the rows read, in order.
:class:`StageMap` alone knows the header's words; see NOTE [request
protocol] in ``_procs.serve``.

NOTE [stage room]
    The room for explicit rows holds as many positions as 8-byte rows would fill the data (a column's scattered
    rows), as large as the data for most datasets, and rarely used whole. Reserved with the rest, it doubled what a
    stage took of /dev/shm (a stage of one 4 MiB row needed 8 MiB, refused in an 8 MiB /dev/shm). So only the
    header and the data are reserved and checked when the stage is made; the consumer populates the positions a
    request needs before it writes them (``Segment.populate``), once per stage up to the most asked so far, and a
    /dev/shm with no room for them is a ``ShmSpaceError`` at ``request``, never a SIGBUS. Kernels that cannot
    populate reserve it all.
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._io.setref import NodeRef, SetRef
from ..errors import StreamClosedError
from .layout import PAGE, round_up
from .segment import Segment

if TYPE_CHECKING:
    from .._io.node import NodeInfo
    from .._plan.requests import ReadRows, RowPlan


# Stage header: int64 words, then the node description from byte _DESC_AT. Only StageMap uses them.
_H_REQ, _H_EXPLICIT, _H_START, _H_STEP, _H_N_READ, _H_DESC_LEN, _H_QUERY, _H_RESULT_ROWS = range(8)
_H_STATUS = 16
#: Most shares one request is split into (one status word each).
MAX_SHARES = 64
_DESC_AT = 1024
HEADER_BYTES = 2 * PAGE
# Share status.
PENDING, DONE, FAILED = 0, 1, 2


@dataclass(frozen=True)
class StageLayout:
    """Sizes and offsets of a stage segment (bytes)."""

    max_rows: int
    data_nbytes: int

    @property
    def rows_offset(self) -> int:
        return HEADER_BYTES

    @property
    def data_offset(self) -> int:
        return HEADER_BYTES + round_up(8 * self.max_rows, PAGE)

    @property
    def nbytes(self) -> int:
        return self.data_offset + round_up(max(self.data_nbytes, 1), PAGE)

    @property
    def rows_room(self) -> "tuple[int, int]":
        """Where the row positions lie (offset, length): not reserved when the stage is made (NOTE [stage room])."""
        return self.rows_offset, self.data_offset - self.rows_offset


class StageMap:
    """One process's mapping of a stage segment."""

    def __init__(self, segment: Segment, layout: StageLayout, writable: bool) -> None:
        self.segment = segment
        self.layout = layout
        self.words: "np.ndarray | None" = np.frombuffer(segment.buf, dtype=np.int64, count=_DESC_AT // 8)
        self.rows = np.frombuffer(segment.buf, dtype=np.int64, count=layout.max_rows, offset=layout.rows_offset)
        self._writable = writable
        self._data_at = layout.data_offset  # asked twice a request: a property of properties
        self._rows_room = 0  # bytes of the row positions populated so far (the consumer's: NOTE [stage room])

    def data(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The first ``shape`` of the data area, as ``dtype``."""
        n = math.prod(shape)
        try:
            if n and dtype.itemsize:
                # An export of the mapping (np.ndarray(buffer=) holds none): closed under this array, by stop() from
                # another thread or in a `with future.get_unsafe()`, the segment keeps its bytes for it (close())
                # instead of unmapping them beneath it, a crash.
                arr = np.frombuffer(self.segment.buf, dtype, n, self._data_at).reshape(shape)
            else:  # no byte to read (frombuffer refuses a size of 0)
                arr = np.ndarray(shape, dtype, buffer=self.segment.buf, offset=self._data_at)
        except ValueError:
            if self.words is None:  # closed, maybe by another thread just now
                raise StreamClosedError("the stage is closed") from None
            raise
        if not self._writable:  # writable as its (writable) buffer is, else
            arr.flags.writeable = False
        return arr

    def _words(self) -> np.ndarray:
        """The header's words; ``StreamClosedError`` once closed (by another thread, say: stop(), a stage's close)."""
        words = self.words  # once: close() may set it to None meanwhile
        if words is None:
            raise StreamClosedError("the stage is closed")
        return words

    def write_desc(self, desc: bytes) -> None:
        self.segment.buf[_DESC_AT : _DESC_AT + len(desc)] = desc
        self._words()[_H_DESC_LEN] = len(desc)

    # -- the consumer's side of the header: the one place that knows its words ----------------
    def write_request(self, req: int, plan: "RowPlan | None", desc: bytes) -> None:
        """Set up request ``req``: its rows ``plan`` (None: a query, described in ``desc``), every share pending.
        ``ShmSpaceError`` before anything is written where /dev/shm has no room for its row positions."""
        if plan is not None and plan.rows is not None:
            self._room_for_rows(plan.n_read)
        w = self._words()
        w[_H_REQ] = req
        w[_H_QUERY] = plan is None
        w[_H_RESULT_ROWS] = 0
        if plan is not None:
            w[_H_EXPLICIT] = plan.rows is not None
            w[_H_START] = plan.start
            w[_H_STEP] = plan.step
            w[_H_N_READ] = plan.n_read
            if plan.rows is not None:
                self.rows[: plan.n_read] = plan.rows
        w[_H_STATUS : _H_STATUS + MAX_SHARES] = PENDING
        self.write_desc(desc)

    def _room_for_rows(self, n: int) -> None:
        """Allocate the pages of the first ``n`` row positions (NOTE [stage room]), once."""
        need = round_up(8 * n, PAGE)
        if need > self._rows_room:
            self.segment.populate(self.layout.rows_offset + self._rows_room, need - self._rows_room,
                                  "The stage's row positions", need=need - self._rows_room)
            self._rows_room = need

    def status(self, n_shares: int) -> list[int]:
        """The status (PENDING, DONE, FAILED) of the first ``n_shares`` shares; ``StreamClosedError`` once closed.

        A copy, and no view held in a local either: a view on the stage kept
        in a frame (of a traceback: Ctrl-C lands here often while a future's
        wait looks, NOTE [waiting awake]) would keep the mapping, and its file
        descriptor, alive.
        """
        try:
            return self.words[_H_STATUS : _H_STATUS + n_shares].tolist()  # type: ignore[index]  # None once closed: below
        except TypeError:
            if self.words is None:  # closed, maybe by another thread just now
                raise StreamClosedError("the stage is closed") from None
            raise

    @property
    def result_rows(self) -> int:
        """Rows a query's reader wrote."""
        return int(self._words()[_H_RESULT_ROWS])

    # -- the reader's side -------------------------------------------------------------------
    def read_desc(self) -> bytes:
        """The node (or query) description the consumer wrote."""
        return bytes(self.segment.buf[_DESC_AT : _DESC_AT + int(self._words()[_H_DESC_LEN])])

    @property
    def request_id(self) -> int:
        return int(self._words()[_H_REQ])

    @property
    def is_query(self) -> bool:
        return bool(self._words()[_H_QUERY])

    @property
    def n_read(self) -> int:
        """Rows the request reads (the first dimension of its data)."""
        return int(self._words()[_H_N_READ])

    def rows_of(self, a: int, b: int) -> "ReadRows":
        """The source rows of positions ``a..b`` of the request: a view of the explicit rows in the stage, else a range.

        Neither is a copy: 8 bytes a row, made afresh each request, cost the
        reader a page fault per 512 rows. The view is read only while the
        share is: the consumer writes the rows again only once every share
        of the request has a status (NOTE [request protocol]), and a view
        kept past the stage's close keeps its mapping (``Segment.close``).
        """
        w = self._words()
        if w[_H_EXPLICIT]:
            return self.rows[a:b]
        start, step = int(w[_H_START]), int(w[_H_STEP])
        return range(start + step * a, start + step * b, step)

    def set_result_rows(self, n: int) -> None:
        """A query's reader wrote ``n`` rows."""
        self._words()[_H_RESULT_ROWS] = n

    def set_status(self, share: int, status: int) -> None:
        """Share ``share`` is read (DONE) or failed (FAILED); set after its data and report. Nothing where the map was
        closed meanwhile (the stage closed in another thread, or by its finalizer at exit, under a read in this
        process): its future says the stage was closed."""
        words = self.words  # once: close() may set it to None meanwhile; the mapping stays while a view of it lives
        if words is not None:
            words[_H_STATUS + share] = status

    def close(self) -> None:
        """Unmap; arrays of its data still alive keep their bytes, moved to private memory by the segment's owner
        (NOTE [segment lifetime]), else the mapping goes with the last of them."""
        self.words = self.rows = None  # type: ignore[assignment]  # closed: unmapped (words is checked)
        self.segment.close(keep=[(self._data_at, self.layout.data_nbytes)])


#: Longest node description a stage header holds.
MAX_DESC = HEADER_BYTES - _DESC_AT


def describe(engine: str, node: NodeInfo, files: "str | tuple[str, ...]", ref: "SetRef | NodeRef | None" = None) -> bytes:
    """The bytes that tell a reader which node to read and how (written into the stage per request).

    A node of a set (``files``) goes as a :class:`~multitables._io.setref.SetRef`
    (``ref``, where the caller made it already), which the reader resolves with the Reader's files; a node too
    large for the header, as the :class:`~multitables._io.setref.NodeRef` ``ref`` its readers were handed it under.
    """
    if ref is None and node.parts and isinstance(files, tuple):
        ref = SetRef.of(node, files)
    desc = pickle.dumps((engine, ref or node), protocol=pickle.HIGHEST_PROTOCOL)
    if isinstance(ref, SetRef) and ref.grown and len(desc) > MAX_DESC:  # NOTE [growing sets] in ``_io.setref``
        raise ValueError(f"{node.filename!r} read with swmr=True is too many files to hand their rows and sizes to the "
                         f"readers ({len(desc)} bytes described, at most {MAX_DESC}): read fewer files per Reader")
    if len(desc) > MAX_DESC:
        raise ValueError(f"the file name and node path are too long to hand to the readers ({len(desc)} bytes described)")
    return desc


def describe_query(node: NodeInfo, method: str, kwargs: dict[str, Any]) -> bytes:
    """The bytes that tell a reader which PyTables call to run on which node (a query)."""
    try:
        desc = pickle.dumps((node, method, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise TypeError(
            f"the query on {node.path!r} cannot be handed to the readers, which run it in their own processes: "
            f"condvars must be plain values or arrays (not a PyTables column or another open object; name a column "
            f"of the table in the condition instead): {exc}"
        ) from exc
    if len(desc) > MAX_DESC:
        raise ValueError(
            f"the query on {node.path!r} is too large to hand to the readers ({len(desc)} bytes pickled, at most "
            f"{MAX_DESC}): pass large condvars as columns of the table instead"
        )
    return desc
