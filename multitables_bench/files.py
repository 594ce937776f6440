"""Writing the benchmark's files, reading one into the page cache, and h5py with the filters it needs."""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np

from multitables_bench.records import DEFAULT_DATA, NODE, ROW_VALUES, Codec

#: Rows written per append while generating a file.
WRITE_ROWS = 4096
#: ``smooth`` data: each value is the one before plus a whole step drawn uniformly from -SMOOTH_STEP..SMOOTH_STEP.
SMOOTH_STEP = 8


def make_rows(rng: np.random.Generator, n: int, data: str = DEFAULT_DATA) -> np.ndarray:
    """``n`` float32 rows of ``ROW_VALUES`` values of ``data`` (a key of :data:`~multitables_bench.records.DATA`).

    ``noise``: standard normal values, as the established benchmark writes;
    their mantissas are random, so no codec gets far (1.05-1.2x).

    ``smooth``: along each row a random walk from 0 in whole steps of
    -8..8 (uniform), stored as float32, like sensor counts: the values stay
    small integers (|v| < 8192, exact in float32) whose low mantissa bytes
    are zero, which compresses ~4.2x with zlib 3 and ~3.1x with blosc 3
    (shuffle on, PyTables' default). A walk of random floats would compress
    only ~1.3x: its low mantissa bits are as random as noise.

    The rows depend only on ``rng``'s state: a seeded generator drawing block
    after block writes the same file every time.
    """
    if data == "noise":
        return rng.standard_normal((n, ROW_VALUES), dtype=np.float32)
    if data == "smooth":
        steps = rng.integers(-SMOOTH_STEP, SMOOTH_STEP + 1, (n, ROW_VALUES), dtype=np.int8)
        return np.cumsum(steps, axis=1, dtype=np.int16).astype(np.float32)
    raise ValueError(f"unknown data {data!r}")


def write_file(
    path: str, n_rows: int, codec: Codec, chunk_rows: "int | None" = None, seed: int = 0, data: str = DEFAULT_DATA
) -> None:
    """Rows of ``data`` (:func:`make_rows`) at ``/data``: an EArray of float32 rows of 1024 values, PyTables' chunking
    unless ``chunk_rows``, written ``WRITE_ROWS`` at a time from a generator seeded with ``seed``."""
    import tables
    from tqdm import tqdm

    filters = tables.Filters(complevel=codec.complevel, complib=codec.complib) if codec.complevel else None
    chunkshape = (chunk_rows, ROW_VALUES) if chunk_rows else None
    rng = np.random.default_rng(seed)
    with tables.open_file(path, "w") as f:
        arr = f.create_earray(
            "/", NODE[1:], tables.Float32Atom(), (0, ROW_VALUES), filters=filters, chunkshape=chunkshape, expectedrows=n_rows
        )
        kind = "" if data == DEFAULT_DATA else f"{data} "
        desc = f"writing {kind}{codec.label} {os.path.basename(path)}"
        with tqdm(total=n_rows, desc=desc, unit="row", unit_scale=True, leave=False) as bar:
            for start in range(0, n_rows, WRITE_ROWS):
                rows = min(WRITE_ROWS, n_rows - start)
                arr.append(make_rows(rng, rows, data))
                bar.update(rows)


def read_through_cache(path: str) -> None:
    """Read all of ``path`` through the page cache (a warm pass starts with it all cached)."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def h5py_with_filters() -> Any:
    """The ``h5py`` module, with hdf5plugin's filters (blosc, lz4, zstd...) registered."""
    import h5py

    importlib.import_module("hdf5plugin")  # importing it registers them
    return h5py
