"""multitables-benchmark: how fast multitables reads HDF5 from the disk, beside the disk itself and plain single-process reads.

For every codec (--complibs x --complevels) it writes a file of random
normal float32 rows of 1024 values (--size GiB; incompressible noise, so
the figures show decompression overhead only; --data smooth: a random
walk in whole steps along each row, which compresses several times;
'--data noise smooth': a file of each) and times, in the same run:

* the raw read rate of the file with O_DIRECT (the disk ceiling);
* one process reading it in order with each engine, as a user without this
  library would (h5py read_direct, PyTables read(out=)), in blocks of
  the size multitables uses;
* multitables for n_procs = 1 .. --max_procs and the default
  (n_procs=None), direct access and generator, with each engine;

then a "small files" section: three tiny files read by default-n_procs
multitables against the best single-process reader.

Every pass reads the whole file once. Before it, the page cache is set up
(--cache: direct = past the page cache: the chunk engine with
O_DIRECT, the HDF5 readers with HDF5's direct driver where the installed
HDF5 has it, else with their pages dropped; evict = drop the file's
pages; warm = read the file into the cache; auto = direct where the
installed HDF5 has the direct driver, else evict) and the file's resident fraction is
measured (mincore) and printed; a pass meant to be cold that starts with
more than 1% of the file resident is marked in every output. A figure is the
median over --repeats of --cycles passes.

Your own data: 'multitables-benchmark --read data.h5:/images [FILE:DATASET ...]'
measures the same readers (and --engines, --modes, --cache, --repeats,
--max_procs) on datasets of your files instead of generated ones: the
O_DIRECT read of each file, the single-process readers and multitables, a
row per dataset (file, path, shape, dtype, stored size and HDF5 filters
named). Your files are opened read-only and never written; cold passes
drop their pages from the page cache.

Run 'multitables-benchmark --quick' (small file, well under a minute) or
'multitables-benchmark --file /disk/under/test/bench.h5' (1 GiB).
Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, replace
from typing import Sequence

from multitables_bench import diskmodel, scaling
from multitables_bench.cache_modes import resolve_cache
from multitables_bench.machine import machine_info, usable_cpus, versions
from multitables_bench.passes import measure
from multitables_bench.plot import plot
from multitables_bench.read_report import read_tables
from multitables_bench.records import (
    DATA, DEFAULT_DATA, ENGINES, MODES, READ_DATA, ROW_NBYTES, Context, GiB, Pass, Settings, data_path,
)
from multitables_bench.report import load_report, render_html, render_markdown, render_text, report_json, report_tables, summarize
from multitables_bench.scaling_report import scaling_markdown
from multitables_bench.sections import run_sections
from multitables_bench.userdata import check_read, measure_read, read_targets

SECTIONS = ("main", "training", "random", "blocks", "scaling", "gpu")
#: Rows of 1 KiB in the training / random-access file: 256 MiB (--quick: 16 MiB).
SECTION_ROWS, QUICK_SECTION_ROWS = 1 << 18, 1 << 14
CACHES = ("auto", "direct", "evict", "warm")
DEFAULT_COMPLEVELS = (0, 3, 9)
DEFAULT_COMPLIB = "blosc"
#: --quick: a 32 MiB file, a check that every section runs (the default may read it in this process: NOTE [read plan]).
QUICK_SIZE_GIB = 1 / 32


# ---------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="multitables-benchmark",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--size", type=float, default=None, help="GiB of data in the generated file (default 1; --quick: 1/32)")
    add("--cycles", type=int, default=None, help="passes through the file per repeat (default 1)")
    add("--max_procs", type=int, default=None, help="largest n_procs measured (default: the usable CPUs; --quick: at most 2)")
    add("--complib", default=None, help="one compression library (as the established benchmark); joins --complibs")
    add("--complibs", nargs="+", default=None, help=f"compression libraries, PyTables names (default {DEFAULT_COMPLIB})")
    add("--complevels", nargs="+", type=int, default=None, help="compression levels, 0-9 (default 0 3 9)")
    add("--engines", nargs="+", default=list(ENGINES), choices=ENGINES, help="engines to decode with (default: all)")
    add("--modes", nargs="+", default=list(MODES), choices=MODES, help="multitables access modes (default: both)")
    add("--repeats", type=int, default=None, help="repeats per measurement; medians are quoted (default 3; --quick: 1)")
    add("--cache", default="auto", choices=CACHES, help="how passes avoid (or use) the page cache (default: auto)")
    add("--H5FD_DIRECT_OFF", dest="direct_off", action="store_true", help="never use HDF5's direct driver (auto then evicts)")
    add("--file", default=None, help="where to write the benchmark file: on the disk under test (default: a temporary directory)")
    add("--quick", action="store_true", help="a small file and one repeat: well under a minute (README, CI)")
    add("--no-small-files", dest="small_files", action="store_false", help="skip the small-files section")
    add("--json", metavar="PATH", default=None, help="write every raw time and the summary as JSON")
    add("--markdown", metavar="PATH", nargs="?", const="-", default=None, help="write Markdown tables (no PATH: stdout)")
    add("--html", metavar="PATH", nargs="?", const="-", default=None, help="write an HTML page (no PATH: stdout)")
    add("--plot", metavar="PATH.png", default=None, help="plot MB/s against n_procs (needs matplotlib)")
    add("--sections", nargs="+", default=["main"], choices=SECTIONS,
        help="what to measure: main (streaming, the default), training (batches vs DataLoader), random (Reader vs h5py), "
             "blocks (block_size=256 in a queue and the generator vs h5py's slices), scaling (n_procs 1, 2, 4 ... "
             "--max_procs beside plain h5py processes and DataLoader, with page-fault counters; --file keeps its files for the next run to reuse), gpu (a training step on a GPU fed by "
             "multitables with and without device=, and by DataLoader with pinned memory; needs CUDA)")
    add("--data", nargs="+", default=[DEFAULT_DATA], choices=list(DATA),
        help="what the files hold: noise (random normal, the default) and/or smooth (a random walk in whole steps, "
             "which compresses several times); with both, a file of each per codec")
    add("--read", nargs="+", metavar="FILE:DATASET", default=None,
        help="measure your own datasets instead of generated files: a dataset path inside the file after a colon "
             "(split at the last one), several allowed, of one file or more; opened read-only, never written")
    add("--report-from", metavar="JSON", default=None, help="measure nothing: report the results of an earlier --json run")
    add("--section-mib", type=int, default=None,
        help=f"--sections training / random / blocks: MiB of 1 KiB rows in their file (default {SECTION_ROWS >> 10}; "
             f"--quick: {QUICK_SECTION_ROWS >> 10}); --sections scaling: MiB of 4 KiB rows in each of its two files "
             f"(default {scaling.DEFAULT_MIB}; --quick: {scaling.QUICK_MIB})")
    add("--gpu-step-ms", type=float, default=None,
        help="--sections gpu: the training step's length in ms (default: as long as the readers take to deliver a "
             "batch, CPU only, measured first in the same run; give one to compare two packages' rows with the step)")
    add("--disk-model", choices=tuple(diskmodel.KINDS), default=None,
        help="read through a model of a spinning disk (hdd) or a RAID 0 of two (raid0), shared by every reader process: "
             "a seek for every read that does not continue the previous one, a capped rate (multitables_bench/diskmodel.py)")
    add("--seek-ms", type=float, default=diskmodel.SEEK_MS, help=f"--disk-model: ms per seek (default {diskmodel.SEEK_MS:g})")
    add("--disk-mbps", type=float, default=diskmodel.DISK_MBPS,
        help=f"--disk-model: MB/s of one disk (default {diskmodel.DISK_MBPS:g})")
    add("--disk-readahead-kib", type=int, default=diskmodel.READAHEAD >> 10,
        help=f"--disk-model: KiB a disk reads on past a read while idle (default {diskmodel.READAHEAD >> 10}; 0: none)")
    add("--disk-page-cache", action=argparse.BooleanOptionalAction, default=True,
        help="--disk-model: model a page cache in front of the disks, emptied before every pass, so that a page is "
             "read from the disk once per pass (default; O_DIRECT reads bypass it)")
    return parser


#: What only the main section measures or writes (``argparse`` dests): refused with ``--sections`` without main.
MAIN_ONLY = frozenset({"size", "cycles", "complib", "complibs", "complevels", "engines", "modes", "cache", "direct_off",
                       "small_files", "markdown", "html", "plot", "data"})


#: Options that describe the generated files (``argparse`` dests): refused with ``--read``.
GENERATED_ONLY = frozenset({"size", "complib", "complibs", "complevels", "data", "file", "plot", "section_mib",
                            "disk_model"})


def _refuse_with_read(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """``parser.error`` for what ``--read`` cannot take: the generated files' options, other sections."""
    given = [action.option_strings[0] for action in parser._actions
             if action.dest in GENERATED_ONLY and getattr(a, action.dest) != action.default]
    if given:
        plot = "; --plot draws the generated files by complevel" if "--plot" in given else ""
        parser.error(f"{', '.join(given)} cannot go with --read, which measures your datasets as they are: "
                     f"{'they set' if len(given) > 1 else 'it sets'} up the files the benchmark generates{plot}")
    if a.report_from:
        parser.error("--report-from measures nothing and --read measures your datasets: give one of them")
    if a.sections != ["main"]:
        parser.error("--read measures the main section's readers on your datasets: leave out --sections")


