"""The training section of the benchmark: shuffled batches of 256 rows, page cache warm and cold, side by side.

Every contender reads the same rows (``/X``: float32 rows of 256 values, 1 KiB,
and their int64 labels ``/y``; zlib 3) in shuffled batches of :data:`BATCH`,
with ``n_procs`` reader processes or ``num_workers`` workers: multitables
``get_batches`` over the one file and over the rows split into :data:`SHARDS`
files (a glob); a PyTorch ``DataLoader`` over h5py, (a) a row per
``__getitem__``, (b) contiguous slices in shuffled order; MosaicML's
``StreamingDataset`` over the rows in MDS (gzip 3, its nearest codec to zlib 3),
read locally with its default shuffle through a ``DataLoader``: its first epoch
(which decompresses each shard beside it) and later ones (which read those).

A pass is one epoch ((a): its first batches), from creating the dataset or
``Streamer`` to the last batch. Before it, untimed: the contender's preparation,
its files read into the page cache (warm) or all dropped from it (cold; memory
settled first where the VM reports free pages, NOTE [free page reporting] in
:mod:`multitables_bench.cache`), a garbage collection. Repeats alternate every
contender and both cache states; a figure is the median.
"""

from __future__ import annotations

import gc
import glob
import os
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from multitables_bench.cache import evict, free_page_reporting, resident_fraction, settle_free_memory
from multitables_bench.files import h5py_with_filters, read_through_cache

#: Features per row of the training and random-access files (float32): 1 KiB rows.
FEATURES = 256
BATCH = 256
SEED = 0
#: Files the sharded copy of the training file is split into.
SHARDS = 64
#: Bytes of one sample as every contender delivers it: a row of /X and its int64 label.
SAMPLE_BYTES = FEATURES * 4 + 8
CACHES = ("warm", "cold")
#: A cold pass starting with more than this fraction of its files cached is marked.
WARM_START = 0.01
INSTALL_MOSAIC = "pip install mosaicml-streaming (in a separate venv: it pins numpy<2.2; see BENCHMARKS.md)"

#: One pass: given a list, it appends every batch's labels to it; returns the rows delivered.
PassFn = Callable[[Optional[list]], int]


@dataclass(frozen=True)
class Figure:
    """One measured way of reading: rows (samples) per second, median over repeats."""

    section: str
    label: str
    rows_per_s: float
    seconds: tuple[float, ...]
    rows: int
    cache: str = "warm"
    key: str = ""
    mb_per_s: float = 0.0
    warm_start: bool = False


@dataclass(frozen=True)
class Contender:
    """A way of reading the training rows: its key, label, files, and one pass."""

    key: str
    label: str
    files: Callable[[], list[str]]
    run: PassFn
    prepare: Callable[[], None] = field(default=lambda: None)


def multitables_pass(files: "str | list[str]", n_procs: int) -> PassFn:
    """Shuffled ``get_batches`` of /X and /y, from a fresh ``Streamer`` of ``files`` (a file, a glob or a list)."""

    def run(sink: Optional[list]) -> int:
        import multitables

        batches = multitables.Streamer(files).get_batches(["/X", "/y"], batch_size=BATCH, shuffle=True, seed=SEED,
                                                          n_procs=n_procs)
        return _drain(batches, sink, lambda b: b[1])

    return run


