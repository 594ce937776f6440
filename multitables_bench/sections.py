"""The training, blocks and random-access sections of the benchmark (``multitables-benchmark --sections ...``).

Both read a zlib level 3 file of 1 KiB float32 rows (``/X``) and their int64
labels (``/y``), and set multitables beside what a user would write without
it, measured in the same run:

* training (:mod:`multitables_bench.training`): samples/s and MB/s of
  shuffled batches of 256 rows, page cache warm and cold, for multitables
  over the file and over the same rows in 64 shard files, PyTorch
  ``DataLoader`` over h5py, and MosaicML streaming over the rows in its MDS
  format (where the ``streaming`` package is installed);
* blocks: rows/s of every row in blocks of 256 rows as code written for 2.x
  asks for them (``block_size=256``), against h5py's slices;
* random access: rows/s for batches of 256 sorted random row indices, page
  cache warm, against h5py fancy indexing in one process and the
  established ``Reader`` approach of one request at a time; and for rows
  asked for one at a time, in order and at random, against h5py's ``ds[i]``.

This module writes the files (the training file, its shards, its MDS copy),
measures random access, and reports both sections.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np

from multitables_bench.files import h5py_with_filters, read_through_cache
from multitables_bench.training import (
    BATCH, FEATURES, SEED, SHARDS, Figure, import_streaming, training_section,
)

#: MosaicML's codec for the MDS copy: deflate level 3, as zlib 3 (gzip framing; MDS has no byte-shuffle filter).
MDS_COMPRESSION = "gz:3"
#: Rows read and written at a time while copying the training file.
COPY_ROWS = 16384


def write_training_file(path: str, n_rows: int) -> None:
    """/X: n_rows x FEATURES float32, /y: int64 labels; zlib level 3 + shuffle, PyTables' chunking."""
    import tables

    filters = tables.Filters(complevel=3, complib="zlib", shuffle=True)
    rng = np.random.default_rng(SEED)
    with tables.open_file(path, "w") as f:
        x = f.create_earray("/", "X", tables.Float32Atom(), (0, FEATURES), filters=filters, expectedrows=n_rows)
        y = f.create_earray("/", "y", tables.Int64Atom(), (0,), filters=filters, expectedrows=n_rows)
        for start in range(0, n_rows, COPY_ROWS):
            n = min(COPY_ROWS, n_rows - start)
            x.append(rng.standard_normal((n, FEATURES), dtype=np.float32))
            y.append(np.arange(start, start + n))


def shard_paths(directory: str) -> str:
    """The glob naming the shard files in ``directory`` (``train-000.h5`` ...)."""
    return os.path.join(directory, "train-*.h5")


def write_shards(path: str, directory: str, n_shards: int = SHARDS) -> list[str]:
    """Split ``path``'s /X and /y into ``n_shards`` files of consecutive rows (as equal as can be), same chunks and filters."""
    import tables

    os.makedirs(directory, exist_ok=True)
    names = []
    with tables.open_file(path) as src:
        n_rows = len(src.root.y)
        bounds = np.linspace(0, n_rows, n_shards + 1).astype(int)
        for k in range(n_shards):
            names.append(os.path.join(directory, f"train-{k:03d}.h5"))
            with tables.open_file(names[-1], "w") as f:
                for node in (src.root.X, src.root.y):
                    out = f.create_earray("/", node.name, node.atom, (0,) + node.shape[1:], filters=node.filters,
                                          chunkshape=node.chunkshape)
                    for start in range(bounds[k], bounds[k + 1], COPY_ROWS):
                        out.append(node[start:min(start + COPY_ROWS, bounds[k + 1])])
    return names


