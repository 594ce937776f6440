"""What an epoch's first batch costs the consumer on the ``device=`` path, against a batch in mid-epoch, on the CPU.

The device's calls (copies, events, gathers) do nothing here: on a GPU they
are queued and run later, so the consumer's own CPU time per batch is what
an epoch's first batch adds (issue 30: it should wait no longer than a batch
in mid-epoch). Shuffled batches of 1,024 rows over the GPU section's file
(``multitables_bench.gpu``: 4 KiB zlib-3 rows, written when missing), 2
readers; times epochs 2-5, then profiles the first two batches of the next
4 epochs (the profiler's own cost stays out of the times); prints the
medians of the consumer's thread CPU per batch (an epoch's first, second
and last, a window's first, the others), the batches that stand out by
their place in the epoch, and the profile.

    python benchmarks/epoch_start.py --file bench/gpu512.h5 --mib 512
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time
from typing import Any

import numpy as np


class _Nothing:
    """A device array: any slice of it is itself."""

    def __getitem__(self, key: Any) -> "_Nothing":
        return self


class NoDevice:
    """``CudaOps``' calls, doing nothing (``_train.device.DeviceStaging``'s ops)."""

    def lock(self, array: Any) -> None: ...
    def unlock(self, array: Any) -> None: ...
    def lock_memory(self, address: int, nbytes: int, what: str) -> None: ...
    def unlock_memory(self, address: int) -> None: ...
    def empty(self, shape: Any, dtype: Any) -> _Nothing: return _Nothing()
    def window(self, shape: Any, dtype: Any) -> _Nothing: return _Nothing()
    def copy(self, dst: Any, src: Any) -> None: ...
    def record(self) -> None: ...
    def host_wait(self, event: Any) -> None: ...
    def device_wait(self, event: Any) -> None: ...
    def done(self, event: Any) -> bool: return True
    def drain(self) -> None: ...
    def training_mark(self) -> None: ...
    def copies_after(self, event: Any) -> None: ...
    def index(self, perm: np.ndarray, buffer: int) -> np.ndarray: return np.ascontiguousarray(perm, np.int64)
    def index_ahead(self, perm: np.ndarray, buffer: int) -> Any: return np.ascontiguousarray(perm, np.int64), None
    def ordered(self, index: Any, copied: Any) -> None: ...
    def gather(self, src: Any, index: Any, out: Any) -> None: ...


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--epochs", type=int, default=4, help="epochs timed, after the first")
    p.add_argument("--sampling", choices=["all", "weights", "indices"], default="all",
                   help="every row, a weighted draw of as many (weights 1 to 4), or every other row")
    p.add_argument("--copy-threads", type=int, help="the batches' copy threads (default: as the machine's CPUs give)")
    args = p.parse_args()
    import importlib
    import importlib.util

    import multitables

    if args.copy_threads is not None:  # where the windows' memory looks them up (buffers; windows before it had one)
        home = importlib.import_module("multitables._train.buffers" if importlib.util.find_spec(
            "multitables._train.buffers") else "multitables._train.windows")
        home.copy_threads = lambda: args.copy_threads  # type: ignore[attr-defined]
    from multitables._train.device import DeviceStaging
    from multitables_bench.gpu import BATCH, by_place, write_file

    if not os.path.exists(args.file):
        write_file(args.file, args.mib)
    n_rows = multitables.Streamer(args.file).get_batches("/X", BATCH, n_procs=0).n_rows
    sampling = {"all": {}, "weights": {"weights": np.arange(n_rows) % 4 + 1.0},
                "indices": {"indices": np.arange(0, n_rows, 2)}}[args.sampling]
    batches = multitables.Streamer(args.file).get_batches("/X", BATCH, n_procs=2, epochs=None, seed=0, **sampling)
    staging = DeviceStaging(NoDevice(), batches.row_types)
    it = batches.iter_into(lambda n: [_Nothing()], staging)
    n = len(batches)
    for _ in range(n):  # the first epoch: readers start, windows fill
        next(it)
    window = batches.window * batches.block_size // BATCH  # batches a window
    cpu: list[float] = []
    for _ in range(args.epochs):  # timed alone: a profiler running in a call would be charged to it
        for i in range(n):
            t = time.thread_time()
            next(it)
            cpu.append(time.thread_time() - t)
    prof = cProfile.Profile(time.thread_time)
    for _ in range(args.epochs):  # then the epochs' first batches (and the batch after each) profiled
        for i in range(n):
            if i < 2:
                prof.enable()
            next(it)
            if i < 2:
                prof.disable()
    firsts = [c for k, c in enumerate(cpu) if k % n == 0]
    seconds = [c for k, c in enumerate(cpu) if k % n == 1]
    lasts = [c for k, c in enumerate(cpu) if k % n == n - 1]
    windows = [c for k, c in enumerate(cpu) if k % n > 1 and (k % n) % window == 0]
    rest = [c for k, c in enumerate(cpu) if k % n > 1 and (k % n) % window and k % n != n - 1]
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.3f} ms" if xs else "-"  # noqa: E731
    print(f"{n} batches an epoch, {window} a window; the consumer's CPU per batch (medians): an epoch's first "
          f"{ms(firsts)}, its second {ms(seconds)}, its last {ms(lasts)}, a later window's first {ms(windows)}, "
          f"the others {ms(rest)} (the slowest of those {max(rest) * 1e3:.3f} ms)")
    print(by_place(cpu, n))  # work moved off an epoch's first batch must not make another stand out
    pstats.Stats(prof).sort_stats("cumtime").print_stats(20)
    batches.close()
    staging.close()


if __name__ == "__main__":
    main()
