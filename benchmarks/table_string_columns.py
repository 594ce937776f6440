"""A PyTables table of wide string columns among numbers: PyTables, h5py and multitables' ways; medians of 5.

Usage: python benchmarks/table_string_columns.py DIR [--filters none|blosc|zlib] [--rows N] [--runs 5]
(DIR: where the file is written once; page cache warm after the first run.)

The table: an ``IsDescription`` of Int32, StringCol(16), Float64, StringCol(32), Int32, StringCol(64), Float64
(136-byte rows, 1.5 M rows: 204 MB), strings of random lower-case letters 1 to their size long, NUL-padded as
PyTables stores them; blosc is lz4 5 + shuffle, zlib 1 + shuffle (PyTables' default). Printed: PyTables
``table.read()``'s time, then each way's time and its ratio to it (medians of per-run ratios, ways alternating
in each run; above 1: faster): PyTables ``iterrows()``, a loop over the rows of an array in memory (numpy's cost
of a row object, what a generator pays beyond the read), h5py's ``ds[()]``, ``get_queue`` direct with ``n_procs``
0, 1, 2 and left out, ``get_generator`` with 0 and 2, each engine with ``n_procs=0``; then the S64 column: PyTables
``read(field="path")``, and ``get_queue(field="path", n_procs=0)`` with its ratio to that. Rows are checked
against h5py's once, untimed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import h5py
import hdf5plugin  # noqa: F401  (blosc for h5py)
import numpy as np
import tables

import multitables


class Row(tables.IsDescription):
    id = tables.Int32Col(pos=0)
    name = tables.StringCol(16, pos=1)
    x = tables.Float64Col(pos=2)
    label = tables.StringCol(32, pos=3)
    k = tables.Int32Col(pos=4)
    path = tables.StringCol(64, pos=5)
    y = tables.Float64Col(pos=6)


FILTERS = {"none": None, "blosc": tables.Filters(5, "blosc:lz4", shuffle=True), "zlib": tables.Filters(1, "zlib")}


def write(path: str, filters: "tables.Filters | None", n: int) -> None:
    rng = np.random.default_rng(0)
    with tables.open_file(path + ".tmp", "w") as f:
        table = f.create_table("/", "t", Row, filters=filters, expectedrows=n)
        for start in range(0, n, 1 << 18):
            rows = np.zeros(min(1 << 18, n - start), table.dtype)
            i = np.arange(start, start + len(rows))
            rows["id"], rows["k"], rows["x"], rows["y"] = i, i % 97, rng.standard_normal(len(rows)), i * 0.25
            for column, size in (("name", 16), ("label", 32), ("path", 64)):
                letters = rng.integers(97, 123, (len(rows), size), dtype=np.uint8)
                letters[np.arange(size) >= rng.integers(1, size + 1, len(rows))[:, None]] = 0
                rows[column] = letters.view(f"S{size}").ravel()
            table.append(rows)
    os.rename(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--filters", choices=list(FILTERS), default="none")
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.makedirs(args.folder, exist_ok=True)
    path = os.path.join(args.folder, f"string_columns_{args.filters}_{args.rows}.h5")
    if not os.path.exists(path):
        write(path, FILTERS[args.filters], args.rows)

    def pytables_read() -> None:
        with tables.open_file(path) as f:
            f.root.t.read()

    def pytables_iterrows() -> None:
        with tables.open_file(path) as f:
            for _ in f.root.t.iterrows():
                pass

    def pytables_column() -> None:
        with tables.open_file(path) as f:
            f.root.t.read(field="path")

    def plain_h5py() -> None:
        with h5py.File(path, "r") as f:
            f["t"][()]

    def queue(n_procs: "int | None", field: "str | None" = None, engine: str = "auto", got: "list | None" = None):
        def run() -> None:
            stream = multitables.Streamer(path, engine=engine)
            with stream.get_queue("/t", n_procs=n_procs, field=field, ordered=True, remainder=True) as q:
                for guard in q.iter():
                    with guard as block:
                        if got is not None:
                            got.append(block.copy())
        return run

    def generator(n_procs: int) -> "object":
        return lambda: [None for _ in multitables.Streamer(path).get_generator("/t", n_procs=n_procs)]

    with h5py.File(path, "r") as f:
        expected = f["t"][()]
    for engine in ("auto", "h5py", "chunks", "tables"):
        got: list = []
        queue(0, engine=engine, got=got)()
        assert np.concatenate(got).tobytes() == expected.tobytes(), engine
    ways = {"PyTables read()": pytables_read, "PyTables iterrows()": pytables_iterrows,
            "numpy rows looped": lambda: [None for _ in expected], "h5py ds[()]": plain_h5py,
            **{f"queue n_procs={n}": queue(n) for n in (0, 1, 2, None)},
            **{f"generator n_procs={n}": generator(n) for n in (0, 2)},
            **{f"queue {e} n_procs=0": queue(0, engine=e) for e in ("h5py", "chunks", "tables")},
            "PyTables read(field=path)": pytables_column, "queue field=path n_procs=0": queue(0, "path")}
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.runs):  # alternating
        for k, way in ways.items():
            began = time.perf_counter()
            way()  # type: ignore[operator]
            times[k].append(time.perf_counter() - began)
    base = times["PyTables read()"]
    print(f"{args.filters}, {os.path.getsize(path) / 1e6:.0f} MB stored: PyTables read() {statistics.median(base) * 1e3:.0f} ms")
    for k, v in times.items():
        against = times["PyTables read(field=path)"] if k.startswith("queue field") else base
        ratio = statistics.median(b / t for b, t in zip(against, v))
        print(f"  {k:28s} {statistics.median(v) * 1e3:7.0f} ms  {ratio:5.2f}")


if __name__ == "__main__":
    main()
