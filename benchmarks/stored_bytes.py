"""Stored bytes (no filter): multitables' default against one h5py process, and what the planner turned down (issue #29, item 3).

Every pass reads every row of ``/data`` of ``--file`` (float32 rows, any
chunking or none; written if missing: ``--rows`` rows of 1024 random values
in PyTables' chunks, no filter), as:

* ``h5py``: one ``h5py.File``, ``read_direct`` in blocks of 1,024 rows into
  one buffer (the benchmark's single-process reader);
* ``default direct`` / ``default generator``: ``Streamer(f).get_queue('/data',
  remainder=True)``, every block taken and released / ``get_generator``,
  every row (what ``auto`` and the planner choose);
* ``readers=2 direct`` / ``generator``: the same with ``n_procs=2`` (reader
  processes, which the planner no longer starts for stored bytes);
* ``hinted direct``: the default with the hints one reader gave before
  issue #29 (the next block, the first block itself too, whatever the
  filters).

Passes are prepared as the benchmark's (``cold``: the file's pages dropped,
memory settled where this VM reports free pages; ``warm``: read in) and
interleaved, the order the same in every repeat. Printed: each way's median
ms and its rate against ``h5py`` (>1 faster). Run from the checkout::

    python benchmarks/stored_bytes.py --file bench/stored.h5 --rows 262144 --cache cold warm --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from typing import Callable

import numpy as np

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # multitables_bench, after PYTHONPATH

NODE = "/data"


def write(path: str, rows: int) -> None:
    import tables

    rng = np.random.default_rng(0)
    with tables.open_file(path, "w") as f:
        arr = f.create_earray("/", NODE[1:], tables.Float32Atom(), (0, 1024), expectedrows=rows)
        for start in range(0, rows, 4096):
            arr.append(rng.standard_normal((min(4096, rows - start), 1024), dtype=np.float32))


def ways(path: str) -> "dict[str, Callable[[], int]]":
    import h5py

    import multitables
    from multitables._io import blockread

    def plain() -> int:
        with h5py.File(path, "r") as f:
            ds = f[NODE]
            n = ds.shape[0]
            buf = np.empty((1024,) + ds.shape[1:], ds.dtype)
            for a in range(0, n, 1024):
                b = min(a + 1024, n)
                ds.read_direct(buf[: b - a], np.s_[a:b])
        return n

    def direct(n_procs: "int | None") -> int:
        rows = 0
        with multitables.Streamer(path).get_queue(NODE, n_procs=n_procs, remainder=True) as queue:
            for guard in queue.iter():
                with guard as block:
                    rows += len(block)
        return rows

    def generator(n_procs: "int | None") -> int:
        return sum(1 for _ in multitables.Streamer(path).get_generator(NODE, n_procs=n_procs))

    def hinted() -> int:
        planned = blockread.hint_distance
        blockread.hint_distance = lambda n_readers, filter_ids: max(n_readers, 1)  # type: ignore[assignment]
        try:
            return direct(None)
        finally:
            blockread.hint_distance = planned

    return {
        "h5py": plain,
        "default direct": lambda: direct(None),
        "default generator": lambda: generator(None),
        "readers=2 direct": lambda: direct(2),
        "readers=2 generator": lambda: generator(2),
        "hinted direct": hinted,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", default="bench/stored.h5")
    p.add_argument("--rows", type=int, default=131072, help="rows of 4 KiB written when --file is missing")
    p.add_argument("--cache", nargs="+", choices=("cold", "warm"), default=["cold", "warm"])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    from multitables._io.fileset import forget_learned
    from multitables_bench.cache_modes import prepare_cache

    if not os.path.exists(args.file):
        os.makedirs(os.path.dirname(args.file) or ".", exist_ok=True)
        write(args.file, args.rows)
    functions = ways(args.file)
    print(f"{args.file}: {os.path.getsize(args.file) / 2**20:.0f} MiB; medians of {args.repeats}; rate = h5py ms / ms\n")
    print("| cache | " + " | ".join(functions) + " |")
    print("|---|" + "---|" * len(functions))
    for cache in args.cache:
        times: dict[str, list[float]] = {k: [] for k in functions}
        for _ in range(args.repeats):
            for name, fn in functions.items():
                forget_learned()  # every pass a first read of the file, as in a fresh process
                prepare_cache(args.file, "evict" if cache == "cold" else "warm")
                gc.collect()
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        base = statistics.median(times["h5py"])
        cells = [f"{statistics.median(v) * 1e3:.1f} ms ({base / statistics.median(v):.2f}x)" for v in times.values()]
        print(f"| {cache} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
