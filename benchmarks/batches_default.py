"""Training batches' default readers against none and two, by dataset size, each package in turn.

Usage: python benchmarks/batches_default.py DIR --mib 8 32 128 --packages A B [--epochs 4] [--step-ms 1] [--runs 3]
       [--transform-us US --stored]

For each size, DIR/batches-<MIB>.h5 holds smooth float32 rows (a random walk along each row) of 4 KiB, zlib 3 +
shuffle in chunks of 64 rows (written once). Each run is a fresh interpreter importing multitables from one package
(a directory holding a ``multitables`` folder, put first on ``sys.path``; ``.`` for this checkout) that makes
``get_batches("/data", 256, n_procs=N)`` and iterates ``--epochs`` epochs, a training step keeping the CPU busy for
``--step-ms`` per batch. Ways: each package's default (``n_procs`` left out), and this checkout with ``n_procs=0`` and
``n_procs=2``. Printed per size and way: the readers taken, the median seconds of the first epoch, of the later
epochs, and of the whole loop (the batches' making included), and the loop's samples a second. Runs alternate
between the ways. ``--transform-us``: a transform keeping a CPU busy that long a row (``get_batches(transform=)``);
``--stored``: the rows stored without a filter (DIR/stored-<MIB>.h5), cheap to read, so that only the transform's
work can pay for readers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from forkserver_passes import write

_RUN = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import multitables
path, n_procs, epochs, step = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]) / 1000
row_s = float(sys.argv[6]) / 1e6
def busy(rows):
    end = time.perf_counter() + row_s * len(rows)
    while time.perf_counter() < end:
        pass
    return rows
t0 = time.perf_counter()
batches = multitables.Streamer(path).get_batches("/data", 256, n_procs=None if n_procs == "default" else int(n_procs),
                                                 transform=busy if row_s else None)
times = []
for epoch in range(epochs):
    t = time.perf_counter()
    for x in batches:
        end = time.perf_counter() + step
        while time.perf_counter() < end:
            pass
    times.append(time.perf_counter() - t)
print(json.dumps([batches.n_procs, time.perf_counter() - t0, times, batches.n_rows]))
batches.close()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--mib", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--packages", nargs="+", default=["."])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--transform-us", type=float, default=0.0)
    p.add_argument("--stored", action="store_true")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    ways = [(pkg, "default") for pkg in args.packages] + [(".", "0"), (".", "2")]
    for mib in args.mib:
        path = os.path.join(args.dir, f"{'stored' if args.stored else 'batches'}-{mib}.h5")
        if not os.path.exists(path):
            write(path, mib, **({"compression": None, "shuffle": False} if args.stored else {}))
        got: "dict[tuple[str, str], list]" = {way: [] for way in ways}
        for _ in range(args.runs):
            for pkg, n in ways:
                run = subprocess.run([sys.executable, "-c", _RUN, os.path.abspath(pkg), path, n, str(args.epochs),
                                      str(args.step_ms), str(args.transform_us)], capture_output=True, text=True)
                if run.returncode:
                    sys.exit(run.stderr[-3000:])
                got[(pkg, n)].append(json.loads(run.stdout))
        for (pkg, n), runs in got.items():
            readers = sorted({tuple(r[0]) for r in runs})
            first = statistics.median(r[2][0] for r in runs)
            later = statistics.median(t for r in runs for t in r[2][1:])
            total = statistics.median(r[1] for r in runs)
            print(f"{mib} MiB  {pkg} n_procs={n}: readers {readers}  first epoch {first:.3f} s  later {later:.3f} s  "
                  f"loop {total:.3f} s  {runs[0][3] * args.epochs / total:,.0f} samples/s")


if __name__ == "__main__":
    main()
