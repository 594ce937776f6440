"""The GPU training section (``--sections gpu``): a training step on a GPU fed by each way of reading, epoch after epoch.

Issue 30 asks what a training loop on a GPU node gets: samples per second and
the fraction of steps that waited on data. The file: smooth float32 rows of
4 KiB (a random walk along each row), zlib 3 + shuffle, written with h5py.
The step: matrix products on the GPU sized so that a step takes about as long
as the readers take to deliver a batch (measured first, CPU only), so that
neither side hides the other; or as long as ``--gpu-step-ms`` says, so that two
packages' rows with the step compare (sized by each one's own rate, they do
not). The table's header gives the step's length. Each contender runs
``EPOCHS`` epochs of shuffled batches of ``BATCH`` rows; the figures are those
of the epochs after the first (readers that live across epochs show there),
page cache warm:

* multitables, CPU tensors, ``.to("cuda")`` in the loop (what a user without
  ``device=`` writes);
* multitables ``get_batches(..., device="cuda")`` (shuffled: windows copied to
  the GPU and batches gathered there, NOTE [windows on a device] in
  ``multitables._train.device``);
* ``torch.utils.data.DataLoader`` over h5py slices of ``BATCH`` rows in a
  shuffled order, ``num_workers`` = the CPUs, ``pin_memory=True``,
  ``persistent_workers=True``, ``.to("cuda", non_blocking=True)``;
* multitables CPU only, no step: the rate the readers deliver;
* ``device="cuda"`` and DataLoader again with no step: the rate batches land
  in GPU memory, what issue 30's targets compare (0.9 of the stream's rate
  into shared memory, which ``benchmarks/batches_profile.py`` times, and 5x
  DataLoader's).

A step *waited* when asking for its batch took more than a tenth of a step.
With a step, the medians of how long an epoch's first batch and a batch in
mid-epoch took to come (issue 30: readers that live across epochs make the
first no longer than the second), and, for multitables, of the first batch of
a shuffle window other than an epoch's first: whether an epoch's first batch
waits for what every window's first waits for, or for more. Those are the
host's clock: a host that runs ahead of the GPU also waits for it (for a
buffer's copies to pass before the buffer is written again), which says
nothing of the training. So, on the GPU's own clock (events before and after
each step), how much of the run the GPU sat between steps, and how long
before an epoch's first step and before one in mid-epoch: issue 30's "the
first batch waits no longer than a batch in mid-epoch", as the GPU sees it.
Needs torch with CUDA, h5py and this package; nothing else.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from multitables_bench.files import read_through_cache

#: Rows per batch (4 MiB of 4 KiB rows).
BATCH = 1024
ROW = 1024  # float32 values per row
EPOCHS = 5
#: A step waited on data when getting its batch took more than this fraction of a step.
WAITED = 0.1


@dataclass(frozen=True)
class GpuFigure:
    label: str
    samples_per_s: float
    gb_per_s: float
    waited: "float | None"  # fraction of steps; None where no step ran
    #: Seconds the first batch of an epoch took to come, and a batch in mid-epoch (medians; None where no step ran).
    epoch_start: "float | None" = None
    mid_epoch: "float | None" = None
    #: Seconds a window's first batch, not an epoch's, took to come (median; None where no step ran or no windows).
    window_start: "float | None" = None
    #: On the GPU's own clock (:class:`_GpuGaps`; None where no step ran on a GPU): the share of the run the GPU
    #: sat between a step's end and the next one's start, and those gaps (s, medians) before an epoch's first
    #: step and before one in mid-epoch. The host may run ahead of the GPU and wait for it (a buffer's copies
    #: to pass), which its own clock counts as a wait; the GPU's says whether the training waited on data.
    gpu_idle: "float | None" = None
    gpu_epoch_start: "float | None" = None
    gpu_mid_epoch: "float | None" = None


def write_file(path: str, mib: int) -> None:
    import h5py

    rows = mib * (1 << 20) // (ROW * 4)
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("X", (rows, ROW), "<f4", chunks=(16, ROW), compression="gzip", compression_opts=3, shuffle=True)
        for start in range(0, rows, 8192):
            n = min(8192, rows - start)
            ds[start : start + n] = np.cumsum(rng.standard_normal((n, ROW), dtype=np.float32), axis=1)


def ready_file(path: str, mib: int, log: "Callable[[str], None] | None" = None) -> None:
    """The section's file at ``path`` (written where missing: ``mib`` MiB), read into the page cache."""
    if not os.path.exists(path):
        if log is not None:
            log(f"writing {mib} MiB to {path}")
        write_file(path, mib)
    read_through_cache(path)