def write_mds(path: str, directory: str, streaming: Any) -> None:
    """The rows of ``path`` as MosaicML MDS in ``directory``: columns ``x`` (float32 row) and ``y`` (int64), gz level 3."""
    columns = {"x": f"ndarray:float32:{FEATURES}", "y": "int64"}
    with h5py_with_filters().File(path, "r") as f, \
            streaming.MDSWriter(out=directory, columns=columns, compression=MDS_COMPRESSION) as writer:
        for start in range(0, len(f["y"]), COPY_ROWS):
            x, y = f["X"][start:start + COPY_ROWS], f["y"][start:start + COPY_ROWS]
            for row, label in zip(x, y):
                writer.write({"x": row, "y": int(label)})


def median_rate(section: str, label: str, run: Callable[[], int], repeats: int, log: Callable[[str], None]) -> Figure:
    """Time ``run`` ``repeats`` times in a row (page cache as it is); its rows over the median time."""
    times, rows = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows = run()
        times.append(time.perf_counter() - t0)
        log(f"{section}: {label}: {rows} rows in {times[-1]:.3f} s")
    return Figure(section, label, rows / statistics.median(times), tuple(times), rows)


def _index_batches(n_rows: int, n_batches: int) -> list[np.ndarray]:
    rng = np.random.default_rng(SEED)
    return [np.sort(rng.choice(n_rows, BATCH, replace=False)) for _ in range(n_batches)]


def random_access_section(path: str, n_procs: int, repeats: int, n_batches: int, log: Callable[[str], None]) -> list[Figure]:
    """Rows/s for ``n_batches`` batches of BATCH sorted random rows of /X."""
    import multitables

    read_through_cache(path)
    with h5py_with_filters().File(path, "r") as f:
        n_rows = len(f["X"])
    batches = _index_batches(n_rows, n_batches)

    def h5py_fancy() -> int:
        with h5py_with_filters().File(path, "r") as f:
            ds = f["X"]
            return sum(len(ds[idx]) for idx in batches)

    def reader(in_flight: int) -> Callable[[], int]:
        def run() -> int:
            rows = 0
            with multitables.Reader(path, n_procs=n_procs) as r:
                ds = r.get_dataset("/X")
                stages = [ds.create_stage(BATCH) for _ in range(in_flight)]
                futures: list[Any] = []
                for i, idx in enumerate(batches):
                    if len(futures) == in_flight:
                        rows += len(futures.pop(0).get())
                    futures.append(r.request(ds[idx], stages[i % in_flight]))
                rows += sum(len(fut.get()) for fut in futures)
            return rows

        return run

    return [
        median_rate("random", "h5py fancy indexing, 1 process", h5py_fancy, repeats, log),
        median_rate("random", f"multitables Reader, one request at a time (established use), n_procs={n_procs}",
                     reader(1), repeats, log),
        median_rate("random", f"multitables Reader, 4 requests in flight, n_procs={n_procs}", reader(4), repeats, log),
    ]


#: Rows read one request each by the one-row part of the random-access section.
ONE_ROW_READS = 2000


def one_row_section(path: str, n_procs: int, repeats: int, log: Callable[[str], None]) -> list[Figure]:
    """Rows/s for ONE_ROW_READS rows of /X read one at a time (a map-style dataset's ``__getitem__``), in order and
    at random: the fixed cost of a request, against h5py's ``ds[i]`` with its chunk cache."""
    import multitables

    read_through_cache(path)
    with h5py_with_filters().File(path, "r") as f:
        n_rows = len(f["X"])
    orders = {"in order": np.arange(min(ONE_ROW_READS, n_rows)),
              "at random": np.random.default_rng(SEED).integers(0, n_rows, ONE_ROW_READS)}
    figures = []
    for name, rows in orders.items():
        section, picks = f"rows {name}", rows.tolist()

        def h5py_rows() -> int:
            with h5py_with_filters().File(path, "r") as f:
                ds = f["X"]
                for i in picks:
                    ds[i]
            return len(picks)

        def reader_rows() -> int:
            with multitables.Reader(path, n_procs=n_procs) as r:
                ds = r.get_dataset("/X")
                stage = ds.create_stage(1)
                for i in picks:
                    r.request(ds[i], stage).get()
            return len(picks)

        figures += [median_rate(section, f"h5py ds[i], 1 process, {name}", h5py_rows, repeats, log),
                    median_rate(section, f"multitables Reader, one row a request, n_procs={n_procs}, {name}",
                                reader_rows, repeats, log)]
    return figures


