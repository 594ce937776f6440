"""The report, built from results and context only: tables, then text, Markdown, HTML or JSON.

:func:`summarize` turns passes into one :class:`Result` per (file, reader);
:func:`load_report` reads a ``--json`` report back for ``--report-from``.
"""

from __future__ import annotations

import html
import json
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Sequence

from multitables_bench.records import (
    COLD_TOLERANCE,
    DATA,
    DEFAULT_DATA,
    GiB,
    MB,
    ROW_NBYTES,
    ROW_VALUES,
    SMALL_FILES,
    USER_ENGINES,
    Codec,
    Context,
    Dataset,
    Pass,
    Reader,
    Result,
    Settings,
    data_path,
    make_codec,
    single_engines,
)

#: Multitables on a small file should read at least this fraction of the best single-process rate.
SMALL_TARGET = 0.9
WARM_NOTE = "* started with more than 1% of the file in the page cache although the pass was meant to read from the disk"


def summarize(passes: Iterable[Pass]) -> list[Result]:
    """One :class:`Result` per (file, data, codec, reader), in first-seen order."""
    groups: dict[tuple[str, str, Codec, Reader], list[Pass]] = {}
    # The file's size, for passes recorded before file_nbytes was: what the O_DIRECT pass of that file read.
    sizes: dict[tuple[str, str, Codec], int] = {}
    for p in passes:
        groups.setdefault((p.target, p.data, p.codec, p.reader), []).append(p)
        if p.reader.kind == "odirect":
            sizes.setdefault((p.target, p.data, p.codec), p.nbytes)
    results = []
    for (target, data, codec, reader), group in groups.items():
        by_repeat: dict[int, list[Pass]] = {}
        for p in group:
            by_repeat.setdefault(p.repeat, []).append(p)
        repeats = [ps for _, ps in sorted(by_repeat.items())]
        rates = tuple(sum(p.nbytes for p in ps) / sum(p.seconds for p in ps) / MB for ps in repeats)
        warm = any(p.warm_start for p in group)
        first = group[0]
        used = statistics.mode(p.n_procs_used for p in group)  # what most passes used
        file_rate = ratio = None
        if reader.kind == "odirect":  # it reads the file's bytes
            file_rate = statistics.median(rates)
        else:
            size = first.file_nbytes or sizes.get((target, data, codec))
            if size:
                ratio = first.nbytes / size
                file_rate = statistics.median(rates) / ratio
        results.append(
            Result(target, codec, reader, statistics.median(rates), rates, warm, used, first.block_size, data, file_rate, ratio)
        )
    return results


@dataclass(frozen=True)
class Table:
    """A rendered-agnostic table: a title, a header, rows of cell strings, notes below."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = field(default=())
    #: The heading of the part of the report it belongs to ("": none, as in a noise-only run).
    section: str = ""


def find_result(results: Sequence[Result], target: str, codec: Codec, reader: Reader) -> "Result | None":
    """The result of ``reader`` on this file and codec, or None if it was not measured."""
    return next((r for r in results if r.target == target and r.codec == codec and r.reader == reader), None)


def best_single(results: Sequence[Result], target: str, codec: Codec) -> "Result | None":
    """The fastest single-process reader of a file, of those a user without multitables would write."""
    singles = [
        r
        for r in results
        if r.target == target and r.codec == codec and r.reader.kind == "single" and r.reader.engine in USER_ENGINES
    ]
    return max(singles, key=lambda r: r.mb_per_s, default=None)


def cell(result: "Result | None", best: "Result | None" = None) -> str:
    """``"812 MB/s"``, with ``" 1.95x"`` against ``best`` and ``*`` for a warm start; ``n/a`` when not measured."""
    if result is None:
        return "n/a"
    text = f"{result.mb_per_s:,.0f} MB/s"
    if best is not None:
        text += f" {result.mb_per_s / best.mb_per_s:.2f}x"
    return text + ("*" if result.warm_start else "")


def file_cell(result: "Result | None") -> str:
    """``"193 MB/s"`` of the file's bytes, ``*`` for a warm start; ``n/a`` when not measured or not recorded."""
    if result is None or result.file_mb_per_s is None:
        return "n/a"
    return f"{result.file_mb_per_s:,.0f} MB/s" + ("*" if result.warm_start else "")


