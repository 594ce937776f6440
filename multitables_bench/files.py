"""Writing the benchmark's files, reading one into the page cache, and h5py with the filters it needs."""

from __future__ import annotations

import importlib
import os
from typing import Any

import numpy as np

from multitables_bench.records import NODE, ROW_VALUES, Codec

#: Rows written per append while generating a file.
WRITE_ROWS = 4096


def write_file(path: str, n_rows: int, codec: Codec, chunk_rows: "int | None" = None, seed: int = 0) -> None:
    """Random normal float32 rows of 1024 values at ``/data`` (an EArray, PyTables' chunking unless ``chunk_rows``)."""
    import tables
    from tqdm import tqdm

    filters = tables.Filters(complevel=codec.complevel, complib=codec.complib) if codec.complevel else None
    chunkshape = (chunk_rows, ROW_VALUES) if chunk_rows else None
    rng = np.random.default_rng(seed)
    with tables.open_file(path, "w") as f:
        arr = f.create_earray(
            "/", NODE[1:], tables.Float32Atom(), (0, ROW_VALUES), filters=filters, chunkshape=chunkshape, expectedrows=n_rows
        )
        desc = f"writing {codec.label} {os.path.basename(path)}"
        with tqdm(total=n_rows, desc=desc, unit="row", unit_scale=True, leave=False) as bar:
            for start in range(0, n_rows, WRITE_ROWS):
                rows = min(WRITE_ROWS, n_rows - start)
                arr.append(rng.standard_normal((rows, ROW_VALUES), dtype=np.float32))
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
