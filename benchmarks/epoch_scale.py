"""What an epoch's boundary costs the consumer when an epoch has many pieces, batch by batch, on the CPU.

An epoch of 100 GiB in blocks of 4 MiB has 25,600 pieces; the same count
here on a small file: ``--pieces`` blocks of 8 int64 rows of 64 bytes
(zlib, a chunk a block), batches of one block, windows of 64 blocks, 2
readers, shuffled, on the host; every row, or a subset (``--sampling``). Times the consumer's thread CPU of every
batch over ``--epochs`` epochs after the first, and prints each batch by
its place in the epoch (the median over the epochs): an epoch's first and
second batch, a window's first, and the ten slowest places. What the epoch
boundary does once per piece shows in the first batches, and the next
epoch's publishing in some of the batches after them.

    python benchmarks/epoch_scale.py --file bench/pieces.h5 --pieces 25600 --epochs 3
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

ROWS = 8  # a block's rows, and a batch's
WINDOW = 64  # blocks a window


def write_file(path: str, pieces: int) -> None:
    import h5py

    n = pieces * ROWS
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=np.arange(n * 8, dtype=np.int64).reshape(n, 8), chunks=(ROWS, 8), compression="gzip",
                         compression_opts=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--pieces", type=int, default=25_600)
    p.add_argument("--epochs", type=int, default=3, help="epochs timed, after the first")
    p.add_argument("--sampling", choices=["all", "weights", "indices"], default="all",
                   help="every row, a weighted draw of as many (weights 1 to 4), or every other row (half the pieces)")
    args = p.parse_args()
    import multitables

    if not os.path.exists(args.file):
        write_file(args.file, args.pieces)
    n_rows = args.pieces * ROWS
    sampling = {"all": {}, "weights": {"weights": np.arange(n_rows) % 4 + 1.0},
                "indices": {"indices": np.arange(0, n_rows, 2)}}[args.sampling]
    batches = multitables.Streamer(args.file).get_batches("/X", ROWS, n_procs=2, epochs=None, seed=0, block_size=ROWS,
                                                          window=WINDOW * ROWS, **sampling)
    it = iter(batches)
    n = len(batches)
    for _ in range(n):  # the first epoch: readers start
        next(it)
    cpu: list[float] = []
    for _ in range(args.epochs):
        for _ in range(n):
            t = time.thread_time()
            next(it)
            cpu.append(time.thread_time() - t)
    places = np.median(np.reshape(cpu, (args.epochs, n)), axis=0) * 1e3  # ms, each place's median over the epochs
    typical = float(np.median(places))
    ms = lambda x: f"{x:.3f} ms ({x / typical:.1f}x)"  # noqa: E731
    print(f"{n} batches an epoch (one piece each), {WINDOW} a window; the consumer's CPU per batch, medians over "
          f"{args.epochs} epochs: the typical {typical:.3f} ms, an epoch's first {ms(places[0])}, its second "
          f"{ms(places[1])}, a window's first " + (ms(float(np.median(places[WINDOW::WINDOW]))) if n > WINDOW else "-"))
    print("the slowest places: " + ", ".join(f"{i} {ms(places[i])}" for i in np.argsort(-places)[:10]))
    batches.close()


if __name__ == "__main__":
    main()
