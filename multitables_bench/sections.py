"""The training and random-access sections of the benchmark (``multitables-benchmark --sections ...``).

Both read a zlib level 3 file with the page cache warm, as a training loop or
a sampler re-reading a file that fits in memory would, and set multitables
beside what a user would write without it, measured in the same run:

* training: samples/s for shuffled batches of 256 rows of ``/X`` and
  ``/y``, against a PyTorch ``DataLoader`` over an h5py dataset with per-row
  ``__getitem__`` (a), and one whose sampler hands the workers contiguous
  slices (b), with ``num_workers`` = the reader count;
* random access: rows/s for batches of 256 sorted random row indices,
  against h5py fancy indexing in one process and the established ``Reader``
  approach of one request at a time.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from multitables_bench.files import h5py_with_filters, read_through_cache

#: Features per row of the training and random-access files (float32): 1 KiB rows.
FEATURES = 256
BATCH = 256
SEED = 0


@dataclass(frozen=True)
class Figure:
    """One measured way of reading: rows (samples) per second, median over repeats."""

    section: str
    label: str
    rows_per_s: float
    seconds: tuple[float, ...]
    rows: int


def write_training_file(path: str, n_rows: int) -> None:
    """/X: n_rows x FEATURES float32, /y: int64 labels; zlib level 3 + shuffle, PyTables' chunking."""
    import tables

    filters = tables.Filters(complevel=3, complib="zlib", shuffle=True)
    rng = np.random.default_rng(SEED)
    with tables.open_file(path, "w") as f:
        x = f.create_earray("/", "X", tables.Float32Atom(), (0, FEATURES), filters=filters, expectedrows=n_rows)
        y = f.create_earray("/", "y", tables.Int64Atom(), (0,), filters=filters, expectedrows=n_rows)
        for start in range(0, n_rows, 16384):
            n = min(16384, n_rows - start)
            x.append(rng.standard_normal((n, FEATURES), dtype=np.float32))
            y.append(np.arange(start, start + n))


def _median_rate(section: str, label: str, run: Callable[[], int], repeats: int, log: Callable[[str], None]) -> Figure:
    times, rows = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows = run()
        times.append(time.perf_counter() - t0)
        log(f"{section}: {label}: {rows} rows in {times[-1]:.3f} s")
    return Figure(section, label, rows / statistics.median(times), tuple(times), rows)


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


class _H5Rows:
    """A map-style dataset as users write it: one h5py row per ``__getitem__`` (file opened per worker)."""

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


class _ContiguousSlices:
    """A sampler handing each worker whole contiguous slices of BATCH rows, in shuffled order."""

    def __init__(self, n_rows: int, seed: int) -> None:
        self.starts = np.arange(0, n_rows - n_rows % BATCH, BATCH)
        self.seed = seed

    def __len__(self) -> int:
        return len(self.starts)

    def __iter__(self) -> Any:
        for s in np.random.default_rng(self.seed).permutation(self.starts):
            yield slice(int(s), int(s) + BATCH)


def training_section(path: str, n_procs: int, repeats: int, per_row_batches: int, log: Callable[[str], None]) -> list[Figure]:
    """Samples/s of one shuffled epoch (multitables, slices DataLoader) and of ``per_row_batches`` per-row batches."""
    import torch
    from torch.utils.data import DataLoader

    import multitables

    torch.set_num_threads(1)
    read_through_cache(path)
    stream = multitables.Streamer(path)

    def ours() -> int:
        batches = stream.get_batches(["/X", "/y"], batch_size=BATCH, shuffle=True, seed=SEED, n_procs=n_procs)
        return sum(len(y) for _, y in batches)

    def per_row() -> int:
        loader = DataLoader(_H5Rows(path), batch_size=BATCH, shuffle=True, num_workers=n_procs)
        rows = 0
        for i, (_, y) in enumerate(loader):
            rows += len(y)
            if i + 1 == per_row_batches:
                break
        return rows

    def slices() -> int:
        loader = DataLoader(_H5Rows(path), batch_size=None, sampler=_ContiguousSlices(len(_H5Rows(path)), SEED), num_workers=n_procs)
        return sum(len(y) for _, y in loader)

    return [
        _median_rate("training", f"multitables get_batches, shuffle=True, n_procs={n_procs}", ours, repeats, log),
        _median_rate("training", f"(a) DataLoader, h5py row per __getitem__, shuffle=True, num_workers={n_procs} "
                     f"(first {per_row_batches} batches)", per_row, repeats, log),
        _median_rate("training", f"(b) DataLoader, contiguous slices of {BATCH} in shuffled order, num_workers={n_procs}",
                     slices, repeats, log),
    ]