class _Slices:
    """Map-style: item ``i`` is rows ``[i * BATCH, (i + 1) * BATCH)`` read with h5py (opened once per worker)."""

    def __init__(self, path: str) -> None:
        import h5py

        self.path = path
        with h5py.File(path) as f:
            self.n = len(f["X"]) // BATCH
        self._ds: Any = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import h5py
        import torch

        if self._ds is None:
            self._ds = h5py.File(self.path)["X"]
        return torch.from_numpy(self._ds[i * BATCH : (i + 1) * BATCH])


def _step_fn(seconds: float, device: Any) -> "Callable[[Any], Any]":
    """A training step of about ``seconds`` on the GPU: ``k`` products of the batch with a square matrix."""
    import torch

    w = torch.randn(ROW, ROW, device=device) / ROW**0.5
    x = torch.randn(BATCH, ROW, device=device)

    def run(k: int) -> float:
        _sync(device)
        t = time.perf_counter()
        for _ in range(20):
            y = x
            for _ in range(k):
                y = y @ w
        _sync(device)
        return (time.perf_counter() - t) / 20

    k = max(1, int(seconds / max(run(8) / 8, 1e-7)))

    def step(batch: Any) -> Any:
        y = batch
        for _ in range(k):
            y = y @ w
        return y.sum()

    return step


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _GpuGaps:
    """Events on the GPU's current stream before and after each step: how long the GPU sat between one step's
    end and the next one's start (the first: from when the loop began, the GPU idle then), on its own clock."""

    def __init__(self) -> None:
        self._marks: list[Any] = []
        self.mark()

    def mark(self) -> None:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._marks.append(event)

    def gaps(self) -> "list[float]":
        """Seconds before each step (call after the GPU is synchronized)."""
        return [end.elapsed_time(start) / 1e3 for end, start in zip(self._marks[0::2], self._marks[1::2])]


def _timed(batches: Iterator[Any], step: "Callable[[Any], Any] | None", n_batches: int, device: Any,
           move: bool = True) -> "tuple[float, float, list[float], list[float] | None]":
    """Seconds for ``n_batches`` steps, the fraction of steps whose batch came late, each batch's wait (s), and
    where a step ran on a GPU, the GPU's gap before each step (s, :class:`_GpuGaps`).

    ``move``: a batch not on ``device`` is copied there (no step: the copies are waited for at the end).
    """
    waits = []
    gpu = _GpuGaps() if step is not None and device.type == "cuda" else None
    t0 = time.perf_counter()
    last = t0
    for i, batch in enumerate(batches):
        got = time.perf_counter()
        waits.append(got - last)
        if move and batch.device.type != device.type:
            batch = batch.to(device, non_blocking=device.type == "cuda" and batch.is_pinned())
        if gpu is not None:
            gpu.mark()  # the batch's copy and gather are queued before it
        if step is not None:
            step(batch)
        if gpu is not None:
            gpu.mark()
        last = time.perf_counter()
        if i + 1 == n_batches:
            break
    _sync(device)
    seconds = time.perf_counter() - t0
    step_s = seconds / max(1, len(waits))
    late = sum(1 for w in waits if w > WAITED * step_s)
    return seconds, late / max(1, len(waits)), waits, None if gpu is None else gpu.gaps()


