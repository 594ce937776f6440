"""The chunk engine in the registry (:mod:`multitables._io.engines`): what it reads, where ``auto`` prefers it, how it opens."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any

from ..._sys.forks import renew_lock_in_children
from ..node import NodeInfo
from ..scattered import GroupRows, rows_decoded_bytes
from ..vlen import VLEN_PROBLEM
from .pread import CACHES
from .source import ChunkSource
from .storage import chunks_problem, known_layout
from .transport import ScratchBuffer

#: Filters whose pipelines the chunk engine decodes clearly faster than h5py
#: (one core, same run): deflate + shuffle 2.1-2.3x (2.7x in the benchmark's
#: warm run, BENCHMARKS.md), deflate alone 1.55x,
#: lzf + shuffle 2.3x. With blosc, lz4, zstd and bitshuffle it was 1.0-1.2x
#: on large files and 0.5-0.6x on 4 MB ones (its set-up costs more than
#: HDF5's), so ``auto`` leaves those to h5py in the consumer.
WIN_FILTERS = frozenset({1, 32000})
#: Filters the chunk engine reads faster than the h5py engine in reader
#: processes. Blosc 3 + shuffle, 2 GiB of smooth rows, 16 cores (issue #29's
#: lent machine): one reader 0.99x one h5py process against 0.55x, 16 readers
#: 4.96x against 3.32x; here, two readers, within noise of each other (1.34x
#: and 1.41x, BENCHMARKS.md), and in the consumer the h5py engine is ahead
#: (0.98x against 0.92x of one h5py process, 256 MiB). A Reader's requests of 1-4,096 rows, in reader processes or
#: in this process: 1.20-1.88x the h5py engine's rows/s (geometric means; single request shapes 0.33-13x).
READER_WIN_FILTERS = frozenset({32001})
#: Decoded bytes of a chunk from which reader processes' streams of :data:`READER_WIN_FILTERS` are the chunk engine's.
#: Blosc decodes as fast here as in HDF5, so the engine wins by reading the stored bytes of many chunks at once and
#: loses by its Python around each chunk (~3 us more than HDF5's, a tile's chunk-row copied at once,
#: :mod:`multitables._io.chunks.tiles`). Blosc 5 + shuffle, uint16 images of 512 x 512 in tiles, one process, CPU a
#: pass against h5py's (medians of 3): 8 KiB chunks 1.29x, 32 KiB 1.14x, 128 KiB 1.01x, 256-512 KiB 0.76-1.02x;
#: PyTables' 4 MiB chunks of 4 KiB rows are where two readers gained (above). A Reader's requests are measured apart.
READER_CHUNK_BYTES = 128 << 10
#: Decoded bytes up to which a chunked dataset described just now, in the consumer, is left to h5py: it reads through
#: the open that described it, where this engine would first learn the layout (~50 us) and set up its pipeline. First
#: reads of zlib-3 files (scratch, 40 files a size): 1 KiB 1.62x h5py's time, 6 KiB 1.58x, 62 KiB 1.28x, 250 KiB
#: 0.89x, 1 MiB 0.62x. The next stream of the file finds it described, learns the layout, and reads no HDF5 again.
FIRST_LOOK_BYTES = 64 << 10


#: Decoded bytes of a chunk below which ``auto`` leaves a stream to h5py: the chunk engine's Python around each chunk
#: (~15 us) costs more than HDF5's. zlib 3 + shuffle, one process, CPU seconds a pass (fresh interpreters, medians of
#: 2): PyTables' one-row chunks of 24-byte rows 4.08 against h5py's 2.40, 10M float32 in 256-byte chunks 3.0-3.65
#: against 1.9-2.1; 1 KiB chunks 0.85 against 0.93, 4 KiB 0.31-0.34 against 0.36, 8 KiB tiles 0.83 against 1.16.
SMALL_CHUNK_BYTES = 1 << 10


#: Verdicts of the engine's check kept (a few hundred bytes each): a set of this many files is checked with one HDF5 open
#: each, the inspection's (NOTE [file sets] in ``_io.fileset``).
VERDICTS_KEPT = 1 << 15

_VERDICTS: "OrderedDict[tuple[Any, str], str | None]" = OrderedDict()
_VERDICTS_LOCK = threading.Lock()
renew_lock_in_children(globals(), "_VERDICTS_LOCK")


def _verdict_key(node: NodeInfo) -> "tuple[Any, str] | None":
    """What a verdict on ``node`` is kept under: the identity of the local file described and the dataset's path (None:
    an object, a file open for SWMR reading, a link into another file, whose layouts are kept otherwise or not)."""
    if node.identity is None or node.linked_file is not None or node.remote is not None:
        return None
    return (node.identity, node.path)


def forget_verdicts() -> None:
    """Forget the verdicts kept (``_io.fileset.forget_learned``)."""
    with _VERDICTS_LOCK:
        _VERDICTS.clear()


def _chunk_nbytes(node: NodeInfo) -> int:
    """Decoded bytes of one chunk of ``node`` (chunked), as delivered: its rows' bytes, times the part of a row it holds
    (``row_shape`` ends with an element's own dimensions, which no chunk splits)."""
    chunks = node.chunk_shape or (node.chunk_rows or 1,)
    split = tuple(node.row_shape[: len(chunks) - 1])
    return (node.chunk_rows or 1) * node.row_nbytes * math.prod(chunks[1:]) // max(1, math.prod(split))


class ChunkEngine:
    """The chunk engine (:class:`~multitables._io.engines.Engine`): reads the stored chunks itself (:mod:`multitables._io.chunks.source`).

    Named, it reads what it can and leaves the rest to ``auto``'s walk
    (``falls_back``): the stream then reports the engine that really reads.
    """

    name = ChunkSource.engine
    title = "the chunk engine"
    caches = CACHES
    options = None  # it reads the file itself
    falls_back = True

    def preferred(self, node: NodeInfo, in_set: bool = False, readers: bool = False, opened: bool = False,
                  requests: bool = False) -> bool:
        """Where ``auto`` should take it ahead of h5py (when it reads ``node``): measured faster there.

        Contiguous data is one read into the block (1.37x h5py); a file of a
        set is reopened every block of a shuffled epoch, which costs this
        engine a stat and an ``open`` (NOTE [layout cache] in ``_io.chunks.storage``)
        where h5py opens the HDF5 file again (blosc 3, 32 shards of 4 MiB,
        warm: shards read 1.00x one file with the chunk engine, 0.91x with h5py).
        An object (a URL) it reads with merged ranged requests in flight, where
        h5py asks for a chunk at a time through a file object: many times faster
        whatever the filters (BENCHMARKS.md, object storage). Read by reader
        processes, or a Reader's requests, also blosc (:data:`READER_WIN_FILTERS`); a Reader's requests also chunks with
        no filter, whose rows it reads as stored (random 4 KiB rows of PyTables' 128-row chunks: 6.6x h5py, which read
        each whole chunk; a stream of them by two readers took h5py, 0.78-0.91x). Not a small chunked dataset at a first
        look (:data:`FIRST_LOOK_BYTES`), nor a stream of small chunks (:data:`SMALL_CHUNK_BYTES`), nor readers' stream of
        blosc chunks too small to earn their Python back (:data:`READER_CHUNK_BYTES`).
        """
        if in_set or node.chunk_rows is None or node.remote is not None:
            return True
        if opened and not readers and node.n_rows * node.row_nbytes <= FIRST_LOOK_BYTES and known_layout(node) is None:
            return False
        if requests and not node.filter_ids:
            return True
        if not requests and _chunk_nbytes(node) < SMALL_CHUNK_BYTES:
            return False
        wins = WIN_FILTERS
        if readers and (requests or _chunk_nbytes(node) >= READER_CHUNK_BYTES):
            wins = wins | READER_WIN_FILTERS
        return bool(wins.intersection(node.filter_ids))

    def problem(self, node: NodeInfo, open_kwargs: "dict[str, Any]", dataset: Any = None) -> "str | None":
        """Why the chunk engine cannot read ``node`` (:func:`~multitables._io.chunks.storage.chunks_problem`); None: it can.

        ``dataset``: the node's open ``h5py.Dataset``, spared a second open (it
        stays open); what is learned of its layout is remembered for the
        readers (NOTE [layout cache]). The verdict is kept under the file's
        identity, a file just written's too, whose layout is not: a set's
        inspection asks with each file open, its resolution asks again
        (NOTE [file sets]). A verdict gone stale in the gap of the identity
        costs no row: an open that finds what this engine cannot read
        leaves the file to another engine (:func:`~multitables._io.engines.open_source`).
        """
        if open_kwargs:
            return f"it takes no open options (the 'h5py' and 'tables' engines do), got {sorted(open_kwargs)}"
        if node.vlen:
            return VLEN_PROBLEM
        key = _verdict_key(node)
        if key is not None and dataset is None:
            with _VERDICTS_LOCK:
                if key in _VERDICTS:
                    _VERDICTS.move_to_end(key)
                    return _VERDICTS[key]
        why = chunks_problem(node, dataset)
        if key is not None:
            with _VERDICTS_LOCK:
                _VERDICTS[key] = why
                if len(_VERDICTS) > VERDICTS_KEPT:
                    _VERDICTS.popitem(last=False)
        return why

    def open(self, node: NodeInfo, open_kwargs: "dict[str, Any]", plan: Any = None, dataset: Any = None, *,
             cache: str = "page", scratch: "ScratchBuffer | None" = None) -> ChunkSource:
        """:class:`~multitables._io.chunks.source.ChunkSource`; raises :class:`~multitables._io.node.Unsupported` for what it cannot read."""
        return ChunkSource(node, cache, dataset, scratch=scratch)

    def open_rows(self, node: NodeInfo, open_kwargs: "dict[str, Any]") -> GroupRows:
        return GroupRows(ChunkSource(node, decoded_bytes=rows_decoded_bytes(node)), node)


#: The chunk engine.
ENGINE = ChunkEngine()