def compression(results: Sequence[Result], target: str, codec: Codec) -> "float | None":
    """The file's compression ratio (uncompressed data bytes / file bytes), or None if no pass recorded it."""
    return next((r.file_ratio for r in results if r.target == target and r.codec == codec and r.file_ratio), None)


def ratio_cell(ratio: "float | None") -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def efficiency(
    results: Sequence[Result], codec: Codec, engine: str, mode: str, n_procs: int, target: str = "main"
) -> "float | None":
    """Parallel efficiency: MB/s with ``n_procs`` readers / (``n_procs`` x MB/s with one); None if either is missing."""
    one = find_result(results, target, codec, Reader("multitables", engine, mode, 1))
    many = find_result(results, target, codec, Reader("multitables", engine, mode, n_procs))
    if one is None or many is None:
        return None
    return many.mb_per_s / (n_procs * one.mb_per_s)


def warm_notes(results: Iterable["Result | None"]) -> tuple[str, ...]:
    return (WARM_NOTE,) if any(r is not None and r.warm_start for r in results) else ()


def baseline_table(results: Sequence[Result], complib: str, complevels: Sequence[int], engines: Sequence[str]) -> Table:
    """Per complevel: the file's compression ratio, the disk ceiling and each single-process reader (ratio to the best)."""
    header = ("complevel", "compression (data / file bytes)", "O_DIRECT read (disk)", *(Reader("single", e).label for e in engines))
    rows, seen = [], []
    for level in complevels:
        codec = make_codec(complib, level)
        best = best_single(results, "main", codec)
        readers = [Reader("odirect"), *(Reader("single", e) for e in engines)]
        found = [find_result(results, "main", codec, r) for r in readers]
        seen += found
        ratio = ratio_cell(compression(results, "main", codec))
        rows.append((str(level), ratio, cell(found[0]), *(cell(r, best) for r in found[1:])))
    title = f"{complib}: the disk and one process (MB/s, ratio to the best single-process reader)"
    return Table(title, header, tuple(rows), warm_notes(seen))


def scaling_table(
    results: Sequence[Result], complib: str, complevels: Sequence[int], engine: str, mode: str, max_procs: int
) -> Table:
    """Complevel x n_procs for one engine and mode, with the default n_procs, then the parallel efficiency at max_procs."""
    n_procs_list: list["int | None"] = [*range(1, max_procs + 1), None]
    rows, seen = [], []
    for level in complevels:
        codec = make_codec(complib, level)
        best = best_single(results, "main", codec)
        found = [find_result(results, "main", codec, Reader("multitables", engine, mode, n)) for n in n_procs_list]
        seen += found
        eff = efficiency(results, codec, engine, mode, max_procs)
        extra = ("n/a" if eff is None else f"{eff:.2f}",) if max_procs > 1 else ()
        rows.append((str(level), *(cell(r, best) for r in found[:-1]), default_cell(found[-1], best), *extra))
    eff_header = (f"efficiency {max_procs} / ({max_procs} x 1)",) if max_procs > 1 else ()
    header = ("complevel / n_procs", *(str(n) for n in n_procs_list[:-1]), "default (what it used)", *eff_header)
    title = f"{complib}: multitables, {mode} access, engine {engine} (MB/s, ratio to the best single-process reader)"
    return Table(title, header, tuple(rows), warm_notes(seen))