def window_firsts(per_epoch: int, window_rows: int) -> "set[int]":
    """The batches of an epoch (0-based) that hold the first row of a shuffle window of ``window_rows`` rows."""
    return {k for k in range(per_epoch) if (k * BATCH - 1) // window_rows != ((k + 1) * BATCH - 1) // window_rows}


def by_place(times: "list[float]", per_epoch: int) -> str:
    """Each batch of an epoch by its place (``times``: whole epochs, seconds a batch): the typical median, the slowest
    place, and the places over 1.25 times the typical (slowest first); a median over the batches hides one slow batch
    an epoch."""
    places = [float(np.median(times[i::per_epoch])) for i in range(per_epoch)]
    typical = float(np.median(places))
    slowest = max(range(per_epoch), key=places.__getitem__)
    out = sorted((i for i in range(per_epoch) if places[i] > 1.25 * typical), key=lambda i: -places[i])
    return (f"by place in the epoch (medians over {len(times) // per_epoch} epochs; the typical {typical * 1e3:.3f} ms): "
            f"the slowest batch {slowest}, {places[slowest] * 1e3:.3f} ms; over 1.25 times the typical: "
            + (", ".join(f"{i} ({places[i] * 1e3:.3f} ms)" for i in out) or "none"))


def _boundary(waits: "list[float]", per_epoch: int, windows: "set[int]") -> "tuple[float, float, float | None]":
    """The median wait of the epochs' first batches (``waits`` starts with one), of the other batches, and of those
    among them that start a window (``windows``: their indexes in an epoch; None where there are none)."""
    firsts = waits[::per_epoch]
    rest = [w for i, w in enumerate(waits) if i % per_epoch]
    starts = [w for i, w in enumerate(waits) if i % per_epoch and i % per_epoch in windows]
    return (float(np.median(firsts)), float(np.median(rest)) if rest else float("nan"),
            float(np.median(starts)) if starts else None)


def gpu_section(path: str, n_procs: int, log: Callable[[str], None], device: Any = "cuda",
                step_s: "float | None" = None) -> "tuple[list[GpuFigure], float]":
    """The figures: CPU only; ``.to("cuda")``; ``device=`` with no step, then with it; DataLoader likewise
    (``device="cpu"`` runs the same loops on the CPU, for tests); and the step's length in seconds (``step_s``,
    or as long as the CPU-only batches take to come)."""
    import torch

    import multitables
    import multitables.torch as mt

    device = torch.device(device)
    on_gpu = device.type == "cuda"
    stream = multitables.Streamer(path)
    cpu = mt.get_batches(stream, "/X", BATCH, n_procs=n_procs, epochs=None, seed=0)
    n = len(cpu.batches)  # per epoch: the adapter's len() is a pass, none when endless
    windows = window_firsts(n, cpu.batches.window * cpu.batches.block_size)
    figures: list[GpuFigure] = []

    def record(label: str, seconds: float, waited: "float | None", batches: int, waits: "list[float] | None" = None,
               windowed: bool = True, gaps: "list[float] | None" = None) -> None:
        samples = batches * BATCH / seconds
        start, mid, window = (None, None, None) if waits is None else _boundary(waits, n, windows if windowed else set())
        idle, gpu_start, gpu_mid = (None, None, None) if gaps is None else (sum(gaps) / seconds, *_boundary(gaps, n, set())[:2])
        figures.append(GpuFigure(label, samples, samples * ROW * 4 / 1e9, waited, start, mid, window, idle, gpu_start, gpu_mid))
        log(f"{label}: {samples:,.0f} samples/s" + ("" if waited is None else f", waited {waited:.0%}")
            + ("" if start is None else f"; an epoch's first batch came in {start * 1e3:.2f} ms, one in mid-epoch in "
                                        f"{mid * 1e3:.2f} ms" + ("" if window is None else
                                                                 f", a later window's first in {window * 1e3:.2f} ms")
                                        + " (medians)")
            + ("" if idle is None else f"; the GPU idle {idle:.0%} of the time, before an epoch's first step "
                                       f"{gpu_start * 1e3:.2f} ms, before one in mid-epoch {gpu_mid * 1e3:.2f} ms"))

    it = iter(cpu)
    _timed(it, None, n, device, move=False)  # the first epoch: readers start, windows fill
    seconds, _, _, _ = _timed(it, None, (EPOCHS - 1) * n, device, move=False)
    record("multitables, CPU only, no step (the rate the readers deliver)", seconds, None, (EPOCHS - 1) * n)
    step_s = step_s or seconds / ((EPOCHS - 1) * n)
    step = _step_fn(step_s, device)

    seconds, waited, waits, gaps = _timed(it, step, (EPOCHS - 1) * n, device)
    record('multitables, CPU tensors, .to("cuda") in the loop', seconds, waited, (EPOCHS - 1) * n, waits, gaps=gaps)
    cpu.close()
    del it, cpu

    gpu = mt.get_batches(stream, "/X", BATCH, n_procs=n_procs, epochs=None, seed=0, device=device, pin_memory=on_gpu)
    it = iter(gpu)
    _timed(it, step, n, device)
    seconds, _, _, _ = _timed(it, None, (EPOCHS - 1) * n, device)
    record('multitables, get_batches(device="cuda"), no step', seconds, None, (EPOCHS - 1) * n)
    seconds, waited, waits, gaps = _timed(it, step, (EPOCHS - 1) * n, device)
    record('multitables, get_batches(device="cuda")', seconds, waited, (EPOCHS - 1) * n, waits, gaps=gaps)
    gpu.close()
    del it, gpu

    from torch.utils.data import DataLoader, RandomSampler

    loader = DataLoader(_Slices(path), batch_size=None, sampler=RandomSampler(range(n)), num_workers=n_procs,
                        pin_memory=on_gpu, persistent_workers=True)

    def epochs() -> Iterator[Any]:
        while True:
            yield from loader

    it2 = epochs()
    _timed(it2, step, n, device)
    label = f"DataLoader(num_workers={n_procs}, pin_memory=True, persistent_workers=True) over h5py"
    seconds, _, _, _ = _timed(it2, None, (EPOCHS - 1) * n, device)
    record(f"{label}, no step", seconds, None, (EPOCHS - 1) * n)
    seconds, waited, waits, gaps = _timed(it2, step, (EPOCHS - 1) * n, device)
    record(label, seconds, waited, (EPOCHS - 1) * n, waits, windowed=False, gaps=gaps)
    del it2, loader  # its workers go
    return figures, step_s


def gpu_markdown(figures: "list[GpuFigure]", mib: int, n_procs: int, step_s: float, step_given: bool = False) -> str:
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU: the CPU"
    sized = "given" if step_given else "as long as the CPU-only batches take to come"
    head = (
        f"### Training on a GPU ({name}, {os.cpu_count()} CPUs; {mib} MiB of 4 KiB rows, "
        f"zlib 3 + shuffle, batches of {BATCH} rows, {n_procs} readers or workers, epochs 2-{EPOCHS}, page cache warm; "
        f"a step of {step_s * 1e3:.2f} ms, {sized})\n\n"
        "| reader | samples/s | GB/s | steps that waited on data | an epoch's first batch came in (ms) | "
        "a batch in mid-epoch (ms) | of those, a window's first (ms) | the GPU idle between steps | "
        "the GPU idle before an epoch's first step / one in mid-epoch (ms) |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )

    def ms(seconds: "float | None") -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.2f}"

    rows = [f"| {f.label} | {f.samples_per_s:,.0f} | {f.gb_per_s:.2f} | {'-' if f.waited is None else f'{f.waited:.0%}'} "
            f"| {ms(f.epoch_start)} | {ms(f.mid_epoch)} | {ms(f.window_start)} "
            f"| {'-' if f.gpu_idle is None else f'{f.gpu_idle:.0%}'} "
            f"| {'-' if f.gpu_epoch_start is None else f'{ms(f.gpu_epoch_start)} / {ms(f.gpu_mid_epoch)}'} |"
            for f in figures]
    return head + "\n".join(rows) + "\n"


def run_gpu(workdir: str, mib: int, n_procs: "int | None", log: Callable[[str], None], path: "str | None" = None,
            step_ms: "float | None" = None) -> str:
    """Write the file (or reuse ``path``), read it into the page cache, measure; the section's Markdown."""
    import torch

    if not torch.cuda.is_available():
        return "### Training on a GPU\n\nSkipped: torch.cuda.is_available() is False on this machine.\n"
    path = path or os.path.join(workdir, "gpu.h5")
    ready_file(path, mib, log)
    n_procs = n_procs or len(os.sched_getaffinity(0))
    figures, step_s = gpu_section(path, n_procs, log, step_s=None if step_ms is None else step_ms / 1e3)
    return gpu_markdown(figures, mib, n_procs, step_s, step_given=step_ms is not None)
