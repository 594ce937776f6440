"""Two readers against one with a transform in the readers (get_batches(transform=)), page cache warm.

Writes (once) 256 MiB of zlib-3 float32 rows of 1024 values, then times whole
shuffled epochs of ``get_batches("/data", 256, transform=...)`` with
``n_procs`` 1 and 2, alternating (one ``Batches`` for each, iterated epoch
after epoch as a training loop does), and prints the medians and their ratio. The
transform costs about what decoding does (``--work`` rounds of an
elementwise polynomial; 0: no transform, for the decode-only ratio).

    python benchmarks/transform_scaling.py --file bench/transform.h5 --runs 5 --work 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import multitables

ROWS, VALUES = 65_536, 1024


def costly(rows: np.ndarray, rounds: int) -> np.ndarray:
    """Some elementwise work, ``rounds`` times: what an augmentation might cost."""
    out = rows.astype(np.float32)
    for _ in range(rounds):
        out = out * np.float32(0.999) + np.sin(out) * np.float32(0.001)
    return out


class Costly:
    """A picklable transform of ``rounds`` rounds."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return costly(rows, self.rounds)


def make(path: str) -> None:
    import tables

    rng = np.random.default_rng(0)
    with tables.open_file(path, "w") as f:
        arr = f.create_earray("/", "data", tables.Float32Atom(), (0, VALUES), filters=tables.Filters(3, "zlib", shuffle=True))
        for start in range(0, ROWS, 8192):
            walk = np.cumsum(rng.integers(-8, 9, size=(8192, VALUES)), axis=1).astype(np.float32)
            arr.append(walk)


def batches(path: str, n_procs: int, rounds: int) -> "multitables.Batches":
    """Shuffled batches of 256 rows, made once and iterated epoch after epoch, as a training loop does
    (its shuffle-window buffers are kept from epoch to epoch)."""
    kw = {"transform": Costly(rounds)} if rounds else {}
    return multitables.Streamer(path).get_batches("/data", 256, seed=0, n_procs=n_procs, **kw)


def epoch(loader: "multitables.Batches") -> float:
    t = time.perf_counter()
    for batch in loader:
        pass
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--work", type=int, default=3, help="rounds of the transform (0: none)")
    args = p.parse_args()
    if not os.path.exists(args.file):
        make(args.file)
    mb = ROWS * VALUES * 4 / 1e6
    times: dict[int, list[float]] = {1: [], 2: []}
    loaders = {n: batches(args.file, n, args.work) for n in (1, 2)}
    for run in range(args.runs + 1):
        for n in (1, 2):
            t = epoch(loaders[n])
            if run:  # the first round warms the page cache and the imports
                times[n].append(t)
                print(f"run {run} n_procs={n}: {mb / t:,.0f} MB/s", flush=True)
    one, two = statistics.median(times[1]), statistics.median(times[2])
    print(f"work={args.work}: 1 reader {mb / one:,.0f} MB/s, 2 readers {mb / two:,.0f} MB/s, 2/1 {one / two:.2f}x")


if __name__ == "__main__":
    main()