class H5Rows:
    """A map-style dataset as users write it: one h5py row (or slice) per ``__getitem__``, the file opened per worker."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._f: Any = None
        with h5py_with_filters().File(path, "r") as f:
            self.n = len(f["y"])

    def _open(self) -> Any:
        if self._f is None:
            self._f = h5py_with_filters().File(self.path, "r")
        return self._f

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        f = self._open()
        return f["X"][i], f["y"][i]


class ContiguousSlices:
    """A sampler handing each worker whole contiguous slices of BATCH rows (the last one short), in shuffled order."""

    def __init__(self, n_rows: int, seed: int) -> None:
        self.n_rows = n_rows
        self.starts = np.arange(0, n_rows, BATCH)
        self.seed = seed

    def __len__(self) -> int:
        return len(self.starts)

    def __iter__(self) -> Any:
        for s in np.random.default_rng(self.seed).permutation(self.starts):
            yield slice(int(s), min(int(s) + BATCH, self.n_rows))


def _drain(loader: Any, sink: Optional[list], labels: Callable[[Any], Any], max_batches: "int | None" = None) -> int:
    """Rows in the batches of ``loader`` (its first ``max_batches``), their labels appended to ``sink``."""
    rows = 0
    for i, batch in enumerate(loader):
        y = labels(batch)
        rows += len(y)
        if sink is not None:
            sink.append(np.asarray(y))
        if max_batches is not None and i + 1 == max_batches:
            break
    return rows


def per_row_pass(path: str, n_workers: int, max_batches: "int | None") -> PassFn:
    """(a): ``DataLoader(shuffle=True)`` over :class:`H5Rows`, its first ``max_batches`` batches (None: the epoch)."""

    def run(sink: Optional[list]) -> int:
        from torch.utils.data import DataLoader

        loader = DataLoader(H5Rows(path), batch_size=BATCH, shuffle=True, num_workers=n_workers)
        return _drain(loader, sink, lambda b: b[1], max_batches)

    return run


def slices_pass(path: str, n_workers: int) -> PassFn:
    """(b): ``DataLoader(batch_size=None)`` over :class:`H5Rows` with :class:`ContiguousSlices`."""

    def run(sink: Optional[list]) -> int:
        from torch.utils.data import DataLoader

        data = H5Rows(path)
        loader = DataLoader(data, batch_size=None, sampler=ContiguousSlices(len(data), SEED), num_workers=n_workers)
        return _drain(loader, sink, lambda b: b[1])

    return run


def import_streaming() -> "tuple[Any, str]":
    """(the ``streaming`` module, "") or (None, why it cannot be used)."""
    try:
        import streaming
        import streaming.base.compression
        import streaming.base.util  # noqa: F401  (both used by mosaic_prepare)
    except ImportError as e:
        return None, f"the package is not installed ({e}); to measure it: {INSTALL_MOSAIC}"
    except Exception as e:  # e.g. a CUDA torchvision beside a CPU torch: "operator torchvision::nms does not exist"
        return None, f"importing it failed: {type(e).__name__}: {e}"
    return streaming, ""


def mds_files(local: str, decompressed: bool) -> list[str]:
    """The MDS directory's index and its shards: compressed (``.mds.gz``) or as the first epoch decompressed them."""
    shards = sorted(glob.glob(os.path.join(local, "*.mds" if decompressed else "*.mds.gz")))
    return [os.path.join(local, "index.json")] + shards


def mosaic_pass(streaming: Any, local: str, n_workers: int) -> PassFn:
    """A local ``StreamingDataset`` (``shuffle=True``, its default algorithm) through ``DataLoader(batch_size=BATCH)``."""

    def run(sink: Optional[list]) -> int:
        from torch.utils.data import DataLoader

        dataset = streaming.StreamingDataset(local=local, shuffle=True, batch_size=BATCH)
        loader = DataLoader(dataset, batch_size=BATCH, num_workers=n_workers)
        return _drain(loader, sink, lambda b: b["y"])

    return run


def mosaic_prepare(streaming: Any, local: str, decompressed: bool) -> Callable[[], None]:
    """Before a pass: the shards as a first epoch finds them (only ``.gz``) or as it leaves them; no stale shared memory."""

    def prepare() -> None:
        for gz in mds_files(local, decompressed=False)[1:]:
            raw = gz[: -len(".gz")]
            if not decompressed and os.path.exists(raw):
                os.remove(raw)
            elif decompressed and not os.path.exists(raw):
                with open(gz, "rb") as src, open(raw, "wb") as dst:
                    dst.write(streaming.base.compression.decompress("gz:3", src.read()))
        streaming.base.util.clean_stale_shared_memory()

    return prepare


