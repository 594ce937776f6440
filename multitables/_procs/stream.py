"""Streaming on the reader pool: the loop that fills a ring with blocks, and the consumer's side of it.

A stream's readers are its *readers*: each claims the next block of the plan,
reads it into a free slot (``_io.blockread.read_block``) and publishes it
(NOTE [ring protocol] in ``_shm.ring``). The consumer's
:class:`StreamReaders` starts them on a :class:`~.pool.ReaderPool` and,
before every wait for a block, checks that none failed (NOTE [failure
reports] in ``pool``).

NOTE [readers across epochs]
    A training loop walks its data epoch after epoch. Starting readers for
    each epoch forked the training process every epoch (write-protecting
    all its private memory, a model's host copy included) and made each
    epoch's first batch wait for its first window to be read from nothing.
    So a stream can outlive its first blocks: its plan is a
    ``_plan.blocks.GrowingPlan``, its ring holds a block table (NOTE [ring
    protocol] in ``_shm.ring``), and the consumer publishes blocks as it
    goes (``Queue.extend``): in a loop of epochs, the next epoch's while the
    current one is trained on, so the readers go straight on from one to the
    next. A
    reader that finds nothing published waits for more, as idle as a
    reader waiting for a free slot, watching the stop flag and the
    consumer's life. A jump of the position (``break`` then another
    epoch, ``set_epoch``, ``load_state_dict``) withdraws what was
    published and not yet claimed (``Queue.rewind``): the blocks claimed
    are read and dropped, and the stream goes on with the new ones. Block
    numbers only grow, so a delivered block is never taken for another.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from typing import Any, Callable, cast

import numpy as np

from .._io.blockread import BlockReader, Pacer, Transform, delivered
from .._io.chunks.storage import adopt_layout, learned_layouts
from .._io.engines import open_source
from .._io.fileset import node_signature
from .._io.files import FileSignature, GrowingFile, check_file_unchanged
from .._io.node import NodeInfo
from .._io.objects.identity import ObjectIdentity
from .._plan.blocks import BlockPlan, GrowingPlan, RangePlan
from .._plan.readers import ReadPlan, cpu_share
from .._shm.layout import RingLayout, RingSync
from .._shm.ring import WAIT, PeerGone, Ring
from .._shm.space import check_space, semaphores_for, shared_memory_free
from .._shm.tableplan import TablePlan
from ..errors import ReaderError, StreamClosedError
from .pool import REPORT_TIMEOUT, ReaderPool
from .process import PARENT_CHECK_INTERVAL, ReaderProcess


@dataclass(frozen=True)
class StreamSpec:
    """A checked, planned stream: what is read, by which engine, how (NOTE [read plan]); everything but the processes.

    Made in the consumer before anything starts; it travels whole to the
    readers (without ``dataset``).
    """

    node: NodeInfo
    engine: str  # resolved: "chunks", "h5py" or "tables"
    read: ReadPlan
    #: Deliver blocks in plan order (else in the order they are done).
    ordered: bool = True
    #: Where chunk bytes come from: "page" or "direct" (O_DIRECT, chunk engine only).
    cache: str = "page"
    #: Run on each block's rows where it is read (NOTE [transforms]); the blocks are its output.
    transform: "Transform | None" = None
    #: The h5py.Dataset the checks opened (``_io.node.open_node``), kept for a read in the consumer (which closes it).
    dataset: Any = dc_field(default=None, compare=False, repr=False)

    @property
    def plan(self) -> "BlockPlan | RangePlan | GrowingPlan":
        """The blocks (the first ones, for a stream that grows: NOTE [readers across epochs])."""
        return self.read.blocks

    @property
    def n_procs(self) -> int:
        """Reader processes; 0: the blocks are read in the consumer."""
        return self.read.n_procs

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the delivered rows (the transform's output, with one)."""
        return delivered(self.node, self.transform)[0]

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape of a delivered row (the transform's output, with one)."""
        return delivered(self.node, self.transform)[1]

    def open(
        self, open_kwargs: dict[str, Any], n_readers: int, pacer: "Pacer | None" = None, plan: Any = None
    ) -> BlockReader:
        """This stream's blocks, read through a source opened here (in the consumer, the dataset the checks opened).

        ``plan``: where the blocks come from, if not :attr:`plan` (a reader's view of its ring's block table).
        """
        source = open_source(self.engine, self.node, open_kwargs, self.plan, self.dataset, cache=self.cache)
        return BlockReader(source, self.plan if plan is None else plan, self.node, n_readers, self.transform, pacer,
                           self.read.split_rows)


@dataclass(frozen=True)
class StreamSettings:
    """What every reader of one stream needs, sent once at process start: the spec, and where its ring is."""

    spec: StreamSpec
    open_kwargs: dict[str, Any]
    shm_name: str
    layout: RingLayout
    #: The file's identity when the stream started (None: not checked); see NOTE [file identity] in ``_io.files``.
    file_signature: "FileSignature | GrowingFile | ObjectIdentity | None" = None
    #: ``(key, layout)`` the consumer learned, for readers that do not inherit it (NOTE [layout cache] in
    #: ``_io.chunks.storage``); empty under fork.
    layouts: "tuple[tuple[Any, Any], ...]" = ()


def stream_loop(reader: ReaderProcess, settings: StreamSettings, sync: RingSync) -> None:
    """A reader's loop: claim, read, publish, until the plan is done or the consumer stops or dies."""
    reader.segments.add(settings.shm_name)
    reader.path = settings.spec.node.path  # for a report, from the start: mapping the ring may fail too
    ring = Ring.attach(settings.shm_name, settings.layout, sync, reader.identity.index)
    source = None
    try:
        reader.on_failure = ring.fail  # wakes the consumer, which then waits for the report
        reader.attached()
        ring.map_own_slots()  # NOTE [slots and page tables]: after the barrier, the consumer need not wait for it
        parent_alive = reader.parent_alive

        def keep_going() -> bool:
            return not ring.stopped and parent_alive()

        def before_read(a: int, b: int) -> None:
            reader.rows = (a, b)
            if not parent_alive():
                raise PeerGone  # orphaned: stop now rather than at the end of the block (NOTE [orphans])

        spec = settings.spec
        filename = spec.node.filename
        for key, layout in settings.layouts:
            adopt_layout(key, layout)
        plan = TablePlan(ring) if settings.layout.table else spec.plan
        blocks = spec.open(settings.open_kwargs, spec.n_procs, Pacer(spec.node.chunk_rows, PARENT_CHECK_INTERVAL / 2), plan)
        source = blocks.source
        check_file_unchanged(filename, settings.file_signature)
        while True:
            claimed = ring.claim(plan.n_blocks, keep_going)
            if claimed is None:
                break
            if claimed is WAIT:  # NOTE [readers across epochs]: nothing published yet
                if not ring.wait_for_more(keep_going):
                    break
                continue
            k, slot = claimed  # type: ignore[misc]  # neither None nor WAIT (above): a (block, slot)
            blocks.read(k, ring.slots[slot], before_read)
            reader.rows = blocks.named(k)  # what a change of the file found now names
            check_file_unchanged(filename, settings.file_signature)
            reader.rows = None
            ring.publish(slot, k, plan.rows(k), keep_going)
            if not parent_alive():
                break
    except PeerGone:
        pass  # the consumer died or stopped us while we waited for the ring lock
    except Exception:
        # A file changed under a read explains the read's failure (a truncated
        # chunk, a decode error): say so, with the read's error as context.
        check_file_unchanged(settings.spec.node.filename, settings.file_signature)
        raise
    finally:
        if source is not None:
            try:
                source.close()
            except Exception:
                pass
        ring.close()


def _ring_advice(layout: RingLayout, split_rows: int) -> str:
    """What makes a ring that does not fit smaller: the read-ahead that would fit (where the slots are the blocks
    asked for, not several read together), or no readers at all."""
    free = shared_memory_free()
    fits = 0 if free is None or split_rows else (free - layout.data_offset) // layout.slot_stride
    room = f" (read_ahead={fits} fits now)" if 0 < fits < layout.n_slots else ""
    return (f"a smaller read_ahead or block_size{room}, n_procs=0 (the blocks read in this process, which takes no "
            f"shared memory)")


class StreamReaders:
    """``spec.n_procs`` readers filling one ring; owned by one queue."""

    def __init__(self, spec: StreamSpec, open_kwargs: dict[str, Any], start_method: "str | None") -> None:
        self._fault: "Callable[[], ReaderError] | None" = None  # makes the error, once a reader failed
        node = spec.node
        self.filename, self.path = node.filename, node.path
        layout = RingLayout(spec.read.read_ahead, spec.plan.block_size, spec.row_shape, spec.dtype, spec.read.table)
        # Before anything is created (semaphores too); Ring.create checks again.
        slot = layout.slot_nbytes
        size = f"{slot / (1 << 20):.1f} MiB" if slot >= 1 << 20 else f"{slot / 1024:.1f} KiB"
        rows = f"{layout.block_size:,} row{'s' if layout.block_size != 1 else ''}"
        check_space(layout.nbytes, f"The ring ({layout.n_slots} slots of {rows}, {size} each)",
                    _ring_advice(layout, spec.read.split_rows))
        self.pool = ReaderPool(start_method, node.filename, node.path, name="reader", n_readers=spec.n_procs)
        with semaphores_for("The ring's semaphores"):
            sync = RingSync.create(self.pool.ctx, spec.read.read_ahead, spec.n_procs)
        self.ring = Ring.create(layout, sync)  # may raise ShmSpaceError; nothing started yet
        self._n_readers = spec.n_procs
        try:
            if layout.table:  # the first blocks are there when the readers start
                assert not isinstance(spec.plan, BlockPlan)  # a table of blocks: blocks given one by one
                self.extend(spec.plan.starts, spec.plan.stops)
            # Readers not forked from here need not learn the layout again (NOTE [layout cache] in ``_io.chunks.storage``).
            forked = self.pool.ctx.get_start_method() == "fork"
            sent = learned_layouts(node) if spec.engine == "chunks" and not (forked or node.parts or node.remote) else ()
            settings = StreamSettings(
                replace(spec, dataset=None), open_kwargs, self.ring.segment.name, layout, node_signature(node), sent
            )
            self.pool.start(stream_loop, [(settings, sync)] * spec.n_procs, files=node.files, segments=(settings.shm_name,),
                            semaphores=sync.semaphores)
            if spec.n_procs < cpu_share():
                self.ring.allocate_slots()  # NOTE [slots while readers start]: a CPU of this process's share is left over
            self.pool.wait_attached("start", self.check)
            self.pool.unlink_semaphores()  # every reader opened them (NOTE [semaphore names])
            # Every reader has it mapped (NOTE [segment lifetime]). In the try: a Ctrl-C held over the unlink is raised
            # as it ends, and the readers must stop then, for no frame of a traceback that keeps this one (a
            # notebook's last error) will.
            self.ring.segment.unlink()
        except BaseException:
            try:
                self.close()
            finally:
                self.ring.segment.unlink()  # none of the readers ever will map it
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of the readers."""
        return self.pool.pids

    @property
    def alive_pids(self) -> list[int]:
        """Process ids of the readers whose end this process has not seen."""
        ended = self.pool.ended
        return [pid for i, pid in enumerate(self.pool.pids) if i not in ended]

    def extend(self, starts: Any, stops: Any) -> None:
        """Publish more blocks to the readers (NOTE [readers across epochs])."""
        self.ring.extend(starts, stops, self._n_readers, self.check)

    def rewind(self) -> int:
        """Withdraw the blocks published and not claimed, drop the claimed ones once read; the next block's number."""
        return self.ring.rewind(self.check)

    def check(self, taking: bool = True) -> bool:
        """Raise the error of a reader that failed or died; True otherwise. Cheap enough to call per block.

        ``taking``: the consumer waits for a block from the ring, which no reader will bring once every reader has
        exited with none ready (else it waits for its own thread's slots: readers done by then are no failure).
        See NOTE [failure reports] in ``pool``. Every call after a failure
        raises a new instance of the same error: an instance kept here would
        keep, through its traceback, every frame it went up through (the
        caller's loop and its locals) in a cycle with this object.
        """
        self.pool.check_owner()
        if self._fault is not None:
            raise self._fault()
        if self.pool.closed:  # closed from another thread while this one waited for a block
            raise StreamClosedError(f"the stream of {self.path!r} in {self.filename!r} was closed")
        fault = self._look(taking)
        if fault is not None:
            self._fault = fault
            self._tell_stop()  # raise first: close() joins the others (NOTE [shutdown])
            raise fault()
        return True

    def _look(self, taking: bool) -> "Callable[[], ReaderError] | None":
        """What makes the error of a reader that failed or died, if one did (``taking``: as :meth:`check`)."""
        pool, ring, where = self.pool, self.ring, f"{self.path!r} in {self.filename!r}"  # no self in what is kept
        if ring.failed:
            report = pool.own_report(REPORT_TIMEOUT)
            if report is not None:
                return report.to_exception
            return lambda: ReaderError(f"a reader of {where} failed without sending a report")
        pool.look()
        for i in sorted(pool.ended):
            if pool.end_error(i) is not None:
                return cast("Callable[[], ReaderError]", functools.partial(pool.end_error, i))  # it ended failing
        if taking and not pool.running and not ring.stopped and ring.ready_count() == 0:
            return lambda: ReaderError(f"every reader of {where} has exited, but the block the consumer waits for never came")
        return None

    def _tell_stop(self) -> None:
        """Step 1 of NOTE [shutdown], which cannot block. Idempotent (only the consumer sets the flag)."""
        if not self.ring.stopped:
            self.ring.stop()
            self.ring.wake_readers(self.pool.n_readers)

    def close(self, background: bool = False) -> None:
        """Stop every reader and free everything; see NOTE [shutdown]. Idempotent. ``background``: the ring's
        pages are given back after this returns (NOTE [release off the path] in ``_sys.release``)."""
        # Each step idempotent, none skipped for the one before: a close cut short (a handler's exception) is ended
        # by the next (the queue's finalizer).
        self.pool.close(self._tell_stop)
        self.ring.segment.unlink()
        self.ring.close(background)

