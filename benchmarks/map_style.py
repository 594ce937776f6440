"""Rows/s of a PyTorch map-style Dataset over h5py and over a Reader (docs/random_access.rst, 'A PyTorch map-style
Dataset'): 100,000 gzip rows of 16 float32 in chunks of 256, a shuffled DataLoader, batches of 64.

    python benchmarks/map_style.py [--batches N] [--rounds R]

Each case loads the first N batches of a fresh loader (its workers' start included), in R interleaved rounds;
the median is printed. Workers start by fork.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import multitables

ROWS, WIDTH, CHUNK, BATCH = 100_000, 16, 256, 64


class H5pyRows(Dataset):
    """h5py opened lazily in each worker; a row per ``__getitem__``, the dataset looked up by name each time."""

    def __init__(self, path: str) -> None:
        self.path, self.file = path, None

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> np.ndarray:
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return self.file["X"][i]


class H5pyKept(H5pyRows):
    """h5py opened lazily in each worker, its dataset kept (``X = file["X"]`` once): no lookup of the name per row."""

    def __getitem__(self, i: int) -> np.ndarray:
        if self.file is None:
            self.file = h5py.File(self.path, "r")
            self.x = self.file["X"]
        return self.x[i]


class ReaderRows(Dataset):
    """A Reader with ``n_procs=0`` made lazily in each worker (as docs/random_access.rst shows it)."""

    def __init__(self, path: str, per_batch: bool = False, n_procs: int = 0) -> None:
        self.path, self.reader, self.n_procs = path, None, n_procs
        if per_batch:
            self.__getitems__ = self._batch

    def __len__(self) -> int:
        return ROWS

    def _open(self) -> None:
        self.reader = multitables.Reader(self.path, n_procs=self.n_procs)
        self.x = self.reader.get_dataset("/X")
        self.stage = self.x.create_stage(BATCH)

    def _batch(self, indices: list[int]) -> list[np.ndarray]:
        if self.reader is None:
            self._open()
        return list(self.reader.request(self.x[indices], self.stage).get())

    def __getitem__(self, i: int) -> np.ndarray:
        if self.reader is None:
            self._open()
        return self.reader.request(self.x[i], self.stage).get()


def rate(dataset: Dataset, workers: int, batches: int) -> float:
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                        multiprocessing_context="fork" if workers else None)
    start = time.perf_counter()
    for k, _batch in enumerate(loader):
        if k + 1 == batches:
            break
    return batches * BATCH / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "rows.h5")
        data = np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype("<f4")
        with h5py.File(path, "w") as f:
            f.create_dataset("X", data=data, chunks=(CHUNK, WIDTH), compression="gzip")
        cases = {
            "h5py, __getitem__ per row, num_workers=0": lambda: rate(H5pyRows(path), 0, args.batches),
            "h5py, __getitem__ per row, num_workers=2": lambda: rate(H5pyRows(path), 2, args.batches),
            "h5py, dataset kept, __getitem__ per row, num_workers=0": lambda: rate(H5pyKept(path), 0, args.batches),
            "h5py, dataset kept, __getitem__ per row, num_workers=2": lambda: rate(H5pyKept(path), 2, args.batches),
            "Reader(n_procs=0) per worker, __getitem__ per row, num_workers=2":
                lambda: rate(ReaderRows(path), 2, args.batches),
            "Reader(n_procs=0) per worker, __getitems__ per batch, num_workers=2":
                lambda: rate(ReaderRows(path, per_batch=True), 2, args.batches),
            "Reader (readers), __getitems__ per batch, num_workers=0":
                lambda: rate(ReaderRows(path, per_batch=True, n_procs=None), 0, args.batches),  # type: ignore[arg-type]
        }
        got: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, run in cases.items():
                got[name].append(run())
        for name, rates in got.items():
            print(f"{name:70s} {statistics.median(rates):>10,.0f} rows/s  ({', '.join(f'{r:,.0f}' for r in rates)})")
    sys.stdout.flush()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
