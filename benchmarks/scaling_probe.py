"""Where the time of many readers goes: one pass per configuration, with the readers' CPU time split user / system.

For a zlib-3 and a blosc-3 file of smooth rows (the scaling section's files,
``--mib`` each), each engine and reader count given, with the read-ahead
hints on and off (NOTE [prefetch] in ``multitables/_io/blockread.py``; off:
``_io.blockread.ahead`` answers nothing): the pass's MB/s from asking for the
queue and from its first block, the seconds to that first block, and the CPU
seconds the readers spent in user and system mode and the consumer in all,
per GiB delivered. Each pass runs in a forked child of a process that has
imported the libraries; medians of ``--repeats``.

    python benchmarks/scaling_probe.py --dir bench/probe --mib 1024 --procs 8 16
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import statistics
import time

GiB = 1 << 30


def _cpu(pid: int) -> "tuple[float, float]":
    """User and system CPU seconds of ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _cpu_or(pid: int, last: "tuple[float, float]") -> "tuple[float, float]":
    """:func:`_cpu` of ``pid``, or ``last`` where it has ended (a reader done with its share of a small file)."""
    try:
        return _cpu(pid)
    except (FileNotFoundError, ProcessLookupError):
        return last


def one_pass(path: str, engine: str, n: int, hints: bool, out: "multiprocessing.Queue[dict]") -> None:
    import multitables
    from multitables._io import blockread

    if not hints:
        blockread.ahead = lambda *args, **kwargs: ()  # type: ignore[assignment]
    t0 = time.perf_counter()
    c0 = time.process_time()
    with multitables.Streamer(path, engine=engine).get_queue("/data", n_procs=n) as q:
        pids = q.reader_pids
        nbytes, first, cpu = 0, None, None
        for guard in q.iter():
            with guard as block:
                nbytes += block.nbytes
            if first is None:
                first = time.perf_counter() - t0
            if q.at_end or cpu is None:
                # The last sample before the readers end; one that ended already keeps its last sample.
                cpu = [_cpu_or(p, cpu[i] if cpu else (0.0, 0.0)) for i, p in enumerate(pids)]
        end = time.perf_counter() - t0
    user = sum(u for u, _ in cpu or [])
    system = sum(s for _, s in cpu or [])
    out.put({"engine": q.engine, "n": q.n_procs, "hints": hints, "seconds": end, "first": first, "bytes": nbytes,
             "reader_user_per_gib": user / (nbytes / GiB), "reader_sys_per_gib": system / (nbytes / GiB),
             "consumer_cpu_per_gib": (time.process_time() - c0) / (nbytes / GiB)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--procs", type=int, nargs="+", default=[8, 16])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from multitables_bench.files import write_file
    from multitables_bench.scaling import CODECS

    os.makedirs(args.dir, exist_ok=True)
    n_rows = args.mib * (1 << 20) // 4096
    files = {}
    for codec in CODECS:
        path = os.path.join(args.dir, f"probe-{codec.label}-{args.mib}.h5")
        if not os.path.exists(path):
            write_file(path, n_rows, codec, data="smooth")
        files[codec.label] = path
        with open(path, "rb") as f:  # into the page cache
            while f.read(16 << 20):
                pass
    ctx = multiprocessing.get_context("fork")
    rows = []
    for label, path in files.items():
        for engine in ("chunks", "h5py") if "blosc" in label else ("chunks",):
            for n in args.procs:
                for hints in (True, False):
                    got = []
                    for _ in range(args.repeats):
                        q = ctx.Queue()
                        proc = ctx.Process(target=one_pass, args=(path, engine, n, hints, q))
                        proc.start()
                        while True:  # a pass that fails says so, rather than leave this waiting
                            try:
                                got.append(q.get(timeout=1))
                                break
                            except queue.Empty:
                                if proc.exitcode is not None and q.empty():
                                    raise SystemExit(f"the pass {label} {engine} n={n} hints={hints} failed") from None
                        proc.join()
                    med = {k: statistics.median(g[k] for g in got) for k in got[0] if isinstance(got[0][k], float)}
                    row = {"file": label, **got[0], **med}
                    row["mb_s"] = row["bytes"] / row["seconds"] / 1e6
                    row["mb_s_after_first"] = row["bytes"] / (row["seconds"] - row["first"]) / 1e6
                    rows.append(row)
                    print(f"{label} {engine:6s} n={n:2d} hints={'on ' if hints else 'off'}: {row['mb_s']:7,.0f} MB/s "
                          f"({row['mb_s_after_first']:7,.0f} after the first block at {row['first']:.3f} s); readers "
                          f"user {row['reader_user_per_gib']:.2f} + sys {row['reader_sys_per_gib']:.2f} s/GiB, consumer "
                          f"{row['consumer_cpu_per_gib']:.2f} s/GiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
