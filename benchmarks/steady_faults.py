"""Minor faults and context switches per GiB in the steady state: a cyclic stream, counted after a whole pass.

Issue 29's counters as ``multitables_bench.counters`` takes them, on a cyclic
``get_queue`` of ``/data`` (blocks of 512 rows), counted over ``--blocks``
blocks after ``--warm`` blocks (more than a pass: every reader has written
the slots it uses and warmed its caches), for each engine and reader count.

    python benchmarks/steady_faults.py bench/epochs.h5 --engines chunks h5py --procs 1 2
"""

from __future__ import annotations

import argparse

import multitables
from multitables_bench.counters import snapshot, touch, window


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--engines", nargs="+", default=["chunks", "h5py"])
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--warm", type=int, default=300)
    p.add_argument("--blocks", type=int, default=1500)
    args = p.parse_args()
    for engine in args.engines:
        for n in args.procs:
            with multitables.Streamer(args.file, engine=engine).get_queue("/data", n_procs=n, block_size=512, cyclic=True) as q:
                it, pids = q.iter(), q.reader_pids
                for _ in range(args.warm):
                    with next(it) as block:
                        touch(block)
                before, nbytes = snapshot(pids, consumer_first=False), 0
                for _ in range(args.blocks):
                    with next(it) as block:
                        touch(block)
                        nbytes += block.nbytes
                counted = window(before, snapshot(pids), nbytes, args.blocks)
            print(engine, n, {k: round(v) for k, v in counted.per_gib().items()}, flush=True)


if __name__ == "__main__":
    main()