def file_table(
    results: Sequence[Result], complib: str, complevels: Sequence[int], engines: Sequence[str], modes: Sequence[str],
    max_procs: int,
) -> Table:
    """Every reader's rate in MB/s of file bytes (the data rate / the compression ratio), one column per complevel."""
    codecs = [make_codec(complib, level) for level in complevels]
    readers = [Reader("odirect"), *(Reader("single", e) for e in single_engines(engines))]
    readers += [Reader("multitables", e, m, n) for e in engines for m in modes for n in [*range(1, max_procs + 1), None]]
    rows = [("compression (data / file bytes)", *(ratio_cell(compression(results, "main", c)) for c in codecs))]
    seen = []
    for reader in readers:
        found = [find_result(results, "main", c, reader) for c in codecs]
        seen += found
        rows.append((reader.label, *(file_cell(r) for r in found)))
    title = f"{complib}: MB/s of file bytes (the data rate divided by the file's compression ratio)"
    return Table(title, ("reader / complevel", *(str(level) for level in complevels)), tuple(rows), warm_notes(seen))


def small_table(results: Sequence[Result], modes: Sequence[str]) -> Table:
    """Each small file: the best single-process reader, then default multitables in each mode with its ratio."""
    modes_header = (f"multitables {m}, default n_procs" for m in modes)
    header = ("file", "rows", "best single process", *modes_header, f"target >= {SMALL_TARGET}x")
    rows, seen = [], []
    for small in SMALL_FILES:
        mine = [r for r in results if r.target == small.key]
        if not mine:
            continue
        codec = mine[0].codec
        best = best_single(results, small.key, codec)
        found = [find_result(results, small.key, codec, Reader("multitables", "auto", m, None)) for m in modes]
        seen += [best, *found]
        met = best is not None and all(r is not None and r.mb_per_s >= SMALL_TARGET * best.mb_per_s for r in found)
        best_text = "n/a" if best is None else f"{cell(best)} ({best.reader.engine})"
        cells = (default_cell(r, best) for r in found)
        rows.append((small.description, str(small.n_rows), best_text, *cells, "yes" if met else "NO"))
    title = "Small files: default multitables (engine auto) against the best single-process reader"
    return Table(title, header, tuple(rows), warm_notes(seen))


def default_cell(result: "Result | None", best: "Result | None") -> str:
    """A default-n_procs cell: the rate and ratio, and where it read (in most passes)."""
    text = cell(result, best)
    if result is not None and result.n_procs_used is not None:
        where = "in-process" if result.n_procs_used == 0 else f"{result.n_procs_used} procs"
        text += f" ({where})"
    return text


def report_tables(results: Sequence[Result], ctx: Context) -> list[Table]:
    """Per data kind (a section each unless the run is noise only), per complib: the baselines, the scaling tables and
    the file-bytes table; then the small files."""
    s = ctx.settings
    levels = s.complevels
    sectioned = s.data != (DEFAULT_DATA,)
    tables = []
    for data in s.data:
        mine = [r for r in results if r.data == data]
        part = []
        for complib in s.complibs:
            part.append(baseline_table(mine, complib, levels, single_engines(s.engines)))
            for engine in s.engines:
                for mode in s.modes:
                    part.append(scaling_table(mine, complib, levels, engine, mode, s.max_procs))
            part.append(file_table(mine, complib, levels, s.engines, s.modes, s.max_procs))
        section = f"data: {data}, {DATA.get(data, data)}" if sectioned else ""
        tables += [replace(t, section=section) for t in part]
    if any(r.target != "main" for r in results):
        section = f"small files (data: {s.data[0]})" if sectioned else ""
        tables.append(replace(small_table(results, s.modes), section=section))
    return tables