#: Rows of the blocks the blocks section asks for: a batch's, as code written for 2.x passes ``block_size``.
ASKED_BLOCK = 256


def blocks_section(path: str, repeats: int, log: Callable[[str], None]) -> list[Figure]:
    """Rows/s of every row of /y (8-byte labels) and of /X in blocks of ASKED_BLOCK rows, page cache warm, the readers
    multitables chooses: a queue's blocks against h5py's slices of as many rows in one process, and the generator's
    rows against each row of those slices; what a small ``block_size`` costs."""
    import multitables

    read_through_cache(path)
    figures = []
    for node in ("y", "X"):

        def h5py_slices(each_row: bool) -> Callable[[], int]:
            def run() -> int:
                with h5py_with_filters().File(path, "r") as f:
                    ds, rows = f[node], 0
                    for i in range(0, len(ds), ASKED_BLOCK):
                        block = ds[i:i + ASKED_BLOCK]
                        rows += sum(1 for _ in block) if each_row else len(block)
                return rows

            return run

        def queue_blocks() -> int:
            with multitables.Streamer(path).get_queue(f"/{node}", block_size=ASKED_BLOCK, remainder=True) as q:
                rows = 0
                for guard in q.iter():
                    with guard as block:
                        rows += len(block)
            return rows

        def generator_rows() -> int:
            return sum(1 for _ in multitables.Streamer(path).get_generator(f"/{node}", block_size=ASKED_BLOCK))

        blocks, rows = f"blocks of /{node}", f"rows of /{node}"
        figures += [
            median_rate(blocks, f"h5py ds[i:i + {ASKED_BLOCK}], 1 process", h5py_slices(False), repeats, log),
            median_rate(blocks, f"multitables get_queue(block_size={ASKED_BLOCK})", queue_blocks, repeats, log),
            median_rate(rows, f"h5py each row of ds[i:i + {ASKED_BLOCK}], 1 process", h5py_slices(True), repeats, log),
            median_rate(rows, f"multitables get_generator(block_size={ASKED_BLOCK})", generator_rows, repeats, log),
        ]
    return figures


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def markdown(figures: Sequence[Figure], baseline_label_prefix: str, unit: str) -> str:
    """One Markdown table: each figure's rate and its ratio to the figure whose label starts with the prefix."""
    base = next(f for f in figures if f.label.startswith(baseline_label_prefix))
    lines = [f"| reader | {unit} | ratio |", "| --- | ---: | ---: |"]
    for f in figures:
        lines.append(f"| {f.label} | {f.rows_per_s:,.0f} | {f.rows_per_s / base.rows_per_s:.2f}x |")
    return "\n".join(lines)


#: (numerator, denominator, what, target): the training ratios reported, by contender key.
TRAINING_RATIOS = (
    ("shards", "one", f"multitables: {SHARDS} shard files / one file", 0.9),
    ("one", "mosaic", "multitables, one file / MosaicML, first epoch", 1.0),
    ("shards", "mosaic", f"multitables, {SHARDS} shards / MosaicML, first epoch", 1.0),
    ("one", "mosaic-later", "multitables, one file / MosaicML, later epochs", 1.0),
    ("one", "a", "multitables, one file / DataLoader (a) row per __getitem__", 10.0),
    ("one", "b", "multitables, one file / DataLoader (b) contiguous slices", 1.3),
)


