"""Shuffled CPU batches across packages: the GPU section's "CPU only" loop, each package in turn, rounds alternating.

The GPU section sizes its training step by the rate CPU-only batches come
(``multitables_bench/gpu.py``), so a package whose CPU batches are slower
also looks slower with a step. This runs that loop alone: a fresh
interpreter per pass with one package first on its path, the torch adapter's
``get_batches(stream, "/X", 1024, epochs=None)`` over the GPU section's file,
the first epoch let go by and the next ones timed. Prints each pass (GB/s and
the consumer's CPU seconds per second) and each package's median.

    python benchmarks/ab_batches.py --file bench/gpu.h5 --mib 512 --packages ../before . --rounds 4

A package is a folder that holds ``multitables/`` (``git archive REV multitables | tar -x -C DIR``). The file is
written first where it is missing (``--mib``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PASS = r"""
import json, resource, sys, time
import multitables, multitables.torch as mt
path, n_procs, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
batches = mt.get_batches(multitables.Streamer(path), "/X", 1024, n_procs=n_procs, epochs=None, seed=0)
n = len(batches.batches)
it = iter(batches)
for _ in zip(range(n), it):  # the first epoch: readers start, windows fill
    pass
ru = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter()
got = sum(b.numel() * b.element_size() for _, b in zip(range((epochs - 1) * n), it))
seconds = time.perf_counter() - t
ru2 = resource.getrusage(resource.RUSAGE_SELF)
cpu = ru2.ru_utime + ru2.ru_stime - ru.ru_utime - ru.ru_stime
batches.close()
print(json.dumps({"package": multitables.__file__, "gbps": got / seconds / 1e9, "consumer_cpu": cpu / seconds}))
"""


def run_pass(package: str, path: str, n_procs: int, epochs: int) -> dict:
    """One pass in a fresh interpreter started in an empty folder, ``package`` first on its path (checked)."""
    package = os.path.abspath(package)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p))
    with tempfile.TemporaryDirectory() as cwd:  # python -c puts its folder first: an empty one imports nothing
        out = subprocess.run([sys.executable, "-c", PASS, path, str(n_procs), str(epochs)], cwd=cwd, env=env,
                             capture_output=True, text=True, check=True).stdout
    got = json.loads(out.splitlines()[-1])
    assert got["package"].startswith(package + os.sep), (got["package"], package)
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--mib", type=int, default=512, help="size of the file written where it is missing")
    p.add_argument("--packages", nargs="+", required=True, help="folders that each hold a multitables package")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--epochs", type=int, default=5, help="epochs a pass reads; all but the first are timed")
    p.add_argument("--n_procs", type=int, default=None, help="readers (default: the CPU count)")
    args = p.parse_args()
    if not os.path.exists(args.file):
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from multitables_bench.gpu import write_file

        os.makedirs(os.path.dirname(os.path.abspath(args.file)), exist_ok=True)
        write_file(args.file, args.mib)
    n_procs = args.n_procs or len(os.sched_getaffinity(0))
    rates: dict[str, list[float]] = {pkg: [] for pkg in args.packages}
    for r in range(args.rounds):
        for pkg in args.packages:
            got = run_pass(pkg, os.path.abspath(args.file), n_procs, args.epochs)
            rates[pkg].append(got["gbps"])
            print(f"round {r + 1} {pkg}: {got['gbps']:.2f} GB/s, consumer CPU {got['consumer_cpu']:.2f} s per s",
                  flush=True)
    for pkg, got in rates.items():
        print(f"{pkg}: median {statistics.median(got):.2f} GB/s ({min(got):.2f}-{max(got):.2f}), {n_procs} readers")


if __name__ == "__main__":
    main()
