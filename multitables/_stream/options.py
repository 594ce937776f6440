"""How one :class:`~multitables.Streamer` opens its files, and the queues it opens on them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._io.blockread import Transform, delivered
from .._io.engines import checked_together, open_source, readers_may_change, resolve_engine, set_look
from .._io.fileset import describe_files, inspect_files, open_files, own_flags
from .._io.node import NodeInfo
from .._io.objects.config import Store
from .._io.objects.urls import shown
from .._plan.blocks import GrowingPlan, RangePlan
from .._plan.costs import rate_sample_rows
from .._plan.readers import DatasetShape, Machine, plan_blocks
from .._procs.stream import StreamSpec
from .._shm.space import shared_memory_free
from .queue import Queue


@dataclass(frozen=True)
class StreamOptions:
    """How one :class:`~multitables.Streamer` opens its files: what every stream of it shares."""

    #: The file, or the files of a set in row order (NOTE [file sets] in ``_io.fileset``).
    files: "str | tuple[str, ...]"
    engine: str
    cache: str
    start_method: "str | None"
    open_kwargs: dict[str, Any]
    #: How objects (URLs) are reached: ``storage_options`` resolved, no secret; None where no file is one.
    store: "Store | None" = None

    def __repr__(self) -> str:  # a presigned URL's query holds its signature: shown as ?...
        files = shown(self.files) if isinstance(self.files, str) else tuple(shown(f) for f in self.files)
        return (f"StreamOptions(files={files!r}, engine={self.engine!r}, cache={self.cache!r}, "
                f"start_method={self.start_method!r}, open_kwargs={self.open_kwargs!r}, store={self.store!r})")

    __str__ = __repr__

    @property
    def named(self) -> str:
        """The files as reprs name them: the file (a URL as shown: no secret), or a set's size, first and last file."""
        return shown(self.files) if isinstance(self.files, str) else describe_files(self.files)

    def open_files(self, path: str, field: "str | None" = None) -> "tuple[NodeInfo, Any]":
        """The node at ``path`` of the files, and its open ``h5py.Dataset`` (None for a set): ``_io.fileset.open_files``."""
        return open_files(self.files, path, field, self.store, look=self._look, **own_flags(self.open_kwargs))

    def inspect(self, path: str, field: "str | None" = None, vlen: bool = False, summed: bool = False) -> NodeInfo:
        """The node at ``path`` of the files, checked (every file of a set; NOTE [file sets] in ``_io.fileset``);
        ``vlen``: one of variable-length rows is given, not refused (NOTE [variable-length rows] in ``_io.vlen``);
        ``summed``: each file's node with its ``data_sum`` (NOTE [data sums] in ``_io.sums``)."""
        return inspect_files(self.files, path, field, self.store, vlen=vlen, look=self._look, summed=summed,
                             **own_flags(self.open_kwargs))

    @property
    def _look(self) -> Any:
        """What :meth:`resolve` asks of each file of a set with it open, asked as the set is inspected (one open a file)."""
        return set_look(self._asked, self.open_kwargs)

    def resolve(self, node: NodeInfo, dataset: Any = None, readers: bool = False) -> str:
        """The engine that will read ``node`` (``readers``: by reader processes); refuses ``cache='direct'`` where the
        chunk engine cannot read it."""
        engine = resolve_engine(self._asked, node, self.open_kwargs, dataset, readers)
        if self.cache == "direct" and engine != "chunks":
            raise ValueError(
                f"cache='direct' needs the chunk engine, which cannot read {node.path!r} in {node.filename!r} "
                f"(it would be read by {engine!r})"
            )
        return engine

    def resolve_each(self, nodes: "list[NodeInfo]") -> "list[str]":
        """:meth:`resolve` of each of ``nodes``, PyTables tried on all their files in one probe (``checked_together``)."""
        with checked_together(self._asked, nodes, self.open_kwargs):
            return [self.resolve(node) for node in nodes]

    def engine_for_readers(self, node: NodeInfo, engine: str, readers: int, dataset: Any = None) -> str:
        """The engine that reads ``node`` once the plan gives it ``readers`` processes: ``engine`` (as :meth:`resolve`
        chose it), or one faster in reader processes than in the consumer (NOTE [read plan]; blosc: the chunk engine).

        The plan made for ``engine`` stands: it prices the two engines alike on the filters where readers change
        ``auto``'s choice (``READER_WIN_FILTERS``: the plan's decode rates tell engines apart on deflate only)."""
        if not readers or not readers_may_change(self._asked, node, self.open_kwargs, opened=dataset is not None):
            return engine
        return self.resolve(node, dataset, readers=True)

    @property
    def _asked(self) -> str:
        """The engine to resolve: ``engine``, except that O_DIRECT is the chunk engine's alone: with it, ``auto`` asks
        that engine first even where h5py would be chosen for speed (blosc), rather than refuse a node it reads."""
        return "chunks" if self.cache == "direct" and self.engine == "auto" else self.engine

    @property
    def machine(self) -> Machine:
        """The machine the plans are made for: this process's CPUs and the readers' start method."""
        return Machine.here(self.start_method)

    def open_queue(self, spec: StreamSpec, whole: bool = False) -> Queue:
        """Start reading ``spec``: its readers, or in this process; ``whole``: its queue gives the blocks read, though
        each holds several of the caller's (for rows: NOTE [read plan])."""
        return Queue(spec, self.open_kwargs, self.start_method, whole)

    def read_rows(self, node: NodeInfo, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of ``node``, read here into a fresh array (a source opened and closed for them)."""
        out = np.empty((stop - start,) + node.row_shape, node.dtype)
        if len(out):
            self._read(self.resolve(node), node, start, out)
        return out

    def measure_rate(self, node: NodeInfo, engine: str) -> "float | None":
        """The rate (uncompressed bytes a second) at which ``engine`` reads ``node`` in this process: its first whole
        chunks (``_plan.costs.rate_sample_rows``), read twice and the second read timed, so that the disk is out of
        it (``DatasetShape.decode_rate``; the plan asks for it only where its answer turns on it). None where the read
        took no measurable time, where the chunks are too large to sample, and for other engines than the chunk
        engine: h5py and PyTables keep decoded chunks in HDF5's chunk cache, so that the second read decodes nothing
        (h5py "read" smooth blosc 3 at 25-36 GB/s so)."""
        rows = rate_sample_rows(node.n_rows, node.row_nbytes, node.chunk_rows)
        if engine != "chunks" or not rows:
            return None
        out = np.empty((rows,) + node.row_shape, node.dtype)
        seconds = self._read(engine, node, 0, out, times=2)  # the first: the disk's part, and the pages of ``out``
        return out.nbytes / seconds if seconds > 0 else None

    def _read(self, engine: str, node: NodeInfo, start: int, out: np.ndarray, times: int = 1) -> float:
        """Read ``len(out)`` rows of ``node`` from ``start`` into ``out``, ``times`` times, through a source opened and
        closed for them; the seconds the last read took."""
        source = open_source(engine, node, self.open_kwargs, cache=self.cache)
        try:
            for _ in range(times):
                began = time.perf_counter()
                source.read_into(start, start + len(out), out)
            return time.perf_counter() - began
        finally:
            source.close()

    def queue_over(
        self,
        node: NodeInfo,
        engine: str,
        blocks: "RangePlan | GrowingPlan",
        n_procs: int,
        read_ahead: "int | None" = None,
        transform: "Transform | None" = None,
        *,
        table: int = 0,
        most_blocks: "int | None" = None,
        held: float = 0.0,
    ) -> Queue:
        """An ordered queue over explicitly planned blocks of ``node`` (for the training layer; ``n_procs=0`` reads here).

        ``node`` and ``engine``: as inspected and resolved when the training
        layer was made; the readers check the file is still that one. A
        :class:`~multitables._plan.blocks.GrowingPlan` makes a stream that
        takes more blocks as it goes, through a block table of ``table``
        entries (NOTE [readers across epochs] in ``_procs.stream``). ``held``: the share of its slots that its
        caller may hold at once, which a default ``read_ahead`` adds (``_plan.readers.plan_blocks``).
        """
        if blocks.stops and max(blocks.stops) > node.n_rows:
            raise ValueError(f"the plan reads up to row {max(blocks.stops)} but {node.path!r} has {node.n_rows} rows")
        dtype, row_shape = delivered(node, transform)
        read = plan_blocks(
            blocks, self.machine, n_procs=n_procs, read_ahead=read_ahead, table=table, most_blocks=most_blocks,
            remote=DatasetShape.of(node).remote, slot_bytes=blocks.block_size * dtype.itemsize * int(np.prod(row_shape)),
            shm_free=shared_memory_free() if n_procs and read_ahead is None else None, held=held,
        )
        return self.open_queue(StreamSpec(node, engine, read, True, self.cache, transform))
