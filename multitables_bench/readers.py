"""The ways of reading one whole file, each calling ``progress(rows)`` as it goes.

The O_DIRECT read (the disk's ceiling), one process reading in order as a
user without multitables would (:func:`read_single`), and multitables itself
(:func:`read_multitables`); :func:`probe_multitables` asks what multitables
would pick without reading.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from multitables_bench import cache as pagecache
from multitables_bench.cache_modes import open_kwargs_for
from multitables_bench.files import h5py_with_filters
from multitables_bench.records import Reader, Target

#: Generator rows counted between progress-bar updates (updating per row would cost more than the read).
PROGRESS_STEP = 1024


def engine_can_read(target: Target, engine: str) -> "str | None":
    """None if ``engine`` decodes the target's dataset here, else why not."""
    try:
        _read_rows(target, engine, {}, 1, _buffer(target, 1), lambda n: None, stop=1)
    except Exception as exc:  # a missing filter surfaces as OSError, ValueError or HDF5ExtError
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _buffer(target: Target, block_size: int) -> np.ndarray:
    """Rows of the target's shape and dtype, ``block_size`` of them."""
    return np.empty((block_size, *target.row_shape), target.dtype)


def _read_rows(
    target: Target,
    engine: str,
    open_kwargs: dict[str, str],
    block_size: int,
    buffer: np.ndarray,
    progress: Callable[[int], None],
    stop: "int | None" = None,
) -> int:
    """Read the target's dataset in order, ``block_size`` rows at a time, into ``buffer``; return the rows read."""
    path = target.path
    if engine == "chunks":
        from multitables._io.engines import open_source
        from multitables._io.node import inspect_node

        node = inspect_node(path, target.node)
        src = open_source("chunks", node, {}, cache=open_kwargs.get("cache", "page"))
        try:
            if src.engine != "chunks":
                raise ValueError(f"the chunk engine cannot read {path} (it would fall back to {src.engine})")
            return _read_blocks(src.read_into, stop or node.n_rows, block_size, buffer, progress)
        finally:
            src.close()
    if engine == "h5py":
        with h5py_with_filters().File(path, "r", **open_kwargs) as f:
            ds = f[target.node]
            read = lambda a, b, out: ds.read_direct(out, np.s_[a:b])  # noqa: E731
            return _read_blocks(read, stop or ds.shape[0], block_size, buffer, progress)
    import tables

    with tables.open_file(path, "r", **open_kwargs) as f:
        node = f.get_node(target.node)
        return _read_blocks(lambda a, b, out: node.read(a, b, out=out), stop or node.nrows, block_size, buffer, progress)


def _read_blocks(
    read: Callable[[int, int, np.ndarray], Any], n_rows: int, block_size: int, buffer: np.ndarray, progress: Callable[[int], None]
) -> int:
    for start in range(0, n_rows, block_size):
        stop = min(start + block_size, n_rows)
        read(start, stop, buffer[: stop - start])
        progress(stop - start)
    return n_rows


def read_odirect(target: Target, progress: Callable[[int], object]) -> float:
    """The file's raw bytes with O_DIRECT, past the page cache: bytes/s."""
    return pagecache.odirect_read_rate(target.path, progress=progress)


def read_single(target: Target, reader: Reader, cache: str, block_size: int, progress: Callable[[int], None]) -> int:
    """One process, in order, as a user without multitables would read."""
    buffer = _buffer(target, block_size)
    return _read_rows(target, reader.engine, open_kwargs_for(cache, reader.engine), block_size, buffer, progress)


def _readers_running() -> int:
    """multitables reader processes this process has running now."""
    import multiprocessing

    return sum(p.name.startswith("multitables-reader") for p in multiprocessing.active_children())


def read_multitables(
    target: Target, reader: Reader, cache: str, progress: Callable[[int], None], used: "list[int] | None" = None
) -> int:
    """Stream the whole dataset once (remainder included) with multitables; return the rows seen.

    ``used``, if given, gets the reader processes the pass used appended (0:
    read in this process), as the queue reports them.
    """
    import multitables

    stream = multitables.Streamer(target.path, engine=reader.engine, **open_kwargs_for(cache, reader.engine))
    rows = 0
    if reader.mode == "direct":
        with stream.get_queue(target.node, n_procs=reader.n_procs, remainder=True) as queue:
            for guard in queue.iter():
                with guard as block:
                    n = len(block)
                rows += n
                progress(n)
            if used is not None:
                used.append(queue.n_procs)
        return rows
    pending = 0
    gen = stream.get_generator(target.node, n_procs=reader.n_procs)
    for _row in gen:  # the readers start with the first row
        pending = 1
        break
    if used is not None:
        used.append(_readers_running())  # the generator's queue is out of reach
    for _row in gen:
        pending += 1
        if pending == PROGRESS_STEP:
            rows += pending
            progress(pending)
            pending = 0
    progress(pending)
    return rows + pending


def probe_multitables(target: Target, engine: str, n_procs: "int | None", cache: str) -> tuple[int, int]:
    """(reader processes, rows per block) multitables picks for these arguments; opens a queue and closes it at once."""
    import multitables

    stream = multitables.Streamer(target.path, engine=engine, **open_kwargs_for(cache, engine))
    with stream.get_queue(target.node, n_procs=n_procs) as queue:
        return queue.n_procs, queue.block_size
