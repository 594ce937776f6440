"""One block of a stream into a caller's buffer: the one loop both the consumer and a reader process run.

NOTE [transforms]
    A training loop's per-sample work (augmentation, decoding bytes stored
    per row) can run where the rows are read: ``get_batches(transform=)``
    gives a function of a block's rows to the readers, which read each block
    into a private buffer, call the function, and write its result into the
    slot, so it runs in parallel as decoding does, without a second pool of
    processes. Its output (dtype, rows' shape) is learnt once, in the
    consumer, by calling it on the first rows before any reader starts
    (:meth:`Transform.infer`); the slots are laid out for it, and a later
    call that gives anything else fails with the function's traceback, as
    any error in a reader does. Rows reach it block by block, in file order,
    before any shuffling; it must map each row on its own. That first call,
    on the first 2 rows, is timed; where the readers can turn on its price
    (not with ``n_procs`` given for one dataset, nor where fewer than two
    readers could work at once, as on a dataset's one chunk read as one
    block, nor where the read alone pays for readers:
    ``_plan.readers.transform_stake``) it is called on a copy of more of
    the first rows, about 20 ms of them by the first call's time a row, no
    more than show readers pay, and a line through
    the two gives its time a call (a sleep, a lock, its own overhead) and a
    row; a short larger call is timed twice, and a cheap first call or one
    no cheaper than the larger (an import or a JIT that no reader's call
    pays) once more, warm, the lesser standing: one call (an ``n_procs``
    given), two (a costly transform), at most six (a cheap one), always on
    copies of the first rows (``_train.transforms.price``). The plan prices
    its work at a call a block and a row a row (NOTE [read plan] in
    ``_plan.readers``). Rows of different
    sizes (h5py vlen, PyTables VLArray) reach it as an object array, one
    ndarray or bytes a row: NOTE [variable-length rows] in ``_io.vlen``.

NOTE [prefetch]
    A reader alternates between waiting for the disk and decoding; alone, it
    leaves the disk idle while it decodes and the CPU idle while it waits.
    Readers claim blocks in order from one counter, so with n readers the
    block a reader will claim next is about k + n when it has just claimed
    k. Before reading block k it asks the source to start fetching block
    k + n (``Source.prefetch``: ``POSIX_FADV_WILLNEED`` on the chunks' byte
    ranges, which queues the reads and returns). The page cache is shared,
    so it does not matter which reader ends up claiming that block. A
    reader's first block (k < n) hints blocks k to k + n, so that the first
    blocks too reach the disk in file order (:func:`~multitables._plan.blocks.ahead`).
    One reader (or the consumer) reads in file order, which the kernel's own
    read-ahead follows: it hints only where it decodes, so that the disk
    reads the next block meanwhile, and stored bytes not at all (a hint is
    a system call per run of chunks, and the h5py engine learns the chunk
    index to make it: it cost more than the read of an uncompressed block;
    :func:`~multitables._plan.readers.hint_distance`).
    With ``O_DIRECT`` there is no cache to warm, and bytes already cached
    are not hinted (NOTE [hints on cached bytes] in ``_io.chunks.pread``).
    Measured on a cold 1 GiB zlib-3 file (PyTables chunks of 512 KiB, 4 MiB
    blocks), two readers, 8 interleaved passes each: median 705 MB/s
    without, 1,125 MB/s with (every pass with it faster than every pass
    without); hinting further ahead (k+1..k+3, k+2..k+4) did no better. The
    gain depends on the device: later runs, once this VM's host had cached
    the disk image, and runs under a blkio bandwidth limit (420 and 840
    MiB/s, where the kernel's own 8 MiB readahead already keeps the disk
    busy) showed no difference either way (within the +-10% noise), and
    a warm file no cost beyond that noise.
    Those runs predate the benchmark's memory settling (NOTE [free page
    reporting] in ``multitables_bench/cache.py``); with it, ``benchmarks/profile_readers.py
    pattern`` puts two processes reading alternate blocks within this VM's
    noise of each other with and without the hint. It stays where several
    readers take turns: it is what keeps a device busy that does not read
    ahead for a strided pattern.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .._plan.blocks import BlockPlan, GrowingPlan, RangePlan, ahead
from .._plan.readers import hint_distance
from .._sys.signals import raised_by_handler
from .engines import Source
from .node import NodeInfo
from .vlen import row_payload


def read_block(
    source: Source,
    plan: "BlockPlan | RangePlan | GrowingPlan",
    k: int,
    out: np.ndarray,
    hints: int,
    pacer: "Pacer | None" = None,
    before_read: "Callable[[int, int], None] | None" = None,
    transform: "Transform | None" = None,
    scratch: "np.ndarray | None" = None,
    cut: int = 0,
) -> np.ndarray:
    """Read block ``k`` of ``plan`` into ``out`` (the caller's slot); return the rows of it that the block fills.

    With a ``transform``, the rows are read into ``scratch`` (a block of the
    node's rows) and the transform's result goes into ``out``.
    First hints the blocks ``ahead`` names, ``hints`` blocks on, to the source (NOTE [prefetch]),
    and has it fetch what this block needs where that pays (an object's
    bytes: ``Source.fetch``).
    With a ``pacer`` the pieces are cut into timed reads (NOTE [orphans]);
    ``before_read(a, b)`` runs before each read of source rows ``a..b``
    (to note them for a failure report, or to raise and stop). ``cut``: the
    rows of the caller's blocks where a block read holds several (NOTE [read
    plan]): a read that fails is read again one of them at a time, so that
    its error names the caller's block that fails, as it would have.
    """
    target = out if transform is None else scratch
    assert target is not None, "a transform needs a scratch buffer"
    for piece in ahead(plan, k, hints):
        source.prefetch(piece.start, piece.stop)
    try:
        source.fetch([(piece.start, piece.stop) for piece in plan.pieces(k)])
    except Exception:  # an object's bytes not got: name the block (the first caller's block of a read of several)
        first = next(iter(plan.pieces(k)), None)
        if before_read is not None and first is not None:
            before_read(first.start, min(first.stop, first.start + cut) if cut else first.stop)
        raise
    for piece in plan.pieces(k):
        spans = pacer.split(piece.start, piece.stop) if pacer is not None else ((piece.start, piece.stop),)
        for a, b in spans:
            if before_read is not None:
                before_read(a, b)
            dst = piece.dst + a - piece.start
            t = time.perf_counter()
            try:
                source.read_into(a, b, target[dst : dst + b - a])
            except Exception as exc:
                if not cut or b - a <= cut or raised_by_handler(exc):  # NOTE [a handler's exception]: not read again
                    raise
                _read_cut(source, a, b, target, dst, cut, piece.start, before_read)  # raises where it fails
            if pacer is not None:
                pacer.took(b - a, time.perf_counter() - t)
    n = plan.rows(k)
    if transform is not None:
        if before_read is not None and n:
            first = plan.pieces(k)[0]
            before_read(first.start, first.stop)  # its failure names the block it was given, not the last read's rows
        transform.apply(target[:n], out[:n])
    return out[:n]


def _read_cut(source: Source, a: int, b: int, slot: np.ndarray, at: int, cut: int, first: int,
              before_read: "Callable[[int, int], None] | None") -> None:
    """Rows ``a..b`` into ``slot`` (from its row ``at`` on) again, one read for each of the caller's blocks of ``cut``
    rows they meet, from the start of the first (a timed read may begin inside one; not before ``first``, where the
    piece of source rows begins); the read that fails raises, its rows noted by ``before_read`` first."""
    back = min(at % cut, a - first)
    a, at = a - back, at - back
    while a < b:
        stop = min(b, a + cut - at % cut)
        if before_read is not None:
            before_read(a, stop)
        source.read_into(a, stop, slot[at : at + stop - a])
        at, a = at + stop - a, stop


class BlockReader:
    """Blocks of one plan read through one source into callers' buffers; a transform's scratch buffer is its own.

    The consumer (a queue read in this process) and every reader process
    read with one of these, so a block is read the same way wherever it is.
    """

    def __init__(
        self,
        source: Source,
        plan: "BlockPlan | RangePlan | GrowingPlan",
        node: NodeInfo,
        n_readers: int,
        transform: "Transform | None" = None,
        pacer: "Pacer | None" = None,
        cut: int = 0,
    ) -> None:
        self.source, self.plan, self._node, self._cut = source, plan, node, cut
        self._hints = hint_distance(n_readers, node.filter_ids)  # NOTE [read plan]
        self._transform, self._pacer = transform, pacer
        self._scratch: "np.ndarray | None" = None  # the rows as read, for a transform; made at its first block

    def named(self, k: int) -> "tuple[int, int] | None":
        """The source rows an error about block ``k`` as a whole names (its file changed under the read): the caller's
        first block of it, where it holds several (NOTE [read plan]); else its first piece of rows. None: no rows."""
        piece = next(iter(self.plan.pieces(k)), None)
        if piece is None:
            return None
        return piece.start, piece.stop if not self._cut else min(piece.stop, piece.start + self._cut)

    def whole_before(self, k: int, row: int) -> int:
        """Rows of block ``k`` (from its first) before source row ``row`` that make whole caller's blocks, where it
        holds several (NOTE [read plan]; else 0): after a read that failed at ``row``, those were read whole."""
        if not self._cut:
            return 0
        for piece in self.plan.pieces(k):
            if piece.start <= row < piece.stop:
                return (piece.dst + row - piece.start) // self._cut * self._cut
        return 0

    def read(self, k: int, out: np.ndarray, before_read: "Callable[[int, int], None] | None" = None) -> np.ndarray:
        """Block ``k`` into ``out`` (see :func:`read_block`); return the rows of ``out`` it fills."""
        if self._transform is not None and self._scratch is None:
            self._scratch = np.empty((self.plan.block_size,) + self._node.row_shape, self._node.dtype)
        return read_block(
            self.source, self.plan, k, out, self._hints, self._pacer, before_read, self._transform, self._scratch, self._cut
        )


def delivered(node: NodeInfo, transform: "Transform | None") -> "tuple[np.dtype, tuple[int, ...]]":
    """The dtype and row shape of the rows delivered from ``node``: the transform's output, with one."""
    return (node.dtype, node.row_shape) if transform is None else (transform.dtype, transform.row_shape)


