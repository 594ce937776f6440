"""Where a batch that starts a window waits, on the ``device=`` path (issue 30): the host's time per batch, split by
the calls that can block it.

On a lent H200 (thirty-eighth session) an epoch's first batch came in 0.90 ms and a later window's first in 0.65
ms, against 0.28 ms in mid-epoch, while the consumer's own CPU for them (``benchmarks/epoch_start.py``) was 0.33,
0.14 and 0.11 ms: the rest is a wait. This script says in which call. Shuffled
``multitables.torch.get_batches(device=...)`` over the GPU section's file (``multitables_bench.gpu``: 4 KiB zlib-3
rows, written when missing), batches of 1,024, the default readers, a GPU step of ``--step-ms`` (the section's
length for this file on the H200), epochs 2 to ``--epochs + 1`` timed. Each call below is timed where it is made,
and charged to the batch being fetched:

* ``host_wait``: the host waits for a copy's event (a window buffer to be written again, a slot to be given back);
* ``index``: a window's order copied to the device;
* ``device_wait``, ``copy``, ``record``, ``ordered``, ``training_mark``: queued device work (should be short);
* ``done``: whether a copy's event has passed (a slot can be given back);
* ``(in ordered) ...``: the parts of ``ordered``, the training stream's waits (``device_wait``'s too) and the index's
  ``record_stream``, within the calls above (not added up);
* ``Queue.get``: the wait for the readers' next block;
* ``Future.result``: a window's order (made on another thread), the copy threads' work.

    python benchmarks/window_waits.py --file bench/gpu512.h5 --mib 512

Without CUDA it says so and ends, unless ``--device cpu`` (the CPU path's calls, for a test of this script).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import Future
from typing import Callable

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # multitables_bench, after PYTHONPATH
from multitables_bench.calls import time_calls  # noqa: E402

#: The batch being fetched (set by the loop), and the seconds each timed call took during it.
NOW = [-1]
SPENT: "defaultdict[tuple[int, str], float]" = defaultdict(float)


def charge(label: str) -> "Callable[[float, float, tuple], None]":
    def done(t0: float, t1: float, _args: tuple) -> None:
        SPENT[NOW[0], label] += t1 - t0

    return done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--epochs", type=int, default=3, help="epochs timed, after the first")
    p.add_argument("--step-ms", type=float, default=1.0, help="the GPU step's length (ms)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--procs", type=int, default=None, help="readers (default: the library's)")
    args = p.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("Skipped: torch.cuda.is_available() is False on this machine.")
        return
    import multitables
    import multitables.torch as mt
    from multitables._stream.queue import Queue
    from multitables_bench.gpu import BATCH, _step_fn, _sync, by_place, window_firsts, write_file

    device = torch.device(args.device)
    if device.type == "cuda":
        from multitables._train.cuda import CudaOps, RuntimeOps

        for name in ("host_wait", "index", "device_wait", "copy", "record", "ordered", "training_mark", "done"):
            time_calls(CudaOps, name, charge(name))
            if name in RuntimeOps.__dict__:  # the runtime's own calls (NOTE [the runtime's own calls])
                time_calls(RuntimeOps, name, charge(name))
        # Parts of ``ordered``, timed within it (not added to the rest's sum): the training stream's wait, the index's
        # record_stream.
        time_calls(CudaOps, "_training_waits", charge("(in ordered) wait"))
        time_calls(RuntimeOps, "_training_waits", charge("(in ordered) wait"))
        time_calls(torch.Tensor, "record_stream", charge("(in ordered) record_stream"))
    time_calls(Queue, "get", charge("Queue.get"))
    time_calls(Future, "result", charge("Future.result"))
    if not os.path.exists(args.file):
        write_file(args.file, args.mib)
    step = _step_fn(args.step_ms / 1e3, device)
    batches = mt.get_batches(multitables.Streamer(args.file), "/X", BATCH, n_procs=args.procs, epochs=None, seed=0,
                             device=device, pin_memory=device.type == "cuda")
    per_epoch = len(batches.batches)
    windows = window_firsts(per_epoch, batches.batches.window * batches.batches.block_size)
    it = iter(batches)
    waits: "list[float]" = []
    for i in range((args.epochs + 1) * per_epoch):
        NOW[0] = i - per_epoch  # the first epoch (readers start, windows fill) is charged to negative batches
        t = time.perf_counter()
        batch = next(it)
        waits.append(time.perf_counter() - t)
        step(batch)
    _sync(device)
    readers = getattr(batches.batches, "n_procs", None)  # per dataset
    batches.close()

    kinds = {"an epoch's first": [], "a later window's first": [], "the others": []}
    for i in range(args.epochs * per_epoch):
        k = i % per_epoch
        kind = "an epoch's first" if k == 0 else "a later window's first" if k in windows else "the others"
        kinds[kind].append(i)
    labels = sorted({label for _, label in SPENT})
    print(f"{per_epoch} batches an epoch, windows start at batches {sorted(windows)[:4]}...; readers per dataset "
          f"{readers if readers is not None else 'the default'}; a step of {args.step_ms:.2f} ms on {device}; "
          f"epochs 2-{args.epochs + 1}, medians (ms)")
    print("| batch | batches | came in | " + " | ".join(labels) + " | the rest |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in labels) + " | ---: |")
    for kind, ids in kinds.items():
        if not ids:
            continue
        came = [waits[per_epoch + i] for i in ids]
        parts = {label: [SPENT.get((i, label), 0.0) for i in ids] for label in labels}
        rest = [c - sum(parts[label][j] for label in labels if not label.startswith("(in ")) for j, c in enumerate(came)]
        ms = lambda xs: f"{statistics.median(xs) * 1e3:.3f}"  # noqa: E731
        print(f"| {kind} | {len(ids)} | {ms(came)} | " + " | ".join(ms(parts[label]) for label in labels)
              + f" | {ms(rest)} |")
    print(by_place(waits[per_epoch:], per_epoch) + " (came in)")


if __name__ == "__main__":
    main()
