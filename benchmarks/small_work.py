"""Small work (issue #20, part 1): multitables against one plain process on small files, cold and warm.

The shapes of the issue, each written with PyTables (float32 rows of 4 KiB,
``multitables_bench.files.write_file``) for every codec asked:

* ``three``: three files of 1,000 rows in 16-row chunks (PyTables' default
  for them), read one after the other: one ``Streamer`` per file;
* ``block``: one file of 256 rows in one 256-row chunk (a single block);
* ``subchunk``: 100 rows in a 1,024-row chunk (less than a chunk).

Every row of every file is read by each reader of a pass, which includes
opening the files (and, for multitables, creating the ``Streamer``):

* ``h5py``: one ``h5py.File`` per file, ``read_direct`` of the whole
  dataset into a fresh array (hdf5plugin's filters registered);
* ``tables``: ``tables.open_file`` and ``read()`` of the whole node;
* ``h5py rows``: as ``h5py``, then a loop over the array's rows (the
  generator's baseline: what a user who wants rows writes);
* ``direct``: ``multitables.Streamer(f).get_queue('/data', remainder=True)``,
  every block taken and released (default ``n_procs``, ``engine``);
* ``generator``: ``Streamer(f).get_generator('/data')``, every row.

Passes are prepared as the benchmark prepares its own (``multitables_bench.cache_modes.prepare_cache``:
``cold`` drops the files' pages and, on a VM whose balloon reports free
pages, settles memory; ``warm`` reads them in) and ``gc.collect()`` runs
before each, outside the timer. A pass leaves the next one slower or faster
(PyTables' pass leaves the next ~2% slower here), so the order of passes
walks every ordered pair of readers equally often (:func:`~multitables_bench.passes.pass_order`): a
rotation would put PyTables before ``direct`` in three repeats of four and
never before ``h5py`` (BENCHMARKS.md). ``--order loop`` instead runs each
reader in a process of its own, its passes one after another (warm: with
nothing between them), as a user's program reading small files in a loop
does: there a pass depends on what the reader's own passes left in the
heap. Printed: per shape and codec, each
reader's median ms and its rate against the best single-process reader
(h5py or PyTables, whichever is faster by median) and the generator's
against ``h5py rows``, as a Markdown table,
with each reader's median minor page faults a pass in this process: where
they differ, so does the time (fresh heap pages cost a fault each here).

Run from the checkout, e.g.::

    python benchmarks/small_work.py --repeats 41 --cache cold warm
    python benchmarks/small_work.py --shapes three --codecs zlib --cache cold --profile 30
    python benchmarks/small_work.py --one-reader 1 --codecs blosc --data smooth --repeats 9
    python benchmarks/small_work.py --order loop --cache warm --repeats 41

``--profile N`` instead times N passes of multitables (direct) phase by
phase (opening the file and checking the node, engine choice, ``parallel_pays``,
opening the source, reading the blocks, closing it; the rest is the
Streamer and queue themselves) and prints a cProfile of N more, by
cumulative time.

``--one-reader GIB`` (issue #20, part 2) instead writes a file of GIB GiB
and times one reader process against one plain h5py process on it
(:func:`one_reader`). ``PYTHONPATH`` may name another copy of the package
to measure (the checkout is appended to ``sys.path`` for
``multitables_bench`` only).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable

import numpy as np

# The checkout, for multitables_bench; appended, so that PYTHONPATH may name another multitables to compare.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from multitables_bench.calls import time_calls  # noqa: E402
from multitables_bench.cache_modes import prepare_cache  # noqa: E402
from multitables_bench.files import h5py_with_filters, write_file  # noqa: E402
from multitables_bench.passes import pass_order  # noqa: E402
from multitables_bench.records import NODE, Codec  # noqa: E402

#: (files, rows per file, rows per chunk) of each shape.
SHAPES = {"three": (3, 1000, 16), "block": (1, 256, 256), "subchunk": (1, 100, 1024)}
CODECS = {"zlib": Codec("zlib", 3), "blosc": Codec("blosc", 3), "none": Codec("zlib", 0)}
READERS = ("h5py", "tables", "h5py rows", "direct", "generator")
#: The single-process readers of arrays; ``h5py rows`` is the generator's own baseline (it also walks the rows).
SINGLE = ("h5py", "tables")
ROWS = "h5py rows"


def make_files(directory: str, shape: str, codec: str, data: str) -> list[str]:
    """Write the files of ``shape`` (once: kept between runs); return their paths."""
    n_files, n_rows, chunk = SHAPES[shape]
    paths = []
    for i in range(n_files):
        path = os.path.join(directory, f"small-{shape}-{codec}-{data}-{i}.h5")
        if not os.path.exists(path):
            write_file(path, n_rows, CODECS[codec], chunk, seed=i, data=data)
        paths.append(path)
    return paths


def _h5py_array(path: str) -> np.ndarray:
    """The whole dataset of ``path`` read with h5py into a fresh array."""
    h5py = h5py_with_filters()
    with h5py.File(path, "r") as f:
        ds = f[NODE]
        out = np.empty(ds.shape, ds.dtype)
        ds.read_direct(out)
    return out


def read_h5py(paths: list[str]) -> int:
    return sum(len(_h5py_array(path)) for path in paths)


def read_h5py_rows(paths: list[str]) -> int:
    """As :func:`read_h5py`, then every row taken as the generator's caller takes them: what a user who wants rows
    writes with h5py (iterating the ``Dataset`` itself reads one row at a time, far slower)."""
    rows = 0
    for path in paths:
        for _row in _h5py_array(path):
            rows += 1
    return rows


def read_tables(paths: list[str]) -> int:
    import tables

    rows = 0
    for path in paths:
        with tables.open_file(path, "r") as f:
            rows += len(f.get_node(NODE).read())
    return rows


#: The engine the multitables readers ask for (``--engine``).
ENGINE = ["auto"]


def read_direct(paths: list[str]) -> int:
    import multitables

    rows = 0
    for path in paths:
        with multitables.Streamer(path, engine=ENGINE[0]).get_queue(NODE, remainder=True) as queue:
            for guard in queue.iter():
                with guard as block:
                    rows += len(block)
    return rows


def read_generator(paths: list[str]) -> int:
    import multitables

    rows = 0
    for path in paths:  # the loop of ``read_h5py_rows``: a generator expression around it would cost a resume a row
        for _row in multitables.Streamer(path, engine=ENGINE[0]).get_generator(NODE):
            rows += 1
    return rows


FUNCTIONS: dict[str, Callable[[list[str]], int]] = {
    "h5py": read_h5py, "tables": read_tables, "h5py rows": read_h5py_rows, "direct": read_direct,
    "generator": read_generator,
}


def prepare(paths: list[str], cache: str) -> None:
    """The cache for a pass, and a process that never read the files (no node or layout remembered: NOTE [file
    identity])."""
    from multitables._io.fileset import forget_learned

    forget_learned()
    for path in paths:
        prepare_cache(path, "warm" if cache == "warm" else "evict")
    gc.collect()


def time_readers(
    paths: list[str], readers: "list[str]", cache: str, repeats: int, n_rows: int, faults: "dict[str, list[int]] | None" = None
) -> dict[str, list[float]]:
    """Seconds of each reader's passes over ``paths``, in :func:`~multitables_bench.passes.pass_order`."""
    return time_functions(paths, {r: (lambda r=r: FUNCTIONS[r](paths)) for r in readers}, cache, repeats, n_rows, faults)


