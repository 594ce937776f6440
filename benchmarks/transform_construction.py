"""What constructing ``Batches`` costs with and without a transform (no reader starts: construction only).

Writes 1,000 rows of 3 float64 (gzip, in chunks of 64 rows, and in one chunk), then constructs and closes
``get_batches("/X", 100, transform=...)`` ``--runs`` times per case, after one untimed construction, and prints the
median milliseconds and how many times construction called the transform:

    python benchmarks/transform_construction.py --dir bench --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import h5py
import numpy as np

import multitables


def doubles(rows: np.ndarray) -> np.ndarray:
    return rows * 2


def sleeps_1ms_a_call(rows: np.ndarray) -> np.ndarray:
    time.sleep(0.001)
    return rows * 2


def sleeps_10ms_a_row(rows: np.ndarray) -> np.ndarray:
    time.sleep(0.01 * len(rows))
    return rows * 2


class Counted:
    """``function``, its calls counted."""

    def __init__(self, function) -> None:
        self.function, self.calls = function, 0

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        self.calls += 1
        return self.function(rows)


CASES = [("none", None, None), ("x * 2", doubles, None), ("1 ms a call", sleeps_1ms_a_call, None),
         ("10 ms a row", sleeps_10ms_a_row, None), ("10 ms a row, n_procs=2", sleeps_10ms_a_row, 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="bench")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    files = {}
    for name, chunk in [("64-row chunks", 64), ("one chunk", 1000)]:
        files[name] = path = Path(args.dir) / f"construction-{chunk}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("/X", data=np.arange(3000.0).reshape(1000, 3), chunks=(chunk, 3), compression="gzip")
    print(f"{'file':<14} {'transform':<24} {'median ms':>9} {'calls':>5}")
    for file, path in files.items():
        stream = multitables.Streamer(str(path), start_method="fork")
        for name, function, n_procs in CASES:
            times, calls = [], 0
            for run in range(args.runs + 1):
                counted = None if function is None else Counted(function)
                began = time.perf_counter()
                stream.get_batches("/X", 100, n_procs=n_procs, transform=counted).close()
                if run:  # the first: imports and caches
                    times.append(time.perf_counter() - began)
                calls = counted.calls if counted else 0
            print(f"{file:<14} {name:<24} {1e3 * statistics.median(times):>9.1f} {calls:>5}")


if __name__ == "__main__":
    main()
