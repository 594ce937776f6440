"""The scaling section's report: a table per codec, the machine's facts, and issue 29's targets, in Markdown."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from multitables_bench.counters import FAULT_TARGET, PAGE_SIZE, pages_per_gib
from multitables_bench.records import ROW_NBYTES, GiB
from multitables_bench.scaling import CODECS, ScalingFigure, ScalingRun, procs_list

HEADER = ("reader", "processes", "MB/s", "vs h5py", "efficiency", "readers: minor faults/GiB",
          "readers: switches/GiB", "consumer: minor faults/GiB", "consumer: switches/GiB", "faults < 1% of pages")
COUNTERS = ("reader_minflt_per_gib", "reader_switches_per_gib", "consumer_minflt_per_gib", "consumer_switches_per_gib")
#: Issue 29's targets on a many-core machine (the largest n measured stands for 16).
ZLIB_EFFICIENCY, BLOSC_VS_PROCESSES, BLOSC_ONE_VS_H5PY = 0.8, 0.95, 0.95


def label(f: ScalingFigure) -> str:
    """What a row reads with."""
    if f.kind == "h5py":
        return f"h5py, one process (read_direct, blocks of {f.block_rows:,} rows)"
    if f.kind == "multitables":
        n = f"default (n_procs={f.n_used})" if f.n is None else f"n_procs={f.n}"
        return f"multitables direct, {n}, engine {f.engine}"
    if f.kind == "processes":
        return f"{f.n} plain h5py process{'es' if f.n != 1 else ''}, each its own share (nothing handed over)"
    if f.kind == "dataloader":
        return f"DataLoader(num_workers={f.n}, batch_size=None), h5py blocks of {f.block_rows:,} rows"
    if f.kind == "inflate":
        return (f"the file's chunks inflated in memory (libdeflate), {f.n} process{'es at once' if f.n != 1 else ''}: "
                "the cores alone (nothing read or handed over)")
    return f"memcpy, {f.n} process{'es at once' if f.n != 1 else ''}"


def find(figures: Sequence[ScalingFigure], codec: str, kind: str, n: "int | None") -> Optional[ScalingFigure]:
    """The figure of ``kind`` with ``n`` on ``codec``, or None if it was not measured."""
    return next((f for f in figures if f.codec == codec and f.kind == kind and f.n == n), None)


def efficiency(figures: Sequence[ScalingFigure], f: ScalingFigure) -> "float | None":
    """rate(n) / (n x rate(1)) within ``f``'s kind; the default row counts the readers it ran."""
    n = f.n_used if f.n is None else f.n
    one = find(figures, f.codec, f.kind, 1)
    if f.kind not in ("multitables", "processes", "dataloader", "inflate") or one is None or not n:
        return None
    return f.mb_per_s / (n * one.mb_per_s)