def contenders(path: str, shards: str, mds: "str | None", n_procs: int, per_row_batches: "int | None",
               streaming: Any) -> list[Contender]:
    """Every contender over ``path``, its shard glob ``shards`` and its MDS directory ``mds`` (None: no MosaicML)."""
    one, many = (lambda: [path]), (lambda: sorted(glob.glob(shards)))
    first = "" if per_row_batches is None else f" (first {per_row_batches} batches)"
    out = [
        Contender("one", f"multitables get_batches, one file, n_procs={n_procs}", one, multitables_pass(path, n_procs)),
        Contender("shards", f"multitables get_batches, {SHARDS} shard files, n_procs={n_procs}", many,
                  multitables_pass(shards, n_procs)),
        Contender("a", f"(a) DataLoader, h5py row per __getitem__, shuffle=True, num_workers={n_procs}{first}", one,
                  per_row_pass(path, n_procs, per_row_batches)),
        Contender("b", f"(b) DataLoader, h5py contiguous slices of {BATCH} in shuffled order, num_workers={n_procs}",
                  one, slices_pass(path, n_procs)),
    ]
    if mds is not None and streaming is not None:
        label = f"MosaicML StreamingDataset (MDS, gz:3, shuffle=True), DataLoader num_workers={n_procs}"
        out += [
            Contender("mosaic", f"{label}: first epoch (decompresses its shards)", lambda: mds_files(mds, False),
                      mosaic_pass(streaming, mds, n_procs), mosaic_prepare(streaming, mds, False)),
            Contender("mosaic-later", f"{label}: later epochs (shards decompressed)", lambda: mds_files(mds, True),
                      mosaic_pass(streaming, mds, n_procs), mosaic_prepare(streaming, mds, True)),
        ]
    return out


def set_cache(files: Sequence[str], cache: str) -> float:
    """Read ``files`` into the page cache (warm) or drop every one's pages (cold); the fraction of their bytes cached now.

    Either way the memory is settled first where the VM reports free pages:
    a pass allocates its shuffle windows and rings (multitables: two windows
    of up to 256 MiB) as a cold pass fills the page cache, and unsettled, a
    warm multitables pass after a MosaicML one measured 2.7x slower than a
    cold one (NOTE [free page reporting] in :mod:`multitables_bench.cache`).
    """
    if free_page_reporting():
        settle_free_memory(2 * sum(os.path.getsize(n) for n in files) + (256 << 20))
    for name in files:
        (read_through_cache if cache == "warm" else evict)(name)
    sizes = [os.path.getsize(n) for n in files]
    return sum(resident_fraction(n) * s for n, s in zip(files, sizes)) / max(1, sum(sizes))


def measure(runs: Sequence[Contender], repeats: int, log: Callable[[str], None],
            caches: Sequence[str] = CACHES) -> list[Figure]:
    """``repeats`` rounds of every contender in every cache state, alternating; a figure per (contender, cache)."""
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # MDS samples, harmless here
    times: dict[tuple[str, str], list[float]] = {(c.key, cache): [] for c in runs for cache in caches}
    rows: dict[str, int] = {}
    cached_at_start: dict[tuple[str, str], float] = {}
    for r in range(repeats):
        for cache in caches:
            for c in runs:
                c.prepare()
                cached = set_cache(c.files(), cache)
                gc.collect()
                t0 = time.perf_counter()
                rows[c.key] = c.run(None)
                times[(c.key, cache)].append(time.perf_counter() - t0)
                cached_at_start[(c.key, cache)] = max(cached, cached_at_start.get((c.key, cache), 0.0))
                log(f"training {r + 1}/{repeats} {cache}: {c.label}: {rows[c.key]:,} rows in "
                    f"{times[(c.key, cache)][-1]:.3f} s [{cached:.1%} cached]")
    figures = []
    for c in runs:
        for cache in caches:
            rate = rows[c.key] / statistics.median(times[(c.key, cache)])
            figures.append(Figure("training", c.label, rate, tuple(times[(c.key, cache)]), rows[c.key], cache, c.key,
                                  rate * SAMPLE_BYTES / 1e6,
                                  cache == "cold" and cached_at_start[(c.key, cache)] > WARM_START))
    return figures


def training_section(path: str, shards: str, mds: "str | None", n_procs: int, repeats: int,
                     per_row_batches: "int | None", log: Callable[[str], None]) -> "tuple[list[Figure], list[str]]":
    """Figures for every contender, warm and cold, and notes (a contender skipped, and why)."""
    import torch

    torch.set_num_threads(1)
    streaming, why = import_streaming()
    notes = [] if streaming is not None else [f"MosaicML streaming: skipped: {why}"]
    for note in notes:
        log(note)
    return measure(contenders(path, shards, mds, n_procs, per_row_batches, streaming), repeats, log), notes