def describe(ctx: Context) -> list[tuple[str, str]]:
    """The report's header: the machine, the file, the data and the method, as (name, sentence) pairs."""
    m, s = ctx.machine, ctx.settings
    f = m.get("file", {})
    mem = f"{m['memory_bytes'] / GiB:.1f} GiB memory" if m.get("memory_bytes") else "memory unknown"
    device = f.get("device") or f.get("source", "?")
    rot = {True: "rotational", False: "non-rotational", None: "rotational flag unknown"}[f.get("rotational")]
    raid = f", RAID {f['raid_level']}" if f.get("raid_level") else ""
    under = f", over {', '.join(f['underlying'])}" if f.get("underlying") else ""
    model = f", {f['model']}" if f.get("model") else ""
    unit, stored = ("dataset", "stored bytes") if s.read else ("file", "file bytes")
    return [
        ("machine", f"{m['cpu_model']}, {m['cpus']} CPUs ({m['usable_cpus']} usable), {mem}; {m['system']}"),
        ("file", f"{_file_paths(f.get('path', '?'), s)} on {device} ({rot}{raid}{under}{model}), "
                 f"{f.get('fstype', '?')} mounted at {f.get('mount', '?')}"),
        ("data", _describe_data(s)),
        ("cache", ctx.cache_note),
        ("method", f"each pass reads the whole {unit} once (multitables: start-up and shut-down included); median over "
                   f"{s.repeats} repeat(s) of {s.cycles} pass(es); MB = 10^6 bytes of uncompressed data (file bytes for "
                   f"O_DIRECT); ratios are to the best single-process reader of the same {unit}; MB/s of {stored} = "
                   f"the data rate / the {unit}'s compression ratio (uncompressed bytes / {stored}); parallel "
                   "efficiency = MB/s(n_procs=N) / (N x MB/s(n_procs=1)), N the largest n_procs measured"),
        *((("quick", "a --quick run: the file is small, so starting reader processes weighs on multitables' figures; "
                      "they check that everything works, the full run gives the figures"),) if s.quick else ()),
        ("versions", ", ".join(f"{k} {v}" for k, v in ctx.versions.items())),
        *(("note", n) for n in ctx.notes),
    ]


def _describe_data(s: Settings) -> str:
    if s.read:
        return (f"{len(s.read)} dataset(s) of the user's (--read), named in the first table; a pass reads the whole "
                "dataset, the O_DIRECT read the whole file it is in (once per file), and the page cache is set up and "
                "its resident fraction measured for the whole file; the files are opened read-only")
    size = f"{s.n_rows:,} rows of {ROW_VALUES} "
    if s.data == (DEFAULT_DATA,):
        return (f"{size}random normal float32 ({s.n_rows * ROW_NBYTES / GiB:.3g} GiB): "
                "noise does not compress, so these figures show decompression overhead only, "
                "not what compression saves on real data")
    kinds = "; ".join(f"{d}: {DATA.get(d, d)}" for d in s.data)
    return f"{size}float32 values ({s.n_rows * ROW_NBYTES / GiB:.3g} GiB) in a file per codec of each kind: {kinds}"


def _file_paths(path: str, s: Settings) -> str:
    """The benchmark file's path, or with several kinds of data, the file of each."""
    if s.data == (DEFAULT_DATA,) or s.read:
        return path
    return ", ".join(data_path(path, d, s.data) for d in s.data) + " (one per data kind)"


def render_text(tables: Sequence[Table], ctx: Context) -> str:
    lines = ["multitables benchmark", ""] + [f"{k:>8}: {v}" for k, v in describe(ctx)]
    for t, section in _with_sections(tables):
        if section:
            lines += ["", "=" * len(section), section, "=" * len(section)]
        widths = [max(len(row[i]) for row in (t.header, *t.rows)) for i in range(len(t.header))]
        lines += ["", t.title, _text_row(t.header, widths), "-+-".join("-" * w for w in widths)]
        lines += [_text_row(row, widths) for row in t.rows] + list(t.notes)
    return "\n".join(lines) + "\n"


def _with_sections(tables: Sequence[Table]) -> list[tuple[Table, str]]:
    """Each table with the section heading to print before it ("" but where the section changes)."""
    out, current = [], ""
    for t in tables:
        out.append((t, t.section if t.section != current else ""))
        current = t.section
    return out


