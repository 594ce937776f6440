"""Which rows each block holds: pure functions, no I/O.

A *block* is ``block_size`` consecutive rows (the last one may be short when
``remainder=True``; in cyclic mode a block may wrap from the end of the
dataset to its start). Block ``k`` is split into *pieces*: contiguous runs of
source rows and where they land in the slot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

MiB = 1 << 20

#: Uncompressed bytes a block aims at when the dataset is chunked, and the
#: most it may hold. Measured with h5py on zlib-3 and blosc-3 float32 rows:
#: 1 MiB blocks read at 93% (zlib) and 89% (blosc) of 4 MiB ones, 256 KiB
#: blocks at 80% and 54%.
TARGET_BLOCK_BYTES = 4 * MiB
#: Block size for contiguous (unchunked) datasets.
CONTIGUOUS_BLOCK_BYTES = 1 * MiB
#: Aim for at least this many blocks per reader, so the readers share the
#: work evenly; blocks shrink (down to one chunk) for smaller datasets.
MIN_BLOCKS_PER_READER = 4
#: What it costs to start the readers and see the first block (s), by start
#: method. Measured with 2 readers on a 4 MiB file, median of 5, on the
#: 2-core development machine while busy: fork 0.043, forkserver 0.84,
#: spawn 1.2 (each spawned reader imports numpy, h5py and PyTables).
START_COST_S = {"fork": 0.05, "forkserver": 0.9, "spawn": 1.2}
#: Rough one-core decode rates (bytes/s) by engine and HDF5 filter id, to
#: judge whether parallel reading can pay. h5py: deflate ~0.55 GB/s and blosc
#: ~1.5-2 GB/s here, bzip2 far slower, no filter ~3.7 GB/s warm; the chunk
#: engine decodes deflate + shuffle ~2.7x faster than h5py; PyTables decodes
#: deflate ~1.8x and blosc ~2.3x slower (the benchmark's warm one-core
#: figures, BENCHMARKS.md).
_DECODE_RATE = {1: 0.55e9, 307: 0.03e9, 32001: 1.5e9, 32026: 1.5e9, 32004: 1.5e9, 32015: 0.8e9, 32008: 1.5e9}
_ENGINE_SPEED = {"chunks": {1: 2.7}, "tables": {1: 1 / 1.8, 32001: 1 / 2.3}}
_COPY_RATE = 3.5e9
#: Most readers per usable CPU: more only take turns on the same cores (each
#: with its own ring slots and open file), while a few per CPU still help
#: where reads wait on storage rather than decode.
READERS_PER_CPU = 4


@dataclass(frozen=True)
class Piece:
    """Source rows ``[start, stop)`` go to slot rows ``[dst, dst + stop - start)``."""

    start: int
    stop: int
    dst: int


@dataclass(frozen=True)
class BlockPlan:
    """The blocks of one pass (or of an endless cyclic stream) over ``n_rows`` rows."""

    n_rows: int
    block_size: int
    cyclic: bool = False
    remainder: bool = False

    def __post_init__(self) -> None:
        if self.n_rows < 1 or self.block_size < 1 or self.block_size > self.n_rows:
            raise ValueError(f"invalid plan: {self}")

    @property
    def n_blocks(self) -> "int | None":
        """Blocks in one pass; None when cyclic (endless)."""
        if self.cyclic:
            return None
        full, rest = divmod(self.n_rows, self.block_size)
        return full + (1 if self.remainder and rest else 0)

    def start(self, k: int) -> int:
        """First source row of block ``k``."""
        return (k * self.block_size) % self.n_rows if self.cyclic else k * self.block_size

    def rows(self, k: int) -> int:
        """Rows in block ``k``."""
        if self.cyclic:
            return self.block_size
        return min(self.block_size, self.n_rows - k * self.block_size)

    def pieces(self, k: int) -> tuple[Piece, ...]:
        """The contiguous source runs of block ``k``: one, or two where a cyclic block wraps."""
        start, n = self.start(k), self.rows(k)
        first = min(n, self.n_rows - start)
        if first == n:
            return (Piece(start, start + n, 0),)
        return (Piece(start, self.n_rows, 0), Piece(0, n - first, first))


def ahead(plan: "BlockPlan | RangePlan", k: int, distance: int) -> tuple[Piece, ...]:
    """The pieces a reader that claimed block ``k`` hints before reading it: block ``k + distance``, the one it is likely to read next.

    Readers claim blocks in increasing order from one counter, so with
    ``distance`` readers each takes about every ``distance``-th block. A
    reader's first block (``k < distance``) hints blocks ``k`` to ``k +
    distance``, itself included: the first blocks are otherwise read
    unhinted, after later blocks' hints, and a disk goes back for them (on
    the RAID 0 model, two readers' passes had 16-28 seeks against one
    process's 3; BENCHMARKS.md). Blocks past the end are left out.
    """
    if distance < 1:
        return ()
    last = k + distance if plan.n_blocks is None else min(k + distance, plan.n_blocks - 1)
    first = k if k < distance else k + distance
    return tuple(p for j in range(first, last + 1) for p in plan.pieces(j))


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cap_readers(n_procs: int, n_blocks: "int | None", cpus: int) -> int:
    """``n_procs`` capped at what can be used: a reader per block of a pass (``None``: endless), ``READERS_PER_CPU`` per CPU."""
    cap = READERS_PER_CPU * max(cpus, 1)
    return min(n_procs, cap if n_blocks is None else min(cap, n_blocks))


def default_block_size(n_rows: int, row_nbytes: int, chunk_rows: "int | None", n_procs: int) -> int:
    """Rows per block: whole chunks near :data:`TARGET_BLOCK_BYTES`, smaller for small datasets.

    ``n_procs=0`` (reading in the consumer) keeps blocks large: there are no
    readers to share the blocks between.
    """
    row_nbytes = max(row_nbytes, 1)
    if chunk_rows:
        chunks = max(1, TARGET_BLOCK_BYTES // (chunk_rows * row_nbytes))
        if n_procs:
            # Enough blocks that every reader gets several, but never less than one chunk.
            per_reader = n_rows // (chunk_rows * n_procs * MIN_BLOCKS_PER_READER)
            chunks = max(1, min(chunks, per_reader))
        size = chunks * chunk_rows
    else:
        size = max(1, CONTIGUOUS_BLOCK_BYTES // row_nbytes)
        if n_procs:
            size = max(1, min(size, n_rows // (n_procs * MIN_BLOCKS_PER_READER)))
    return max(1, min(size, n_rows))


def default_read_ahead(n_procs: int) -> int:
    """Slots in the ring: one being filled per reader, as many ready, and the consumer's."""
    return 2 * max(n_procs, 1) + 2


