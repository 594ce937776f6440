"""A/B of one stream pass over a set of small files between two checkouts, alternating runs in fresh interpreters.

Writes ``--files`` files of 1,000 float32 rows (4 KiB, gzip 3, one chunk) into ``--dir`` if absent, then times one
``get_queue`` pass over them as one set with ``--n_procs`` readers (default 2) and ``--engine``; ``--cold`` drops
the files' pages (fsync, ``POSIX_FADV_DONTNEED``) before each pass. Prints each run and the medians.

    python benchmarks/ab_set.py --dir bench/set300 --a ../before --b . --runs 11 --cold --engine h5py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

PASS = r"""
import glob, os, sys, time, multitables
folder, n_procs, engine, cold = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "cold"
files = sorted(glob.glob(os.path.join(folder, "*.h5")))
stream = multitables.Streamer(files, engine=engine)
if cold:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
t = time.perf_counter()
with stream.get_queue("/data", n_procs=n_procs) as queue:
    for guard in queue.iter():
        with guard:
            pass
print(time.perf_counter() - t)
"""


def make(folder: str, n: int) -> None:
    import h5py
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        with h5py.File(os.path.join(folder, f"s{i:04d}.h5"), "w") as f:
            f.create_dataset("data", data=rng.standard_normal(1000).astype(np.float32), chunks=(1000,),
                             compression="gzip", compression_opts=3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--files", type=int, default=300)
    p.add_argument("--a", required=True, help="checkout A (e.g. the commit before)")
    p.add_argument("--b", required=True, help="checkout B")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--n_procs", type=int, default=2)
    p.add_argument("--engine", default="auto")
    p.add_argument("--cold", action="store_true")
    args = p.parse_args()
    folder = os.path.abspath(args.dir)
    if not os.path.isdir(folder):
        make(folder, args.files)
    times: "dict[str, list[float]]" = {"A": [], "B": []}
    for _ in range(args.runs):
        for name, root in (("A", args.a), ("B", args.b)):
            root = os.path.abspath(root)
            env = dict(os.environ, PYTHONPATH=root)
            argv = [sys.executable, "-c", PASS, folder, str(args.n_procs), args.engine, "cold" if args.cold else "warm"]
            out = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True, check=True).stdout
            times[name].append(float(out.split()[-1]))
            print(name, f"{times[name][-1] * 1e3:.1f} ms", flush=True)
    a, b = statistics.median(times["A"]), statistics.median(times["B"])
    print(f"medians: A {a * 1e3:.1f} ms, B {b * 1e3:.1f} ms, B/A {b / a:.3f}")


if __name__ == "__main__":
    main()
