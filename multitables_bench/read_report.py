"""The report's tables for ``--read``: the main section's tables with a row (or column) per user's dataset where the
main section has one per complevel, after a table naming each dataset."""

from __future__ import annotations

import os
from typing import Sequence

from multitables_bench.records import MB, Codec, Context, Dataset, Reader, Result, single_engines
from multitables_bench.report import (
    Table, best_single, cell, compression, default_cell, efficiency, file_cell, find_result, ratio_cell, warm_notes,
)


def _codec(d: Dataset) -> Codec:
    """The codec its passes were recorded with (:func:`multitables_bench.userdata.describe`)."""
    return Codec(d.filters, 0)


def _size(nbytes: int) -> str:
    return f"{nbytes / MB:,.1f} MB"


def datasets_table(datasets: Sequence[Dataset]) -> Table:
    """Each dataset: its file, path, shape, dtype, sizes, compression ratio, filters and chunks, as HDF5 reports them."""
    header = ("dataset", "file", "path", "shape", "dtype", "stored", "uncompressed", "compression (data / stored bytes)",
              "filters (HDF5)", "chunks")
    rows = tuple(
        (d.key, os.path.basename(d.file), d.path, " x ".join(map(str, d.shape)), d.dtype, _size(d.stored_nbytes),
         _size(d.data_nbytes), f"{d.data_nbytes / d.stored_nbytes:.2f}x" if d.stored_nbytes else "n/a", d.filters,
         " x ".join(map(str, d.chunks)) if d.chunks else "contiguous")
        for d in datasets
    )
    return Table("Your datasets (--read)", header, rows)


def _odirect(results: Sequence[Result], datasets: Sequence[Dataset], d: Dataset) -> "Result | None":
    """The O_DIRECT read of the dataset's file: measured on the first dataset of that file."""
    same_file = [other for other in datasets if os.path.realpath(other.file) == os.path.realpath(d.file)]
    return next((r for other in same_file if (r := find_result(results, other.key, _codec(other), Reader("odirect")))),
                None)


def baseline_table(results: Sequence[Result], datasets: Sequence[Dataset], engines: Sequence[str]) -> Table:
    """Per dataset: the compression ratio, the disk ceiling (its whole file) and each single-process reader."""
    header = ("dataset", "compression (data / stored bytes)", "O_DIRECT read of the file (disk)",
              *(Reader("single", e).label for e in engines))
    rows, seen = [], []
    for d in datasets:
        codec = _codec(d)
        best = best_single(results, d.key, codec)
        found = [find_result(results, d.key, codec, Reader("single", e)) for e in engines]
        disk = _odirect(results, datasets, d)
        seen += [disk, *found]
        rows.append((d.key, ratio_cell(compression(results, d.key, codec)), cell(disk), *(cell(r, best) for r in found)))
    title = "Your datasets: the disk and one process (MB/s, ratio to the best single-process reader)"
    return Table(title, header, tuple(rows), warm_notes(seen))


def scaling_table(
    results: Sequence[Result], datasets: Sequence[Dataset], engine: str, mode: str, max_procs: int
) -> Table:
    """Dataset x n_procs for one engine and mode, with the default n_procs, then the parallel efficiency at max_procs."""
    n_procs_list: list["int | None"] = [*range(1, max_procs + 1), None]
    rows, seen = [], []
    for d in datasets:
        codec = _codec(d)
        best = best_single(results, d.key, codec)
        found = [find_result(results, d.key, codec, Reader("multitables", engine, mode, n)) for n in n_procs_list]
        seen += found
        eff = efficiency(results, codec, engine, mode, max_procs, d.key)
        extra = ("n/a" if eff is None else f"{eff:.2f}",) if max_procs > 1 else ()
        rows.append((d.key, *(cell(r, best) for r in found[:-1]), default_cell(found[-1], best), *extra))
    eff_header = (f"efficiency {max_procs} / ({max_procs} x 1)",) if max_procs > 1 else ()
    header = ("dataset / n_procs", *(str(n) for n in n_procs_list[:-1]), "default (what it used)", *eff_header)
    title = f"Your datasets: multitables, {mode} access, engine {engine} (MB/s, ratio to the best single-process reader)"
    return Table(title, header, tuple(rows), warm_notes(seen))


def file_table(
    results: Sequence[Result], datasets: Sequence[Dataset], engines: Sequence[str], modes: Sequence[str], max_procs: int
) -> Table:
    """Every reader's rate in MB/s of stored bytes (the data rate / the compression ratio), one column per dataset."""
    readers = [Reader("single", e) for e in single_engines(engines)]
    readers += [Reader("multitables", e, m, n) for e in engines for m in modes for n in [*range(1, max_procs + 1), None]]
    rows = [("compression (data / stored bytes)", *(ratio_cell(compression(results, d.key, _codec(d))) for d in datasets))]
    seen = []
    for reader in readers:
        found = [find_result(results, d.key, _codec(d), reader) for d in datasets]
        seen += found
        rows.append((reader.label, *(file_cell(r) for r in found)))
    title = "Your datasets: MB/s of stored bytes (the data rate divided by the dataset's compression ratio)"
    return Table(title, ("reader / dataset", *(d.key for d in datasets)), tuple(rows), warm_notes(seen))


def read_tables(results: Sequence[Result], ctx: Context) -> list[Table]:
    """The datasets, the baselines, a scaling table per engine and mode, and the stored-bytes table."""
    s, datasets = ctx.settings, ctx.datasets
    tables = [datasets_table(datasets), baseline_table(results, datasets, single_engines(s.engines))]
    tables += [scaling_table(results, datasets, e, m, s.max_procs) for e in s.engines for m in s.modes]
    return tables + [file_table(results, datasets, s.engines, s.modes, s.max_procs)]
