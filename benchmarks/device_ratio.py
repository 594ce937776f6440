"""Issue 30's ">= 0.9 of the stream's rate": batches into GPU memory against the same readers' stream into shared
memory, alternated over rounds, with the variants that could close the gap.

``benchmarks/batches_profile.py`` measured each once, 0.12-0.15 s of
epochs at 8-9 GB/s, the stream first: on a lent H200 the ratio came out
0.87, 0.95 and 0.86 in three calls, while the readers ran 0.4-0.9 CPU-s
a second less with ``device=`` (the consumer's own CPU, 0.55-0.58 s a
second, and PyTorch's threads share the cores with 16 readers). Here each
round runs, in turn: the cyclic stream (``get_queue(cyclic=True)``, direct
blocks, nothing copied: passes 2 on), and shuffled batches of 1,024 rows
with ``device=`` (epochs 2 on), each over ``--passes`` passes after the
one that starts its readers; the variants: the default readers with the
stream's default slots (``read_ahead``: two per reader and two, as
``device=`` had them before it took twice as many) and with twice
``device=``'s, and one reader fewer than the default. Prints
every round and the medians, each against the stream's median, with the
readers' and the consumer's CPU seconds a second.

    python benchmarks/device_ratio.py --file bench/gpu512.h5 --mib 512 --rounds 5

Without CUDA it says so and ends, unless ``--device cpu`` (the same loops with batches on the CPU, for a test of this
script).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # multitables_bench, after PYTHONPATH


def _children_cpu() -> float:
    """CPU seconds (user and system) of this process's children: the readers."""
    tick = os.sysconf("SC_CLK_TCK")
    total, me = 0, str(os.getpid())
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            if fields[1] == me:
                total += int(fields[11]) + int(fields[12])
    return total / tick


def _timed(take: Callable[[], int], n: int) -> "tuple[float, float, float]":
    """GB/s of ``n`` calls of ``take`` (each gives its bytes), and the readers' and this process's CPU s per s."""
    w0, c0, r0 = time.perf_counter(), time.process_time(), _children_cpu()
    nbytes = sum(take() for _ in range(n))
    return _finish(nbytes, w0, c0, r0)


def _finish(nbytes: int, w0: float, c0: float, r0: float) -> "tuple[float, float, float]":
    wall = time.perf_counter() - w0
    return nbytes / wall / 1e9, (_children_cpu() - r0) / wall, (time.process_time() - c0) / wall


def stream_rate(stream: Any, n_procs: int, passes: int) -> "tuple[float, float, float]":
    import h5py

    with h5py.File(stream.filename) as f:
        rows = len(f["X"])
    with stream.get_queue("/X", n_procs=n_procs, cyclic=True) as q:
        n_blocks = -(-rows // q.block_size)
        for _ in range(n_blocks):  # the first pass: readers start
            with q.get():
                pass

        def take() -> int:
            with q.get() as block:
                return block.nbytes

        return _timed(take, passes * n_blocks)


def batches_rate(stream: Any, n_procs: int, passes: int, device: str, **given: Any) -> "tuple[float, float, float]":
    import torch

    import multitables.torch as mt
    from multitables_bench.gpu import BATCH

    batches = mt.get_batches(stream, "/X", BATCH, n_procs=n_procs, epochs=None, seed=0, device=device, **given)
    try:
        per_epoch = len(batches.batches)
        it = iter(batches)
        for _ in range(per_epoch):  # the first epoch: readers start, the windows fill
            next(it)
        on_gpu = device.startswith("cuda")

        def take() -> int:
            batch = next(it)
            return batch.element_size() * batch.nelement()

        w0, c0, r0 = time.perf_counter(), time.process_time(), _children_cpu()
        nbytes = sum(take() for _ in range(passes * per_epoch))
        if on_gpu:
            torch.cuda.synchronize()
        return _finish(nbytes, w0, c0, r0)
    finally:
        batches.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--passes", type=int, default=4, help="passes (epochs) timed after the first, per run")
    p.add_argument("--procs", type=int, default=0, help="readers (0: the CPUs this process may use)")
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    import torch

    import multitables
    from multitables_bench.gpu import ready_file

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"device={args.device!r}: skipped, torch.cuda.is_available() is False")
        return
    ready_file(args.file, args.mib)
    n = args.procs or len(os.sched_getaffinity(0))
    from multitables._plan.readers import default_read_ahead

    stream_slots = default_read_ahead(n)
    stream = multitables.Streamer(args.file)
    runs: "dict[str, Callable[[], tuple[float, float, float]]]" = {
        f"stream, {n} readers, cyclic": lambda: stream_rate(stream, n, args.passes),
        f"device={args.device!r}, {n} readers": lambda: batches_rate(stream, n, args.passes, args.device),
        f"device={args.device!r}, {n} readers, read_ahead={stream_slots} (the stream's default)":
            lambda: batches_rate(stream, n, args.passes, args.device, read_ahead=stream_slots),
        f"device={args.device!r}, {n} readers, read_ahead={4 * stream_slots}":
            lambda: batches_rate(stream, n, args.passes, args.device, read_ahead=4 * stream_slots),
        f"device={args.device!r}, {max(1, n - 1)} readers": lambda: batches_rate(stream, max(1, n - 1), args.passes, args.device),
    }
    got: "dict[str, list[tuple[float, float, float]]]" = {label: [] for label in runs}
    for r in range(args.rounds):
        for label, run in runs.items():
            rate, readers, consumer = run()
            got[label].append((rate, readers, consumer))
            print(f"round {r + 1}, {label}: {rate:.2f} GB/s, readers' CPU {readers:.2f} s per s, "
                  f"the consumer's {consumer:.2f}", flush=True)
    base = statistics.median(g[0] for g in got[next(iter(runs))])
    print(f"\nmedians of {args.rounds} rounds, {args.passes} passes each after the first (of the stream's):")
    for label, values in got.items():
        rate = statistics.median(v[0] for v in values)
        ratios = sorted(v[0] / s[0] for v, s in zip(values, got[next(iter(runs))]))
        print(f"  {label}: {rate:.2f} GB/s ({rate / base:.2f}; round by round {ratios[0]:.2f}-{ratios[-1]:.2f}), "
              f"readers' CPU {statistics.median(v[1] for v in values):.2f} s per s, "
              f"the consumer's {statistics.median(v[2] for v in values):.2f}")


if __name__ == "__main__":
    main()
