"""Chunks narrower than a row, in this process: plain h5py against multitables' engines; alternating, medians of 5.

Usage: python benchmarks/narrow_chunks.py DIR [CASE ...]  (DIR: where the files are written once; page cache warm)

Printed per case: plain ``ds[()]``'s time, then each way's ratio to it (above 1: faster): ``blocks``, h5py
``read_direct`` over 4 MiB blocks into one buffer; ``default``, multitables with ``n_procs`` left out;
``ENGINE/0``, that engine in this process (``auto`` names the engine it took). Rows are checked once, untimed.
"""
import sys, os, time, statistics, h5py, hdf5plugin, numpy as np, multitables
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
rng = np.random.default_rng(0)
cases = {
  "cols64_f4_none": ((200_000, 64), np.float32, (200_000 // 4, 1), {}),
  "w2_none": ((200_000, 64), np.float32, (25_000, 2), {}),
  "w4_none": ((200_000, 64), np.float32, (12_500, 4), {}),
  "w8_none": ((200_000, 64), np.float32, (6_250, 8), {}),
  "w16_none": ((200_000, 64), np.float32, (3_125, 16), {}),
  "w1s_none": ((200_000, 64), np.float32, (1_000, 1), {}),
  "w1_u1_none": ((200_000, 64), np.uint8, (50_000, 1), {}),
  "half_row_none": ((100_000, 256), np.float32, (1000, 128), {}),
  "img_none": ((20_000, 32, 32, 3), np.uint8, (100, 16, 16, 3), {}),
  "img_gzip": ((20_000, 32, 32, 3), np.uint8, (100, 16, 16, 3), dict(compression="gzip", compression_opts=1)),
  "half_row_blosc": ((100_000, 256), np.float32, (1000, 128), dict(**hdf5plugin.Blosc(cname="lz4", clevel=5))),
  "cols_blosc": ((200_000, 64), np.float32, (20_000, 8), dict(**hdf5plugin.Blosc(cname="lz4", clevel=5))),
}
only = sys.argv[2:] or list(cases)
for name in only:
    shape, dt, chunks, kw = cases[name]
    path = f"{d}/{name}.h5"
    if not os.path.exists(path):
        data = (np.cumsum(rng.integers(-2, 3, size=shape), axis=-1) % 200).astype(dt)
        with h5py.File(path, "w") as f:
            f.create_dataset("d", data=data, chunks=chunks, **kw)
    with h5py.File(path, "r") as f:
        ref = f["d"][()]
    def plain():
        with h5py.File(path, "r") as f:
            return f["d"][()]
    def blocks():
        with h5py.File(path, "r") as f:
            ds = f["d"]; rows = max(chunks[0], (4 << 20) // (ref[0].nbytes) // chunks[0] * chunks[0])
            buf = np.empty((rows,) + ref.shape[1:], ref.dtype)
            for a in range(0, len(ds), rows):
                n = min(rows, len(ds) - a)
                ds.read_direct(buf, np.s_[a:a + n], np.s_[:n])
        return None
    def mt(engine, n):
        def run():
            out = [] if run.check else None
            with multitables.Streamer(path, engine=engine).get_queue("/d", n_procs=n, ordered=True, remainder=True) as q:
                for g in q.iter():
                    with g as b:
                        if out is not None:
                            out.append(b.copy())
                run.used = q.engine
            return None if out is None else np.concatenate(out)
        run.check = True
        return run
    ways = {"plain": plain, "blocks": blocks}
    ways["default"] = mt("auto", None)
    for n in (0,):
        for e in ("auto", "chunks", "h5py"):
            ways[f"{e}/{n}"] = mt(e, n)
    t = {k: [] for k in ways}
    for r in range(5):
        for k, f in ways.items():
            t0 = time.perf_counter(); x = f(); t[k].append(time.perf_counter() - t0)
            if r == 0 and hasattr(f, "check"):
                assert np.array_equal(x, ref), (name, k)
                f.check = False
    base = statistics.median(t["plain"])
    print(f"{name} {ref.nbytes/2**20:.0f} MiB plain {base*1e3:.0f} ms: " + "  ".join(
        f"{k}{'('+ways[k].used+')' if k.startswith('auto') else ''} {base/statistics.median(v):.2f}" for k, v in t.items() if k != "plain"), flush=True)
