"""Batches/s of random row batches ("a sample drawn by index", as a replay buffer or a retrieval service draws them)
read by h5py and by a Reader, each case in a fresh interpreter, the cases alternating, the median of the rounds.

    python benchmarks/random_batches.py --file F [--path /X] [--batch 256] [--batches 200] [--rounds 5] [--cases ...]
    python benchmarks/random_batches.py --file F --case reader0 ...    # one case, one interpreter: prints batches/s

Every batch is ``--batch`` random rows of the whole dataset (with repeats, unsorted), the caller's order kept:

* ``h5py_sorted``: ``ds[u][inv]`` with ``u, inv = np.unique(idx, return_inverse=True)`` (h5py wants sorted, unique);
* ``h5py_rows``: ``np.stack([ds[i] for i in idx])``;
* ``torch2``: a DataLoader(num_workers=2) over a Dataset whose ``__getitem__`` takes a BatchSampler's index list and
  reads it as ``h5py_sorted`` does;
* ``reader0``: ``reader.request(x[idx], stage).get()`` with ``Reader(n_procs=0)``;
* ``reader2``: the same with 2 reader processes, one request at a time;
* ``pool2``: 2 reader processes, 4 requests in flight on a stage pool.

``--cold`` drops the file's pages from the page cache (``posix_fadvise(DONTNEED)``) before each case.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import time

import numpy as np

CASES = ("h5py_sorted", "h5py_rows", "torch2", "reader0", "reader2", "pool2")


def batches(n_rows: int, batch: int, count: int, seed: int = 0) -> "list[np.ndarray]":
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_rows, batch) for _ in range(count)]


def h5py_sorted(ds, idx):
    u, inv = np.unique(idx, return_inverse=True)
    return ds[u][inv]


class _H5pyBatches:
    """A map-style Dataset read a batch at a time (a BatchSampler's list per ``__getitem__``), h5py opened lazily."""

    def __init__(self, filename: str, path: str, n: int) -> None:
        self.filename, self.path, self.n, self.ds = filename, path, n, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx):
        if self.ds is None:
            import h5py
            importlib.import_module("hdf5plugin")  # blosc
            self.ds = h5py.File(self.filename, "r")[self.path]
        return h5py_sorted(self.ds, np.asarray(idx))


class _Fixed:
    """A sampler giving fixed index batches (the same as the other cases read)."""

    def __init__(self, idx: "list[np.ndarray]") -> None:
        self.idx = idx

    def __iter__(self):
        return (i.tolist() for i in self.idx)

    def __len__(self) -> int:
        return len(self.idx)


def run_case(case: str, filename: str, path: str, batch: int, count: int, check: bool, n_warm: int = 20) -> float:
    import h5py
    importlib.import_module("hdf5plugin")  # blosc, for h5py
    with h5py.File(filename, "r") as f:
        n = f[path].shape[0]
    warm, idx = batches(n, batch, n_warm, seed=1), batches(n, batch, count)
    if case.startswith("h5py"):
        ds = h5py.File(filename, "r")[path]
        read = (lambda i: h5py_sorted(ds, i)) if case == "h5py_sorted" else (lambda i: np.stack([ds[int(j)] for j in i]))
        return timed(lambda seq: [read(i) for i in seq], warm, idx)
    if case == "torch2":
        import torch.utils.data as tud
        loader = tud.DataLoader(_H5pyBatches(filename, path, n), sampler=_Fixed(warm + idx), batch_size=None,
                                num_workers=2, multiprocessing_context="fork")
        it = iter(loader)
        return timed(lambda seq: [next(it) for _ in seq], warm, idx)
    import multitables
    with multitables.Reader(filename, n_procs=0 if case == "reader0" else 2) as reader:
        x = reader.get_dataset(path)
        into = x.create_stage_pool(batch, 4) if case == "pool2" else x.create_stage(batch)
        in_flight = 4 if case == "pool2" else 1
        futures: list = []

        def go(seq):
            for i in seq:
                futures.append(reader.request(x[i], into))
                if len(futures) == in_flight:
                    futures.pop(0).get()
            while futures:
                futures.pop(0).get()

        if check:
            with h5py.File(filename, "r") as f:
                for i in idx[:5]:
                    assert np.array_equal(reader.request(x[i], into).get(), h5py_sorted(f[path], i))
        return timed(go, warm, idx)


def timed(go, warm: "list[np.ndarray]", idx: "list[np.ndarray]") -> float:
    """Batches/s of ``go(idx)``, once ``go(warm)`` has run."""
    go(warm)
    t = time.perf_counter()
    go(idx)
    return len(idx) / (time.perf_counter() - t)


def drop_pages(filename: str) -> None:
    fd = os.open(filename, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--file", required=True)
    p.add_argument("--path", default="/X")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warm", type=int, default=20, help="batches read before the timing")
    p.add_argument("--cases", nargs="*", default=list(CASES))
    p.add_argument("--case")
    p.add_argument("--cold", action="store_true")
    p.add_argument("--check", action="store_true")
    a = p.parse_args()
    if a.case:
        if a.cold:
            drop_pages(a.file)
        print(run_case(a.case, a.file, a.path, a.batch, a.batches, a.check, a.warm))
        return
    got: "dict[str, list[float]]" = {c: [] for c in a.cases}
    for _ in range(a.rounds):
        for c in a.cases:
            cmd = [sys.executable, __file__, "--file", a.file, "--path", a.path, "--batch", str(a.batch),
                   "--batches", str(a.batches), "--warm", str(a.warm), "--case", c] + (["--cold"] if a.cold else [])
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if out.returncode:
                sys.exit(f"{c}: {out.stderr}")
            got[c].append(float(out.stdout.split()[-1]))
    for c in a.cases:
        print(f"{c:12s} {statistics.median(got[c]):9.1f} batches/s  ({' '.join(f'{v:.0f}' for v in got[c])})")


if __name__ == "__main__":
    main()