# ---------------------------------------------------------------------------
# Random access
# ---------------------------------------------------------------------------


def _index_batches(n_rows: int, n_batches: int) -> list[np.ndarray]:
    rng = np.random.default_rng(SEED)
    return [np.sort(rng.choice(n_rows, BATCH, replace=False)) for _ in range(n_batches)]


def random_access_section(path: str, n_procs: int, repeats: int, n_batches: int, log: Callable[[str], None]) -> list[Figure]:
    """Rows/s for ``n_batches`` batches of BATCH sorted random rows of /X."""
    import multitables

    read_through_cache(path)
    with h5py_with_filters().File(path, "r") as f:
        n_rows = len(f["X"])
    batches = _index_batches(n_rows, n_batches)

    def h5py_fancy() -> int:
        with h5py_with_filters().File(path, "r") as f:
            ds = f["X"]
            return sum(len(ds[idx]) for idx in batches)

    def reader(in_flight: int) -> Callable[[], int]:
        def run() -> int:
            rows = 0
            with multitables.Reader(path, n_procs=n_procs) as r:
                ds = r.get_dataset("/X")
                stages = [ds.create_stage(BATCH) for _ in range(in_flight)]
                futures: list[Any] = []
                for i, idx in enumerate(batches):
                    if len(futures) == in_flight:
                        rows += len(futures.pop(0).get())
                    futures.append(r.request(ds[idx], stages[i % in_flight]))
                rows += sum(len(fut.get()) for fut in futures)
            return rows

        return run

    return [
        _median_rate("random", "h5py fancy indexing, 1 process", h5py_fancy, repeats, log),
        _median_rate("random", f"multitables Reader, one request at a time (established use), n_procs={n_procs}",
                     reader(1), repeats, log),
        _median_rate("random", f"multitables Reader, 4 requests in flight, n_procs={n_procs}", reader(4), repeats, log),
    ]


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def markdown(figures: Sequence[Figure], baseline_label_prefix: str, unit: str) -> str:
    """One Markdown table: each figure's rate and its ratio to the figure whose label starts with the prefix."""
    base = next(f for f in figures if f.label.startswith(baseline_label_prefix))
    lines = [f"| reader | {unit} | ratio |", "| --- | ---: | ---: |"]
    for f in figures:
        lines.append(f"| {f.label} | {f.rows_per_s:,.0f} | {f.rows_per_s / base.rows_per_s:.2f}x |")
    return "\n".join(lines)


def run_sections(sections: Sequence[str], workdir: str, n_rows: int, n_procs: int, repeats: int,
                 log: Callable[[str], None]) -> tuple[str, list[Figure]]:
    """Write the zlib-3 file, run the sections asked for, remove the file; the Markdown report and the figures."""
    path = os.path.join(workdir, "sections.h5")
    write_training_file(path, n_rows)
    out, figures = [], []
    try:
        if "training" in sections:
            fig = training_section(path, n_procs, repeats, per_row_batches=40, log=log)
            figures += fig
            out.append(f"### Training reads: {n_rows:,} rows of {FEATURES} float32 + int64 label, zlib 3, batches of {BATCH}, "
                       f"page cache warm\n\n" + markdown(fig, "(a)", "samples/s"))
        if "random" in sections:
            fig = random_access_section(path, n_procs, repeats, n_batches=200, log=log)
            figures += fig
            out.append(f"### Random access: batches of {BATCH} sorted random rows of {n_rows:,} x {FEATURES} float32, "
                       f"zlib 3, page cache warm\n\n" + markdown(fig, "h5py", "rows/s"))
    finally:
        os.remove(path)
    return "\n\n".join(out), figures
