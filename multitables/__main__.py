"""``python -m multitables``: write an example file, read it with plain h5py and with multitables, compare.

Options: ``--rows`` (default 98304 rows of 1024 float32, 384 MiB uncompressed:
enough for reader processes to pay), ``--complib`` (default ``zlib``),
``--complevel`` (3), ``--data`` (``smooth``: a random walk along each row, in
whole steps, which compresses ~4x; ``noise``: random normal values, which
hardly compress), ``--n-procs`` (default: what multitables picks),
``--file`` (default: a temporary file, removed afterwards; a file given is
kept). Every figure printed is measured here, on this machine.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import tempfile
import textwrap
import time
from typing import Callable

import numpy as np

ROW_VALUES = 1024  # float32 values a row: 4 KiB rows

DATA = {
    "smooth": "a random walk along each row, in whole steps (like sensor counts stored as float32)",
    "noise": "random normal values (hardly compress)",
}


def make_rows(rng: np.random.Generator, n: int, data: str) -> np.ndarray:
    """``n`` rows of ``data`` (a key of :data:`DATA`)."""
    if data == "noise":
        return rng.standard_normal((n, ROW_VALUES), dtype=np.float32)
    steps = rng.integers(-8, 9, (n, ROW_VALUES), dtype=np.int8)
    return np.cumsum(steps, axis=1, dtype=np.int16).astype(np.float32)


#: The root attribute that marks a file this demo wrote.
EXAMPLE_MARK = "multitables_demo_example"


def target_problem(filename: str) -> "str | None":
    """Why ``--file filename`` may not be written (None: it may): a folder, a missing folder, or a file that this
    demo did not write (the user's data is never written over)."""
    if os.path.isdir(filename):
        return f"--file {filename!r} is a folder: name a file in it"
    folder = os.path.dirname(os.path.abspath(filename))
    if not os.path.isdir(folder):
        return f"--file {filename!r}: there is no folder {folder!r}"
    if not os.path.lexists(filename):
        return None
    import h5py

    try:
        with h5py.File(filename, "r") as f:
            if f.attrs.get(EXAMPLE_MARK, False):
                return None
    except OSError:
        pass
    return f"--file {filename!r} exists and this demo did not write it: give a new path (it is never written over)"


def write_example(filename: str, n_rows: int, complib: str, complevel: int, data: str = "smooth") -> None:
    """``n_rows`` rows of ``data``, written with PyTables (shuffle on, its default chunking)."""
    import tables
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread left running when the readers fork (Python 3.12 warns of it)
    filters = tables.Filters(complevel=complevel, complib=complib, shuffle=True)
    rng = np.random.default_rng(0)
    with tables.open_file(filename, "w") as f:
        f.root._v_attrs[EXAMPLE_MARK] = True  # a later --file may write over this file, and over no other
        arr = f.create_earray("/", "data", tables.Float32Atom(), (0, ROW_VALUES), filters=filters, expectedrows=n_rows)
        step = 4096
        for start in tqdm(range(0, n_rows, step), desc=f"writing {filename}", unit="block", leave=False):
            arr.append(make_rows(rng, min(step, n_rows - start), data))


def h5py_reader(filename: str) -> Callable[[], int]:
    """One plain process: h5py ``read_direct`` in blocks of ~16 MiB into one preallocated array."""
    import h5py

    try:  # blosc and friends, as a user reading such a file would install
        importlib.import_module("hdf5plugin")
    except ImportError:
        pass
    with h5py.File(filename, "r") as f:
        shape, chunk_rows = f["/data"].shape, (f["/data"].chunks or (1,))[0]
    step = max(1, (16 << 20) // (4 * ROW_VALUES) // chunk_rows) * chunk_rows
    buf = np.zeros((min(step, shape[0]), ROW_VALUES), np.float32)

    def read() -> int:
        with h5py.File(filename, "r") as f:
            dset = f["/data"]
            for start in range(0, shape[0], step):
                n = min(step, shape[0] - start)
                dset.read_direct(buf, np.s_[start : start + n], np.s_[:n])
        return shape[0]

    return read


def describe_file(filename: str, args: argparse.Namespace) -> str:
    row_nbytes = 4 * ROW_VALUES
    raw, disk = args.rows * row_nbytes, os.path.getsize(filename)
    import h5py

    import tables

    with h5py.File(filename, "r") as f:
        chunk_rows = (f["/data"].chunks or (args.rows,))[0]
    with tables.open_file(filename, "r") as f:  # what PyTables wrote: it may have taken another complib
        filters = f.root.data.filters
    stored = (f"{filters.complib} level {filters.complevel}" if filters.complevel else "uncompressed") + (
        " + shuffle" if filters.shuffle else "")
    return (
        f"file: {plural(args.rows, 'row')} of {ROW_VALUES} float32 ({row_nbytes:,} B a row, {size(raw)}), "
        f"{stored}, chunks of {plural(chunk_rows, 'row')};\n"
        f"      {args.data} data: {DATA[args.data]};\n"
        f"      {size(disk)} on disk ({raw / disk:.1f}x compressed)"
    )


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}es" if word.endswith("s") else f"{n:,} {word}s"


def size(nbytes: int) -> str:
    """``nbytes`` in MiB, or KiB under one MiB (a tiny file is not "0 MiB")."""
    return f"{nbytes / 2**20:,.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:,.1f} KiB"


def why(info: dict, ratios: dict, n_cpus: int, asked: "int | None") -> "list[str]":
    """A few lines on where the difference comes from, from the figures measured (nothing assumed)."""
    procs, engine, ratio = info["procs"], info["engine"], ratios["direct"]
    chosen = f"the default on {n_cpus} CPUs" if asked is None else f"n_procs={asked} asked"
    speed = f"{ratio:.2f}x as fast as plain h5py" if ratio >= 1 else f"at {ratio:.2f}x plain h5py's rate: slower here"
    readers = plural(procs, "reader process")
    lines = [f"multitables read the file {speed}, with {readers} ({chosen}) and its {engine!r} engine."]
    if engine == "chunks":
        how = "multitables' chunk engine reads the stored chunks itself and decodes them"
    else:
        how = f"multitables decodes with {engine} too,"
    if procs == 0 and asked == 0:
        how += " in this process, as asked."
    elif procs == 0:
        how += " in this process: the file is too small for reader processes to pay (try more --rows)."
    elif "one" in ratios and procs > 1 and ratios["one"] >= ratio:  # measured so: say it, credit nothing else
        how += (f" straight into shared memory; here one reader process alone read it at {ratios['one']:.2f}x h5py's "
                f"rate, as fast as {procs} readers: more readers added nothing in this run (cores busy with other "
                f"work, or a limit other than decoding; `multitables-benchmark` measures each number of readers).")
    elif "one" in ratios:
        how += (f" straight into shared memory (one reader process alone: {ratios['one']:.2f}x h5py's rate), "
                f"and {procs} readers decode on {plural(min(procs, n_cpus), 'core')} at once.")
    else:
        how += f" straight into shared memory, in {readers} on {plural(min(procs, n_cpus), 'core')}."
    lines.append("Why: plain h5py decodes every chunk in one process, on one core; " + how)
    return lines


def main(argv: "list[str] | None" = None) -> None:
    import tables

    import multitables
    from multitables._plan.readers import available_cpus

    parser = argparse.ArgumentParser(prog="python -m multitables", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=98304, help="rows of 1024 float32 (default 98304: 384 MiB)")
    parser.add_argument("--complib", default="zlib", choices=tables.filters.all_complibs, metavar="COMPLIB",
                        help="PyTables complib: zlib (the default), blosc, blosc:lz4, ...")
    parser.add_argument("--complevel", type=int, default=3, choices=range(10), metavar="0-9",
                        help="compression level (default 3; 0 stores the rows uncompressed)")
    parser.add_argument("--data", choices=sorted(DATA), default="smooth",
                        help="; ".join(f"{name}: {text}" for name, text in sorted(DATA.items())) + " (default smooth)")
    parser.add_argument("--n-procs", type=int, default=None, help="reader processes (default: multitables' choice)")
    parser.add_argument("--file", default=None, help="write the example here and keep it (a new path, or one this demo wrote before)")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error(f"--rows must be at least 1, got {args.rows}")
    if args.n_procs is not None and args.n_procs < 0:
        parser.error(f"--n-procs must be 0 or more, got {args.n_procs}")
    problem = None if args.file is None else target_problem(args.file)
    if problem is not None:
        parser.error(problem)

    tmpdir = None
    filename = args.file
    if filename is None:
        tmpdir = tempfile.TemporaryDirectory(prefix="multitables_demo_")
        filename = os.path.join(tmpdir.name, "example.h5")
    n_cpus = available_cpus()
    print(f"multitables demo: one HDF5 file read with plain h5py and with multitables, on this machine "
          f"({n_cpus} CPUs).", flush=True)
    try:
        t0 = time.perf_counter()
        write_example(filename, args.rows, args.complib, args.complevel, args.data)
        written_s = time.perf_counter() - t0
        print(describe_file(filename, args) + f", written in {written_s:.1f} s.")
        print("Reading it whole, page cache warm (the file was just written), best of 3 passes each, alternating:\n",
              flush=True)
        stream = multitables.Streamer(filename)
        info: dict = {}

        def direct(n_procs: "int | None") -> int:
            n = 0
            with stream.get_queue("/data", n_procs=n_procs, remainder=True) as queue:
                for guard in queue.iter():
                    with guard as block:
                        n += len(block)
                if n_procs == args.n_procs:
                    info.update(procs=queue.n_procs, engine=queue.engine)
            return n

        def generator() -> int:
            return sum(1 for _ in stream.get_generator("/data", n_procs=args.n_procs))

        label = "defaults" if args.n_procs is None else f"n_procs={args.n_procs}"
        readers = {
            "h5py": ("h5py read_direct, 1 process", h5py_reader(filename)),
            "direct": (f"multitables get_queue, {label}", lambda: direct(args.n_procs)),
            "generator": (f"multitables get_generator, {label}", generator),
        }
        if args.n_procs != 1:
            readers["one"] = ("multitables get_queue, n_procs=1", lambda: direct(1))
        # Best of three passes, the readers in turn (slow drift touches all alike). The page
        # cache holds the file just written; the first pass also pays for cold imports.
        best = dict.fromkeys(readers, float("inf"))
        for _ in range(3):
            for key, (_, read) in readers.items():
                gc.collect()
                start = time.perf_counter()
                rows = read()
                best[key] = min(best[key], time.perf_counter() - start)
                assert rows == args.rows, (key, rows, args.rows)
        ratios = {key: best["h5py"] / dt for key, dt in best.items()}

        print(f"  {'reader':<44} {'MB/s':>8} {'rows/s':>11} {'vs h5py':>8}")
        nbytes = args.rows * 4 * ROW_VALUES
        for key, (name, _) in readers.items():
            dt = best[key]
            print(f"  {name:<44} {nbytes / dt / 1e6:8,.0f} {args.rows / dt:11,.0f} {ratios[key]:7.2f}x")
        print()
        for line in why(info, ratios, n_cpus, args.n_procs) + [
            "These numbers come from this machine, now (MB/s: 10^6 bytes of uncompressed data a second); "
            "`multitables-benchmark` measures more (BENCHMARKS.md)."
        ]:
            print(textwrap.fill(line, 110, subsequent_indent="  ", break_on_hyphens=False))
        if args.file is not None:
            print(f"The file is kept: {args.file}")
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()


if __name__ == "__main__":
    main()
