"""A/B of the streaming path between two checkouts, page cache warm (or cold), alternating runs in one session.

Times one whole pass of ``get_queue`` (direct access) and ``get_generator``
over a 1 GiB zlib-3 file of random normal float32 rows of ``--row-values``
values (default 1,024: 4 KiB rows; fewer make more rows, where the
generator's cost a row shows), read by ``--engine`` (default the chunk
engine) in ``--n_procs`` readers (default 2), with each checkout in
turn (a fresh interpreter each, ``PYTHONPATH`` set to the checkout), so that
the host's drift hits both alike. ``--cold`` evicts the file from the page
cache before each pass (``multitables_bench.cache.evict``). Prints each run
and the medians.

    python benchmarks/ab_stream.py --file bench/ab.h5 --a ../before --b . --runs 7
    python benchmarks/ab_stream.py --file bench/ab16.h5 --row-values 16 --a ../before --b . --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

PASS = r"""
import sys, time, multitables
path, mode, n_procs, engine, cold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "cold"
if cold:
    from multitables_bench.cache import evict
    evict(path)
stream = multitables.Streamer(path, engine=engine)
t = time.perf_counter()
if mode == "direct":
    with stream.get_queue("/data", n_procs=n_procs) as q:
        for g in q.iter():
            with g as block:
                pass
else:
    for row in stream.get_generator("/data", n_procs=n_procs):
        pass
print(time.perf_counter() - t)
"""


def make(path: str, rows: int, values: int) -> None:
    import numpy as np
    import tables

    rng = np.random.default_rng(0)
    step = max(1, (32 << 20) // (4 * values))  # 32 MiB at a time
    with tables.open_file(path, "w") as f:
        arr = f.create_earray("/", "data", tables.Float32Atom(), shape=(0, values), filters=tables.Filters(3, "zlib"))
        for start in range(0, rows, step):
            arr.append(rng.standard_normal((min(step, rows - start), values), dtype=np.float32))


def run_in(root: str, code: str, *argv: str) -> str:
    """Run ``code`` with the package of checkout ``root`` (checked), in a fresh interpreter; its stdout.

    The interpreter starts in ``root``: ``python -c`` puts its working
    directory first on ``sys.path``, ahead of ``PYTHONPATH``, so started from
    another checkout it would import that checkout's package instead.
    """
    root = os.path.abspath(root)
    check = f"import multitables, os; assert os.path.dirname(os.path.dirname(multitables.__file__)) == {root!r}, multitables.__file__\n"
    env = dict(os.environ, PYTHONPATH=root)
    return subprocess.run(
        [sys.executable, "-c", check + code, *argv], cwd=root, env=env, capture_output=True, text=True, check=True
    ).stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--a", required=True, help="checkout A (e.g. the commit before)")
    p.add_argument("--b", required=True, help="checkout B")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--n_procs", type=int, default=2)
    p.add_argument("--engine", default="chunks", help="the engine the readers decode with")
    p.add_argument("--cold", action="store_true", help="evict the file from the page cache before each pass")
    p.add_argument("--row-values", type=int, default=1024, help="float32 values a row of a file it writes")
    args = p.parse_args()
    if not os.path.exists(args.file):
        make(args.file, (1 << 30) // (4 * args.row_values), args.row_values)
    import h5py

    with h5py.File(args.file, "r") as f:
        nbytes = f["/data"].size * f["/data"].dtype.itemsize
    if not args.cold:
        subprocess.run(["cat", args.file], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    times: dict[tuple[str, str], list[float]] = {}
    for run in range(args.runs):
        for mode in ("direct", "generator"):
            for label, root in (("A", args.a), ("B", args.b)):
                out = run_in(root, PASS, os.path.abspath(args.file), mode, str(args.n_procs), args.engine,
                             "cold" if args.cold else "warm")
                t = float(out.strip().splitlines()[-1])
                times.setdefault((mode, label), []).append(t)
                print(f"run {run} {mode} {label}: {nbytes / t / 1e6:,.0f} MB/s", flush=True)
    for mode in ("direct", "generator"):
        a = statistics.median(times[(mode, "A")])
        b = statistics.median(times[(mode, "B")])
        print(f"{mode}: A {nbytes / a / 1e6:,.0f} MB/s, B {nbytes / b / 1e6:,.0f} MB/s, B/A {a / b:.3f}")


if __name__ == "__main__":
    main()