def parse_args(argv: "Sequence[str] | None" = None) -> Settings:
    """Parse and check the command line; ``--quick`` fills in small defaults that explicit options override."""
    parser = build_parser()
    a = parser.parse_args(argv)
    quick = a.quick
    if a.read is not None:
        _refuse_with_read(parser, a)
    if "main" not in a.sections:  # the sections take --file, --repeats, --max_procs, --quick, --json: no other
        given = [action.option_strings[0] for action in parser._actions
                 if action.dest in MAIN_ONLY and getattr(a, action.dest) != action.default]
        if given:
            parser.error(f"{', '.join(given)} apply to the main section only: add main to --sections, or leave them out")
    complibs = tuple(dict.fromkeys(([a.complib] if a.complib else []) + (a.complibs or [])))
    settings = Settings(
        size_gib=a.size if a.size is not None else (QUICK_SIZE_GIB if quick else 1.0),
        cycles=a.cycles if a.cycles is not None else 1,
        max_procs=a.max_procs if a.max_procs is not None else (min(2, usable_cpus()) if quick else usable_cpus()),
        complibs=complibs or (DEFAULT_COMPLIB,),
        complevels=tuple(dict.fromkeys(a.complevels if a.complevels is not None else DEFAULT_COMPLEVELS)),
        engines=tuple(dict.fromkeys(a.engines)),
        modes=tuple(dict.fromkeys(a.modes)),
        repeats=a.repeats if a.repeats is not None else (1 if quick else 3),
        cache=a.cache,
        direct_off=a.direct_off,
        file=a.file,
        quick=quick,
        small_files=a.small_files and not a.read,
        json=a.json,
        markdown=a.markdown,
        html=a.html,
        plot=a.plot,
        report_from=a.report_from,
        sections=tuple(dict.fromkeys(a.sections)),
        data=(READ_DATA,) if a.read else tuple(dict.fromkeys(a.data)),
        read=tuple(dict.fromkeys(a.read or ())),
    )
    problem = check_settings(settings)
    if problem:
        parser.error(problem)
    return settings


