"""What starting a stream's readers costs: ``get_queue`` split into making the ring, forking, attaching.

    python benchmarks/stream_startup.py bench/epochs.h5 --procs 8 --repeats 3
    python benchmarks/stream_startup.py bench/epochs.h5 --procs 8 --repeats 4 --start-method forkserver
    PYTHONPATH=<another copy> python benchmarks/stream_startup.py bench/scal-scaling-blosc-3.h5 --procs 1 --repeats 25

The dataset is ``--path`` (``/data``). With ``--start-method forkserver`` the
first pass also starts the fork server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import multitables
from multitables._procs import pool
from multitables._shm import ring

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # multitables_bench, after PYTHONPATH
from multitables_bench.calls import time_calls  # noqa: E402

SPENT: dict[str, float] = {}


def timed(owner: Any, name: str, label: str) -> None:
    """Add the seconds of each call of ``owner.name`` to ``SPENT[label]``."""
    time_calls(owner, name, lambda t0, t1, _args: SPENT.__setitem__(label, SPENT.get(label, 0.0) + t1 - t0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--path", default="/data")
    p.add_argument("--start-method", default=None, help="fork, forkserver or spawn (default: multiprocessing's)")
    args = p.parse_args()
    timed(ring.Ring, "create", "ring")
    timed(pool.ReaderPool, "start", "fork")
    timed(pool.ReaderPool, "wait_attached", "attach")
    if hasattr(ring.Ring, "allocate_slots"):  # NOTE [slots while readers start]; absent from packages before it
        timed(ring.Ring, "allocate_slots", "allocate")
    firsts = []
    for _ in range(args.repeats):
        SPENT.clear()
        t0 = time.perf_counter()
        with multitables.Streamer(args.file, start_method=args.start_method).get_queue(args.path, n_procs=args.procs) as q:
            t1 = time.perf_counter()
            q.get().release()
            t2 = time.perf_counter()
        parts = ", ".join(f"{k} {v:.3f}" for k, v in SPENT.items())
        print(f"n_procs={q.n_procs}: get_queue {t1 - t0:.3f} s ({parts}), first block {t2 - t1:.3f} s", flush=True)
        firsts.append(t2 - t0)
    print(f"from get_queue to the first block: median {statistics.median(firsts) * 1e3:.1f} ms of {len(firsts)}")


if __name__ == "__main__":
    main()
