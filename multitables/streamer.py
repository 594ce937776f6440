"""Streaming a dataset: the :class:`Streamer`, its direct-access :class:`Queue` and the row generator.

NOTE [lent blocks]
    The generator yields the rows of the readers' slots themselves: copying
    each block out first took the consumer's time from the cores the
    readers decode on (measured in BENCHMARKS.md). A slot is lent: it
    goes back to the readers once no row of it is alive. Every row is a
    view of one array made for that block (``Ring.lend``), so that array's
    reference count says whether the caller still holds a row
    (``_sys.refs``); it is checked for each lent block whenever the next
    block comes.
    At most ``_LENT_BLOCKS`` are lent at once, and never every slot: the
    block being yielded and the one before, whose last row a ``for``
    loop's name still holds. A caller who keeps rows (``list(gen)``)
    pins the blocks lent so far; from then on blocks are copied into two
    private buffers in turn, so the readers are never starved of slots.
    The last block of a pass is always copied: after the loop its last
    row is still bound, and should not hold the ring. Rows the caller
    still holds when the ring closes stay valid: their slots are moved
    to private memory then (NOTE [segment lifetime] in ``_shm.segment``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Any, Generator, Iterator, Sequence, TypeAlias, cast, overload

import numpy as np

from ._sys.checks import check_bool, check_int
from ._sys.copies import copy_rows
from ._sys.forks import note_forgone
from ._sys.refs import held_elsewhere
from ._sys.signals import signals_deferred
from .batches import Batches
from ._train.batch import refuse_dataloader_keywords
from ._stream.backends import empty_block
from ._stream.options import StreamOptions
from ._stream import queue as _queue
from ._stream.queue import Guard, Queue
from ._stream.rows import RowIterator, walked
from ._procs.stream import StreamSpec
from ._io.chunks.source import CACHES
from ._io.engines import check_engine, check_open_options
from ._io.names import as_files
from ._io.node import close_dataset
from ._io.objects.config import make_store
from ._io.objects.urls import is_url
from ._plan.readers import DatasetShape, plan_stream, rate_decides, would_save_s
from ._procs.pool import check_start_method
from ._shm.space import shared_memory_free

__all__ = ["Streamer", "Queue", "Guard"]


def _names_url(filename: Any) -> bool:
    """Whether ``filename`` (a name, or a list of names) names an object (``s3://``, ``http(s)://``)."""
    if isinstance(filename, (list, tuple)):
        return any(is_url(name) for name in filename)
    return is_url(filename)


#: Blocks the generator lends at most at once (NOTE [lent blocks]): the one it yields and the one
#: before, whose last row a ``for`` loop's name still holds when the next block's first row comes.
_LENT_BLOCKS = 2


#: The row iterators of the blocks being walked of every generator whose rows come from readers (a ring), by id:
#: a forked child must not go on walking them (NOTE [forked children] in ``_procs.pool``).
_WALKED_FROM_READERS: "dict[int, list[Iterator[np.ndarray]]]" = {}


def _end_walks_in_child() -> None:
    """In a forked child: end the block each ring-backed generator is walking, so that its next ``next()`` asks the
    queue, which raises the ``RuntimeError`` of a fork. The block's rows are the parent's slot (``Ring.lend``), which
    the parent gives back to its readers once it moves on: rows walked here from then on would be another block's,
    silently."""
    for active in list(_WALKED_FROM_READERS.values()):
        for rows in active:
            move = getattr(rows, "__setstate__", None)  # an iterator over the block's rows: its position
            if move is not None:
                move(sys.maxsize - 1)  # past the rows: the next step ends it, and it lets the block go
                next(rows, None)


os.register_at_fork(after_in_child=_end_walks_in_child)


def _rows_alive(entry: "tuple[Guard, np.ndarray]") -> bool:
    """Whether a row of a lent block (``(guard, base of its rows)``) is still alive somewhere."""
    return held_elsewhere(entry, 1)


def _give_back_unused(lent: "list[tuple[Guard, np.ndarray]]") -> "list[tuple[Guard, np.ndarray]]":
    """Release the lent blocks of which no row is alive any more; return the others."""
    kept = []
    for entry in lent:
        if _rows_alive(entry):
            kept.append(entry)
        else:
            entry[0].release()
    return kept


class Streamer:
    """Streams datasets of an HDF5 file, or of a set of files, through parallel reader processes.

    Parameters
    ----------
    filename : str, bytes, os.PathLike, or a list of them
        The HDF5 file (written by PyTables, h5py or anything else producing
        HDF5). A list of files, or a glob pattern (``"train-*.h5"``, its
        matches in sorted order), is one dataset: each node's rows are the
        files' rows in turn, in every access mode. Each file must hold the
        node with the same dtype and row shape; one that does not is
        refused, by name, before any reader starts. Readers keep a few files
        open at a time, however many there are. A ``file://`` URL is a local
        file. Readers open files by name: an open h5py or PyTables object,
        or a file object, is refused (``TypeError``) saying which name and
        path to pass.
    engine : {"auto", "chunks", "h5py", "tables"}
        What the readers decode with. ``chunks`` reads the stored chunks
        itself and decodes them straight into the slots (zlib + shuffle 2.7x
        h5py's rate per core). ``h5py`` uses hdf5plugin's filters and
        decodes zlib 1.8x and blosc 2.3x faster per core than the PyTables
        wheel. ``auto`` takes ``chunks`` where it reads the node and was
        measured faster (deflate and lzf, contiguous storage), else h5py, and
        PyTables when PyTables open options are given or only PyTables reads
        the dataset. :attr:`Queue.engine` says which engine reads. Every
        engine delivers what h5py's ``dataset[()]`` gives, or refuses the
        dataset before any reader starts (:class:`MissingFilterError` for a
        filter nothing here decodes).
    cache : {"page", "direct"}
        ``direct`` reads chunk bytes with ``O_DIRECT``, past the page cache
        (chunk engine only; with the stock wheels, no HDF5 rebuild needed).
    start_method : str, optional
        The multiprocessing start method for the readers (``fork``,
        ``spawn``, ``forkserver``); default: multiprocessing's default.
    storage_options : dict, optional
        For files given as URLs (``s3://bucket/path/train-*.h5``,
        ``https://host/file.h5``): ``endpoint_url``, ``region``, ``key``,
        ``secret``, ``token``, ``anon``, ``profile``, ``cache_dir`` and
        ``cache_size`` (a local cache for the epochs after the first), and
        how requests are made. Without them, the endpoint, region and
        credentials come from the environment (``AWS_ENDPOINT_URL``,
        ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``...), as the
        usual S3 clients read them. See :doc:`object_storage`.
    **open_kwargs
        Passed to the engine's open call, as in the established API (for
        PyTables: e.g. ``DRIVER='H5FD_CORE'``). With ``engine`` ``auto`` or
        ``tables`` they are PyTables'; one it does not know (which it would
        ignore) is warned of.
    """

    # The established API had the queue class here. Named through its module: ``Queue = Queue`` reads to a type
    # checker as an alias of itself, and every ``-> Queue`` below as no type at all.
    Queue: TypeAlias = _queue.Queue

    def __init__(
        self,
        filename: "str | bytes | os.PathLike[str] | os.PathLike[bytes] | list[Any] | tuple[Any, ...]",
        *,
        engine: str = "auto",
        cache: str = "page",
        start_method: "str | None" = None,
        storage_options: "dict[str, Any] | None" = None,
        **open_kwargs: Any,
    ) -> None:
        store = make_store(storage_options) if storage_options is not None or _names_url(filename) else None
        files = as_files(filename, store)
        self._options = StreamOptions(files, engine, cache, start_method, open_kwargs, store)
        check_engine(engine)
        check_open_options(engine, open_kwargs, stacklevel=2)
        if cache not in CACHES:
            raise ValueError(f"cache={cache!r} is not one of {CACHES}")
        if cache == "direct" and _names_url(files):
            raise ValueError("cache='direct' reads local files past the page cache; URLs are read by ranged requests")
        if cache == "direct" and engine not in ("auto", "chunks"):
            raise ValueError(f"cache='direct' needs the chunk engine (engine='auto' or 'chunks'), not engine={engine!r}")
        check_start_method(start_method)

    def __repr__(self) -> str:
        o = self._options
        settings = (("engine", o.engine, "auto"), ("cache", o.cache, "page"), ("start_method", o.start_method, None))
        asked = [f"{name}={value!r}" for name, value, default in settings if value != default]
        return f"<multitables.Streamer {', '.join([repr(o.named)] + asked)}>"

    @property
    def filename(self) -> "str | tuple[str, ...]":
        """The HDF5 file's name, from the root for a local file (as the working directory was when the Streamer was
        made); for a set, its files in row order (a pattern's matches)."""
        return self._options.files

    @property
    def options(self) -> StreamOptions:
        """How this streamer opens its files (engine, cache, start method, open options), which its streams share."""
        return self._options

    def _spec(
        self,
        path: str,
        n_procs: "int | None",
        read_ahead: "int | None",
        cyclic: bool,
        block_size: "int | None",
        ordered: bool,
        field: "str | None",
        remainder: bool,
        rows_only: bool = False,
    ) -> StreamSpec:
        """Check every argument and the node, and plan the stream; starts nothing."""
        n_procs = check_int("n_procs", n_procs, 0)
        read_ahead = check_int("read_ahead", read_ahead, 1, established=True)
        block_size = check_int("block_size", block_size, 1)
        cyclic = check_bool("cyclic", cyclic)
        ordered = check_bool("ordered", ordered)
        remainder = check_bool("remainder", remainder)
        options = self._options
        node, dataset = options.open_files(path, field)
        try:
            engine = options.resolve(node, dataset)
            shape, machine = DatasetShape.of(node), options.machine
            if n_procs is None and rate_decides(shape, engine, machine):  # NOTE [read plan]: measured, not assumed
                shape = dataclasses.replace(shape, decode_rate=options.measure_rate(node, engine))
            plan = functools.partial(
                plan_stream, shape, engine, machine, n_procs=n_procs, block_size=block_size, read_ahead=read_ahead,
                cyclic=cyclic, remainder=remainder, rows_only=rows_only,
            )  # fmt: skip
            read = plan()
            if n_procs is None:
                note_forgone(would_save_s(shape, engine, machine))  # NOTE [fork server] in _sys.forks
            if read.n_procs and (block_size is None or read_ahead is None or read.split_rows):
                # A ring of defaults, or of blocks read together: fit it (NOTE [read plan]).
                read = plan(shm_free=shared_memory_free())
            engine = options.engine_for_readers(node, engine, read.n_procs, dataset)
        except BaseException:
            close_dataset(dataset)
            raise
        if read.n_procs or engine not in ("h5py", "chunks"):
            close_dataset(dataset)  # readers open their own
            dataset = None
        return StreamSpec(node, engine, read, ordered, options.cache, dataset=dataset)

    def get_queue(
        self,
        path: str,
        n_procs: "int | None" = None,
        read_ahead: "int | None" = None,
        cyclic: bool = False,
        block_size: "int | None" = None,
        ordered: bool = False,
        field: "str | None" = None,
        remainder: bool = False,
    ) -> Queue:
        """Start readers on the dataset at ``path`` and return a :class:`Queue` of its blocks.

        Parameters
        ----------
        path : str
            The node in the file: an Array, CArray, EArray or Table.
        n_procs : int, optional
            Reader processes; 0 reads the blocks in this process. Default: the
            CPUs this process may use (those it may run on, at most its
            container's CPU quota, its share where torchrun, a launcher, a
            shell or a pool started several like it on those CPUs: NOTE [CPU
            siblings] in ``multitables._sys.siblings``), or none at all
            when starting them would cost more than they save: small
            datasets, one CPU, the fork
            server's first start (NOTE [read plan] in
            ``multitables._plan.readers``, NOTE [fork server] in
            ``multitables._sys.forks``). Capped at 4 per usable CPU
            and at the blocks of a pass (not cyclic); :attr:`Queue.n_procs`
            says how many run.
        read_ahead : int, optional
            Slots in the ring (blocks in flight). Default ``2 * n_procs + 2``,
            fewer (down to ``n_procs + 1``) where the ring would take more than
            half of the shared memory free; 4 buffers where the blocks are read
            in this process.
        cyclic : bool
            Wrap at the end forever; the block spanning the end holds the last
            rows followed by the first ones. Stop with :meth:`Queue.close`.
        block_size : int, optional
            Rows per block. Default: whole chunks near 4 MiB (1 MiB for
            contiguous datasets), fewer for small datasets, and where the
            fewest slots of such blocks would not fit in half of the shared
            memory free (a container's: Docker gives 64 MiB).
        ordered : bool
            Deliver blocks in on-disk order (else in the order they finish).
        field : str, optional
            For a Table: stream this column only (in a nested column, PyTables'
            path to one: ``'outer/inner'``).
        remainder : bool
            Also deliver the last, short block (``len % block_size`` rows);
            otherwise get it with :meth:`get_remainder`.

        Returns
        -------
        Queue
            Owns the reader processes and the shared memory; close it (or use
            it in a ``with``) when done.
        """
        spec = self._spec(path, n_procs, read_ahead, cyclic, block_size, ordered, field, remainder)
        return self._options.open_queue(spec)

    def get_generator(
        self,
        path: str,
        n_procs: "int | None" = None,
        read_ahead: "int | None" = None,
        cyclic: bool = False,
        block_size: "int | None" = None,
        ordered: bool = False,
        field: "str | None" = None,
        remainder: bool = True,
    ) -> RowIterator:
        """Iterate over the rows of ``path``: every row once per pass, remainder included.

        Rows are yours: safe to keep and to change, and nothing overwrites
        them while any row of their block is alive. They are views of the
        block they came from: of the readers' slot itself while you hold no
        more than a block or two (the slot returns to the readers once every
        row of it is gone), else of a private copy (NOTE [lent blocks]); a
        row kept keeps its whole block alive, so keep ``row.copy()`` of a few.
        Arguments as for :meth:`get_queue`; they are checked now, and the
        readers start at the first ``next()``. A ``block_size`` of less than
        1 MiB of rows is read several blocks at a time (the rows, their order
        and the remainder left out are the same). Closing the generator (or
        dropping it) stops them.
        """
        spec = self._spec(path, n_procs, read_ahead, cyclic, block_size, ordered, field, remainder, rows_only=True)
        active: "list[Iterator[np.ndarray]]" = []
        n_rows = spec.read.blocks.pass_rows  # type: ignore[union-attr]  # a stream's plan is a BlockPlan
        return RowIterator.over(self._blocks(spec, active), active, f"{path!r} of {self._options.named!r}", n_rows)

    def _blocks(
        self, spec: StreamSpec, active: "list[Iterator[np.ndarray]]"
    ) -> "Generator[Iterator[np.ndarray], None, None]":
        """An iterator over the rows of each block in turn, also held in ``active`` while the caller walks it."""
        queue = self._options.open_queue(spec, whole=True)
        if queue.n_procs == 0:
            with queue:
                # Read in this process: the blocks are private already, and the
                # backend never refills one whose rows someone holds. A copy
                # would cost ~10% of reading a small file.
                for guard in walked(queue):
                    if not isinstance(guard, Guard):  # rows that raise a signal handler's exception
                        yield guard
                        continue
                    with guard as block:
                        rows = block
                    del block
                    active.append(iter(rows))
                    del rows
                    yield active[0]
                    active.clear()
            return
        # Lend the slots themselves while the caller keeps no more than
        # _LENT_BLOCKS of them, and never all (NOTE [lent blocks]).
        lent: "list[tuple[Guard, np.ndarray]]" = []
        # Otherwise two private copies in turn: reuse the older one's memory
        # unless the caller kept one of its rows (every row is a view
        # holding a reference to it); a fresh 4 MiB array page-faults on
        # every block. (The caller's loop variable still holds the newer
        # one's last row.)
        copies: "list[np.ndarray | None]" = [None, None]
        turn = 0
        try:  # from here no call until it (a handler's exception before the finally left the queue to its finalizer)
            lendable = min(_LENT_BLOCKS, spec.read.read_ahead - 1)
            _WALKED_FROM_READERS[id(active)] = active
            for guard in walked(queue):
                if not isinstance(guard, Guard):  # rows that raise a signal handler's exception
                    yield guard
                    continue
                lent = _give_back_unused(lent)
                if len(lent) < lendable and not queue.at_end:
                    rows = queue.lend(guard)
                    lent.append((guard, cast(np.ndarray, rows.base)))  # every row's base: Ring.lend's flat array
                    del guard
                else:
                    with guard as block:
                        # copies[turn] is bound to no name (held_elsewhere counts them), so mypy cannot narrow it
                        if copies[turn] is None or held_elsewhere(copies, turn) or len(copies[turn]) < len(block):  # type: ignore[arg-type]
                            copies[turn] = empty_block(spec)
                        rows = copies[turn][: len(block)]  # type: ignore[index]  # not None: set just above
                        copy_rows(rows, block)  # NOTE [structured copies]
                    del block
                    turn ^= 1
                active.append(iter(rows))
                del rows
                yield active[0]
                active.clear()
        finally:
            # Close with every lent slot still lent (given back now, one could be
            # refilled before the readers stop), having dropped the arrays of
            # those with no row alive: closing moves only the others to private
            # memory (NOTE [lent blocks]). Releasing the guards after the close
            # is a no-op. A dropped generator runs this as a finalizer, where a
            # signal's exception would be dropped, and the clean-up cut short.
            with signals_deferred(later=True):
                _WALKED_FROM_READERS.pop(id(active), None)
                active.clear()
                guards = [entry[0] for entry in lent]
                lent = [entry for entry in lent if _rows_alive(entry)]
                queue.close()
                # Dropped here, its objects end under the hold too: their finalizers (a pipe's, a semaphore's entry
                # in a registry) run Python code, where a handler's exception is dropped.
                guard = None  # type: ignore[assignment]  # a lent guard not yet recorded holds the queue
                del guards, lent, guard, queue

    # The keywords, and the kind of batch each call gives, as Batches.__init__'s overloads say (a type checker's view).
    # A str is also a Sequence[str]: the first overload takes it, as Batches does.
    # fmt: off
    @overload
    def get_batches(self, paths: str, batch_size: int, *, shuffle: bool = True,  # type: ignore[overload-overlap]
                    seed: int = 0, drop_last: bool = False, n_procs: int | None = None, rank: int | None = None,
                    world_size: int | None = None, block_size: int | None = None, window: int | None = None,
                    read_ahead: int | None = None, field: str | None = None, fields: None = None, indices: Any = None,
                    weights: Any = None, num_samples: int | None = None, epochs: int | None = 1,
                    transform: Any = None) -> Batches[np.ndarray]: ...
    @overload
    def get_batches(self, paths: str, batch_size: int, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                    n_procs: int | None = None, rank: int | None = None, world_size: int | None = None,
                    block_size: int | None = None, window: int | None = None, read_ahead: int | None = None,
                    field: None = None, fields: Sequence[str], indices: Any = None, weights: Any = None,
                    num_samples: int | None = None, epochs: int | None = 1,
                    transform: Any = None) -> Batches[dict[str, np.ndarray]]: ...
    @overload
    def get_batches(self, paths: Sequence[str], batch_size: int, *, shuffle: bool = True, seed: int = 0,
                    drop_last: bool = False, n_procs: int | None = None, rank: int | None = None,
                    world_size: int | None = None, block_size: int | None = None, window: int | None = None,
                    read_ahead: int | None = None, field: None = None, fields: None = None, indices: Any = None,
                    weights: Any = None, num_samples: int | None = None, epochs: int | None = 1,
                    transform: Any = None) -> Batches[tuple[np.ndarray, ...]]: ...
    @overload
    def get_batches(self, paths: str, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                    drop_last: bool = False, n_procs: int | None = None, rank: int | None = None,
                    world_size: int | None = None, block_size: int | None = None, window: int | None = None,
                    read_ahead: int | None = None, field: None = None, fields: Sequence[str] | None = None,
                    indices: Any = None, weights: Any = None, num_samples: int | None = None, epochs: int | None = 1,
                    transform: Any = None) -> Batches[np.ndarray | dict[str, np.ndarray]]: ...
    # fmt: on

    def get_batches(self, paths: "str | Sequence[str]", batch_size: int, **kwargs: Any) -> "Batches[Any]":
        """Batches of rows of ``paths`` (equal lengths) for training loops: shuffled, sharded, resumable.

        See :class:`multitables.Batches` for the arguments. A single array per
        batch for one path (a string), a tuple of them for a sequence of paths,
        a dict of columns with ``fields``. ``DataLoader``'s keywords (``num_workers``, ``sampler``...) raise
        ``TypeError`` saying what takes their place.
        """
        refuse_dataloader_keywords(kwargs)
        return Batches(self, paths, batch_size, **kwargs)

    def get_remainder(self, path: str, block_size: "int | None" = None, field: "str | None" = None) -> np.ndarray:
        """The last ``len % block_size`` rows of ``path`` (empty when ``block_size`` divides the length), read here.
        ``block_size`` None: the one ``get_queue(path, field=field)`` takes by default (2.x's default too)."""
        block_size = check_int("block_size", block_size, 1)
        if block_size is None:
            spec = self._spec(path, None, None, False, None, False, field, False)
            close_dataset(spec.dataset)
            block_size = spec.read.block_size
        node = self._options.inspect(path, field)
        return self._options.read_rows(node, block_size * (node.n_rows // block_size), node.n_rows)
