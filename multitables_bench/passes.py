"""Timing passes: one whole read of a file by one reader, the page cache set up first; which jobs a run times.

:func:`measure` writes each file in turn, times every job on it
(:func:`main_jobs` on the benchmark file, :func:`small_jobs` on the small
files) and removes it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from multitables_bench import diskmodel
from multitables_bench.cache_modes import prepare_cache
from multitables_bench.files import write_file
from multitables_bench.readers import engine_can_read, probe_multitables, read_multitables, read_odirect, read_single
from multitables_bench.records import DEFAULT_DATA, READ_DATA, SMALL_FILES, Pass, Reader, Settings, Target, data_path, single_engines

#: Small-file passes take milliseconds, and one disk request more or less moves a figure by 10-20%:
#: at least this many repeats (a median of 15 still moved a ratio by 5-10% from run to run).
SMALL_MIN_REPEATS = 41
#: ... and in a --quick run, which must stay well under a minute.
QUICK_SMALL_REPEATS = 15


@dataclass(frozen=True)
class Job:
    """A reader on a target, with what the pass records besides its time."""

    target: Target
    reader: Reader
    n_procs_used: "int | None" = None
    block_size: "int | None" = None


def time_pass(job: Job, cache: str, repeat: int, cycle: int, log: Callable[[str], None]) -> Pass:
    """Set the cache up, measure residency, read the whole file once, timed with ``perf_counter``."""
    from multitables._io.fileset import forget_learned

    target, reader = job.target, job.reader
    # Each pass reads the file as a process that never read it: its node is described, its chunk index read again.
    forget_learned()
    resident = prepare_cache(target.path, cache)
    # The garbage of the pass before (PyTables leaves many objects) is collected
    # now, not charged to whichever reader runs next, which on the small files
    # made the pass after a PyTables one measurably slower.
    gc.collect()
    kind = "" if target.data in (DEFAULT_DATA, READ_DATA) else f"{target.data} "
    desc = f"{target.key} {kind}{target.codec.label} {reader.label} [{resident:.1%} cached]"
    file_nbytes = os.path.getsize(target.path)  # what O_DIRECT reads, and the stored bytes of a generated file
    n_procs_used = job.n_procs_used
    model = diskmodel.current()
    # Under a disk model (--disk-model) only the pass itself is charged: writing, probing and warming are not.
    charging = model.charging(os.path.dirname(target.path)) if model is not None else contextlib.nullcontext()
    with charging:
        seconds, n_procs_used = _timed_read(job, cache, desc, file_nbytes, n_procs_used)
    nbytes = file_nbytes if reader.kind == "odirect" else target.data_nbytes
    stored = file_nbytes if reader.kind == "odirect" or target.stored_nbytes is None else target.stored_nbytes
    p = Pass(target.key, target.codec, reader, repeat, cycle, cache, resident, seconds, nbytes, n_procs_used, job.block_size,
             target.data, stored)
    flag = "  WARM START" if p.warm_start else ""
    on_model = f", {model.stats().summary()}" if model is not None else ""
    log(f"{desc} repeat {repeat + 1} cycle {cycle + 1}: {p.seconds:.3f} s, {p.mb_per_s:,.0f} MB/s{on_model}{flag}")
    return p


def _timed_read(job: Job, cache: str, desc: str, file_nbytes: int, n_procs_used: "int | None") -> tuple[float, "int | None"]:
    """Read the whole file once with the job's reader: (seconds, reader processes used)."""
    from tqdm import tqdm

    target, reader = job.target, job.reader
    if reader.kind == "odirect":
        with tqdm(total=file_nbytes, desc=desc, unit="B", unit_scale=True, leave=False) as bar:
            return file_nbytes / read_odirect(target, bar.update), n_procs_used
    with tqdm(total=target.n_rows, desc=desc, unit="row", unit_scale=True, leave=False) as bar:
        used: list[int] = []
        t0 = time.perf_counter()
        if reader.kind == "single":
            rows = read_single(target, reader, cache, job.block_size or 1, bar.update)
        else:
            rows = read_multitables(target, reader, cache, bar.update, used)
        seconds = time.perf_counter() - t0
    if rows != target.n_rows:
        raise RuntimeError(f"{reader.label} read {rows} rows of {target.path}, which has {target.n_rows}")
    return seconds, used[0] if used else n_procs_used


def run_jobs(
    jobs: Sequence[Job], cache: str, repeats: int, cycles: int, log: Callable[[str], None], passes: "list[Pass] | None" = None,
    pairs: bool = False,
) -> list[Pass]:
    """Every job ``repeats`` x ``cycles`` times, appended to ``passes`` (returned).

    Repeats are interleaved (every job once, then again) so that slow drift on the machine touches every job alike.
    ``pairs``: in :func:`pass_order` instead, where a pass is short enough that the one before it moves its time.
    """
    passes = [] if passes is None else passes
    order = pass_order(len(jobs), repeats) if pairs else [j for _ in range(repeats) for j in range(len(jobs))]
    done = [0] * len(jobs)
    for j in order:
        passes += [time_pass(jobs[j], cache, done[j], c, log) for c in range(cycles)]
        done[j] += 1
    return passes


