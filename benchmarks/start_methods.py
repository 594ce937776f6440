"""What starting readers costs a consumer that holds memory of its own, by start method (fork, forkserver).

A training process holds a model, an optimizer's state, caches: private
memory it writes again and again. ``fork`` shares all of it with each reader
copy-on-write: the fork copies its page tables, and the consumer's next write
to each page faults and copies it (the readers, which live across epochs, keep
the old one). ``forkserver`` forks readers from a small server process, which
shares none of it. This holds ``--hold-mib`` MiB written in the consumer
(numpy, as a model's host copy would be) and, per start method and pass,
prints ``get_queue``'s seconds, the first block's after it, and the seconds
and minor page faults of writing the held memory once right after the start.
The first forkserver pass also starts the server. Run from the checkout::

    python benchmarks/start_methods.py bench/epochs.h5 --path /data --procs 8 --hold-mib 2048
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

import multitables


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--path", default="/data")
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--hold-mib", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--methods", nargs="*", default=["fork", "forkserver"])
    args = p.parse_args()
    held = np.ones(args.hold_mib << 18, dtype=np.float32)  # written: private pages of this process
    for method in args.methods:
        stream = multitables.Streamer(args.file, start_method=method)
        for rep in range(args.repeats):
            t0 = time.perf_counter()
            with stream.get_queue(args.path, n_procs=args.procs) as queue:
                t1 = time.perf_counter()
                queue.get().release()
                t2 = time.perf_counter()
                f0 = faults()
                held += 1  # the training step's writes
                t3 = time.perf_counter()
                f1 = faults()
            print(f"{method} pass {rep}: get_queue {t1 - t0:.3f} s, first block {t2 - t1:.3f} s, writing {args.hold_mib} MiB "
                  f"held {t3 - t2:.3f} s ({f1 - f0:,} minor faults)", flush=True)


if __name__ == "__main__":
    main()
