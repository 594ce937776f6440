"""A/B of a training loop across epochs between two checkouts: each epoch's time and its first batch's wait.

One ``Batches`` (``get_batches("/data", 256, n_procs=2)``, shuffled, the
default window: the whole file when it is 256 MiB or less) iterated for
``--epochs`` epochs, with a training step that keeps the CPU busy for
``--step-ms`` per batch. For each epoch after the first: the seconds from
asking for the epoch to its first batch, and the epoch's seconds. Each run is
a fresh interpreter with ``PYTHONPATH`` set to one checkout, A and B in turn,
page cache warm; prints each run and the medians.

    python benchmarks/epoch_boundary.py --file bench/epochs.h5 --a ../before --b . --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess

from ab_stream import run_in

LOOP = r"""
import json, sys, time, multitables
path, epochs, step = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) / 1000
batches = multitables.Streamer(path).get_batches("/data", 256, n_procs=2, seed=0)
out = []
for epoch in range(epochs):
    batches.set_epoch(epoch)
    t0 = time.perf_counter()
    first = None
    for x in batches:
        if first is None:
            first = time.perf_counter() - t0
        end = time.perf_counter() + step
        while time.perf_counter() < end:
            pass
    out.append((first, time.perf_counter() - t0))
batches.close()
print(json.dumps(out))
"""


def make(path: str, rows: int) -> None:
    """/data: ``rows`` x 1024 float32 (4 KiB rows), a random walk along each row, zlib 3 + shuffle."""
    import numpy as np
    import tables

    rng = np.random.default_rng(0)
    with tables.open_file(path, "w") as f:
        arr = f.create_earray("/", "data", tables.Float32Atom(), shape=(0, 1024), filters=tables.Filters(3, "zlib", shuffle=True))
        for start in range(0, rows, 8192):
            n = min(8192, rows - start)
            arr.append(np.cumsum(rng.standard_normal((n, 1024), dtype=np.float32), axis=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--a", required=True, help="checkout A (e.g. the commit before)")
    p.add_argument("--b", required=True, help="checkout B")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=1.0)
    p.add_argument("--mib", type=int, default=256, help="size of the file made when --file does not exist")
    args = p.parse_args()
    if not os.path.exists(args.file):
        make(args.file, args.mib * 256)
    subprocess.run(["cat", args.file], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    firsts: dict[str, list[float]] = {"A": [], "B": []}
    epochs: dict[str, list[float]] = {"A": [], "B": []}
    for run in range(args.runs):
        for label, root in (("A", args.a), ("B", args.b)):
            out = run_in(root, LOOP, os.path.abspath(args.file), str(args.epochs), str(args.step_ms))
            per_epoch = json.loads(out.strip().splitlines()[-1])
            later = per_epoch[1:]  # the first epoch starts its readers in both
            firsts[label] += [f for f, _ in later]
            epochs[label] += [e for _, e in later]
            shown = ", ".join(f"{f:.3f}/{e:.3f}" for f, e in per_epoch)
            print(f"run {run} {label}: first batch / epoch (s) {shown}", flush=True)
    for label in ("A", "B"):
        print(
            f"{label}: epochs after the first, median first-batch wait {statistics.median(firsts[label]):.3f} s, "
            f"median epoch {statistics.median(epochs[label]):.3f} s"
        )
    print(f"epoch B/A {statistics.median(epochs['B']) / statistics.median(epochs['A']):.3f}")


if __name__ == "__main__":
    main()
