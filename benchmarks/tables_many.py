"""Batches over many datasets of a set of files with ``engine="tables"``: time to the first batch and to the end.

Writes ``--files`` files into ``--dir`` if absent, each with ``--datasets`` contiguous int32 datasets of 1,000 rows
(``/d000``, ``/d001``, ...), then runs one epoch of ``Batches(Streamer(files, engine=...), datasets, 256)`` in a fresh
interpreter per run, for each checkout given, alternating. Prints each run and the medians (seconds).

    python benchmarks/tables_many.py --dir bench/many --datasets 50 --a ../before --b . --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

RUN = r"""
import glob, os, sys, time, multitables
folder, datasets, engine = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = sorted(glob.glob(os.path.join(folder, "*.h5")))
t = time.perf_counter()
batches = multitables.Batches(multitables.Streamer(files, engine=engine), [f"/d{i:03d}" for i in range(datasets)], 256,
                              n_procs=0)
first = None
with batches:
    for _ in batches:
        if first is None:
            first = time.perf_counter() - t
print(first, time.perf_counter() - t)
"""


def make(folder: str, files: int, datasets: int) -> None:
    import h5py
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    for i in range(files):
        path = os.path.join(folder, f"f{i}.h5")
        if os.path.exists(path):
            continue
        with h5py.File(path, "w") as f:
            for d in range(datasets):
                f.create_dataset(f"d{d:03d}", data=np.arange(1000, dtype="i4") + d)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--datasets", type=int, default=50)
    p.add_argument("--a", required=True, help="checkout A (e.g. the commit before)")
    p.add_argument("--b", help="checkout B (none: A alone)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--engine", default="tables")
    args = p.parse_args()
    make(args.dir, args.files, max(args.datasets, 300))
    sides = ("a", "b") if args.b else ("a",)
    times: "dict[str, list[tuple[float, float]]]" = {side: [] for side in sides}
    for run in range(args.runs):
        for side in sides:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(getattr(args, side)))
            out = subprocess.run([sys.executable, "-c", RUN, args.dir, str(args.datasets), args.engine], env=env,
                                 check=True, capture_output=True, text=True).stdout.split()
            times[side].append((float(out[0]), float(out[1])))
            print(f"run {run} {side}: first batch {times[side][-1][0]:.2f} s, whole {times[side][-1][1]:.2f} s", flush=True)
    for side in sides:
        first = statistics.median(t[0] for t in times[side])
        whole = statistics.median(t[1] for t in times[side])
        print(f"{side} ({getattr(args, side)}): median first batch {first:.2f} s, whole {whole:.2f} s")


if __name__ == "__main__":
    main()