def parse_disk_model(argv: "Sequence[str] | None" = None) -> "argparse.Namespace | None":
    """The ``--disk-model`` options (``disk_model``, ``seek_ms``, ``disk_mbps``, ``disk_readahead_kib``,
    ``disk_page_cache``), or None without one.

    They stay out of :class:`Settings`: the run they ask for is this same
    command re-run with the model under it (:func:`diskmodel.run_modelled`),
    and the report names the model in its cache line.
    """
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.disk_model is None:
        return None
    if a.seek_ms < 0 or a.disk_mbps <= 0 or a.disk_readahead_kib < 0:
        parser.error(f"--seek-ms must be >= 0, --disk-mbps > 0 and --disk-readahead-kib >= 0; got {a.seek_ms}, "
                     f"{a.disk_mbps}, {a.disk_readahead_kib}")
    if a.cache not in ("auto", "warm") or a.direct_off:
        parser.error("--disk-model keeps the file in the page cache under the model (every read reaches the model at "
                     "its system call); --cache must be auto or warm, without --H5FD_DIRECT_OFF")
    if set(a.sections) != {"main"}:
        parser.error("--disk-model applies to the main section only")
    return a


def check_settings(s: Settings) -> "str | None":
    """What is wrong with ``s``, or None."""
    import tables

    if s.size_gib <= 0:
        return f"--size must be positive, got {s.size_gib}"
    for name, value in (("--cycles", s.cycles), ("--max_procs", s.max_procs), ("--repeats", s.repeats)):
        if value < 1:
            return f"{name} must be at least 1, got {value}"
    from multitables._plan.readers import READERS_PER_CPU

    if s.max_procs > READERS_PER_CPU * usable_cpus():  # multitables starts no more: a column would be mislabelled
        return (f"--max_procs {s.max_procs} is more than the {READERS_PER_CPU * usable_cpus()} readers multitables "
                f"starts on this machine ({READERS_PER_CPU} per usable CPU)")
    bad_levels = [lvl for lvl in s.complevels if not 0 <= lvl <= 9]
    if bad_levels:
        return f"--complevels must be within 0-9, got {bad_levels}"
    bad_libs = [lib for lib in s.complibs if lib not in tables.filters.all_complibs]
    if bad_libs:
        return f"unknown complib {bad_libs}; PyTables knows {', '.join(tables.filters.all_complibs)}"
    if s.cache == "direct" and s.direct_off:
        return "--cache direct and --H5FD_DIRECT_OFF contradict each other"
    if s.report_from and not os.path.isfile(s.report_from):
        return f"--report-from {s.report_from}: no such file (the JSON an earlier run wrote with --json)"
    if s.file and not s.report_from and "main" in s.sections:  # the scaling section reuses its files
        for path in (data_path(s.file, data, s.data) for data in s.data):
            if os.path.exists(path):
                return f"--file {path} exists: the benchmark writes and then removes this file, so give a new path"
    if s.file and not s.report_from and not os.path.isdir(os.path.dirname(os.path.abspath(s.file))):
        return f"--file {s.file}: no such directory (make it first: mkdir -p {os.path.dirname(s.file) or '.'})"
    bad_libs = [lib for lib in s.complibs if tables.which_lib_version(lib.split(":")[0]) is None]
    if bad_libs and "main" in s.sections:
        return (f"complib {bad_libs} is not in this PyTables build (it would write zlib instead and the report would "
                f"say {bad_libs[0]})")
    needs_torch = [name for name in s.sections if name in ("training", "gpu")]
    if needs_torch and not _available("torch"):
        return f"--sections {' '.join(needs_torch)} needs PyTorch, which is not installed (pip install torch)"
    if s.plot and not _available("matplotlib"):
        return "--plot needs matplotlib, which is not installed (pip install matplotlib)"
    if s.read:  # last: it opens every dataset and reads a row with each engine
        return check_read(s)
    return None


