"""Datasets in a few large chunks: plain h5py against multitables' default and in-process reads; alternating, medians.

Usage: python benchmarks/large_chunks.py DIR [CASE ...]  (DIR: where the files are written once; page cache warm)

Each case is 64 MiB of smooth values (a random walk along each row) in gzip 1 + shuffle chunks of the size its name
gives. Printed per case: plain ``ds[()]``'s time, then each way's ratio to it (above 1: faster): ``default``,
multitables with ``n_procs`` left out (the readers it took in brackets: where the plan's decode rate is measured, the
sample is read before the pass); ``0``, the same read in this process (``n_procs=0``). Rows are checked once, untimed.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import h5py
import numpy as np

import multitables

MiB = 1 << 20
GZIP1 = dict(compression="gzip", compression_opts=1, shuffle=True)
#: name: (shape, dtype, chunks)
CASES = {
    "f8_c1m": ((8 * MiB,), np.float64, (MiB // 8,)),
    "f8_c16m": ((8 * MiB,), np.float64, (2 * MiB,)),
    "f8_c32m": ((8 * MiB,), np.float64, (4 * MiB,)),
    "f8_c64m": ((8 * MiB,), np.float64, (8 * MiB,)),
    "u1_wide_c16m": ((16384, 4096), np.uint8, (4096, 4096)),
}


def write(path: str, shape: tuple, dtype: type, chunks: tuple) -> None:
    rng = np.random.default_rng(0)
    if np.dtype(dtype).kind == "f":
        data = np.round(np.cumsum(rng.standard_normal(shape, dtype=np.float32), axis=-1), 2).astype(dtype)
    else:
        data = (np.cumsum(rng.integers(-2, 3, size=shape, dtype=np.int16), axis=-1) % 100).astype(dtype)
    with h5py.File(path + ".tmp", "w") as f:
        f.create_dataset("d", data=data, chunks=chunks, **GZIP1)
    os.rename(path + ".tmp", path)


def main(folder: str, names: list[str], repeats: int = 5) -> None:
    os.makedirs(folder, exist_ok=True)
    for name in names or list(CASES):
        path = os.path.join(folder, name + ".h5")
        if not os.path.exists(path):
            write(path, *CASES[name])
        with h5py.File(path, "r") as f:
            ref = f["d"][()]

        def plain() -> None:
            with h5py.File(path, "r") as f:
                f["d"][()]

        def stream(n_procs: "int | None", check: bool = False) -> int:
            blocks = []
            with multitables.Streamer(path).get_queue("/d", n_procs=n_procs, ordered=True, remainder=True) as queue:
                for guard in queue.iter():
                    with guard as block:
                        if check:
                            blocks.append(block.copy())
            if check:
                assert np.array_equal(np.concatenate(blocks), ref), (name, n_procs)
            return queue.n_procs

        used = {n: stream(n, check=True) for n in (None, 0)}
        ways = {"plain": plain, "default": lambda: stream(None), "0": lambda: stream(0)}
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(repeats):
            for k, way in ways.items():
                began = time.perf_counter()
                way()
                times[k].append(time.perf_counter() - began)
        base = statistics.median(times["plain"])
        print(f"{name} {ref.nbytes / MiB:.0f} MiB plain {base * 1e3:.0f} ms: default ({used[None]} readers) "
              f"{base / statistics.median(times['default']):.2f}  0 {base / statistics.median(times['0']):.2f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