def _text_row(row: Sequence[str], widths: Sequence[int]) -> str:
    return " | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*")


def render_markdown(tables: Sequence[Table], ctx: Context) -> str:
    lines = ["## multitables benchmark", ""] + [f"- **{k}**: {_md_escape(v)}" for k, v in describe(ctx)]
    for t, section in _with_sections(tables):
        if section:
            lines += ["", f"## {_md_escape(section)}"]
        lines += ["", f"### {_md_escape(t.title)}", ""]
        lines.append("| " + " | ".join(map(_md_escape, t.header)) + " |")
        lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(t.header))) + "|")
        lines += ["| " + " | ".join(map(_md_escape, row)) + " |" for row in t.rows]
        lines += [""] + [_md_escape(n) for n in t.notes] if t.notes else []
    return "\n".join(lines) + "\n"


def render_html(tables: Sequence[Table], ctx: Context) -> str:
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8"><title>multitables benchmark</title>',
        "<style>table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #999;padding:2px 8px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}</style></head><body>",
        "<h1>multitables benchmark</h1>",
        "<ul>" + "".join(f"<li><b>{e(k)}</b>: {e(v)}</li>" for k, v in describe(ctx)) + "</ul>",
    ]
    for t, section in _with_sections(tables):
        if section:
            parts.append(f"<h2>{e(section)}</h2>")
        parts.append(f"<h{3 if t.section else 2}>{e(t.title)}</h{3 if t.section else 2}>")
        parts.append("<table>\n<tr>" + "".join(f"<th>{e(c)}</th>" for c in t.header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in t.rows]
        parts.append("</table>")
        parts += [f"<p>{e(n)}</p>" for n in t.notes]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _record(obj: Any) -> dict[str, Any]:
    out = asdict(obj)
    for key in ("warm_start", "mb_per_s"):
        if hasattr(obj, key):
            out[key] = getattr(obj, key)
    return out


def report_json(passes: Sequence[Pass], results: Sequence[Result], ctx: Context) -> dict[str, Any]:
    """Everything: the context, every pass's raw time, and the summary."""
    return {
        "benchmark": "multitables",
        "format": 1,
        "created": ctx.created or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": asdict(ctx.settings),
        "cache": ctx.cache,
        "cache_note": ctx.cache_note,
        "cold_tolerance": COLD_TOLERANCE,
        "row_nbytes": ROW_NBYTES,
        "mb": MB,
        "machine": ctx.machine,
        "versions": ctx.versions,
        "notes": list(ctx.notes),
        "datasets": [asdict(d) for d in ctx.datasets],
        "results": [_record(r) for r in results],
        "passes": [_record(p) for p in passes],
    }


def load_report(path: str) -> tuple[list[Pass], Context]:
    """The passes and context of a JSON report written by ``--json``; ``ValueError`` for a file that is not one."""
    try:
        with open(path) as f:
            d = json.load(f)
        if not isinstance(d, dict) or d.get("benchmark") != "multitables":
            raise ValueError("no 'benchmark': 'multitables' in it")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not a report that --json wrote ({exc})") from exc
    saved: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d["settings"].items()}
    settings = Settings(**saved)
    derived = ("warm_start", "mb_per_s")
    passes = []
    for p in d["passes"]:
        fields = {k: v for k, v in p.items() if k not in derived}
        passes.append(Pass(**{**fields, "codec": Codec(**p["codec"]), "reader": Reader(**p["reader"])}))
    datasets = tuple(Dataset(**{**x, "shape": tuple(x["shape"]), "chunks": x["chunks"] and tuple(x["chunks"])})
                     for x in d.get("datasets", ()))
    return passes, Context(settings, d["cache"], d["cache_note"], d["machine"], d["versions"], tuple(d["notes"]),
                           d.get("created", ""), datasets)
