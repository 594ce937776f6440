"""A column-chunked dataset (chunks narrower than a row) read whole by each engine, against plain h5py.

Usage: python benchmarks/column_chunks.py [--dir bench] [--rows 50000]  (page cache warm; seconds a pass)
"""

from __future__ import annotations

import argparse
import os
import time

import h5py
import numpy as np

import multitables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="bench")
    parser.add_argument("--rows", type=int, default=50_000)
    args = parser.parse_args()
    path = os.path.join(args.dir, f"columns-{args.rows}.h5")
    if not os.path.exists(path):
        with h5py.File(path, "w") as f:
            data = np.random.default_rng(0).random((args.rows, 64), dtype=np.float32)
            f.create_dataset("d", data=data, chunks=(args.rows, 1))
    with h5py.File(path, "r") as f:
        t0 = time.perf_counter()
        ref = f["d"][()]
        print(f"plain h5py ds[()]: {time.perf_counter() - t0:.3f} s")
    for engine in ("auto", "chunks", "h5py"):
        for n_procs in (0, 2):
            t0, out = time.perf_counter(), []
            with multitables.Streamer(path, engine=engine).get_queue("/d", n_procs=n_procs, ordered=True,
                                                                     remainder=True) as queue:
                for guard in queue.iter():
                    with guard as block:
                        out.append(block.copy())
                used = queue.engine
            seconds = time.perf_counter() - t0
            print(f"engine={engine} n_procs={n_procs} ({used}): {seconds:.3f} s, rows equal: "
                  f"{np.array_equal(np.concatenate(out), ref)}")


if __name__ == "__main__":
    main()
