"""Engine choice for a Reader's requests: the h5py engine against the chunk engine, reader processes or none.

Files (made in ``--dir`` where absent, with h5py): 100,000 smooth float32 rows of 16 and of 1,024 values,
uncompressed, gzip 4 + shuffle, and blosc lz4 and zstd (level 5) + shuffle, each in chunks of 256 and of 4,096 rows.
For each dataset and ``n_procs`` (0: read in this process; 2: two readers), one Reader per engine; requests of 1, 64
and 4,096 rows, sorted random or contiguous, one in flight, used in place (``get_direct``). Each repeat draws fresh
rows (no engine's decoded chunks hold them from before) and runs both engines on them, in alternating order; the
number of requests a repeat is set once, from an untimed first read, to take about ``--min-s``. ``auto`` reads
through the engine it names, which is printed. ``--streams`` adds whole passes of ``get_queue(n_procs=0)``.

    python benchmarks/engine_choice.py --dir bench/choice --out bench/choice.jsonl [--only gzip_w16,lz4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

ROWS = 100_000
ENGINES = ("h5py", "chunks")


def make_files(folder: str) -> None:
    """The benchmark's files, those absent."""
    import h5py
    import hdf5plugin

    codecs = {
        "none": {},
        "gzip": dict(compression="gzip", compression_opts=4, shuffle=True),
        "lz4": dict(hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)),
        "zstd": dict(hdf5plugin.Blosc(cname="zstd", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)),
    }
    os.makedirs(folder, exist_ok=True)
    for width in (16, 1024):
        j = np.arange(width, dtype=np.float64)
        for name, kwargs in codecs.items():
            path = os.path.join(folder, f"{name}_w{width}.h5")
            if os.path.exists(path):
                continue
            with h5py.File(path + ".part", "w") as f:
                for chunk in (256, 4096):
                    d = f.create_dataset(f"c{chunk}", (ROWS, width), "f4", chunks=(chunk, width), **kwargs)
                    step = max(1, (8 << 20) // (width * 4))
                    for a in range(0, ROWS, step):
                        i = np.arange(a, min(ROWS, a + step), dtype=np.float64)[:, None]
                        d[a : a + len(i)] = (np.sin(0.01 * j + 0.001 * i) * (1 + 1e-4 * i)
                                             + 0.001 * np.cos(0.37 * j * i)).astype("f4")
            os.replace(path + ".part", path)


def draw(rng: np.random.Generator, k: int, kind: str, count: int) -> list:
    """``count`` requests' rows: ``k`` sorted random rows, or a slice of ``k`` from a random start."""
    if kind == "random":
        return [np.sort(rng.choice(ROWS, k, replace=False)) for _ in range(count)]
    return [slice(a, a + k) for a in rng.integers(0, ROWS - k + 1, count).tolist()]


def timed(reader, ds, stage, requests: list) -> float:
    t = time.perf_counter()
    for rows in requests:
        reader.request(ds[rows], stage).get_direct(lambda a: None)
    return time.perf_counter() - t


def requests_case(path: str, node: str, n_procs: int, repeats: int, min_s: float, log) -> None:
    import multitables

    with multitables.Reader(path, n_procs=0) as r:
        auto = r.get_dataset(node)._engine
    readers = {e: multitables.Reader(path, engine=e, n_procs=n_procs) for e in ENGINES}
    try:
        dss = {e: r.get_dataset(node) for e, r in readers.items()}
        for k in (1, 64, 4096):
            stages = {e: dss[e].create_stage(k) for e in ENGINES}
            for kind in ("random", "contiguous"):
                rng = np.random.default_rng(k)
                first = draw(rng, k, kind, 2)
                per = min(timed(readers[e], dss[e], stages[e], first) / 2 for e in ENGINES)
                count = int(max(1, min(3000, min_s / max(per, 1e-6))))
                times: "dict[str, list[float]]" = {e: [] for e in ENGINES}
                for rep in range(repeats):
                    rows = draw(rng, k, kind, count)
                    for e in ENGINES if rep % 2 == 0 else ENGINES[::-1]:
                        times[e].append(timed(readers[e], dss[e], stages[e], rows))
                rates = {e: [count * k / t for t in v] for e, v in times.items()}
                log.write(json.dumps(dict(phase="reader", file=os.path.basename(path), path=node, n_procs=n_procs,
                                          k=k, kind=kind, count=count, auto=auto, rows_s=rates)) + "\n")
                log.flush()
                med = {e: statistics.median(v) for e, v in rates.items()}
                print(os.path.basename(path), node, f"n_procs={n_procs}", k, kind, f"auto={auto}",
                      " ".join(f"{e} {m:,.0f} rows/s" for e, m in med.items()), f"chunks/h5py {med['chunks'] / med['h5py']:.2f}",
                      flush=True)
    finally:
        for r in readers.values():
            r.close(wait=True)


def streams_case(path: str, node: str, repeats: int, log) -> None:
    import multitables

    times: "dict[str, list[float]]" = {e: [] for e in ENGINES}
    for rep in range(repeats + 1):  # the first round untimed
        for e in ENGINES if rep % 2 == 0 else ENGINES[::-1]:
            t = time.perf_counter()
            with multitables.Streamer(path, engine=e).get_queue(node, n_procs=0) as q:
                for guard in q.iter():
                    with guard:
                        pass
            if rep:
                times[e].append(time.perf_counter() - t)
    with multitables.Streamer(path).get_queue(node, n_procs=0) as q:
        auto = q.engine
    nbytes = ROWS * (16 if "_w16" in path else 1024) * 4
    rates = {e: [nbytes / t / 1e6 for t in v] for e, v in times.items()}
    log.write(json.dumps(dict(phase="stream", file=os.path.basename(path), path=node, n_procs=0, auto=auto, mb_s=rates)) + "\n")
    med = {e: statistics.median(v) for e, v in rates.items()}
    print("stream", os.path.basename(path), node, f"auto={auto}", " ".join(f"{e} {m:,.0f} MB/s" for e, m in med.items()),
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, help="folder of the files (made where absent)")
    p.add_argument("--out", required=True, help="JSON lines appended: one a case")
    p.add_argument("--only", default="", help="comma-separated parts of 'file/dataset' to run (default: all)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-s", type=float, default=0.1, help="seconds a repeat of one engine takes, about")
    p.add_argument("--streams", action="store_true", help="also whole passes of get_queue(n_procs=0)")
    args = p.parse_args()
    make_files(args.dir)
    cases = [(f"{c}_w{w}.h5", f"/c{ch}") for w in (16, 1024) for c in ("none", "gzip", "lz4", "zstd") for ch in (256, 4096)]
    cases = [c for c in cases if any(part in c[0] + c[1] for part in args.only.split(","))]
    with open(args.out, "a") as log:
        for fname, node in cases:
            path = os.path.join(args.dir, fname)
            for n_procs in (0, 2):
                requests_case(path, node, n_procs, args.repeats, args.min_s, log)
            if args.streams:
                streams_case(path, node, args.repeats, log)


if __name__ == "__main__":
    main()