def _available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write("\n" + text)
    else:
        with open(path, "w") as f:
            f.write(text)


def _limit_threads() -> None:
    """One decompression thread, so that "one process" means one core (multitables' readers do the same); no
    progress bars' monitor thread, which would be running at every fork of readers (Python 3.12 warns of those)."""
    for var in ("BLOSC_NTHREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[var] = "1"
    from tqdm import tqdm

    tqdm.monitor_interval = 0


def _workdir(settings: Settings) -> tuple[str, str]:
    """(directory for the small files, the benchmark file's path): the small files sit beside the big one."""
    parent = os.path.dirname(os.path.abspath(settings.file)) if settings.file else None
    workdir = tempfile.mkdtemp(prefix="multitables_bench_", dir=parent)
    return workdir, os.path.abspath(settings.file) if settings.file else os.path.join(workdir, "bench.h5")


def _check_space(directory: str, settings: Settings) -> None:
    needed = int(settings.n_rows * ROW_NBYTES * 1.1) + (64 << 20)
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise SystemExit(f"multitables-benchmark: {directory} has {free / GiB:.1f} GiB free, the files need {needed / GiB:.1f}")


def main(argv: "Sequence[str] | None" = None) -> None:
    _limit_threads()
    settings = parse_args(argv)
    if settings.report_from:
        report(settings)
        return
    model_args = parse_disk_model(argv)
    model = diskmodel.current()
    if model_args is not None and model is None:
        # Every reader must read through the shim, and only processes started with it do: run again under it.
        raise SystemExit(diskmodel.run_modelled(
            list(sys.argv[1:] if argv is None else argv), model_args.disk_model, model_args.seek_ms, model_args.disk_mbps,
            model_args.disk_readahead_kib << 10, model_args.disk_page_cache))
    extra = [name for name in settings.sections if name != "main"]
    if extra:
        measure_sections(settings, extra, parse_section_mib(argv), parse_gpu_step_ms(argv))
        if "main" not in settings.sections:
            return
    workdir, main_path = _workdir(settings)
    passes: list[Pass] = []
    found = read_targets(settings.read)  # checked before (check_read): describing them again cannot fail

    def log(msg: str) -> None:
        from tqdm import tqdm

        tqdm.write(msg, file=sys.stderr)

    interrupted = False
    try:
        if not settings.read:
            _check_space(workdir, settings)
        if model is not None:
            cache, cache_note = "warm", model_cache_note(model)
        else:
            cache, cache_note = resolve_cache(settings, workdir)
        log(f"cache: {cache_note}")
        machine = machine_info(found[0][1].path if found else workdir)
        notes: list[str] = []
        if machine["file"].get("fstype") in ("tmpfs", "ramfs") and cache != "warm":
            notes.append(f"the file is on {machine['file']['fstype']}, which lives in memory: no pass can read from a disk; "
                         "use --file on the disk under test")
            log("warning: " + notes[-1])
        try:
            if found:
                measure_read(settings, [target for _, target in found], cache, notes, log, passes)
            else:
                measure(settings, workdir, main_path, cache, notes, log, passes)
        except KeyboardInterrupt:
            interrupted = True
            notes.append(f"interrupted after {len(passes)} passes: the figures are partial")
            log(notes[-1])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    machine["file"]["path"] = ", ".join(dict.fromkeys(d.file for d, _ in found)) if found else main_path
    ctx = Context(settings, cache, cache_note, machine, versions(), tuple(notes), datasets=tuple(d for d, _ in found))
    emit(passes, ctx)
    if interrupted:  # the partial figures are written and marked; a script's `&&` must not take them as a run
        raise SystemExit(130)


def model_cache_note(model: diskmodel.DiskModel) -> str:
    """The report's cache line for a run on the disk model."""
    return (
        f"disk model, {model.describe()}: every read call of the file is charged to the model (multitables_bench/"
        "diskmodel.py); under the model the real file is kept in this machine's page cache (read in before every "
        "pass) so that its own disk adds nothing"
    )


def parse_gpu_step_ms(argv: "Sequence[str] | None" = None) -> "float | None":
    """``--gpu-step-ms`` (kept out of :class:`Settings`, as it only sets the GPU section's step), or None."""
    parser = build_parser()
    step_ms = parser.parse_args(argv).gpu_step_ms
    if step_ms is not None and not step_ms > 0:
        parser.error(f"--gpu-step-ms must be more than 0, got {step_ms}")
    return step_ms


def parse_section_mib(argv: "Sequence[str] | None" = None) -> "int | None":
    """``--section-mib`` (kept out of :class:`Settings`, as it only sizes the sections' file), or None."""
    parser = build_parser()
    mib = parser.parse_args(argv).section_mib
    if mib is not None and mib < 1:
        parser.error(f"--section-mib must be at least 1, got {mib}")
    return mib


def measure_sections(settings: Settings, sections: Sequence[str], mib: "int | None" = None,
                     gpu_step_ms: "float | None" = None) -> None:
    """Run the training / random-access / scaling sections; print their Markdown tables (JSON beside ``--json``)."""
    workdir, _ = _workdir(settings)
    rows = mib << 10 if mib else QUICK_SECTION_ROWS if settings.quick else SECTION_ROWS
    n_procs = settings.max_procs
    others = [name for name in sections if name not in ("scaling", "gpu")]
    try:
        if others:
            text, figures = run_sections(others, workdir, rows, n_procs, settings.repeats, lambda m: print(m, file=sys.stderr))
            sys.stdout.write(text + "\n\n")
            if settings.json:
                with open(settings.json + ".sections.json", "w") as f:
                    json.dump([asdict(fig) for fig in figures], f, indent=1)
        if "scaling" in sections:
            measure_scaling(settings, mib, workdir)
        if "gpu" in sections:  # torch with CUDA: imported only here
            from multitables_bench.gpu import run_gpu

            gpu_mib = mib or (32 if settings.quick else 512)
            sys.stdout.write(run_gpu(workdir, gpu_mib, settings.max_procs, lambda m: print(m, file=sys.stderr),
                                     step_ms=gpu_step_ms) + "\n")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def measure_scaling(settings: Settings, mib: "int | None", workdir: str) -> None:
    """The scaling section: its Markdown to stdout, its JSON to ``<--json>.scaling.json``."""
    default_mib, memcpy_mib = (scaling.QUICK_MIB, scaling.QUICK_MEMCPY_MIB) if settings.quick else \
        (scaling.DEFAULT_MIB, scaling.MEMCPY_MIB)
    options = scaling.ScalingSettings(mib or default_mib, settings.repeats, settings.max_procs, memcpy_mib, settings.file)
    run = scaling.run_scaling(options, workdir, lambda m: print(m, file=sys.stderr))
    sys.stdout.write(scaling_markdown(run) + "\n\n")
    if settings.json:
        with open(settings.json + ".scaling.json", "w") as f:
            json.dump(run.to_json(), f, indent=1)


def report(settings: Settings) -> None:
    """Report an earlier run's JSON, to the outputs asked for now."""
    try:
        passes, ctx = load_report(settings.report_from or "")
    except ValueError as exc:
        raise SystemExit(f"multitables-benchmark: --report-from {exc}") from None
    outputs = {k: getattr(settings, k) for k in ("json", "markdown", "html", "plot")}
    emit(passes, replace(ctx, settings=replace(ctx.settings, **outputs)))


def emit(passes: Sequence[Pass], ctx: Context) -> None:
    """Print the text report; write the JSON, Markdown, HTML and plot asked for."""
    s = ctx.settings
    results = summarize(passes)
    tables = read_tables(results, ctx) if s.read else report_tables(results, ctx)
    # A page written to stdout is the whole of stdout: the text report then goes to stderr.
    (sys.stderr if "-" in (s.markdown, s.html) else sys.stdout).write(render_text(tables, ctx))
    if s.markdown:
        _write(s.markdown, render_markdown(tables, ctx))
    if s.html:
        _write(s.html, render_html(tables, ctx))
    if s.json:
        with open(s.json, "w") as f:
            json.dump(report_json(passes, results, ctx), f, indent=1)
    if s.plot:
        plot(results, ctx, s.plot)

