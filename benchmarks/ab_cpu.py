"""A/B of the streaming path between two checkouts by CPU time: what a GiB costs the readers and the consumer.

On a shared or throttled machine, wall-clock rates move by tens of per cent
from one pass to the next; the CPU seconds a pass costs move far less. For
each checkout in turn (a fresh interpreter started in the checkout, its own
package checked, as in ``ab_stream.py``), page cache warm:

* ``decode``: the engine reading the whole file in this process (no readers),
  CPU seconds per GiB;
* ``direct``: ``get_queue(n_procs=2)``, every block taken: MB/s, the readers'
  CPU seconds per GiB (from ``/proc``, sampled before the last block) and the
  consumer's;
* ``generator``: ``get_generator(n_procs=2)``, every row: MB/s and the
  consumer's CPU seconds per GiB.

Prints each run and the medians.

    python benchmarks/ab_cpu.py --file bench/ab.h5 --a ../before --b ../after --runs 4 --engine chunks
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from ab_stream import make, run_in

PASS = r"""
import json, os, sys, time
import numpy as np
import multitables
path, mode, engine = sys.argv[1], sys.argv[2], sys.argv[3]
GiB = 1 << 30
def cpu(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
out = {}
c0, t0 = time.process_time(), time.perf_counter()
if mode == "decode":
    from multitables._io.engines import open_source
    from multitables._io.fileset import inspect_files
    from multitables._plan.blocks import BlockPlan
    node = inspect_files(path, "/data")
    plan = BlockPlan(node.n_rows, 1024)
    block = np.empty((1024,) + node.row_shape, node.dtype)
    source = open_source(engine, node, {}, plan)
    c0 = time.process_time()
    for k in range(plan.n_blocks):
        source.read_into(k * 1024, (k + 1) * 1024, block)
    nbytes = plan.n_blocks * block.nbytes
    source.close()
elif mode == "direct":
    nbytes, readers = 0, []
    with multitables.Streamer(path, engine=engine).get_queue("/data", n_procs=2) as q:
        for guard in q.iter():
            with guard as b:
                nbytes += b.nbytes
            if not q.at_end:
                readers = [cpu(p) for p in q.reader_pids]
    out["readers_s_per_gib"] = sum(readers) / (nbytes / GiB)
else:
    rows = sum(1 for _ in multitables.Streamer(path, engine=engine).get_generator("/data", n_procs=2))
    nbytes = rows * 4096
out["mb_s"] = nbytes / (time.perf_counter() - t0) / 1e6
out["consumer_s_per_gib"] = (time.process_time() - c0) / (nbytes / GiB)
print(json.dumps(out))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--engine", default="chunks")
    args = p.parse_args()
    if not os.path.exists(args.file):
        make(args.file, 262_144)
    path = os.path.abspath(args.file)
    with open(path, "rb") as f:  # into the page cache
        while f.read(16 << 20):
            pass
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    for run in range(args.runs):
        for mode in ("decode", "direct", "generator"):
            for label, root in (("A", args.a), ("B", args.b)):
                result = json.loads(run_in(root, PASS, path, mode, args.engine).strip().splitlines()[-1])
                got.setdefault((mode, label), []).append(result)
                shown = ", ".join(f"{k} {v:,.3f}" for k, v in result.items())
                print(f"run {run} {mode} {label}: {shown}", flush=True)
    for mode in ("decode", "direct", "generator"):
        keys = got[(mode, "A")][0].keys()
        med = {label: {k: statistics.median(r[k] for r in got[(mode, label)]) for k in keys} for label in ("A", "B")}
        ratios = ", ".join(f"{k} B/A {med['B'][k] / med['A'][k]:.3f}" for k in keys)
        print(f"{mode}: A {med['A']}, B {med['B']}: {ratios}")


if __name__ == "__main__":
    main()
