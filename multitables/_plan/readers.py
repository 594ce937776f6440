"""How to read a dataset: reader processes, rows per block and slots in the ring, decided once (pure, no I/O).

NOTE [read plan]
    Every face asks this module and nothing else how to read: a stream (:func:`plan_stream`, for ``get_queue`` and
    the generator), training batches (:func:`plan_batches`, several datasets of equal rows), the training layer's
    queues over explicit blocks (:func:`plan_blocks`) and a Reader (:func:`plan_requests`). The inputs are the
    dataset's numbers (:class:`DatasetShape`), the engine that will read it (already resolved: its decode rate
    decides whether readers pay) and the machine (:class:`Machine`: usable CPUs, start method). The answer, a frozen
    :class:`ReadPlan`, travels whole to the readers.

    The rules, the same for every face:

    * readers: by default, the usable CPUs (this process's share of them: NOTE [CPU siblings] in ``_sys.siblings``)
      where they pay (they save what they cost with a margin,
      ``_plan.costs``; never on stored bytes, whose reading is a copy either way, unless a transform runs on them),
      else none. What they save is the one-core time of the read and of a transform (its times a call and a row,
      fitted to its calls on the first rows in the consumer, times the blocks and the rows of a pass: NOTE
      [transforms] in ``_io.blockread``; a cost a call is a block's, not a row's), less what one of as many readers as
      can work at once takes (the CPUs, or the chunks of rows where fewer, or the blocks where they cut a chunk: a
      dataset in one chunk gets none unless its blocks are smaller, asked for with ``block_size``), at the rate the
      chunk engine measured on the
      dataset's first chunks in the consumer where the answer turns on it and the sample is small beside the
      dataset (the default of a stream or of batches: ``DatasetShape.decode_rate``, :func:`rate_decides`), else at a
      table's rate; with none the blocks are read in the consumer; an explicit ``n_procs`` is taken as asked (0
      reads in the consumer); either way capped at ``READERS_PER_CPU`` per CPU and at the blocks of a pass;
    * block size: whole chunks near :data:`TARGET_BLOCK_BYTES` (1 MiB for contiguous datasets), smaller where there
      would be fewer than ``MIN_BLOCKS_PER_READER`` blocks per reader. A transform's row counts as the larger of its
      bytes as read and as written, and its blocks stay within the target even where that cuts a chunk (in equal parts
      where it can): slots and windows hold what it writes, which a decoder makes many times what it reads (a 256 KiB
      image of a 1 KiB row, whose whole chunks would be hundreds of MiB). Training plans its blocks for one reader
      whatever the machine, because an epoch's order is a function of ``(seed, epoch)`` and the blocks alone (NOTE
      [epoch plan] in ``_plan.epoch``): a stream read with ``n_procs=1`` and batches over the same dataset get the
      same blocks. Small blocks a stream's caller asks for are read several at a time (:func:`read_together`): a
      queue hands them out one by one, and a read that fails is read again one of them at a time, to name it;
    * hints (NOTE [prefetch] in ``_io.blockread``): a reader hints the block ``readers`` past the one it claimed
      where several read in turn (a strided pattern, which the kernel's own read-ahead does not follow); one reader,
      or the consumer, hints the next block only where it decodes (the disk reads on while it does), and nothing for
      stored bytes, which the kernel reads ahead of one reader by itself (:func:`hint_distance`);
    * read-ahead: ``2 * readers + 2`` slots (one being filled per reader, as many ready, the consumer's), 4 buffers
      when read in the consumer;
    * shared memory: a ring the defaults make takes at most :data:`SHM_SHARE` of the shared memory free when its
      readers start (``shm_free``: /dev/shm's, or a memory cgroup's where less): fewer slots, down to one per reader
      and the consumer's, and a stream's default blocks smaller (whole chunks) where even those would not fit, then
      default readers fewer, down to none (read in the consumer, which takes no shared memory; ``_plan.room``). A
      container's /dev/shm is small (Docker's default: 64 MiB, where 8 readers' default ring of 4 MiB blocks needs
      72), and others use it too (another stream, DataLoader workers, NCCL). What the caller gives is taken as
      given; a ring that still does not fit is refused before any reader starts (``ShmSpaceError``). Training's
      blocks never shrink (an epoch's order is made of them): its default readers are fewer, down to none;
    * an object (a URL, ``DatasetShape.remote``): each read waits a round trip (tens of ms) and a reader cannot
      fetch ahead for blocks another reader may claim, so blocks are larger (:data:`REMOTE_BLOCK_BYTES`: a round
      trip per 16 MiB rather than per 4, the parts of each fetched in parallel) and readers more
      (``REMOTE_READERS_PER_CPU`` per CPU, and at least ``REMOTE_MIN_READERS`` within ``READERS_PER_CPU``: while
      some wait, others decode), wherever it has a few such blocks; the ring holds one slot per reader and two more.
      A reader has one block's request in flight at a time, and a distant link needs several: on the emulated bucket
      of 50 ms and 2 Gbit/s (BENCHMARKS.md, issue 31), zlib blocks of 16 MiB of rows are 2.8 MB stored, and 4
      readers kept the link at half its cap while using half of the 2 CPUs, 8 readers at 0.8 of it.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from dataclasses import dataclass, replace
from typing import Any, Sequence

from .._sys.cgroups import cpu_quota
from .._sys.siblings import cpu_siblings, torchrun_ranks
from .._sys.forks import forgone_so_far, running_forkserver, server_ready, start_method as default_start_method
from .blocks import MiB, BlockPlan, GrowingPlan, RangePlan, chunk_part
from .costs import MARGIN, RATE_SPREAD, parallel_cpus, parallel_pays, rate_sample_rows, saved_s, start_cost, table_rate
from .costs import split_readers, transform_s, transform_stake_s
from .room import SHM_SHARE, fewest_slots, readers_that_fit
from .subset import default_subset_block

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
#: Memory a training shuffle window aims at, over all datasets, when ``window`` is not given (two such buffers are
#: alive at once: NOTE [window pipelining] in ``_train.windows``).
WINDOW_BYTES = 256 * MiB
#: Uncompressed bytes a block aims at when the dataset is an object (a URL): see NOTE [read plan].
REMOTE_BLOCK_BYTES = 16 * MiB
#: Default readers per usable CPU for an object, whose readers wait on the network as much as they decode.
REMOTE_READERS_PER_CPU = 2
#: Fewest default readers for an object (capped at ``READERS_PER_CPU`` per CPU): the blocks in flight a distant link
#: needs do not depend on the CPUs (NOTE [read plan]).
REMOTE_MIN_READERS = 8
#: Most readers per usable CPU: more only take turns on the same cores (each with its own ring slots and open file),
#: while a few per CPU still help where reads wait on storage rather than decode.
READERS_PER_CPU = 4


@dataclass(frozen=True)
class Machine:
    """What the plan needs of the machine: the CPUs this process may use, and how readers start."""

    cpus: int
    start_method: str
    #: Whether this process is daemonic (a Pool's or a DataLoader's worker): multiprocessing lets it start no reader.
    daemon: bool = False
    #: The fork server's state, where it starts readers (NOTE [fork server] in ``_sys.forks``): whether one this
    #: library started runs, and the seconds streams forwent while none ran (0 where another's runs).
    server_ready: bool = False
    forgone_s: float = 0.0
    #: Other live processes doing the same work on this one's CPUs: its pool's workers, a launcher's ranks (torchrun's,
    #: Lightning's), a shell's jobs (NOTE [CPU siblings] in ``_sys.siblings``); 0: none.
    siblings: int = 0

    @classmethod
    def here(cls, start_method: "str | None" = None) -> "Machine":
        """This process's machine; ``start_method`` None: multiprocessing's default."""
        method = default_start_method(start_method)
        daemon = bool(multiprocessing.current_process().daemon)
        siblings = 0 if daemon else cpu_siblings()  # a daemonic worker's defaults start no reader anyway
        if method != "forkserver":
            return cls(available_cpus(), method, daemon, siblings=siblings)
        # What streams forwent buys a server of ours only where none runs: one started elsewhere lacks the readers'
        # modules, and each start from it imports them (0.26 s a stream here, against a fork's 0.011).
        forgone = forgone_so_far() if running_forkserver() is None else 0.0
        return cls(available_cpus(), method, daemon, server_ready(), forgone, siblings)

    @property
    def share(self) -> int:
        """The CPUs the defaults count on: this process's share of ``cpus`` among it and its siblings, at least one."""
        return max(1, self.cpus // (self.siblings + 1))

    def start_cost(self) -> float:
        """Seconds starting readers costs here (``_plan.costs.start_cost``)."""
        return start_cost(self.start_method, self.server_ready, self.forgone_s)


def cpu_share() -> int:
    """This process's share of the CPUs beside its siblings (``Machine.share``), whatever starts its readers."""
    return Machine(available_cpus(), "fork", siblings=cpu_siblings()).share


@dataclass(frozen=True)
class DatasetShape:
    """What the plan needs of a dataset: its rows, their bytes, its chunks' rows and its filters."""

    n_rows: int
    row_nbytes: int  # uncompressed bytes of a row as delivered; transformed, the larger of as read and as delivered
    chunk_rows: "int | None"  # None: contiguous
    filter_ids: "tuple[int, ...]" = ()
    #: Whether it is read from an object (a URL): every read waits a round trip.
    remote: bool = False
    #: Whether a transform runs on its rows where they are read (NOTE [transforms] in ``_io.blockread``).
    transformed: bool = False
    #: Bytes a second (uncompressed) the consumer read it at, measured here; None: the table's rate for its filters.
    decode_rate: "float | None" = None
    #: Seconds its transform takes on one core a row, and a call beyond its rows' (a call a block), timed in the
    #: consumer where the plan turns on them (``_train.transforms.price``); 0: none.
    transform_row_s: float = 0.0
    transform_call_s: float = 0.0

    @classmethod
    def of(cls, node: Any, transformed: bool = False) -> "DatasetShape":
        """The shape of a node (anything with ``n_rows``, ``row_nbytes``, ``chunk_rows`` and ``filter_ids``; ``remote``
        and ``parts`` where it has them, as ``_io.node.NodeInfo``)."""
        parts = [p.node for p in getattr(node, "parts", ())] or [node]
        remote = any(getattr(n, "remote", None) is not None for n in parts)
        return cls(node.n_rows, node.row_nbytes, node.chunk_rows, tuple(node.filter_ids), remote, transformed)

    @property
    def nbytes(self) -> int:
        return self.n_rows * self.row_nbytes

    def transform_s(self, n_rows: int, block_size: "int | None") -> float:
        """One core's seconds of its transform over ``n_rows`` rows in blocks of ``block_size`` (None: one block)."""
        return transform_s(self.transform_row_s, self.transform_call_s, n_rows, block_size)


@dataclass(frozen=True)
class ReadPlan:
    """How one dataset is read: its blocks, by how many readers (0: in the consumer), through how many slots."""

    blocks: "BlockPlan | RangePlan | GrowingPlan"
    n_procs: int
    read_ahead: int
    #: Entries of the readers' block table for a stream whose blocks are published as it goes (0: fixed blocks).
    table: int = 0
    #: Rows of the caller's blocks, where each block read holds several (:func:`read_together`), which a queue hands
    #: out one by one; 0: the blocks read are the caller's.
    split_rows: int = 0

    @property
    def block_size(self) -> int:
        return self.blocks.block_size


def available_cpus() -> int:
    """CPUs this process and its siblings may use for readers (NOTE [CPU siblings] in ``_sys.siblings``), at least
    one: those it may run on (its affinity), at most its CPU quota's worth, rounded up (``_sys.cgroups``: a
    container's ``--cpus``, a pod's CPU limit); where torchrun started several ranks on this machine
    (``LOCAL_WORLD_SIZE``), the quota's part of the ranks that share its CPUs (the quota is the group's, and ranks
    pinned to CPUs of their own share it too). ``Machine.share`` divides them among the siblings."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
    quota = cpu_quota()
    if quota is not None:
        ranks = torchrun_ranks()
        cpus = min(cpus, math.ceil(quota if ranks is None else quota * ranks[1] / ranks[0]))
    return max(1, cpus)


def cap_readers(n_procs: int, n_blocks: "int | None", cpus: int) -> int:
    """``n_procs`` capped at what can be used: a reader per block of a pass (``None``: endless), ``READERS_PER_CPU`` per CPU."""
    cap = READERS_PER_CPU * max(cpus, 1)
    return min(n_procs, cap if n_blocks is None else min(cap, n_blocks))


def default_block_size(
    n_rows: int, row_nbytes: int, chunk_rows: "int | None", n_procs: int, remote: bool = False,
    most_bytes: "int | None" = None, transformed: bool = False,
) -> int:
    """Rows per block: whole chunks near :data:`TARGET_BLOCK_BYTES` (:data:`REMOTE_BLOCK_BYTES` for an object),
    smaller for small datasets.

    ``n_procs=0`` (reading in the consumer) keeps blocks large: there are no readers to share the blocks between.
    ``most_bytes``: a block's bytes at most (whole chunks: one chunk at least). ``transformed``: a transform's rows,
    whose block is part of a chunk where one exceeds the target (NOTE [read plan]).
    """
    row_nbytes = max(row_nbytes, 1)
    target = REMOTE_BLOCK_BYTES if remote else TARGET_BLOCK_BYTES if chunk_rows else CONTIGUOUS_BLOCK_BYTES
    if most_bytes is not None:
        target = min(target, most_bytes)
    if chunk_rows:
        if transformed and chunk_rows * row_nbytes > target:  # its slots hold what it writes: within the target
            return min(chunk_part(chunk_rows, max(1, target // row_nbytes)), n_rows)
        chunks = max(1, target // (chunk_rows * row_nbytes))
        if n_procs:
            # Enough blocks that every reader gets several, but never less than one chunk.
            per_reader = n_rows // (chunk_rows * n_procs * MIN_BLOCKS_PER_READER)
            chunks = max(1, min(chunks, per_reader))
        size = chunks * chunk_rows
    else:
        size = max(1, target // row_nbytes)
        if n_procs:
            size = max(1, min(size, n_rows // (n_procs * MIN_BLOCKS_PER_READER)))
    return max(1, min(size, n_rows))


def default_read_ahead(n_procs: int, remote: bool = False) -> int:
    """Slots in the ring: one being filled per reader, as many ready, and the consumer's. For an object, one being
    filled per reader and two ready: its readers are more and its blocks larger (NOTE [read plan]), and a block waits
    on the network longer than the consumer takes it."""
    return max(n_procs, 1) + 2 if remote else 2 * max(n_procs, 1) + 2


def hint_distance(n_readers: int, filter_ids: "tuple[int, ...]") -> int:
    """How many blocks past the one it claimed a reader hints (NOTE [read plan]); 0: none. On stored bytes (no filter)
    read by one process a hint only costs: 1 GiB of 4 KiB rows in 512 KiB chunks, in the consumer, medians of 5
    (``benchmarks/stored_bytes.py``): hinted 0.78x one h5py process, unhinted 1.03x, pages dropped; cached 0.86x and
    1.26x."""
    if n_readers >= 2:
        return n_readers
    return 1 if filter_ids else 0


def rate_decides(shape: DatasetShape, engine: str, machine: Machine, looped: bool = False) -> bool:
    """Whether the default readers for ``shape`` turn on the decode rate: the table's rate off by
    :data:`RATE_SPREAD` either way would change the answer, or what a stream forgoes while the fork server is yet to
    start (:func:`would_save_s`). Only then is the rate worth measuring. ``looped``: read as many times as a loop
    runs (batches' epochs: NOTE [readers bought] in ``_train.feed``), so that it may turn on the rate at any size."""
    cpus = parallel_cpus(machine.share, shape.n_rows, shape.chunk_rows)
    if shape.remote or cpus < 2 or machine.daemon or not shape.filter_ids or shape.transformed:
        return False
    if not rate_sample_rows(shape.n_rows, shape.row_nbytes, shape.chunk_rows):  # chunks too large to sample: the table
        return False
    if looped:
        return True
    saved = saved_s(shape.nbytes, table_rate(shape.filter_ids, engine), cpus)
    costs = {machine.start_cost(), replace(machine, server_ready=machine.start_method == "forkserver").start_cost()}
    return any(MARGIN["measured"] * cost / RATE_SPREAD < saved < MARGIN["table"] * cost * RATE_SPREAD for cost in costs)


def default_readers(
    shape: DatasetShape, engine: str, machine: Machine, passes: int = 1, n_rows: "int | None" = None,
    block_size: "int | None" = None,
) -> int:
    """Readers for ``shape`` when none are asked for: every usable CPU where they pay over ``passes`` passes of
    ``n_rows`` rows (None: its own) in blocks of ``block_size`` (None: training's default), a start of readers kept
    across them, else 0 (read in the consumer; always in a daemonic process). Its transform: ``costs.transform_s``.

    An object's: ``REMOTE_READERS_PER_CPU`` per CPU, at least ``REMOTE_MIN_READERS``, where it has more than two
    blocks (NOTE [read plan]; ``plan_stream`` caps them at ``READERS_PER_CPU`` per CPU).
    """
    if machine.daemon:
        return 0
    if shape.remote:
        many = max(REMOTE_READERS_PER_CPU * machine.share, REMOTE_MIN_READERS)
        return many if shape.nbytes > 2 * REMOTE_BLOCK_BYTES else 0
    cpus = parallel_cpus(machine.share, shape.n_rows, shape.chunk_rows, block_size)
    pays = parallel_pays(shape.nbytes * passes, shape.filter_ids, machine.start_cost(), cpus, engine,
                         shape.transform_s(shape.n_rows if n_rows is None else n_rows, block_size) * passes,
                         shape.decode_rate)
    return machine.share if pays else 0


def transform_stake(shape: DatasetShape, engine: str, machine: Machine, block_size: int) -> "float | None":
    """One core's seconds of ``shape``'s transform an epoch, in blocks of ``block_size``, above which the default's
    readers pay on the first (:func:`default_readers`); None where no price changes their answer after any number of
    epochs: a daemonic process, an object, fewer than two readers at work at once, readers paid by the read alone."""
    cpus = parallel_cpus(machine.share, shape.n_rows, shape.chunk_rows, block_size)
    if machine.daemon or shape.remote or cpus < 2:
        return None
    stake = transform_stake_s(shape.nbytes, shape.filter_ids, machine.start_cost(), cpus, engine, shape.decode_rate)
    return stake if stake > 0 else None


def would_save_s(shape: DatasetShape, engine: str, machine: Machine, block_size: "int | None" = None) -> float:
    """Seconds the default's readers would have saved, less their start, had a ready fork server run, where the
    default reads ``shape`` (in blocks of ``block_size``, None: one) in the consumer for want of one; else 0 (NOTE
    [fork server] in ``_sys.forks``)."""
    if machine.start_method != "forkserver" or machine.server_ready \
            or default_readers(shape, engine, machine, 1, None, block_size):  # fmt: skip
        return 0.0
    ready = replace(machine, server_ready=True)
    if not default_readers(shape, engine, ready, 1, None, block_size):
        return 0.0
    cpus = parallel_cpus(machine.share, shape.n_rows, shape.chunk_rows, block_size)
    rate = shape.decode_rate or table_rate(shape.filter_ids, engine)
    return saved_s(shape.nbytes, rate, cpus, shape.transform_s(shape.n_rows, block_size)) - ready.start_cost()


def plan_stream(
    shape: DatasetShape,
    engine: str,
    machine: Machine,
    *,
    n_procs: "int | None" = None,
    block_size: "int | None" = None,
    read_ahead: "int | None" = None,
    cyclic: bool = False,
    remainder: bool = False,
    shm_free: "int | None" = None,
    rows_only: bool = False,
) -> ReadPlan:
    """How a stream reads ``shape`` (NOTE [read plan]); arguments as ``Streamer.get_queue``'s, already type-checked.

    ``shm_free``: the shared memory free for its ring (bytes; None: not known, or no readers). A ``block_size`` larger
    than the dataset is its number of rows. Small blocks asked for are read several at a time (:func:`read_together`;
    ``ReadPlan.split_rows``); ``rows_only``: the caller sees rows, not blocks (the generator), so the slots are fewer.
    """
    defaulted, asked = n_procs is None, block_size
    if n_procs is None:
        n_procs = default_readers(shape, engine, machine)
    n_procs = cap_readers(n_procs, None, machine.cpus)  # first: the default block size depends on it
    while True:
        if asked is None:  # its slots (those asked, or the fewest the defaults allow) within the room for the ring
            room = int(SHM_SHARE * shm_free) if n_procs and shm_free is not None else None
            most = None if room is None else room // (read_ahead or fewest_slots(n_procs))
            block_size = default_block_size(shape.n_rows, shape.row_nbytes, shape.chunk_rows, n_procs, shape.remote, most)
        else:
            block_size = min(asked, shape.n_rows)  # at most one block of every row, as 2.x read it
        # The defaults' fewest slots of their smallest blocks still too large: fewer readers, down to none.
        if not (defaulted and n_procs and read_ahead is None and shm_free is not None
                and fewest_slots(n_procs) * block_size * shape.row_nbytes > SHM_SHARE * shm_free):
            break
        n_procs -= 1
    times = read_together(shape, block_size, n_procs, cyclic, read_ahead, shm_free) if asked is not None else 1
    if times == 1:
        blocks = BlockPlan(shape.n_rows, block_size, cyclic=cyclic, remainder=remainder)
    else:  # the caller's rows: all of them, cyclic or with the remainder; else up to its last whole block
        n_rows = shape.n_rows if cyclic or remainder else shape.n_rows - shape.n_rows % block_size
        blocks = BlockPlan(n_rows, min(block_size * times, n_rows), cyclic=cyclic, remainder=True)
        if rows_only and read_ahead is not None:  # the bytes in flight asked for (a queue's caller holds blocks)
            read_ahead = max(fewest_slots(n_procs) if n_procs else 1, -(-read_ahead // times))
    read = plan_blocks(blocks, machine, n_procs=n_procs, read_ahead=read_ahead, remote=shape.remote,
                       slot_bytes=blocks.block_size * shape.row_nbytes, shm_free=shm_free)
    return read if times == 1 else replace(read, split_rows=block_size)


#: The fewest bytes a block read holds where a stream's caller asked for smaller blocks (NOTE [read plan]): each
#: block read costs a hand-off and ~20 us of Python. Over 16-byte rows, ``block_size=256`` took 2.4x h5py's time
#: in the generator (the default's blocks 0.98x) and 3.3x in a queue (BENCHMARKS.md).
TOGETHER_BYTES = 1 * MiB
#: The most bytes a ring of blocks read together takes (or half the shared memory free, if less): a queue's caller
#: may hold as many blocks as there are slots, each in a slot of its own.
TOGETHER_RING_BYTES = 16 * MiB


def read_together(
    shape: DatasetShape, block_size: int, n_procs: int, cyclic: bool, read_ahead: "int | None", shm_free: "int | None"
) -> int:
    """How many of the caller's blocks of ``block_size`` rows a block read holds (NOTE [read plan]): enough for
    :data:`TOGETHER_BYTES`, as long as each reader still gets ``MIN_BLOCKS_PER_READER`` blocks, within the rows
    (cyclic), and within :data:`TOGETHER_RING_BYTES` for the ring's slots. Any multiple gives the same rows in the
    same order: every row of a pass, or the endless sequence from row 0. 1: the blocks asked for."""
    block_nbytes = max(block_size * shape.row_nbytes, 1)
    times = TOGETHER_BYTES // block_nbytes
    if n_procs:
        times = min(times, shape.n_rows // (block_size * n_procs * MIN_BLOCKS_PER_READER))
    if cyclic:
        times = min(times, shape.n_rows // block_size)
    ring = TOGETHER_RING_BYTES if shm_free is None or not n_procs else min(TOGETHER_RING_BYTES, int(SHM_SHARE * shm_free))
    slots = read_ahead or default_read_ahead(n_procs, shape.remote)
    return max(min(times, ring // (slots * block_nbytes)), 1)


def plan_blocks(
    blocks: "BlockPlan | RangePlan | GrowingPlan", machine: Machine, *, n_procs: int, read_ahead: "int | None" = None,
    table: int = 0, most_blocks: "int | None" = None, remote: bool = False, slot_bytes: int = 0,
    shm_free: "int | None" = None, held: float = 0.0,
) -> ReadPlan:
    """How given blocks are read: ``n_procs`` readers, capped (NOTE [read plan]); the default read-ahead.

    ``table``: a :class:`GrowingPlan`'s block table's entries; ``most_blocks``: the most blocks it will ever hold unread
    (caps the readers, as a fixed plan's blocks do); ``remote``: an object's blocks; ``slot_bytes``: a block's bytes as
    delivered; ``shm_free``: the shared memory free for the ring (None: not known), which the default read-ahead fits
    into; ``held``: the share of the slots the caller may hold at once (a staging that takes slots: NOTE [slots on a
    device] in ``_train.device``), which a default read-ahead adds, so that the readers keep the default's slots.
    """
    n_procs = cap_readers(n_procs, blocks.n_blocks if most_blocks is None else most_blocks, machine.cpus)
    if read_ahead is None:
        read_ahead = math.ceil(default_read_ahead(n_procs, remote) / (1 - held))
        if n_procs and slot_bytes and shm_free is not None:
            fits = int(SHM_SHARE * shm_free) // slot_bytes
            read_ahead = max(fewest_slots(n_procs), min(read_ahead, fits))
    return ReadPlan(blocks, n_procs, read_ahead, table)


@dataclass(frozen=True)
class BatchPlan:
    """How training batches read their datasets: one block size for all, readers per dataset (0: in the consumer)."""

    block_size: int
    n_procs: "tuple[int, ...]"
    read_ahead: "int | None"  # None: each epoch's queues take plan_blocks' default
    #: Blocks whose rows are shuffled together (1 unshuffled: windows change nothing in the order).
    window: int = 1


def plan_batches(
    shapes: "Sequence[DatasetShape]",
    engines: "Sequence[str]",
    machine: Machine,
    *,
    n_rows: int,
    n_procs: "int | None" = None,
    block_size: "int | None" = None,
    read_ahead: "int | None" = None,
    window: "int | None" = None,
    shuffle: bool = True,
    passes: int = 1,
    shm_free: "int | None" = None,
) -> BatchPlan:
    """How batches read datasets of equal rows (NOTE [read plan]): blocks planned for one reader, the readers shared;
    by default, readers priced over ``passes`` epochs (NOTE [readers bought] in ``_train.feed``).

    ``window``: blocks shuffled together; default, as many as :data:`WINDOW_BYTES` holds of every dataset's rows, at
    most the epoch's.

    ``n_rows``: the positions of an epoch (a subset's or a weighted draw's rows, else the datasets'): where it differs
    from the datasets' rows, a default block spans about a default block of file rows. The largest rows set the block.
    ``ValueError`` for a ``block_size`` beyond ``n_rows``. ``shm_free``: the shared memory free for the rings (None:
    not known), which default readers fit.
    """
    file_rows = shapes[0].n_rows
    main = max(shapes, key=lambda s: s.row_nbytes)
    if block_size is None:
        block_size = default_block_size(file_rows, main.row_nbytes, main.chunk_rows, 1, main.remote,
                                        transformed=main.transformed)  # blocks for one reader: never the machine's
        if n_rows != file_rows:
            block_size = default_subset_block(block_size, n_rows, file_rows)
    elif block_size > n_rows:
        what = "the datasets, which have" if n_rows == file_rows else "an epoch, which has"
        raise ValueError(f"block_size={block_size} is larger than {what} {n_rows} rows")
    nbytes = [s.nbytes for s in shapes]
    pays = [default_readers(s, e, machine, passes, n_rows, block_size) > 0 for s, e in zip(shapes, engines)]
    n_blocks = -(-n_rows // block_size)
    cpus = machine.share * (REMOTE_READERS_PER_CPU if any(s.remote for s in shapes) else 1)
    readers = [cap_readers(n, n_blocks, machine.cpus) for n in split_readers(nbytes, pays, n_procs, cpus)]
    if n_procs is None and read_ahead is None and shm_free is not None:  # the blocks stay: fewer readers (NOTE [read plan])
        readers = readers_that_fit(readers, [block_size * s.row_nbytes for s in shapes], shm_free)
    if window is None:
        window = max(1, WINDOW_BYTES // (block_size * max(1, sum(s.row_nbytes for s in shapes))))
    return BatchPlan(block_size, tuple(readers), read_ahead, min(window, n_blocks) if shuffle else 1)


def plan_requests(n_procs: "int | None", machine: Machine) -> int:
    """Readers of a Reader, which serves requests of any size on any dataset of its file: by default its CPUs
    (``Machine.share``: its share beside its siblings), capped. No size to price their start against, so by default
    none where they cannot pay whatever the requests: in a daemonic process, which may start none, and in a process
    with siblings whose share is one CPU, where a reader only takes turns with it (0: read in the consumer, as a
    stream's)."""
    if n_procs is None and (machine.daemon or (machine.siblings and machine.share < 2)):
        return 0
    return cap_readers(machine.share if n_procs is None else n_procs, None, machine.cpus)
