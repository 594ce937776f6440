"""Passes over one file under the ``forkserver`` start method (Python 3.14's default on Linux), each package in turn.

Usage: python benchmarks/forkserver_passes.py FILE --packages A B [--passes 5] [--runs 5] [--way direct|generator]
       python benchmarks/forkserver_passes.py FILE --starts [--runs 3]

Each run is a fresh interpreter that sets ``forkserver``, imports multitables from one package (a directory holding a
``multitables`` folder, put first on ``sys.path``; ``.`` for this checkout) and reads dataset ``/data`` of FILE
``--passes`` times by default (``n_procs`` left out), as a loop over epochs or files does: its first pass pays for
the fork server's start where it starts readers. Printed per package: each pass's median seconds, the readers it
took, and the whole loop's median; first, plain h5py's ``ds[()]`` in a fresh interpreter, for scale. Runs
alternate between the packages. ``--write MIB`` writes FILE first: smooth float32 rows (a random walk along each
row) of 4 KiB, zlib 3 + shuffle in chunks of 64 rows.

``--starts``: what starting 2 readers costs by start method (fork, forkserver, spawn): per run, a fresh interpreter's
three streams of this checkout, each timed from ``get_queue`` to its first block (the first also starts the fork
server); printed per run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_RUN = r"""
import json, multiprocessing, sys, time
multiprocessing.set_start_method(sys.argv[5])
sys.path.insert(0, sys.argv[1])
import multitables
path, passes, way = sys.argv[2], int(sys.argv[3]), sys.argv[4]
n_procs = None if sys.argv[6] == "default" else int(sys.argv[6])
stream = multitables.Streamer(path)
out = []
for _ in range(passes):
    t = time.perf_counter()
    if way == "direct":
        queue = stream.get_queue("/data", n_procs=n_procs)
        for i, guard in enumerate(queue.iter()):
            with guard as block:
                if i == 0 and n_procs:
                    out.append([time.perf_counter() - t, queue.n_procs])
                    break
    else:
        queue = None
        with stream.get_generator("/data") as rows:
            for row in rows:
                pass
    readers = queue.n_procs if queue is not None else -1
    queue is not None and queue.close()
    if not n_procs:
        out.append([time.perf_counter() - t, readers])
print(json.dumps(out))
"""

_PLAIN = r"""
import sys, time, h5py
t = time.perf_counter()
with h5py.File(sys.argv[1], "r") as f:
    f["/data"][()]
print(time.perf_counter() - t)
"""


def write(path: str, mib: int, compression: "str | None" = "gzip", shuffle: bool = True) -> None:
    """``mib`` MiB of smooth float32 rows of 4 KiB in chunks of 64 rows, gzip 3 + shuffle unless told otherwise."""
    import h5py
    import numpy as np

    rows = (mib << 20) // 4096
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", (rows, 1024), "f4", chunks=(64, 1024), compression=compression,
                              compression_opts=3 if compression else None, shuffle=shuffle)
        for start in range(0, rows, 4096):
            n = min(4096, rows - start)
            ds[start:start + n] = np.round(np.cumsum(rng.standard_normal((n, 1024), dtype="f4"), axis=1), 2)


def run_one(pkg: str, path: str, passes: int, way: str, method: str, n_procs: str) -> str:
    """One fresh interpreter's passes (``_RUN``): its JSON output."""
    run = subprocess.run([sys.executable, "-c", _RUN, os.path.abspath(pkg), path, str(passes), way, method, n_procs],
                         capture_output=True, text=True)
    if run.returncode:
        sys.exit(run.stderr[-3000:])
    return run.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--packages", nargs="+", default=["."])
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--way", choices=["direct", "generator"], default="direct")
    p.add_argument("--write", type=int, metavar="MIB")
    p.add_argument("--starts", action="store_true")
    args = p.parse_args()
    if args.write:
        write(args.file, args.write)
    if args.starts:
        for _ in range(args.runs):
            for method in ("fork", "forkserver", "spawn"):
                out = json.loads(run_one(".", args.file, 3, "direct", method, "2"))
                print(method, " ".join(f"{s:.3f}" for s, _ in out))
        return
    plain = [float(subprocess.run([sys.executable, "-c", _PLAIN, args.file], capture_output=True, text=True,
                                  check=True).stdout) for _ in range(args.runs)]
    print(f"plain h5py ds[()]: {statistics.median(plain):.3f} s (median of {args.runs})")
    got: "dict[str, list]" = {pkg: [] for pkg in args.packages}
    for _ in range(args.runs):
        for pkg in args.packages:
            got[pkg].append(json.loads(run_one(pkg, args.file, args.passes, args.way, "forkserver", "default")))
    for pkg, runs in got.items():
        per_pass = [statistics.median(r[k][0] for r in runs) for k in range(args.passes)]
        readers = [sorted({r[k][1] for r in runs}) for k in range(args.passes)]
        total = statistics.median(sum(s for s, _ in r) for r in runs)
        passes = "  ".join(f"{s:.3f}({'/'.join(map(str, n))})" for s, n in zip(per_pass, readers))
        print(f"{pkg}: passes {passes}  loop {total:.3f} s")


if __name__ == "__main__":
    main()