def _fmt(value: "float | None", spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _verdict(counters: "dict[str, float] | None") -> str:
    if counters is None:
        return "n/a (too few blocks)"
    limit = FAULT_TARGET * pages_per_gib()
    return "met" if max(counters["reader_minflt_per_gib"], counters["consumer_minflt_per_gib"]) < limit else "missed"


def codec_rows(figures: Sequence[ScalingFigure], codec: str) -> list[tuple[str, ...]]:
    """The rows of one codec's table."""
    base = find(figures, codec, "h5py", 1)
    rows = []
    for f in (f for f in figures if f.codec == codec):
        n = f.n_used if f.n is None else f.n
        ratio = f"{f.mb_per_s / base.mb_per_s:.2f}x" if base else "n/a"
        cells = ["", "", "", "", ""]
        if f.kind == "multitables":
            cells = [_fmt(f.counters[k] if f.counters else None, ",.0f") for k in COUNTERS] + [_verdict(f.counters)]
            if f.counters and f.readers_counted and f.readers_counted.split("/")[0] != f.readers_counted.split("/")[1]:
                cells[4] += f" ({f.readers_counted} readers counted)"
        rows.append((label(f), str(n), f"{f.mb_per_s:,.0f}", ratio, _fmt(efficiency(figures, f), ".2f"), *cells))
    return rows


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def facts_rows(facts: dict[str, Any], memcpy_mib: int) -> list[tuple[str, str]]:
    """The machine's facts as (what, value) rows."""
    mem = facts["memory_bytes"]
    rows = [("cores this process may use (sched_getaffinity)", f"{facts['cores']} (of {facts['cpus']} CPUs)"),
            ("CPU quota of its control groups (what the default's readers are capped at)",
             "none" if facts.get("cpu_quota") is None else f"{facts['cpu_quota']:g} CPUs"),
            ("threads per core", str(facts["threads_per_core"] or "unknown")), ("CPU", facts["cpu"]),
            ("memory", f"{mem / GiB:.0f} GiB" if mem else "unknown")]
    for n, rate in sorted(facts["memcpy_gb_per_s"].items()):
        rows.append((f"memory copy, {n} process{'es at once' if n > 1 else ''} (np.copyto, {memcpy_mib} MiB "
                     f"buffers already touched)", f"{rate:,.1f} GB/s"))
    return rows


def target_rows(figures: Sequence[ScalingFigure], max_procs: int) -> list[tuple[str, str, str, str]]:
    """Issue 29's targets that this run measured: (target, measured, wanted, verdict)."""
    out = []
    top = find(figures, "zlib-3", "multitables", max_procs)
    if top is not None and max_procs > 1:
        eff = efficiency(figures, top)
        out.append((f"zlib 3, n_procs={max_procs}: efficiency", _fmt(eff, ".2f"), f">= {ZLIB_EFFICIENCY}",
                    "met" if eff is not None and eff >= ZLIB_EFFICIENCY else "missed"))
        cores = find(figures, "zlib-3", "inflate", max_procs)
        if cores is not None:
            out.append((f"the machine: zlib 3 chunks inflated in memory by {max_procs} processes at once: efficiency",
                        _fmt(efficiency(figures, cores), ".2f"), "(the cores alone, for the row above)", "n/a"))
    default, plain = find(figures, "blosc-3", "multitables", None), find(figures, "blosc-3", "processes", max_procs)
    if default is not None and plain is not None:
        r = default.mb_per_s / plain.mb_per_s
        out.append((f"blosc 3, default / {max_procs} plain processes", f"{r:.2f}x", f">= {BLOSC_VS_PROCESSES}x",
                    "met" if r >= BLOSC_VS_PROCESSES else "missed"))
    one, base = find(figures, "blosc-3", "multitables", 1), find(figures, "blosc-3", "h5py", 1)
    if one is not None and base is not None:
        r = one.mb_per_s / base.mb_per_s
        out.append(("blosc 3, n_procs=1 / h5py in its process", f"{r:.2f}x", f">= {BLOSC_ONE_VS_H5PY}x",
                    "met" if r >= BLOSC_ONE_VS_H5PY else "missed"))
    counted = [f for f in figures if f.kind == "multitables" and f.counters]
    if counted:
        worst = max(max(f.counters[k] for k in ("reader_minflt_per_gib", "consumer_minflt_per_gib"))
                    for f in counted if f.counters)
        limit = FAULT_TARGET * pages_per_gib()
        out.append(("minor faults per GiB after the first lap, worst of readers and consumer", f"{worst:,.0f}",
                    f"< {limit:,.0f}", "met" if worst < limit else "missed"))
    return out


def scaling_markdown(run: ScalingRun) -> str:
    """The section: the sizes it used, a table per codec, the machine's facts, the targets."""
    settings, figures, sizes, n_rows = run.settings, run.figures, run.file_nbytes, run.n_rows
    procs = ", ".join(map(str, procs_list(settings.max_procs)))
    data = n_rows * ROW_NBYTES
    squeeze = ", ".join(f"{c.label} {data / sizes[c.label]:.1f}x" for c in CODECS if c.label in sizes)
    pages = pages_per_gib()
    out = [f"### Scaling: {settings.mib:,} MiB of smooth float32 rows ({n_rows:,} rows of 4 KiB; compression {squeeze}), "
           f"page cache warm, medians of {settings.repeats} passes, each in a fresh process",
           "",
           f"Processes N = {procs} (and multitables' default); blocks of about 4 MiB; memory copies of "
           f"{settings.memcpy_mib} MiB buffers. Ratios are to one h5py process; efficiency is rate(N) / (N x rate(1)) "
           f"of the same reader. Counters (multitables only) are taken after the ring's first lap (a block out of "
           f"every slot, or of none new for a lap) and before its last blocks, per GiB delivered: a GiB is {pages:,} pages of {PAGE_SIZE // 1024} KiB, so issue 29's "
           f"target, minor faults below 1% of the pages delivered, is below {FAULT_TARGET * pages:,.0f} per GiB, "
           f"in the readers (summed) and in the consumer."]
    for codec in CODECS:
        if any(f.codec == codec.label for f in figures):
            out += ["", f"#### {codec.label} + shuffle", "", markdown_table(HEADER, codec_rows(figures, codec.label))]
    if not any(f.kind == "dataloader" for f in figures):
        out += ["", "DataLoader: skipped, torch is not installed (pip install torch)."]
    out += ["", "#### The machine", "", markdown_table(("fact", "value"), facts_rows(run.machine, settings.memcpy_mib))]
    targets = target_rows(figures, settings.max_procs)
    if targets:
        out += ["", "#### Issue 29's targets, as far as this run measures them", "",
                markdown_table(("target", "measured", "wanted", "verdict"), targets)]
    return "\n".join(out)
