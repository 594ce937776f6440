"""``python -m multitables``: write a small compressed example file, stream it both ways, print the rates.

Options: ``--rows`` (default 65536 rows of 1024 float32, 256 MiB), ``--complib``
(default ``blosc``), ``--complevel`` (3), ``--n-procs`` (default: the CPUs),
``--file`` (default: a temporary file, removed afterwards).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def write_example(filename: str, n_rows: int, complib: str, complevel: int) -> None:
    """Random normal float32 rows of 1024 values, written with PyTables (its default chunking)."""
    import tables
    from tqdm import tqdm

    filters = tables.Filters(complevel=complevel, complib=complib, shuffle=True)
    rng = np.random.default_rng(0)
    with tables.open_file(filename, "w") as f:
        arr = f.create_earray("/", "data", tables.Float32Atom(), (0, 1024), filters=filters, expectedrows=n_rows)
        step = 4096
        for start in tqdm(range(0, n_rows, step), desc=f"writing {filename}", unit="block"):
            arr.append(rng.standard_normal((min(step, n_rows - start), 1024), dtype=np.float32))


def main(argv: "list[str] | None" = None) -> None:
    import multitables

    parser = argparse.ArgumentParser(prog="python -m multitables", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--complib", default="blosc")
    parser.add_argument("--complevel", type=int, default=3)
    parser.add_argument("--n-procs", type=int, default=None)
    parser.add_argument("--file", default=None)
    args = parser.parse_args(argv)

    tmpdir = None
    filename = args.file
    if filename is None:
        tmpdir = tempfile.TemporaryDirectory(prefix="multitables_demo_")
        filename = os.path.join(tmpdir.name, "example.h5")
    try:
        write_example(filename, args.rows, args.complib, args.complevel)
        stream = multitables.Streamer(filename)
        row_nbytes = 1024 * 4

        def direct() -> int:
            n = 0
            with stream.get_queue("/data", n_procs=args.n_procs) as queue:
                for guard in queue.iter():
                    with guard as block:
                        n += len(block)
                info.update(procs=queue.n_procs, engine=queue.engine, block_size=queue.block_size)
            return n + len(stream.get_remainder("/data", info["block_size"]))

        def generator() -> int:
            return sum(1 for _ in stream.get_generator("/data", n_procs=args.n_procs))

        info: dict = {}
        # Best of three passes: the first one also pays for starting
        # multiprocessing's resource tracker and for cold imports.
        times = {}
        for name, run in (("direct", direct), ("generator", generator)):
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                rows = run()
                best = min(best, time.perf_counter() - t0)
                assert rows == args.rows, (name, rows, args.rows)
            times[name] = best
        procs, engine, block_size = info["procs"], info["engine"], info["block_size"]
        print(f"{args.rows} rows of {row_nbytes} B, {args.complib} level {args.complevel}, "
              f"{procs} reader processes, engine {engine}, blocks of {block_size} rows "
              f"(page cache warm, best of 3 passes)")
        for name, dt in times.items():
            print(f"{name:>9}: {args.rows / dt:12,.0f} rows/s {args.rows * row_nbytes / dt / 1e6:10,.0f} MB/s")
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()


if __name__ == "__main__":
    main()
