"""A PyTables table with a string column: PyTables and h5py against multitables' engines; alternating, medians of 7.

Usage: python benchmarks/table_strings.py DIR [--filters none|blosc|zlib]  (DIR: where the file is written once)

The table: 2 M rows of 32 bytes (int64, float32, float64, an 8-byte string, 4 uint8), 64 MiB, PyTables' chunks.
Printed: PyTables ``table.read()``'s time, then each way's ratio to it (above 1: faster): h5py's ``ds[()]``;
multitables with ``n_procs`` left out (``default``) and each engine in this process (``ENGINE/0``); and the time
of ``deliver_strings`` (the conversion of the strings to what h5py delivers) over the whole table, in this process.
Rows are checked against h5py's once, untimed. Page cache warm.
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
from multitables._io.node import inspect_node
from multitables._io.strings import deliver_strings

ROW = np.dtype([("i", "<i8"), ("x", "<f4"), ("y", "<f8"), ("name", "S8"), ("v", "u1", (4,))])
N_ROWS = 2 << 20
FILTERS = {"none": None, "blosc": tables.Filters(5, "blosc:lz4", shuffle=True), "zlib": tables.Filters(1, "zlib")}


def write(path: str, filters: "tables.Filters | None") -> None:
    rng = np.random.default_rng(0)
    with tables.open_file(path + ".tmp", "w") as f:
        table = f.create_table("/", "t", description=ROW, filters=filters, expectedrows=N_ROWS)
        for start in range(0, N_ROWS, 1 << 20):
            rows = np.zeros(1 << 20, ROW)
            rows["i"] = np.arange(start, start + len(rows))
            rows["x"] = np.cumsum(rng.standard_normal(len(rows), dtype=np.float32))
            rows["y"] = rows["i"] * 0.5
            rows["name"] = np.char.add(b"n", (rows["i"] % 1000).astype("S5"))
            rows["v"] = (rows["i"][:, None] + np.arange(4)) % 256
            table.append(rows)
    os.rename(path + ".tmp", path)


def median_s(run: "object", repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()  # type: ignore[operator]
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--filters", choices=list(FILTERS), default="none")
    args = parser.parse_args()
    os.makedirs(args.folder, exist_ok=True)
    path = os.path.join(args.folder, f"table_strings_{args.filters}.h5")
    if not os.path.exists(path):
        write(path, FILTERS[args.filters])
    with h5py.File(path, "r") as f:
        expected = f["t"][()]

    def pytables() -> None:
        with tables.open_file(path) as f:
            f.root.t.read()

    def plain_h5py() -> None:
        with h5py.File(path, "r") as f:
            f["t"][()]

    def stream(engine: str, n_procs: "int | None", check: bool = False) -> None:
        got = []
        with multitables.Streamer(path, engine=engine).get_queue("/t", n_procs=n_procs, ordered=True, remainder=True) as q:
            for guard in q.iter():
                with guard as block:
                    if check:
                        got.append(block.copy())
        if check:
            assert np.concatenate(got).tobytes() == expected.tobytes(), (engine, n_procs)

    ways = {"h5py ds[()]": plain_h5py, "default": lambda: stream("auto", None)}
    for engine in ("h5py", "chunks", "tables"):
        stream(engine, 0, check=True)
        ways[f"{engine}/0"] = lambda engine=engine: stream(engine, 0)
    stream("auto", None, check=True)
    times: dict[str, list[float]] = {"PyTables read()": [], **{k: [] for k in ways}}
    for _ in range(7):  # alternating
        times["PyTables read()"].append(median_s(pytables, 1))
        for k, way in ways.items():
            times[k].append(median_s(way, 1))
    base = statistics.median(times["PyTables read()"])
    print(f"{args.filters}: PyTables read() {base * 1e3:.1f} ms; " + "  ".join(
        f"{k} {base / statistics.median(v):.2f}" for k, v in times.items() if k != "PyTables read()"))
    pads = inspect_node(path, "/t").string_pads
    copy = expected.copy()
    print(f"deliver_strings over the table: {median_s(lambda: deliver_strings(copy, pads)) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
