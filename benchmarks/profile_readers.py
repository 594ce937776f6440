"""Where the readers' time goes: a workload to sample with py-spy, and a summary of the samples.

Two steps (``py-spy`` from PyPI; it samples the reader processes too)::

    py-spy record -r 250 --subprocesses --idle --format raw -o readers.txt -- \
        python benchmarks/profile_readers.py stream FILE.h5 --n_procs 2 --passes 3
    python benchmarks/profile_readers.py summarize readers.txt

``pattern`` reads FILE the way two readers do, without decoding anything, to
tell how much of the readers' waiting the disk itself imposes::

    python benchmarks/profile_readers.py pattern FILE.h5 --passes 5

``small`` times what the benchmark's small-files section times, many more
times: default multitables (direct access and generator) against h5py
``read_direct`` on a generated file of ROWS rows in CHUNK-row chunks, passes
interleaved::

    python benchmarks/profile_readers.py small --rows 100 --chunk 1024 --passes 300 --cache warm

``placement`` asks where multitables should decode FILE (``/data``): one
h5py process, then default multitables, one reader per CPU, and every block
read in the consumer, direct access and generator, passes interleaved::

    python benchmarks/profile_readers.py placement FILE.h5 --passes 7

``stream`` prepares each pass as the benchmark does (``--cache evict``: the
file's pages dropped, memory settled where the benchmark settles it; ``--cache
warm``: the file read in), streams ``/data`` with the chunk engine, direct
access, and prints per pass the MB/s and the CPU seconds (user and system) of
the readers and the consumer.
``summarize`` sorts the readers' samples (``--idle`` keeps the ones spent
blocked) by what they were doing.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import sys
import time
from typing import Callable

#: (what the reader was doing, a frame that says so), first match wins; frames as py-spy writes them.
ACTIVITIES = (
    ("decode: inflate (deflate)", "Deflate.decode"),
    ("decode: unshuffle", "Shuffle.decode"),
    ("decode: other filters", "multitables/_io/chunks/codecs/"),
    ("wait for the disk: pread", "PreadFile.read_into"),
    ("wait for the disk: prefetch hint (WILLNEED queues the reads)", "PreadFile.hint"),
    ("ring: wait for a free slot, publish", "multitables/_shm/ring.py"),
    ("file check (stat)", "check_file_unchanged"),
    ("chunk engine bookkeeping: plan, index, partial chunks", "multitables/_io/chunks/source.py"),
    ("chunk engine bookkeeping: plan, index, partial chunks", "multitables/_io/chunks/storage.py"),
    ("chunk engine bookkeeping: plan, index, partial chunks", "multitables/_io/chunks/grid.py"),
)
READER = "stream_loop (multitables/_procs/stream.py"


def stream(path: str, n_procs: int, passes: int, cache: str = "evict") -> None:
    """Stream ``path`` ``passes`` times; print MB/s and the CPU seconds the readers and the consumer spent."""
    import multitables
    from multitables_bench.cache_modes import prepare_cache

    for _ in range(passes):
        prepare_cache(path, cache)
        before = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
        t0, rows, row_bytes = time.perf_counter(), 0, 0
        with multitables.Streamer(path, engine="chunks").get_queue("/data", n_procs=n_procs, remainder=True) as queue:
            for guard in queue.iter():
                with guard as block:
                    rows += len(block)
                    row_bytes = block[0].nbytes
        seconds = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
        (ru, rs), (cu, cs) = ((a.ru_utime - b.ru_utime, a.ru_stime - b.ru_stime) for a, b in zip(after, before))
        print(
            f"{rows * row_bytes / seconds / 1e6:,.0f} MB/s in {seconds:.2f} s; CPU s: readers user {ru:.2f} "
            f"system {rs:.2f} ({(ru + rs) / seconds / n_procs:.0%} of {n_procs} cores), consumer {cu + cs:.2f}",
            flush=True,
        )


#: Bytes per read in :func:`read_pattern`: a default block of the benchmark's 4 KiB rows.
PATTERN_BLOCK = 4 << 20


def _read_every(path: str, first: int, step: int, hint: bool) -> None:
    """Read blocks ``first, first + step, ...`` of ``path``; with ``hint``, ask for block ``k + step`` before reading ``k``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        n_blocks = -(-os.fstat(fd).st_size // PATTERN_BLOCK)
        buf = bytearray(PATTERN_BLOCK)
        for k in range(first, n_blocks, step):
            if hint and k + step < n_blocks:
                os.posix_fadvise(fd, (k + step) * PATTERN_BLOCK, PATTERN_BLOCK, os.POSIX_FADV_WILLNEED)
            os.preadv(fd, [buf], k * PATTERN_BLOCK)
    finally:
        os.close(fd)


def read_pattern(path: str, passes: int) -> str:
    """How fast the disk serves the readers' access pattern with no decoding at all: a Markdown table.

    Three ways, interleaved, ``passes`` times each, cold as the benchmark's
    passes: one process reading the file in order; two processes reading
    alternate blocks (the readers' claim order); the same, each hinting the
    block it reads next (NOTE [prefetch]).
    """
    import multiprocessing
    import statistics

    from multitables_bench.cache_modes import prepare_cache

    ways = {"1 process, in order": (1, False), "2 processes, alternate blocks": (2, False),
            "2 processes, alternate blocks, next block hinted": (2, True)}
    size = os.path.getsize(path)
    rates: dict[str, list[float]] = {name: [] for name in ways}
    ctx = multiprocessing.get_context("fork")
    for _ in range(passes):
        for name, (n, hint) in ways.items():
            prepare_cache(path, "evict")
            t0 = time.perf_counter()
            procs = [ctx.Process(target=_read_every, args=(path, i, n, hint)) for i in range(n)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            if any(p.exitcode for p in procs):
                raise SystemExit(f"a reading process failed on {path}")
            rates[name].append(size / (time.perf_counter() - t0) / 1e6)
    lines = ["| file bytes read, no decoding | MB/s (median) | MB/s, each pass |", "|---|---:|---|"]
    for name, rs in rates.items():
        lines.append(f"| {name} | {statistics.median(rs):,.0f} | {', '.join(f'{r:,.0f}' for r in rs)} |")
    return "\n".join(lines)


def _no_progress(rows: int) -> None:
    pass


def _time_interleaved(
    path: str, n_rows: int, readers: "dict[str, Callable[[], int]]", passes: int, cache: str
) -> dict[str, list[float]]:
    """Seconds of each reader's passes, interleaved, each prepared as the benchmark prepares its passes."""
    import gc

    from multitables_bench.cache_modes import prepare_cache

    times: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(passes):
        for name, read in readers.items():
            prepare_cache(path, cache)
            gc.collect()
            t0 = time.perf_counter()
            n = read()
            times[name].append(time.perf_counter() - t0)
            if n != n_rows:
                raise SystemExit(f"{name} read {n} rows of {path}, which has {n_rows}")
    return times


def small(rows: int, chunk: int, passes: int, cache: str, workdir: str, complib: str = "blosc") -> str:
    """Medians of ``passes`` interleaved passes of h5py and default multitables on a small file: a Markdown table.

    The readers and the pass preparation are the benchmark's (blosc level 3
    as its small files; with ``warm``, set-up costs stand out from the disk's).
    """
    import statistics

    from multitables_bench.files import write_file
    from multitables_bench.readers import probe_multitables, read_multitables, read_single
    from multitables_bench.records import Codec, Reader, Target

    target = Target("small", os.path.join(workdir, f"small-{rows}-{chunk}.h5"), Codec(complib, 3), rows, chunk)
    write_file(target.path, rows, target.codec, chunk)
    try:
        _, block = probe_multitables(target, "auto", None, cache)
        readers = {
            "h5py read_direct, 1 process": lambda: read_single(target, Reader("single", "h5py"), cache, block, _no_progress),
            "multitables direct, default n_procs": lambda: read_multitables(
                target, Reader("multitables", "auto", "direct"), cache, _no_progress),
            "multitables generator, default n_procs": lambda: read_multitables(
                target, Reader("multitables", "auto", "generator"), cache, _no_progress),
        }
        times = _time_interleaved(target.path, rows, readers, passes, cache)
    finally:
        os.remove(target.path)
    base = statistics.median(next(iter(times.values())))
    lines = [f"| {rows} rows in {chunk}-row chunks, {complib} 3, {cache}, {passes} passes | ms (median) | rate / h5py |",
             "|---|---:|---:|"]
    for name, ts in times.items():
        lines.append(f"| {name} | {statistics.median(ts) * 1e3:.3f} | {base / statistics.median(ts):.2f}x |")
    return "\n".join(lines)


def placement(path: str, passes: int, cache: str = "evict") -> str:
    """One h5py process against multitables three ways on ``/data`` of ``path``: a Markdown table.

    Default ``n_procs``, one reader per CPU, and every block read in the
    consumer (``_plan.readers.parallel_pays`` made to answer no, as it does for small
    datasets); direct access and generator. The last column lists the
    readers each pass used.
    """
    import statistics

    import h5py

    from multitables._plan import readers as planner  # the planner decides whether readers pay
    from multitables._plan.readers import available_cpus
    from multitables_bench.readers import probe_multitables, read_multitables, read_single
    from multitables_bench.records import MODES, Codec, Reader, Target

    with h5py.File(path, "r") as f:
        n_rows = f["/data"].shape[0]
    target = Target("file", path, Codec("file", 0), n_rows)
    pays = planner.parallel_pays
    cpus = available_cpus()
    used: dict[str, list[int]] = {}

    def read(name: str, mode: str, n_procs: "int | None", consumer: bool = False) -> int:
        planner.parallel_pays = (lambda *args, **kwargs: False) if consumer else pays
        try:
            reader = Reader("multitables", "auto", mode, n_procs)
            return read_multitables(target, reader, cache, _no_progress, used.setdefault(name, []))
        finally:
            planner.parallel_pays = pays

    _, block = probe_multitables(target, "auto", None, cache)
    readers = {"h5py read_direct, 1 process": lambda: read_single(target, Reader("single", "h5py"), cache, block, _no_progress)}
    for mode in MODES:
        for name, n_procs, consumer in (
            (f"multitables {mode}, default n_procs", None, False),
            (f"multitables {mode}, {cpus} readers", cpus, False),
            (f"multitables {mode}, read in the consumer", None, True),
        ):
            readers[name] = lambda name=name, mode=mode, n_procs=n_procs, consumer=consumer: read(name, mode, n_procs, consumer)
    times = _time_interleaved(path, n_rows, readers, passes, cache)
    rates = {name: [target.data_nbytes / t / 1e6 for t in ts] for name, ts in times.items()}
    base = statistics.median(next(iter(rates.values())))
    lines = [f"| {os.path.basename(path)}, {cache}, {passes} passes | MB/s (median) | / h5py | readers used, per pass |",
             "|---|---:|---:|---|"]
    for name, rs in rates.items():
        per_pass = " ".join(map(str, used.get(name, [])))
        lines.append(f"| {name} | {statistics.median(rs):,.0f} | {statistics.median(rs) / base:.2f}x | {per_pass} |")
    return "\n".join(lines)


def summarize(raw_path: str) -> str:
    """A table of the reader processes' samples by activity (raw py-spy output: ``frame;frame;... count``)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in open(raw_path):
        stack, _, n = line.rstrip().rpartition(" ")
        if READER not in stack:
            continue
        activity = next((name for name, frame in ACTIVITIES if frame in stack), "other")
        counts[activity] += int(n)
    total = sum(counts.values())
    if not total:
        raise SystemExit(f"{raw_path}: no samples of reader processes (record with --subprocesses)")
    lines = ["| reader activity | samples | share |", "|---|---:|---:|"]
    for name, n in counts.most_common():
        lines.append(f"| {name} | {n:,} | {n / total:.0%} |")
    return "\n".join(lines)


def main(argv: "list[str] | None" = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("stream", help="the workload to sample")
    run.add_argument("file")
    run.add_argument("--n_procs", type=int, default=2)
    run.add_argument("--passes", type=int, default=3)
    run.add_argument("--cache", choices=("evict", "warm"), default="evict", help="drop the file's pages, or read it in, before each pass")
    show = sub.add_parser("summarize", help="the readers' samples by activity, as Markdown")
    show.add_argument("raw")
    pattern = sub.add_parser("pattern", help="the disk under the readers' access pattern, no decoding, as Markdown")
    pattern.add_argument("file")
    pattern.add_argument("--passes", type=int, default=5)
    tiny = sub.add_parser("small", help="set-up costs: default multitables against h5py on a small file, as Markdown")
    tiny.add_argument("--rows", type=int, default=100)
    tiny.add_argument("--chunk", type=int, default=1024, help="rows per chunk")
    tiny.add_argument("--passes", type=int, default=100)
    tiny.add_argument("--cache", choices=("evict", "warm"), default="warm")
    tiny.add_argument("--dir", default=None, help="where to write the file (default: a temporary directory)")
    where = sub.add_parser("placement", help="decode in reader processes or in the consumer: against h5py, as Markdown")
    where.add_argument("file")
    where.add_argument("--passes", type=int, default=5)
    where.add_argument("--cache", choices=("evict", "warm"), default="evict")
    args = parser.parse_args(argv)
    if args.command == "stream":
        stream(args.file, args.n_procs, args.passes, args.cache)
    elif args.command == "small":
        import tempfile

        with tempfile.TemporaryDirectory(dir=args.dir) as workdir:
            print(small(args.rows, args.chunk, args.passes, args.cache, workdir))
    elif args.command == "placement":
        print(placement(args.file, args.passes, args.cache))
    elif args.command == "pattern":
        print(read_pattern(args.file, args.passes))
    else:
        print(summarize(args.raw))


if __name__ == "__main__":
    sys.exit(main())