def time_functions(
    paths: list[str], functions: "dict[str, Callable[[], int]]", cache: str, repeats: int, n_rows: int,
    faults: "dict[str, list[int]] | None" = None,
) -> dict[str, list[float]]:
    """Seconds of each function's passes (each returns the rows it read), prepared as ``cache`` says, in
    :func:`~multitables_bench.passes.pass_order`.

    ``faults``: filled with each pass's minor page faults in this process. A pass of a small file moves with them:
    whether glibc hands back heap memory it kept or fresh pages depends on what ran before it (BENCHMARKS.md)."""
    readers = list(functions)
    times: dict[str, list[float]] = {r: [] for r in readers}
    for name in (readers[j] for j in pass_order(len(readers), repeats)):
        prepare(paths, cache)
        time_pass(name, functions[name], n_rows, times, faults)
    return times


def time_pass(
    name: str, function: "Callable[[], int]", n_rows: int, times: "dict[str, list[float]]",
    faults: "dict[str, list[int]] | None",
) -> None:
    """One pass of ``function``: its seconds appended to ``times[name]``, its minor page faults to ``faults[name]``."""
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    got = function()
    times.setdefault(name, []).append(time.perf_counter() - t0)
    if faults is not None:
        faults.setdefault(name, []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    if got != n_rows:
        raise SystemExit(f"{name} read {got} rows, expected {n_rows}")


#: Untimed passes before a loop's timed ones: the steady state of a loop over many files (Python specialises a
#: function's code after it has run a few times; h5py's pass is mostly compiled code, multitables' is not).
LOOP_WARMUP = 5


def time_loops(
    paths: list[str], readers: "list[str]", cache: str, repeats: int, n_rows: int, faults: "dict[str, list[int]]"
) -> dict[str, list[float]]:
    """``--order loop``: each reader in a process of its own, as a user's program loops over small files:
    :data:`LOOP_WARMUP` untimed passes, then ``repeats`` passes one after another (warm: nothing between them, no
    ``prepare``)."""
    times: dict[str, list[float]] = {}
    for name in readers:
        command = [sys.executable, os.path.abspath(__file__), "--engine", ENGINE[0], "--loop-child", name, str(n_rows),
                   cache, str(repeats), *paths]
        got = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        times[name], faults[name] = got["times"], got["faults"]
    return times


def loop_child(name: str, n_rows: int, cache: str, repeats: int, paths: list[str]) -> None:
    """The process of :func:`time_loops` for reader ``name``: its times and faults, as JSON on stdout."""
    times: dict[str, list[float]] = {}
    faults: dict[str, list[int]] = {}
    prepare(paths, cache)
    for _ in range(LOOP_WARMUP):
        FUNCTIONS[name](paths)
    for _ in range(repeats):
        if cache != "warm":
            prepare(paths, cache)
        time_pass(name, lambda: FUNCTIONS[name](paths), n_rows, times, faults)
    print(json.dumps({"times": times[name], "faults": faults[name]}))


def table(
    results: "list[tuple[str, str, str, dict[str, list[float]], dict[str, list[int]]]]", readers: "list[str]", repeats: int
) -> str:
    head = "| shape | codec | cache | " + " | ".join(f"{r} ms" for r in readers)
    mt = [r for r in readers if r not in SINGLE and r != ROWS]
    rows_ratio = ROWS in readers and "generator" in readers
    head += " | " + " | ".join(f"{r} / best single" for r in mt) + (" | generator / h5py rows" if rows_ratio else "")
    head += " | page faults a pass |"
    lines = [f"Medians of {repeats} repeats; ratio = best single-process time / multitables time (rates); page "
             f"faults: minor, in the process that ran it, median a pass ({' / '.join(readers)}).", "", head,
             "|" + "---|" * (4 + len(readers) + len(mt) + rows_ratio)]
    for shape, codec, cache, times, faults in results:
        med = {r: statistics.median(ts) for r, ts in times.items()}
        best = min(med[r] for r in readers if r in SINGLE) if any(r in SINGLE for r in readers) else float("nan")
        cells = [f"{med[r] * 1e3:.2f}" for r in readers] + [f"{best / med[r]:.2f}x" for r in mt]
        if rows_ratio:
            cells.append(f"{med[ROWS] / med['generator']:.2f}x")
        cells.append(" / ".join(f"{statistics.median(faults[r]):g}" for r in readers))
        lines.append(f"| {shape} | {codec} | {cache} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- the phases of one multitables pass ------------------------------------------------------


def profile(paths: list[str], passes: int, cache: str) -> str:
    """Time ``passes`` multitables (direct) passes phase by phase, then cProfile as many; a report."""
    import cProfile
    import io
    import pstats

    import multitables
    from multitables import streamer as streamer_mod
    from multitables._io import blockread as blockread_mod
    from multitables._plan import readers as readers_mod
    from multitables._procs import stream as stream_mod
    from multitables._stream import backends as backends_mod
    from multitables._stream import options as options_mod

    spans: dict[str, list[float]] = {}
    stamp: dict[str, float] = {}

    def timed(owner: object, name: str, label: str) -> None:
        """Add each call's seconds to ``stamp[label]``; a phase another layout of the package lacks goes to "the rest"."""
        time_calls(owner, name, lambda t0, t1, _args: stamp.__setitem__(label, stamp.get(label, 0.0) + t1 - t0))

    timed(streamer_mod, "open_node", "open file, node checks (open_node)")
    timed(streamer_mod, "open_files", "open file, node checks (open_files)")
    timed(options_mod.StreamOptions, "open_files", "open file, node checks (open_files)")
    timed(options_mod.StreamOptions, "resolve", "engine choice (resolve_engine)")
    timed(readers_mod, "parallel_pays", "plan (parallel_pays)")
    timed(stream_mod, "open_source", "open the source (open_source)")
    timed(blockread_mod, "read_block", "read blocks (read_block)")
    timed(backends_mod.InlineBackend, "close", "close the source")

    def one_pass() -> None:
        for path in paths:
            with multitables.Streamer(path, engine=ENGINE[0]).get_queue(NODE, remainder=True) as queue:
                for guard in queue.iter():
                    with guard:
                        pass

    totals = []
    for _ in range(passes):
        prepare(paths, cache)
        stamp.clear()
        t0 = time.perf_counter()
        one_pass()
        totals.append(time.perf_counter() - t0)
        for k, v in stamp.items():
            spans.setdefault(k, []).append(v)
    lines = [f"{len(paths)} file(s), {cache}, {passes} passes: total median {statistics.median(totals) * 1e3:.3f} ms", ""]
    for k, v in spans.items():
        lines.append(f"  {statistics.median(v) * 1e3:8.3f} ms  {k}")
    accounted = sum(statistics.median(v) for v in spans.values())
    lines.append(f"  {(statistics.median(totals) - accounted) * 1e3:8.3f} ms  the rest (Streamer, queue, loop)")
    prof = cProfile.Profile()
    for _ in range(passes):
        prepare(paths, cache)
        prof.enable()
        one_pass()
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(45)
    return "\n".join(lines) + "\n\n" + out.getvalue()


# -- one reader on a large file (issue #20, part 2) --------------------------------------------


#: The readers of ``--one-reader``: one plain process, the chunk engine in this process, and multitables
#: with one reader process per engine, and with a source that reads nothing (the process and the ring alone).
ONE_READERS = ("h5py", "chunks in-process", "mt chunks", "mt h5py", "mt no-op source")


def one_reader(path: str, repeats: int, caches: "list[str]") -> str:
    """MB/s of the ``ONE_READERS`` on ``/data`` of ``path``, passes interleaved
    (:func:`~multitables_bench.passes.pass_order`); a Markdown table.

    ``h5py`` reads in blocks of the size multitables picks for one reader
    (as the benchmark's single-process reader does) into one buffer;
    ``chunks in-process`` does the same with the chunk engine's source;
    ``mt ...`` stream with ``get_queue(n_procs=1, remainder=True)``, direct
    access. The no-op source is the chunk engine's with ``read_into`` made
    to return at once (forked readers inherit it): the rows are garbage,
    the time is the reader process and the hand-off alone.
    """
    import multitables
    from multitables._io.chunks import source as chunks_mod
    from multitables._io.engines import open_source
    from multitables._io.node import inspect_node

    h5py = h5py_with_filters()
    node = inspect_node(path, NODE)
    nbytes = node.n_rows * node.row_nbytes
    with multitables.Streamer(path, engine="chunks").get_queue(NODE, n_procs=1) as queue:
        block = queue.block_size

    def blocks(read: Callable[[int, int, np.ndarray], object]) -> int:
        buf = np.empty((block,) + node.row_shape, node.dtype)
        for a in range(0, node.n_rows, block):
            b = min(a + block, node.n_rows)
            read(a, b, buf[: b - a])
        return node.n_rows

    def plain() -> int:
        with h5py.File(path, "r") as f:
            ds = f[NODE]
            return blocks(lambda a, b, out: ds.read_direct(out, np.s_[a:b]))

    def in_process() -> int:
        source = open_source("chunks", inspect_node(path, NODE), {})
        try:
            return blocks(source.read_into)
        finally:
            source.close()

    def stream(engine: str) -> Callable[[], int]:
        def read() -> int:
            rows = 0
            with multitables.Streamer(path, engine=engine).get_queue(NODE, n_procs=1, remainder=True) as queue:
                for guard in queue.iter():
                    with guard as got:
                        rows += len(got)
            return rows
        return read

    def no_op() -> int:
        real = chunks_mod.ChunkSource.read_into
        chunks_mod.ChunkSource.read_into = lambda self, start, stop, out: None  # type: ignore[method-assign]
        try:
            return stream("chunks")()
        finally:
            chunks_mod.ChunkSource.read_into = real  # type: ignore[method-assign]

    functions = dict(zip(ONE_READERS, (plain, in_process, stream("chunks"), stream("h5py"), no_op)))
    lines = [f"{os.path.basename(path)}: {nbytes / 1e6:,.0f} MB of rows, {os.path.getsize(path) / 1e6:,.0f} MB of file, "
             f"blocks of {block} rows; medians of {repeats} passes, MB/s of data (ratio to h5py)", "",
             "| cache | " + " | ".join(ONE_READERS) + " |", "|---|" + "---:|" * len(ONE_READERS)]
    for cache in caches:
        names = list(ONE_READERS)
        times = time_functions([path], {n: functions[n] for n in names}, cache, repeats, node.n_rows)
        med = {n: statistics.median(times[n]) for n in names}
        cells = [f"{nbytes / med[n] / 1e6:,.0f} ({med['h5py'] / med[n]:.2f}x)" for n in names]
        lines.append(f"| {cache} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: "list[str] | None" = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="bench", help="where the files are written (kept; default: bench)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--codecs", nargs="+", default=list(CODECS), choices=list(CODECS))
    parser.add_argument("--data", default="noise", choices=("noise", "smooth"))
    parser.add_argument("--cache", nargs="+", default=["cold", "warm"], choices=("cold", "warm"))
    parser.add_argument("--readers", nargs="+", default=list(READERS), choices=READERS)
    parser.add_argument("--engine", default="auto", choices=("auto", "chunks", "h5py", "tables"),
                        help="the engine multitables is asked for (default: auto, the library's default)")
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--order", default="pairs", choices=("pairs", "loop"),
                        help="pairs (default): each reader after each reader alike, in one process; loop: each "
                             "reader's passes one after another in a process of its own, as a user's program runs")
    parser.add_argument("--loop-child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=int, default=0, metavar="PASSES", help="profile multitables' phases instead")
    parser.add_argument("--one-reader", type=float, default=0, metavar="GIB",
                        help="instead: one reader process on a file of GIB GiB of --data rows, --codecs[0] (issue #20 part 2)")
    args = parser.parse_args(argv)
    if args.loop_child:
        name, n_rows, cache, repeats, *paths = args.loop_child
        ENGINE[0] = args.engine
        loop_child(name, int(n_rows), cache, int(repeats), paths)
        return
    os.makedirs(args.dir, exist_ok=True)
    ENGINE[0] = args.engine
    if args.one_reader:
        codec = args.codecs[0]
        path = os.path.join(args.dir, f"one-reader-{codec}-{args.data}-{args.one_reader:g}.h5")
        if not os.path.exists(path):
            write_file(path, int(args.one_reader * (1 << 30)) // 4096, CODECS[codec], data=args.data)
        print(f"{args.data} rows, {codec}; load average before: {os.getloadavg()[0]:.2f}")
        print(one_reader(path, args.repeats, args.cache))
        return
    if args.profile:
        for shape in args.shapes:
            for codec in args.codecs:
                for cache in args.cache:
                    print(f"## {shape}, {codec}, {args.data}")
                    print(profile(make_files(args.dir, shape, codec, args.data), args.profile, cache))
        return
    results = []
    for shape in args.shapes:
        for codec in args.codecs:
            paths = make_files(args.dir, shape, codec, args.data)
            n_rows = SHAPES[shape][0] * SHAPES[shape][1]
            for reader in args.readers:  # once, untimed: imports, and the files written
                FUNCTIONS[reader](paths)
            for cache in args.cache:
                t0 = time.perf_counter()
                faults: dict[str, list[int]] = {}
                if args.order == "loop":
                    times = time_loops(paths, args.readers, cache, args.repeats, n_rows, faults)
                else:
                    times = time_readers(paths, args.readers, cache, args.repeats, n_rows, faults)
                results.append((shape, codec, cache, times, faults))
                print(f"{shape} {codec} {cache}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(f"{args.data} rows, engine {args.engine}, order {args.order}; load average before: "
          f"{os.getloadavg()[0]:.2f}, after: see uptime")
    print(table(results, args.readers, args.repeats))


if __name__ == "__main__":
    main()
