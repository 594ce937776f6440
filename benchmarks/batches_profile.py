"""Where shuffled batches lose against the stream under them: the queue's rate, the batches' rate, the consumer's CPU.

On the GPU section's file (``multitables_bench.gpu``: 4 KiB zlib-3 rows,
written when missing), page cache warm, ``--procs`` readers:

* the stream alone: ``get_queue`` direct blocks, nothing copied (what the
  readers deliver into shared memory), a pass from a fresh queue, then passes
  2-3 of a cyclic one (readers already started, as the batches' epochs 2-3);
* ``get_batches`` of 1,024 shuffled rows, CPU only, epochs after the first
  (readers across epochs), with the consumer's CPU seconds per wall second
  (near 1: the consumer is the limit) and the readers' (near their number:
  they are); for 1 and 2 copy threads and the default (NOTE [parallel copies]);
* a profile of those epochs: the consumer's functions by their own time;
* with ``--device cuda`` (where torch has CUDA): the same for
  ``multitables.torch.get_batches(device="cuda")``, each batch on the GPU
  (NOTE [windows on a device]), waited for at the end; then the host copies
  that path makes, alone: into a window buffer as it is, page-locked, and
  page-locked with each piece copied to the GPU.

    python benchmarks/batches_profile.py --file bench/gpu.h5 --mib 512 --procs 16 [--device cuda]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True)
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--procs", type=int, default=0, help="readers (0: the CPUs this process may use)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--device", default=None, help="also batches on this torch device (cuda)")
    args = p.parse_args()
    import h5py

    import multitables
    from multitables_bench.gpu import ready_file

    windows = _buffers_home()
    default = windows.copy_threads

    ready_file(args.file, args.mib)
    n = args.procs or len(os.sched_getaffinity(0))
    stream = multitables.Streamer(args.file)
    size = os.path.getsize(args.file)
    with h5py.File(args.file) as f:
        rows = len(f["X"])
    for _ in range(2):
        t0 = time.perf_counter()
        nbytes = 0
        with stream.get_queue("/X", n_procs=n) as q:
            for guard in q.iter():
                with guard as block:
                    nbytes += block.nbytes
        print(f"stream, {n} readers ({q.engine}): {nbytes / (time.perf_counter() - t0) / 1e9:.2f} GB/s "
              f"({size / 1e6:,.0f} MB stored)", flush=True)
    with stream.get_queue("/X", n_procs=n, cyclic=True) as q:
        n_blocks = -(-rows // q.block_size)
        for _ in range(n_blocks):  # the first pass: readers start
            with q.get():
                pass
        w0, r0 = time.perf_counter(), _readers_cpu()
        nbytes = 0
        for _ in range(2 * n_blocks):
            with q.get() as block:
                nbytes += block.nbytes
        wall = time.perf_counter() - w0
        print(f"stream, {n} readers, cyclic, passes 2-3: {nbytes / wall / 1e9:.2f} GB/s, "
              f"readers' CPU {(_readers_cpu() - r0) / wall:.2f} s per s", flush=True)

    for threads in sorted({1, 2, default()}):  # NOTE [parallel copies]
        windows.copy_threads = lambda t=threads: t  # type: ignore[assignment]
        label = f"{threads} copy thread{'s' if threads > 1 else ''}{' (the default)' if threads == default() else ''}"
        epochs(stream, n, args.epochs, label, profiled=False)
    windows.copy_threads = default
    epochs(stream, n, args.epochs, "the default copy threads", profiled=True)
    if args.device:
        import torch

        if args.device.startswith("cuda") and not torch.cuda.is_available():
            print(f"device={args.device!r}: skipped, torch.cuda.is_available() is False", flush=True)
            return
        for profiled in (False, True):
            epochs(stream, n, args.epochs, f"device={args.device!r}", profiled=profiled, device=args.device)
        host_copies(args.device)


def _buffers_home() -> Any:
    """The module where the batches look up ``copy_threads`` and make window buffers: ``_train.buffers`` (since
    1a54beb), or ``_train.windows`` in a package from before it (an A/B's older side)."""
    import importlib
    import importlib.util

    name = "multitables._train.buffers"
    return importlib.import_module(name if importlib.util.find_spec(name) else "multitables._train.windows")


def host_copies(device: str) -> None:
    """The consumer's host copies alone, as ``device=`` makes them: 4 MiB pieces into a 256 MiB window buffer with
    the default copy threads, into the buffer as it is, page-locked in place, and page-locked with each piece then
    copied to the device (NOTE [windows on a device]): whether page-locking or the device's copies slow the CPU's."""
    import numpy as np
    import torch

    from multitables._train.cuda import cuda_ops

    windows = _buffers_home()

    piece, rows = 1024, (256 << 20) // 4096
    src = np.ones((piece, 1024), np.float32)
    buf = windows.empty_window_buffer((rows, 1024), np.float32)
    copier = windows.Copier(windows.copy_threads())
    ops = cuda_ops(torch.device(device)) if device.startswith("cuda") else None
    dev = ops.window(buf.shape, buf.dtype) if ops is not None else None
    try:
        for label in ("as it is", "page-locked", "page-locked, each piece then copied to the device"):
            if label != "as it is" and ops is None:
                break
            if label == "page-locked":
                ops.lock(buf)  # type: ignore[union-attr]
            for _ in range(3):
                w0, c0 = time.perf_counter(), time.process_time()
                for a in range(0, rows, piece):
                    copier.copy(buf[a : a + piece], src)
                    if dev is not None and label.endswith("device"):
                        ops.copy(dev[a : a + piece], buf[a : a + piece])  # type: ignore[union-attr]
                        ops.record()  # type: ignore[union-attr]
                if ops is not None:
                    torch.cuda.synchronize()
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                print(f"host copies, {copier.threads} thread(s), {label}: {buf.nbytes / wall / 1e9:.2f} GB/s, "
                      f"CPU {cpu / wall:.2f} s per s", flush=True)
    finally:
        if ops is not None and label != "as it is":
            ops.unlock(buf)
        copier.close()


def _threads_cpu() -> "dict[int, tuple[str, float]]":
    """This process's threads: id -> (name, CPU seconds, user and system), from ``/proc/self/task``."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def _readers_cpu() -> float:
    """CPU seconds (user and system) of this process's children: the readers."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if fields[1] == me:  # ppid
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def epochs(stream: "object", n: int, n_epochs: int, label: str, profiled: bool, device: "str | None" = None) -> None:
    """Batches of the GPU section's size (on ``device``, else CPU only): the rate of epochs 2 on, the consumer's and the
    readers' CPU."""
    from multitables_bench.gpu import BATCH

    if device is None:
        batches = stream.get_batches("/X", BATCH, n_procs=n, epochs=None, seed=0)  # type: ignore[attr-defined]
    else:
        import multitables.torch as mt

        batches = mt.get_batches(stream, "/X", BATCH, n_procs=n, epochs=None, seed=0, device=device)
    per_epoch = len(batches if device is None else batches.batches)  # per epoch (the adapter's: a pass)
    it = iter(batches)
    for _ in range(per_epoch):  # the first epoch: readers start, the windows fill
        next(it)
    prof = cProfile.Profile() if profiled else None
    t0 = _threads_cpu()
    w0, c0, r0 = time.perf_counter(), time.process_time(), _readers_cpu()
    if prof:
        prof.enable()
    nbytes = 0
    for _ in range((n_epochs - 1) * per_epoch):
        batch = next(it)
        nbytes += batch.nbytes if device is None else batch.element_size() * batch.nelement()
    if device is not None and device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    if prof:
        prof.disable()
    wall, cpu, readers = time.perf_counter() - w0, time.process_time() - c0, _readers_cpu() - r0
    print(f"batches of {BATCH}, {n} readers, {label}, epochs 2-{n_epochs}{' (profiled)' if prof else ''}: "
          f"{nbytes / wall / 1e9:.2f} GB/s, consumer CPU {cpu / wall:.2f} s per s, readers' {readers / wall:.2f}", flush=True)
    t1 = _threads_cpu()
    busy = sorted(((t1[k][1] - t0.get(k, (None, 0.0))[1], t1[k][0]) for k in t1), reverse=True)[:5]
    print("  the consumer's busiest threads (CPU s per s): " + ", ".join(f"{name} {s / wall:.2f}" for s, name in busy), flush=True)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    batches.close()


if __name__ == "__main__":
    main()