def pair_order(n: int) -> list[int]:
    """A cycle of ``n * n`` passes of jobs ``0..n-1`` in which each job follows each job (itself too) once.

    Built greedily, each step taking the highest job not yet after the
    current one (a de Bruijn sequence of order 2: every ordered pair is an
    edge of a complete graph with loops, which has an Euler circuit).
    """
    seq, used = [0], set()
    while True:
        nxt = next((r for r in range(n - 1, -1, -1) if (seq[-1], r) not in used), None)
        if nxt is None:
            return seq[:-1]  # it ends where it began: the last pass's successor is the first
        used.add((seq[-1], nxt))
        seq.append(nxt)


def pass_order(n: int, repeats: int) -> list[int]:
    """The jobs ``0..n-1``, ``repeats`` passes each, in which each job follows each other as often as the others.

    A pass leaves the next one slower or faster (here PyTables' pass over a
    small file leaves the next ~2% slower: BENCHMARKS.md), and a fixed order
    would always charge it to the same job. :func:`pair_order` cycled; the
    last, partial cycle skips the jobs that have their repeats.
    """
    cycle, done, order = pair_order(n), [0] * n, []
    step = 0
    while len(order) < n * repeats:
        j = cycle[step % len(cycle)]
        step += 1
        if done[j] < repeats:
            done[j] += 1
            order.append(j)
    return order


def main_jobs(target: Target, settings: Settings, cache: str, notes: list[str], odirect: bool = True) -> list[Job]:
    """The O_DIRECT read (unless not ``odirect``), the single-process readers and multitables (1..max_procs and
    default) on the benchmark file, or on a user's dataset (``--read``)."""
    jobs = [Job(target, Reader("odirect"))] if odirect else []
    engines = []
    what = target.codec.label if target.key == "main" else f"{target.key} ({target.codec.label})"
    for engine in settings.engines:
        problem = engine_can_read(target, engine)
        if problem:
            notes.append(f"{what}: {engine} cannot decode the file here, skipped ({problem})")
        else:
            engines.append(engine)
    _, default_block = probe_multitables(target, "auto", None, cache)
    singles = single_engines(settings.engines)
    jobs += [Job(target, Reader("single", e), block_size=default_block) for e in singles if not engine_can_read(target, e)]
    for engine in engines:
        for n_procs in [*range(1, settings.max_procs + 1), None]:
            used, block = probe_multitables(target, engine, n_procs, cache)
            jobs += [Job(target, Reader("multitables", engine, mode, n_procs), used, block) for mode in settings.modes]
    return jobs


def small_repeats(settings: Settings) -> int:
    """Repeats for the small files: --repeats, but at least SMALL_MIN_REPEATS (QUICK_SMALL_REPEATS with --quick)."""
    return max(settings.repeats, QUICK_SMALL_REPEATS if settings.quick else SMALL_MIN_REPEATS)


def small_jobs(target: Target, settings: Settings, cache: str) -> list[Job]:
    """Single-process readers and default multitables (engine auto) on a small file."""
    used, block = probe_multitables(target, "auto", None, cache)
    jobs = [Job(target, Reader("single", engine), block_size=block) for engine in single_engines(settings.engines)]
    return jobs + [Job(target, Reader("multitables", "auto", mode, None), used, block) for mode in settings.modes]


def measure(
    settings: Settings, workdir: str, main_path: str, cache: str, notes: list[str], log: Callable[[str], None], passes: list[Pass]
) -> None:
    """Write each file in turn, run its jobs, remove it; every pass is appended to ``passes`` as it ends.

    Per codec, one file of each ``--data`` kind (named by :func:`data_path`), each measured beside its own baselines;
    the small files hold the first kind.
    """
    paths = [data_path(main_path, data, settings.data) for data in settings.data]
    try:
        for codec in settings.codecs:
            for data, path in zip(settings.data, paths):
                target = Target("main", path, codec, settings.n_rows, data=data)
                write_file(target.path, target.n_rows, codec, data=data)
                run_jobs(main_jobs(target, settings, cache, notes), cache, settings.repeats, settings.cycles, log, passes)
                os.remove(target.path)
        if settings.small_files:
            repeats = small_repeats(settings)
            for small in SMALL_FILES:
                path = os.path.join(workdir, f"{small.key}.h5")
                target = Target(small.key, path, settings.small_codec, small.n_rows, small.chunk_rows, settings.data[0])
                write_file(target.path, target.n_rows, target.codec, small.chunk_rows, data=target.data)
                run_jobs(small_jobs(target, settings, cache), cache, repeats, settings.cycles, log, passes, pairs=True)
                os.remove(target.path)
    finally:
        for path in paths:
            if os.path.exists(path):
                os.remove(path)
