"""How faithful the disk model is: read patterns timed under it, against what it should charge (BENCHMARKS.md).

Run by hand: ``python -m multitables_bench.diskmodel_fidelity FILE [hdd|raid0]`` (a 1 GiB file is good).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from multitables_bench.diskmodel import READAHEAD, DiskModel

_PATTERN = r"""
import os, sys
path, pattern, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
size = os.path.getsize(path); half = size // 2; buf = bytearray(step); fd = os.open(path, os.O_RDONLY)
if pattern == "seq":
    offsets = range(0, size - step + 1, step)
elif pattern == "alternate":  # the two halves in turn: every read far from the one before
    offsets = [o for i in range(0, half - step + 1, step) for o in (i, half + i)]
else:  # "half0" / "half1": one half, in order
    first = 0 if pattern == "half0" else half
    offsets = range(first, first + half - step + 1, step)
print(sum(os.preadv(fd, [buf], off) for off in offsets))
"""


def fidelity(path: str, kind: str) -> None:  # pragma: no cover - a measurement, run by hand
    """Time read patterns on ``path`` (1 GiB is good) under a model of ``kind``, in child processes; print MB/s and counts."""
    import time

    from multitables_bench.files import read_through_cache

    MiB = 1 << 20
    runs = [  # name, read size, one pattern per process, read-ahead
        ("one process in order, 4 MiB reads", 4 * MiB, ["seq"], READAHEAD),
        ("one process in order, 64 KiB reads", 64 << 10, ["seq"], READAHEAD),
        ("one process in order, 64 KiB reads, no look-ahead", 64 << 10, ["seq"], 0),
        ("one process, 4 MiB reads alternating between the halves", 4 * MiB, ["alternate"], READAHEAD),
        ("two processes at once, each its own half in order, 4 MiB reads", 4 * MiB, ["half0", "half1"], READAHEAD),
    ]
    read_through_cache(path)
    root = os.path.dirname(os.path.abspath(path))
    with tempfile.TemporaryDirectory() as tmp:
        for name, step, patterns, readahead in runs:
            with DiskModel.create(tmp, kind, readahead=readahead) as model, model.charging(root):
                t0 = time.perf_counter()
                procs = [subprocess.Popen([sys.executable, "-c", _PATTERN, path, p, str(step)], env=model.env(),
                                          stdout=subprocess.PIPE, text=True) for p in patterns]
                total = sum(int(p.communicate()[0]) for p in procs)
                elapsed = time.perf_counter() - t0
                s = model.stats()
            print(f"{kind}: {name}: {total / elapsed / 1e6:.1f} MB/s; {s.summary()}; disks busy "
                  f"{max(d.busy_s for d in s.disks):.2f} s of {elapsed:.2f} s")


if __name__ == "__main__":  # pragma: no cover
    fidelity(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "hdd")
