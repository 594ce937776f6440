"""Encoded images in variable-length rows, decoded by a transform in the readers, against a plain h5py loop.

Writes (once) ``--rows`` images of 48-80 x 48-80 x 3 smooth uint8 pixels, each one variable-length row
(``h5py.vlen_dtype(np.uint8)``) holding its height and width and its zlib-compressed pixels, in chunks of 256 rows,
with a label per row. The transform decodes each row and crops or pads it to 64 x 64 x 3 uint8: the work a
``DataLoader``'s workers would do. Times, page cache warm, alternating, whole epochs of:

* ``h5py``: a plain loop in this process, ``ds[a:a + 256]`` then the transform, block after block in file order;
* ``get_batches(["/images", "/labels"], 256, transform={"/images": decode})``, shuffled, with ``n_procs`` 0 (the
  transform in this process), 1 and 2 (one ``Batches`` each, iterated epoch after epoch as a training loop does).

Prints each one's median rows/s and its ratio to the h5py loop's.

    python benchmarks/vlen_decode.py --file bench/vlen.h5 --rows 10000 --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import zlib

import numpy as np

import multitables

SIDE = 64
BLOCK = 256


def encode(image: np.ndarray) -> np.ndarray:
    """An (h, w, 3) uint8 image as one row: its height and width (uint16), then its zlib-compressed pixels."""
    return np.frombuffer(np.array(image.shape[:2], "<u2").tobytes() + zlib.compress(image.tobytes(), 6), np.uint8)


def decode(rows: np.ndarray) -> np.ndarray:
    """Rows of :func:`encode` as (n, 64, 64, 3) uint8, cropped or zero-padded."""
    out = np.zeros((len(rows), SIDE, SIDE, 3), np.uint8)
    for i, row in enumerate(rows):
        h, w = row[:4].view("<u2")
        image = np.frombuffer(zlib.decompress(row[4:].tobytes()), np.uint8).reshape(h, w, 3)
        out[i, : min(h, SIDE), : min(w, SIDE)] = image[:SIDE, :SIDE]
    return out


def make(path: str, n_rows: int) -> None:
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(path + ".part", "w") as f:
        images = f.create_dataset("/images", (n_rows,), dtype=h5py.vlen_dtype(np.uint8), chunks=(BLOCK,))
        for a in range(0, n_rows, BLOCK):
            rows = np.empty(min(BLOCK, n_rows - a), object)
            for k in range(len(rows)):
                h, w = rng.integers(48, 81, 2)
                y, x = np.mgrid[:h, :w]
                base = (np.sin(x[..., None] * 0.1 + y[..., None] * 0.07 + np.arange(3)) * 100 + 128).astype(np.uint8)
                rows[k] = encode(base + rng.integers(0, 8, base.shape, dtype=np.uint8))  # some noise for zlib
            images[a : a + len(rows)] = rows
        f["/labels"] = rng.integers(0, 10, n_rows)
    os.replace(path + ".part", path)


def h5py_epoch(path: str) -> float:
    import h5py

    t = time.perf_counter()
    with h5py.File(path, "r") as f:
        ds = f["/images"]
        for a in range(0, len(ds), BLOCK):
            decode(ds[a : a + BLOCK])
    return time.perf_counter() - t


def batches_epoch(loader: "multitables.Batches") -> float:
    t = time.perf_counter()
    for _x, _y in loader:
        pass
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    if not os.path.exists(args.file):
        make(args.file, args.rows)
    stream = multitables.Streamer(args.file)
    loaders = {n: stream.get_batches(["/images", "/labels"], BLOCK, seed=0, n_procs=n, transform={"/images": decode})
               for n in (0, 1, 2)}
    n_rows = loaders[0].n_rows
    h5py_epoch(args.file)  # the page cache, and this process's imports
    for loader in loaders.values():
        batches_epoch(loader)  # the readers started, their buffers made
    times: dict[str, list[float]] = {"h5py": [], **{f"n_procs={n}": [] for n in loaders}}
    for _ in range(args.runs):
        times["h5py"].append(h5py_epoch(args.file))
        for n, loader in loaders.items():
            times[f"n_procs={n}"].append(batches_epoch(loader))
    for loader in loaders.values():
        loader.close()
    base = n_rows / statistics.median(times["h5py"])
    print(f"{n_rows} rows, {os.path.getsize(args.file) / 1e6:.1f} MB, {os.cpu_count()} CPUs, median of {args.runs}")
    for name, seconds in times.items():
        rate = n_rows / statistics.median(seconds)
        print(f"{name:10s} {rate:9,.0f} rows/s  {rate / base:.2f}x  (epochs: {', '.join(f'{s:.2f}' for s in seconds)} s)")


if __name__ == "__main__":
    main()
