"""A/B of the request path between two checkouts: requests a second, alternating fresh interpreters.

Makes (once) a zlib-3 file of ``--rows`` rows of 16 float32 in chunks of 256
rows, then, for each checkout in turn (``PYTHONPATH`` set to it), runs in a
fresh interpreter 20,000 requests of one row and 2,000 of a 64-row slice, at
random places, each got before the next is made, on a Reader of ``n_procs``
0 and 2. Prints each run and the medians, and the ratio B/A of requests a
second.

    python benchmarks/ab_requests.py --file bench/req.h5 --a ../before --b . --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

RUN = r"""
import sys, time, numpy as np, multitables
path, n_procs, n_single, n_slices = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
with multitables.Reader(path, n_procs=n_procs) as reader:
    ds = reader.get_dataset("/data")
    stage = ds.create_stage(64)
    for i in range(200):  # warm: files open, chunks cached
        reader.request(ds[i], stage).get()
    rows = [int(i) for i in rng.integers(0, len(ds), n_single)]
    starts = [int(i) for i in rng.integers(0, len(ds) - 64, n_slices)]
    t = time.perf_counter()
    for i in rows:
        reader.request(ds[i], stage).get()
    single = n_single / (time.perf_counter() - t)
    t = time.perf_counter()
    for a in starts:
        reader.request(ds[a:a + 64], stage).get()
    sliced = n_slices / (time.perf_counter() - t)
print(single, sliced)
"""


def make(path: str, rows: int) -> None:
    import numpy as np
    import tables

    if os.path.exists(path):
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    data = np.random.default_rng(0).standard_normal((rows, 16)).astype("f4")
    with tables.open_file(path, "w") as f:
        f.create_carray("/", "data", obj=data, filters=tables.Filters(3, "zlib"), chunkshape=(256, 16))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--a", required=True, help="checkout A (a directory holding the multitables package)")
    p.add_argument("--b", required=True, help="checkout B")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--single", type=int, default=20_000)
    p.add_argument("--slices", type=int, default=2_000)
    args = p.parse_args()
    make(args.file, args.rows)
    got: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for run in range(args.runs):
        for n_procs in (0, 2):
            for name, where in (("A", args.a), ("B", args.b)):
                env = dict(os.environ, PYTHONPATH=os.path.abspath(where))
                out = subprocess.run([sys.executable, "-c", RUN, args.file, str(n_procs), str(args.single),
                                      str(args.slices)], env=env, check=True, capture_output=True, text=True).stdout
                single, sliced = map(float, out.split())
                got.setdefault((name, n_procs), []).append((single, sliced))
                print(f"run {run} n_procs={n_procs} {name}: {single:,.0f} rows/s single, {sliced:,.0f} slices/s", flush=True)
    for n_procs in (0, 2):
        med = {name: [statistics.median(r[k] for r in got[(name, n_procs)]) for k in (0, 1)] for name in "AB"}
        print(f"n_procs={n_procs}: medians A {med['A'][0]:,.0f} / {med['A'][1]:,.0f}, B {med['B'][0]:,.0f} / "
              f"{med['B'][1]:,.0f} requests/s (single / 64-row slices); B/A {med['B'][0] / med['A'][0]:.3f} / "
              f"{med['B'][1] / med['A'][1]:.3f}")


if __name__ == "__main__":
    main()