class Pacer:
    """Cuts a read into whole chunks of about ``budget`` seconds of work, so a reader notices its consumer died.

    NOTE [orphans]: a reader whose consumer was SIGKILLed must stop within
    about a second (nobody else would stop it). Between blocks is too
    seldom where one block takes seconds to decode (16 MiB of bzip2: 1.5 to
    8.4 s), and a parent check inside an engine's C call is impossible. So
    a reader reads a block in pieces sized from the rate it has measured,
    whole chunks (the unit a codec decodes), and checks between them; the
    first piece is one chunk, to time. A fast codec takes milliseconds a
    block: after that first chunk it is read in one piece, as before.
    """

    def __init__(self, chunk_rows: "int | None", budget: float) -> None:
        self._unit = max(1, chunk_rows or 1)
        self._budget = budget
        self._rows_per_piece = self._unit  # one chunk, until a read is timed

    def split(self, start: int, stop: int) -> "Iterator[tuple[int, int]]":
        """Rows ``start..stop`` as consecutive ``(a, b)`` pieces; call :meth:`took` after reading each."""
        a = start
        while a < stop:
            n = self._rows_per_piece
            # Cut at multiples of n: chunk boundaries, since n is a multiple of the chunk rows.
            b = stop if n >= stop - a else min(stop, (a // n + 1) * n)
            yield a, b
            a = b

    def took(self, rows: int, seconds: float) -> None:
        if rows <= 0 or seconds <= 0:
            return
        per_row = seconds / rows
        self._rows_per_piece = max(self._unit, int(self._budget / per_row) // self._unit * self._unit)


@dataclass(frozen=True)
class Transform:
    """A function of a block's rows run where the block is read (NOTE [transforms]), and what it gives.

    ``function(rows) -> array``: ``rows`` holds the block's rows as read, in
    a buffer reused for the next block (change it freely, copy what you
    keep); the result has as many rows, of ``dtype`` and ``row_shape``.
    """

    function: Callable[[np.ndarray], np.ndarray]
    dtype: np.dtype
    row_shape: tuple[int, ...]
    #: Bytes of a row as read; where rows vary in size, the first rows' mean (NOTE [variable-length rows]).
    read_nbytes: int = 0
    #: Seconds its first call took, in the consumer (warm-up included): what its price starts from, where the plan
    #: needs one (``_train.transforms.price``; NOTE [read plan]). 0: not called yet.
    first_s: float = 0.0

    @property
    def row_nbytes(self) -> int:
        """Bytes of a row it gives."""
        return math.prod(self.row_shape) * self.dtype.itemsize

    @classmethod
    def infer(cls, function: Callable[[np.ndarray], np.ndarray], sample: np.ndarray, what: str) -> "Transform":
        """The transform of ``function``, its output described by calling it on ``sample`` (a few rows)."""
        if not callable(function):
            raise TypeError(f"transform for {what} must be callable, not {type(function).__name__}")
        out = function(sample.copy())
        if not isinstance(out, np.ndarray) or out.ndim < 1 or len(out) != len(sample):
            got = f"shape {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            # A tensor (PyTorch's, JAX's...): what a DataLoader's __getitem__ returned, moved here as it was.
            fix = "; return np.asarray(...) of it: the batches become tensors after" if hasattr(out, "__array__") else ""
            raise TypeError(
                f"transform for {what} must return a numpy array with one row per row it is given "
                f"({len(sample)} given, got {got}{fix})"
            )
        if out.dtype.hasobject:
            raise TypeError(f"transform for {what} returned dtype {out.dtype}; shared memory holds plain numbers and records only")
        read = row_payload(sample) if sample.dtype.kind == "O" else sample.itemsize * math.prod(sample.shape[1:])
        return cls(function, out.dtype, out.shape[1:], read)

    def apply(self, rows: np.ndarray, out: np.ndarray) -> None:
        """``function(rows)`` into ``out`` (as many rows); ``TypeError`` if it gives another dtype or shape than before."""
        got = self.function(rows)
        if not isinstance(got, np.ndarray) or got.shape != out.shape or got.dtype != self.dtype:
            desc = f"{got.dtype} {got.shape}" if isinstance(got, np.ndarray) else type(got).__name__
            raise TypeError(
                f"transform {getattr(self.function, '__qualname__', self.function)!r} returned {desc} for "
                f"{len(rows)} rows; it gave {self.dtype} rows of shape {self.row_shape} on its first call"
            )
        out[...] = got