def parallel_pays(
    nbytes: int, filter_ids: "tuple[int, ...]", start_method: "str | None", n_cpus: int, engine: str = "h5py"
) -> bool:
    """Whether ``n_cpus`` reader processes can beat ``engine`` reading ``nbytes`` (uncompressed) in the consumer.

    Readers save at most ``(1 - 1/n_cpus)`` of the one-core read time and
    cost :data:`START_COST_S` to start; they must save twice what they cost.
    """
    if n_cpus < 2:
        return False
    if start_method is None:
        import multiprocessing

        start_method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_context().get_start_method()
    speed = _ENGINE_SPEED.get(engine, {})
    rate = min((_DECODE_RATE.get(f, _COPY_RATE) * speed.get(f, 1.0) for f in filter_ids), default=_COPY_RATE)
    one_core_s = nbytes / rate
    return one_core_s * (1 - 1 / n_cpus) > 2 * START_COST_S.get(start_method, max(START_COST_S.values()))


@dataclass(frozen=True)
class RangePlan:
    """Blocks given explicitly: block ``k`` is source rows ``[starts[k], stops[k])``.

    For orders the regular plan cannot express: shuffled blocks of an epoch,
    one rank's part of a dataset. Same protocol as :class:`BlockPlan`.
    """

    starts: tuple[int, ...]
    stops: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.starts) != len(self.stops) or not self.starts:
            raise ValueError("a range plan needs as many starts as stops, and at least one block")
        if any(b <= a or a < 0 for a, b in zip(self.starts, self.stops)):
            raise ValueError("every block of a range plan needs 0 <= start < stop")

    @property
    def block_size(self) -> int:
        """Rows in the largest block (the size of a slot)."""
        return max(b - a for a, b in zip(self.starts, self.stops))

    @property
    def n_blocks(self) -> int:
        return len(self.starts)

    def start(self, k: int) -> int:
        return self.starts[k]

    def rows(self, k: int) -> int:
        return self.stops[k] - self.starts[k]

    def pieces(self, k: int) -> tuple[Piece, ...]:
        return (Piece(self.starts[k], self.stops[k], 0),)


def split_readers(nbytes: Sequence[int], pays: Sequence[bool], n_procs: "int | None", cpus: int) -> list[int]:
    """Reader processes per dataset: shared in proportion to bytes, small datasets read in-process.

    ``pays[i]`` says whether readers can pay for dataset ``i`` at all
    (:func:`~multitables._plan.blocks.parallel_pays`). ``n_procs=None`` shares
    ``cpus`` among those; if there are none, everything is read in-process.
    An explicit ``n_procs`` is shared the same way, and goes to the largest
    dataset when none pays.
    """
    n = len(nbytes)
    if n_procs == 0:
        return [0] * n
    total = cpus if n_procs is None else n_procs
    big = [i for i in range(n) if pays[i]]
    if not big:
        if n_procs is None:
            return [0] * n
        big = [max(range(n), key=lambda i: nbytes[i])]
    big.sort(key=lambda i: -nbytes[i])
    big = big[:total]  # more big datasets than processes: the largest get one each
    weight = sum(nbytes[i] for i in big) or 1
    out = [0] * n
    for i in big:
        out[i] = 1
    # Largest remainders: hand out what is left beyond one each, in proportion to bytes.
    spare = total - len(big)
    shares = {i: spare * nbytes[i] / weight for i in big}
    for i in big:
        out[i] += int(shares[i])
    left = spare - sum(int(x) for x in shares.values())
    for i in sorted(big, key=lambda i: -(shares[i] - int(shares[i])))[:left]:
        out[i] += 1
    return out