def training_markdown(figures: Sequence[Figure], notes: Sequence[str]) -> str:
    """The training table (warm and cold, samples/s and MB/s), the ratios against their targets, and the notes."""
    by = {(f.key, f.cache): f for f in figures}
    lines = ["| reader | warm samples/s | warm MB/s | cold samples/s | cold MB/s |", "| --- | ---: | ---: | ---: | ---: |"]
    for f in figures:
        if f.cache == "warm":
            c = by[(f.key, "cold")]
            mark = "*" if c.warm_start else ""
            lines.append(f"| {f.label} | {f.rows_per_s:,.0f} | {f.mb_per_s:,.0f} | {c.rows_per_s:,.0f}{mark} | "
                         f"{c.mb_per_s:,.0f}{mark} |")
    lines += ["", "| ratio | warm | cold | target | |", "| --- | ---: | ---: | ---: | --- |"]
    for num, den, what, target in TRAINING_RATIOS:
        if (num, "warm") not in by or (den, "warm") not in by:
            continue
        ratios = [by[(num, c)].rows_per_s / by[(den, c)].rows_per_s for c in ("warm", "cold")]
        met = [r >= target for r in ratios]
        verdict = "met" if all(met) else "missed" if not any(met) else f"met {'warm' if met[0] else 'cold'} only"
        lines.append(f"| {what} | {ratios[0]:.2f}x | {ratios[1]:.2f}x | >= {target:g}x | {verdict} |")
    if any(f.warm_start for f in figures):
        lines.append("\n\\* a cold pass of this reader started with more than 1% of its files in the page cache.")
    lines += [""] + [f"{note}" for note in notes]
    return "\n".join(lines).rstrip()


def run_sections(sections: Sequence[str], workdir: str, n_rows: int, n_procs: int, repeats: int,
                 log: Callable[[str], None]) -> tuple[str, list[Figure]]:
    """Write the zlib-3 file (and for training its shards and MDS copy), run the sections, remove the files.

    Returns the Markdown report and the figures.
    """
    path = os.path.join(workdir, "sections.h5")
    shards, mds = path + "-shards", path + "-mds"
    write_training_file(path, n_rows)
    out, figures = [], []
    try:
        if "training" in sections:
            log(f"writing {SHARDS} shards of {os.path.basename(path)}")
            write_shards(path, shards)
            streaming, _ = import_streaming()
            if streaming is not None:
                log(f"writing {os.path.basename(path)} as MDS ({MDS_COMPRESSION})")
                write_mds(path, mds, streaming)
            fig, notes = training_section(path, shard_paths(shards), mds if streaming is not None else None,
                                          n_procs, repeats, per_row_batches=40, log=log)
            figures += fig
            out.append(f"### Training reads: {n_rows:,} rows of {FEATURES} float32 + int64 label, zlib 3, shuffled "
                       f"batches of {BATCH}, {n_procs} processes each, page cache warm and cold\n\n"
                       + training_markdown(fig, notes))
        if "random" in sections:
            fig = random_access_section(path, n_procs, repeats, n_batches=200, log=log)
            figures += fig
            out.append(f"### Random access: batches of {BATCH} sorted random rows of {n_rows:,} x {FEATURES} float32, "
                       f"zlib 3, page cache warm\n\n" + markdown(fig, "h5py", "rows/s"))
            rows = one_row_section(path, n_procs, repeats, log=log)
            figures += rows
            out.append(f"### Random access, one row a request ({ONE_ROW_READS:,} rows, in order and at random), page cache "
                       "warm\n\n" + "\n\n".join(markdown([f for f in rows if f.section == s], "h5py", "rows/s")
                                                 for s in dict.fromkeys(f.section for f in rows)))
        if "blocks" in sections:
            fig = blocks_section(path, repeats, log=log)
            figures += fig
            out.append(f"### Blocks of {ASKED_BLOCK} rows asked for ({n_rows:,} rows of /y, int64, and of /X, {FEATURES} "
                       "float32), zlib 3, page cache warm\n\n" + "\n\n".join(
                           markdown([f for f in fig if f.section == s], "h5py", "rows/s")
                           for s in dict.fromkeys(f.section for f in fig)))
    finally:
        os.remove(path)
        for directory in (shards, mds):
            shutil.rmtree(directory, ignore_errors=True)
    return "\n\n".join(out), figures
