"""multitables-benchmark: how fast multitables reads HDF5 from the disk, beside the disk itself and plain single-process reads.

For every codec (``--complibs`` x ``--complevels``) it writes a file of random
normal float32 rows of 1024 values (``--size`` GiB; incompressible noise, so
the figures show decompression overhead only) and times, in the same run:

* the raw read rate of the file with ``O_DIRECT`` (the disk ceiling);
* one process reading it in order with each engine, as a user without this
  library would (h5py ``read_direct``, PyTables ``read(out=)``), in blocks of
  the size multitables uses;
* multitables for ``n_procs`` = 1 .. ``--max_procs`` and the default
  (``n_procs=None``), direct access and generator, with each engine;

then a "small files" section: three tiny files read by default-``n_procs``
multitables against the best single-process reader.

Every pass reads the whole file once. Before it, the page cache is set up
(``--cache``: ``direct`` = past the page cache: the chunk engine with
``O_DIRECT``, the HDF5 readers with HDF5's direct driver where the installed
HDF5 has it, else with their pages dropped; ``evict`` = drop the file's
pages; ``warm`` = read the file into the cache; ``auto`` = direct where the
installed HDF5 has the direct driver, else evict) and the file's resident fraction is
measured (``mincore``) and printed; a pass meant to be cold that starts with
more than 1% of the file resident is marked in every output. A figure is the
median over ``--repeats`` of ``--cycles`` passes.

Run ``multitables-benchmark --quick`` (small file, well under a minute) or
``multitables-benchmark --file /disk/under/test/bench.h5`` (1 GiB).
Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import functools
import gc
import html
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

import numpy as np

# ---------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------

ROW_VALUES = 1024
ROW_NBYTES = ROW_VALUES * np.dtype(np.float32).itemsize
NODE = "/data"
GiB = 1 << 30
#: Megabyte as reported: 10**6 bytes (the established benchmark used 2**20).
MB = 1e6
#: A cold pass that starts with more than this fraction of the file cached is marked.
COLD_TOLERANCE = 0.01
#: Bytes settled before a cold pass beyond the file's size: the ring and the readers' buffers.
SETTLE_EXTRA = 256 << 20
#: Rows written per append while generating a file.
WRITE_ROWS = 4096
#: Generator rows counted between progress-bar updates (updating per row would cost more than the read).
PROGRESS_STEP = 1024
#: Multitables on a small file should read at least this fraction of the best single-process rate.
SMALL_TARGET = 0.9
#: Small-file passes take milliseconds, and one disk request more or less moves a figure by 10-20%:
#: at least this many repeats (a median of 15 still moved a ratio by 5-10% from run to run).
SMALL_MIN_REPEATS = 41
#: ... and in a --quick run, which must stay well under a minute.
QUICK_SMALL_REPEATS = 15

ENGINES = ("chunks", "h5py", "tables")
#: The single-process readers a user without multitables would write: the baselines of every ratio.
USER_ENGINES = ("h5py", "tables")
MODES = ("direct", "generator")
SECTIONS = ("main", "training", "random")
#: Rows of 1 KiB in the training / random-access file: 256 MiB (--quick: 16 MiB).
SECTION_ROWS, QUICK_SECTION_ROWS = 1 << 18, 1 << 14
CACHES = ("auto", "direct", "evict", "warm")
DEFAULT_COMPLEVELS = (0, 3, 9)
DEFAULT_COMPLIB = "blosc"
#: --quick: a 32 MiB file (over multitables' 16 MiB in-process threshold, so readers do start).
QUICK_SIZE_GIB = 1 / 32
#: How each engine reads past the page cache: HDF5's direct driver ("auto" streams with PyTables when
#: given open options), or the chunk engine's own O_DIRECT.
DIRECT_OPEN_KWARGS: dict[str, dict[str, str]] = {
    "tables": {"driver": "H5FD_DIRECT"},
    "auto": {"driver": "H5FD_DIRECT"},
    "h5py": {"driver": "direct"},
    "chunks": {"cache": "direct"},
}
#: Cache mode where only the chunk engine reads past the page cache (O_DIRECT); the HDF5 readers,
#: lacking the direct driver, start every pass with the file's pages dropped.
DIRECT_CHUNKS = "direct-chunks"
WARM_NOTE = "* started with more than 1% of the file in the page cache although the pass was meant to read from the disk"


# ---------------------------------------------------------------------------
# What is measured: frozen records
# ---------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Codec:
    """How a file is compressed; complevel 0 is stored uncompressed whatever the library (``complib='none'``)."""

    complib: str
    complevel: int

    @property
    def label(self) -> str:
        return "none" if self.complevel == 0 else f"{self.complib}-{self.complevel}"


@dataclass(frozen=True)
class Reader:
    """One way of reading a file: ``odirect`` (raw bytes), ``single`` (one process, in order) or ``multitables``."""

    kind: str
    engine: str = ""
    mode: str = ""
    #: multitables: the n_procs asked for; None asks for the default.
    n_procs: "int | None" = None

    @property
    def label(self) -> str:
        if self.kind == "odirect":
            return "O_DIRECT read"
        if self.kind == "single":
            call = {"h5py": "h5py read_direct", "tables": "tables read(out=)"}.get(self.engine, "multitables chunks engine")
            return f"{call}, 1 process"
        n = "default" if self.n_procs is None else str(self.n_procs)
        return f"multitables {self.engine} {self.mode} n_procs={n}"


@dataclass(frozen=True)
class Target:
    """A generated file: ``key`` is ``"main"`` for the benchmark file, else the small file's name."""

    key: str
    path: str
    codec: Codec
    n_rows: int
    chunk_rows: "int | None" = None

    @property
    def data_nbytes(self) -> int:
        """Uncompressed bytes of the dataset."""
        return self.n_rows * ROW_NBYTES


@dataclass(frozen=True)
class Pass:
    """One timed read of a whole file."""

    target: str
    codec: Codec
    reader: Reader
    repeat: int
    cycle: int
    cache: str
    #: Fraction of the file's pages in the page cache when the pass started.
    resident: float
    seconds: float
    #: Bytes delivered: the uncompressed data (the file's bytes for O_DIRECT).
    nbytes: int
    #: multitables: reader processes used (0: read in the consumer process).
    n_procs_used: "int | None" = None
    #: Rows per read (single-process readers and multitables).
    block_size: "int | None" = None

    @property
    def warm_start(self) -> bool:
        """Meant to read from the disk, but more than 1% of the file was cached."""
        return self.cache != "warm" and self.resident > COLD_TOLERANCE

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.seconds / MB


@dataclass(frozen=True)
class Result:
    """The passes of one (file, reader) summarised: the median over repeats of each repeat's rate over its cycles."""

    target: str
    codec: Codec
    reader: Reader
    mb_per_s: float
    #: Each repeat's rate (MB/s), in order.
    rates: tuple[float, ...]
    warm_start: bool
    n_procs_used: "int | None"
    block_size: "int | None"


@dataclass(frozen=True)
class Settings:
    """The parsed command line."""

    size_gib: float
    cycles: int
    max_procs: int
    complibs: tuple[str, ...]
    complevels: tuple[int, ...]
    engines: tuple[str, ...]
    modes: tuple[str, ...]
    repeats: int
    cache: str
    direct_off: bool
    file: "str | None"
    quick: bool
    small_files: bool
    json: "str | None" = None
    markdown: "str | None" = None
    html: "str | None" = None
    plot: "str | None" = None
    report_from: "str | None" = None
    #: What to measure: "main" (the streaming matrix), "training", "random" (multitables_benchmark_sections).
    sections: tuple[str, ...] = ("main",)

    @property
    def n_rows(self) -> int:
        return max(1, int(self.size_gib * GiB) // ROW_NBYTES)

    @property
    def codecs(self) -> tuple[Codec, ...]:
        """Files to generate: complevel 0 once, whatever the libraries."""
        found = {Codec("none", 0) if lvl == 0 else Codec(lib, lvl) for lib in self.complibs for lvl in self.complevels}
        return tuple(sorted(found, key=lambda c: (c.complevel != 0, self._lib_order(c.complib), c.complevel)))

    def _lib_order(self, complib: str) -> int:
        return self.complibs.index(complib) if complib in self.complibs else -1

    @property
    def small_codec(self) -> Codec:
        """The small files' codec: the first library at the middle complevel."""
        levels = sorted(self.complevels)
        level = levels[len(levels) // 2]
        return Codec("none", 0) if level == 0 else Codec(self.complibs[0], level)


@dataclass(frozen=True)
class Context:
    """Everything the report says besides the results."""

    settings: Settings
    cache: str
    cache_note: str
    machine: dict[str, Any]
    versions: dict[str, str]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SmallFile:
    """A small file of the "small files" section."""

    key: str
    n_rows: int
    #: Rows per chunk; None: PyTables' choice.
    chunk_rows: "int | None"
    description: str


SMALL_FILES = (
    SmallFile("1000-rows", 1000, None, "1,000 rows (4 MB), PyTables' chunking"),
    SmallFile("one-block", 256, 256, "256 rows in one 256-row chunk: a single block"),
    SmallFile("sub-chunk", 100, 1024, "100 rows in a 1024-row chunk: smaller than one chunk"),
)


# ---------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


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
    add("--engines", nargs="+", default=list(ENGINES), choices=ENGINES, help="engines to decode with (default: both)")
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
        help="what to measure: main (streaming, the default), training (batches vs DataLoader), random (Reader vs h5py)")
    add("--report-from", metavar="JSON", default=None, help="measure nothing: report the results of an earlier --json run")
    return parser


def parse_args(argv: "Sequence[str] | None" = None) -> Settings:
    """Parse and check the command line; ``--quick`` fills in small defaults that explicit options override."""
    parser = build_parser()
    a = parser.parse_args(argv)
    quick = a.quick
    complibs = tuple(dict.fromkeys(([a.complib] if a.complib else []) + (a.complibs or [])))
    settings = Settings(
        size_gib=a.size if a.size is not None else (QUICK_SIZE_GIB if quick else 1.0),
        cycles=a.cycles if a.cycles is not None else 1,
        max_procs=a.max_procs if a.max_procs is not None else (min(2, _usable_cpus()) if quick else _usable_cpus()),
        complibs=complibs or (DEFAULT_COMPLIB,),
        complevels=tuple(dict.fromkeys(a.complevels if a.complevels is not None else DEFAULT_COMPLEVELS)),
        engines=tuple(dict.fromkeys(a.engines)),
        modes=tuple(dict.fromkeys(a.modes)),
        repeats=a.repeats if a.repeats is not None else (1 if quick else 3),
        cache=a.cache,
        direct_off=a.direct_off,
        file=a.file,
        quick=quick,
        small_files=a.small_files,
        json=a.json,
        markdown=a.markdown,
        html=a.html,
        plot=a.plot,
        report_from=a.report_from,
        sections=tuple(dict.fromkeys(a.sections)),
    )
    problem = check_settings(settings)
    if problem:
        parser.error(problem)
    return settings


def check_settings(s: Settings) -> "str | None":
    """What is wrong with ``s``, or None."""
    import tables

    if s.size_gib <= 0:
        return f"--size must be positive, got {s.size_gib}"
    for name, value in (("--cycles", s.cycles), ("--max_procs", s.max_procs), ("--repeats", s.repeats)):
        if value < 1:
            return f"{name} must be at least 1, got {value}"
    bad_levels = [lvl for lvl in s.complevels if not 0 <= lvl <= 9]
    if bad_levels:
        return f"--complevels must be within 0-9, got {bad_levels}"
    bad_libs = [lib for lib in s.complibs if lib not in tables.filters.all_complibs]
    if bad_libs:
        return f"unknown complib {bad_libs}; PyTables knows {', '.join(tables.filters.all_complibs)}"
    if s.cache == "direct" and s.direct_off:
        return "--cache direct and --H5FD_DIRECT_OFF contradict each other"
    if s.file and not s.report_from:
        if os.path.exists(s.file):
            return f"--file {s.file} exists: the benchmark writes and then removes this file, so give a new path"
        if not os.path.isdir(os.path.dirname(os.path.abspath(s.file))):
            return f"--file {s.file}: no such directory"
    if s.plot and not _matplotlib_available():
        return "--plot needs matplotlib, which is not installed (pip install matplotlib)"
    return None


def _matplotlib_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def write_file(path: str, n_rows: int, codec: Codec, chunk_rows: "int | None" = None, seed: int = 0) -> None:
    """Random normal float32 rows of 1024 values at ``/data`` (an EArray, PyTables' chunking unless ``chunk_rows``)."""
    import tables
    from tqdm import tqdm

    filters = tables.Filters(complevel=codec.complevel, complib=codec.complib) if codec.complevel else None
    chunkshape = (chunk_rows, ROW_VALUES) if chunk_rows else None
    rng = np.random.default_rng(seed)
    with tables.open_file(path, "w") as f:
        arr = f.create_earray(
            "/", NODE[1:], tables.Float32Atom(), (0, ROW_VALUES), filters=filters, chunkshape=chunkshape, expectedrows=n_rows
        )
        desc = f"writing {codec.label} {os.path.basename(path)}"
        with tqdm(total=n_rows, desc=desc, unit="row", unit_scale=True, leave=False) as bar:
            for start in range(0, n_rows, WRITE_ROWS):
                rows = min(WRITE_ROWS, n_rows - start)
                arr.append(rng.standard_normal((rows, ROW_VALUES), dtype=np.float32))
                bar.update(rows)


def engine_can_read(path: str, engine: str) -> "str | None":
    """None if ``engine`` decodes ``path``'s dataset here, else why not."""
    try:
        out = np.empty((1, ROW_VALUES), np.float32)
        _read_rows(path, engine, {}, 1, out, lambda n: None, stop=1)
    except Exception as exc:  # a missing filter surfaces as OSError, ValueError or HDF5ExtError
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


# ---------------------------------------------------------------------------
# The page cache
# ---------------------------------------------------------------------------


def resolve_cache(settings: Settings, directory: str) -> tuple[str, str]:
    """The cache mode every pass uses, and a sentence saying why; raises SystemExit for an impossible ``--cache direct``."""
    if settings.cache == "warm":
        return "warm", "warm: the file is read into the page cache before every pass (the memory-bound ceiling)"
    cache, note = _resolve_cold_cache(settings, directory)
    if _settles_memory():
        note += (
            "; this virtual machine hands freed memory back to its host (free page reporting), so before every pass "
            "as much fresh memory as the pass will fill is touched and freed, so that no pass pays the host for "
            "memory an earlier one freed"
        )
    return cache, note


def _resolve_cold_cache(settings: Settings, directory: str) -> tuple[str, str]:
    """:func:`resolve_cache` for the cold modes (direct, evict, auto), before any word on memory settling."""
    from multitables._pagecache import direct_driver_available

    evict_note = "evict: the file's pages are dropped from the page cache (fsync, POSIX_FADV_DONTNEED) before every pass"
    if settings.cache == "evict":
        return "evict", evict_note
    if settings.direct_off:
        return "evict", evict_note + " (--H5FD_DIRECT_OFF)"
    needed = sorted((set(settings.engines) | {"tables", "h5py"}) - {"chunks"})  # small files stream with engine auto
    lacking = [e for e in needed if not direct_driver_available(e, directory)]
    if not lacking:
        note = (
            "direct: HDF5's direct driver (H5FD_DIRECT) and the chunk engine's O_DIRECT read past the page cache "
            "(pages also dropped before each pass)"
        )
        return "direct", note
    why = (
        f"the installed HDF5 has no usable direct driver (H5FD_DIRECT) for {', '.join(lacking)} "
        "(the PyTables and h5py wheels are built without --enable-direct-vfd)"
    )
    if settings.cache == "direct":
        note = (
            f"direct: the chunk engine reads past the page cache with O_DIRECT; {why}, so they (and engine auto) "
            "read through the page cache, its pages dropped (fsync, POSIX_FADV_DONTNEED) before every pass"
        )
        return DIRECT_CHUNKS, note
    return "evict", f"{evict_note}; {why}"


def prepare_cache(path: str, cache: str) -> float:
    """Set the page cache up for a pass over ``path``; return the fraction of the file then resident.

    Cold passes on a virtual machine with free page reporting also get their
    memory settled (NOTE [free page reporting] in ``multitables/_pagecache.py``).
    """
    from multitables._pagecache import evict, resident_fraction, settle_free_memory

    if cache == "warm":
        if resident_fraction(path) < 1.0:
            _read_through_cache(path)
    else:
        evict(path)
        if _settles_memory():
            settle_free_memory(os.path.getsize(path) + SETTLE_EXTRA)
    return resident_fraction(path)


@functools.lru_cache(maxsize=1)
def _settles_memory() -> bool:
    """Whether cold passes settle memory first: on machines whose balloon reports free pages to the host."""
    from multitables._pagecache import free_page_reporting

    return free_page_reporting()


def _read_through_cache(path: str) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def open_kwargs_for(cache: str, engine: str) -> dict[str, str]:
    """The Streamer's options for this engine and cache mode: HDF5's direct driver, the chunk engine's O_DIRECT, or none."""
    if cache == "direct" or (cache == DIRECT_CHUNKS and engine == "chunks"):
        return dict(DIRECT_OPEN_KWARGS[engine])
    return {}


# ---------------------------------------------------------------------------
# Readers: each reads one whole file, calling ``progress(rows)`` as it goes
# ---------------------------------------------------------------------------


def _read_rows(
    path: str,
    engine: str,
    open_kwargs: dict[str, str],
    block_size: int,
    buffer: np.ndarray,
    progress: Callable[[int], None],
    stop: "int | None" = None,
) -> int:
    """Read ``path``'s dataset in order, ``block_size`` rows at a time, into ``buffer``; return the rows read."""
    if engine == "chunks":
        from multitables._engines import open_source
        from multitables._node import inspect_node

        node = inspect_node(path, NODE)
        src = open_source("chunks", node, {}, cache=open_kwargs.get("cache", "page"))
        try:
            if src.engine != "chunks":
                raise ValueError(f"the chunk engine cannot read {path} (it would fall back to {src.engine})")
            return _read_blocks(src.read_into, stop or node.n_rows, block_size, buffer, progress)
        finally:
            src.close()
    if engine == "h5py":
        import h5py
        import hdf5plugin  # noqa: F401  (registers blosc, lz4, zstd...)

        with h5py.File(path, "r", **open_kwargs) as f:
            ds = f[NODE]
            read = lambda a, b, out: ds.read_direct(out, np.s_[a:b])  # noqa: E731
            return _read_blocks(read, stop or ds.shape[0], block_size, buffer, progress)
    import tables

    with tables.open_file(path, "r", **open_kwargs) as f:
        node = f.get_node(NODE)
        return _read_blocks(lambda a, b, out: node.read(a, b, out=out), stop or node.nrows, block_size, buffer, progress)


def _read_blocks(
    read: Callable[[int, int, np.ndarray], Any], n_rows: int, block_size: int, buffer: np.ndarray, progress: Callable[[int], None]
) -> int:
    for start in range(0, n_rows, block_size):
        stop = min(start + block_size, n_rows)
        read(start, stop, buffer[: stop - start])
        progress(stop - start)
    return n_rows


def read_odirect(target: Target, progress: Callable[[int], object]) -> float:
    """The file's raw bytes with O_DIRECT, past the page cache: bytes/s."""
    from multitables._pagecache import odirect_read_rate

    return odirect_read_rate(target.path, progress=progress)


def read_single(target: Target, reader: Reader, cache: str, block_size: int, progress: Callable[[int], None]) -> int:
    """One process, in order, as a user without multitables would read."""
    buffer = np.empty((block_size, ROW_VALUES), np.float32)
    return _read_rows(target.path, reader.engine, open_kwargs_for(cache, reader.engine), block_size, buffer, progress)


def _readers_running() -> int:
    """multitables reader processes this process has running now."""
    import multiprocessing

    return sum(p.name.startswith("multitables-reader") for p in multiprocessing.active_children())


def read_multitables(
    target: Target, reader: Reader, cache: str, progress: Callable[[int], None], used: "list[int] | None" = None
) -> int:
    """Stream the whole dataset once (remainder included) with multitables; return the rows seen.

    ``used``, if given, gets the reader processes the pass used appended (0:
    read in this process), as the queue reports them.
    """
    import multitables

    stream = multitables.Streamer(target.path, engine=reader.engine, **open_kwargs_for(cache, reader.engine))
    rows = 0
    if reader.mode == "direct":
        with stream.get_queue(NODE, n_procs=reader.n_procs, remainder=True) as queue:
            for guard in queue.iter():
                with guard as block:
                    n = len(block)
                rows += n
                progress(n)
            if used is not None:
                used.append(queue.n_procs)
        return rows
    pending = 0
    gen = stream.get_generator(NODE, n_procs=reader.n_procs)
    for _row in gen:  # the readers start with the first row
        pending = 1
        break
    if used is not None:
        used.append(_readers_running())  # the generator's queue is out of reach
    for _row in gen:
        pending += 1
        if pending == PROGRESS_STEP:
            rows += pending
            progress(pending)
            pending = 0
    progress(pending)
    return rows + pending


def probe_multitables(target: Target, engine: str, n_procs: "int | None", cache: str) -> tuple[int, int]:
    """(reader processes, rows per block) multitables picks for these arguments; opens a queue and closes it at once."""
    import multitables

    stream = multitables.Streamer(target.path, engine=engine, **open_kwargs_for(cache, engine))
    with stream.get_queue(NODE, n_procs=n_procs) as queue:
        return queue.n_procs, queue.block_size


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A reader on a target, with what the pass records besides its time."""

    target: Target
    reader: Reader
    n_procs_used: "int | None" = None
    block_size: "int | None" = None


def time_pass(job: Job, cache: str, repeat: int, cycle: int, log: Callable[[str], None]) -> Pass:
    """Set the cache up, measure residency, read the whole file once, timed with ``perf_counter``."""
    from tqdm import tqdm

    target, reader = job.target, job.reader
    resident = prepare_cache(target.path, cache)
    # The garbage of the pass before (PyTables leaves many objects) is collected
    # now, not charged to whichever reader runs next, which on the small files
    # made the pass after a PyTables one measurably slower.
    gc.collect()
    desc = f"{target.key} {target.codec.label} {reader.label} [{resident:.1%} cached]"
    n_procs_used = job.n_procs_used
    if reader.kind == "odirect":
        nbytes = os.path.getsize(target.path)
        with tqdm(total=nbytes, desc=desc, unit="B", unit_scale=True, leave=False) as bar:
            seconds = nbytes / read_odirect(target, bar.update)
    else:
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
        nbytes = target.data_nbytes
        if used:
            n_procs_used = used[0]
    p = Pass(target.key, target.codec, reader, repeat, cycle, cache, resident, seconds, nbytes, n_procs_used, job.block_size)
    flag = "  WARM START" if p.warm_start else ""
    log(f"{desc} repeat {repeat + 1} cycle {cycle + 1}: {p.seconds:.3f} s, {p.mb_per_s:,.0f} MB/s{flag}")
    return p


def run_jobs(
    jobs: Sequence[Job], cache: str, repeats: int, cycles: int, log: Callable[[str], None], passes: "list[Pass] | None" = None
) -> list[Pass]:
    """Every job ``repeats`` x ``cycles`` times, appended to ``passes`` (returned).

    Repeats are interleaved (every job once, then again) so that slow drift on the machine touches every job alike.
    """
    passes = [] if passes is None else passes
    for r in range(repeats):
        for job in jobs:
            passes += [time_pass(job, cache, r, c, log) for c in range(cycles)]
    return passes


def main_jobs(target: Target, settings: Settings, cache: str, notes: list[str]) -> list[Job]:
    """The O_DIRECT read, the single-process readers and multitables (1..max_procs and default) on the benchmark file."""
    jobs = [Job(target, Reader("odirect"))]
    engines = []
    for engine in settings.engines:
        problem = engine_can_read(target.path, engine)
        if problem:
            notes.append(f"{target.codec.label}: {engine} cannot decode the file here, skipped ({problem})")
        else:
            engines.append(engine)
    _, default_block = probe_multitables(target, "auto", None, cache)
    singles = single_engines(settings.engines)
    jobs += [Job(target, Reader("single", e), block_size=default_block) for e in singles if not engine_can_read(target.path, e)]
    for engine in engines:
        for n_procs in [*range(1, settings.max_procs + 1), None]:
            used, block = probe_multitables(target, engine, n_procs, cache)
            jobs += [Job(target, Reader("multitables", engine, mode, n_procs), used, block) for mode in settings.modes]
    return jobs


def single_engines(engines: Sequence[str]) -> list[str]:
    """The single-process readers of a run: the users' baselines always, the chunk engine when it is measured."""
    return [e for e in ENGINES if e in USER_ENGINES or e in engines]


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
    """Write each file in turn, run its jobs, remove it; every pass is appended to ``passes`` as it ends."""
    try:
        for codec in settings.codecs:
            target = Target("main", main_path, codec, settings.n_rows)
            write_file(target.path, target.n_rows, codec)
            run_jobs(main_jobs(target, settings, cache, notes), cache, settings.repeats, settings.cycles, log, passes)
        if settings.small_files:
            repeats = small_repeats(settings)
            for small in SMALL_FILES:
                path = os.path.join(workdir, f"{small.key}.h5")
                target = Target(small.key, path, settings.small_codec, small.n_rows, small.chunk_rows)
                write_file(target.path, target.n_rows, target.codec, small.chunk_rows)
                run_jobs(small_jobs(target, settings, cache), cache, repeats, settings.cycles, log, passes)
                os.remove(target.path)
    finally:
        if os.path.exists(main_path):
            os.remove(main_path)


def summarize(passes: Iterable[Pass]) -> list[Result]:
    """One :class:`Result` per (file, codec, reader), in first-seen order."""
    groups: dict[tuple[str, Codec, Reader], list[Pass]] = {}
    for p in passes:
        groups.setdefault((p.target, p.codec, p.reader), []).append(p)
    results = []
    for (target, codec, reader), group in groups.items():
        by_repeat: dict[int, list[Pass]] = {}
        for p in group:
            by_repeat.setdefault(p.repeat, []).append(p)
        rates = tuple(sum(p.nbytes for p in ps) / sum(p.seconds for p in ps) / MB for _, ps in sorted(by_repeat.items()))
        warm = any(p.warm_start for p in group)
        first = group[0]
        used = statistics.mode(p.n_procs_used for p in group)  # what most passes used
        results.append(Result(target, codec, reader, statistics.median(rates), rates, warm, used, first.block_size))
    return results


# ---------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------


def _read_text(path: str) -> "str | None":
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_model() -> str:
    for line in (_read_text("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_bytes() -> "int | None":
    for line in (_read_text("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def mount_of(path: str) -> dict[str, str]:
    """The mount holding ``path``, from /proc/self/mountinfo: mount point, device numbers, filesystem, source."""
    real = os.path.realpath(path)
    best: dict[str, str] = {}
    for line in (_read_text("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        point = fields[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.get("mount", "")):
            best = {"mount": point, "devno": fields[2], "fstype": tail[0], "source": tail[1]}
    return best


def block_device(devno: str) -> dict[str, Any]:
    """The disk behind ``major:minor``: its name, rotational flag, RAID level (md) and the devices under it."""
    sys_dev = f"/sys/dev/block/{devno}"
    if not os.path.exists(sys_dev):
        return {}
    real = os.path.realpath(sys_dev)
    name = os.path.basename(real)
    disk = os.path.basename(os.path.dirname(real)) if os.path.exists(os.path.join(real, "partition")) else name
    rotational = _read_text(f"/sys/block/{disk}/queue/rotational")
    slaves = sorted(os.listdir(f"/sys/block/{disk}/slaves")) if os.path.isdir(f"/sys/block/{disk}/slaves") else []
    return {
        "device": f"/dev/{name}",
        "disk": disk,
        "rotational": None if rotational is None else rotational == "1",
        "raid_level": _read_text(f"/sys/block/{disk}/md/level"),
        "model": _read_text(f"/sys/block/{disk}/device/model"),
        "underlying": slaves,
    }


def machine_info(path: str) -> dict[str, Any]:
    """CPU model and count, memory, and the device and filesystem ``path`` sits on."""
    mount = mount_of(path)
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cpus": _usable_cpus(),
        "memory_bytes": memory_bytes(),
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "file": {"path": os.path.abspath(path), **mount, **block_device(mount.get("devno", ""))},
    }


def versions() -> dict[str, str]:
    import h5py
    import hdf5plugin
    import tables
    import tqdm

    import multitables

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "multitables": multitables.__version__,
        "tables": tables.__version__,
        "tables HDF5": tables.hdf5_version,
        "h5py": h5py.__version__,
        "h5py HDF5": h5py.version.hdf5_version,
        "hdf5plugin": hdf5plugin.version,
        "tqdm": tqdm.__version__,
    }


# ---------------------------------------------------------------------------
# The report: built from results and context only
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """A rendered-agnostic table: a title, a header, rows of cell strings, notes below."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = field(default=())


def _find(results: Sequence[Result], target: str, codec: Codec, reader: Reader) -> "Result | None":
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


def _codec(complib: str, complevel: int) -> Codec:
    return Codec("none", 0) if complevel == 0 else Codec(complib, complevel)


def _notes(results: Iterable["Result | None"]) -> tuple[str, ...]:
    return (WARM_NOTE,) if any(r is not None and r.warm_start for r in results) else ()


def baseline_table(results: Sequence[Result], complib: str, complevels: Sequence[int], engines: Sequence[str]) -> Table:
    """Per complevel: the disk ceiling and each single-process reader (ratio to the best of them)."""
    header = ("complevel", "O_DIRECT read (disk)", *(Reader("single", e).label for e in engines))
    rows, seen = [], []
    for level in complevels:
        codec = _codec(complib, level)
        best = best_single(results, "main", codec)
        readers = [Reader("odirect"), *(Reader("single", e) for e in engines)]
        found = [_find(results, "main", codec, r) for r in readers]
        seen += found
        rows.append((str(level), cell(found[0]), *(cell(r, best) for r in found[1:])))
    title = f"{complib}: the disk and one process (MB/s, ratio to the best single-process reader)"
    return Table(title, header, tuple(rows), _notes(seen))


def scaling_table(
    results: Sequence[Result], complib: str, complevels: Sequence[int], engine: str, mode: str, max_procs: int
) -> Table:
    """Complevel x n_procs for one engine and mode, with the default n_procs as the last column."""
    n_procs_list: list["int | None"] = [*range(1, max_procs + 1), None]
    rows, seen = [], []
    for level in complevels:
        codec = _codec(complib, level)
        best = best_single(results, "main", codec)
        found = [_find(results, "main", codec, Reader("multitables", engine, mode, n)) for n in n_procs_list]
        seen += found
        rows.append((str(level), *(cell(r, best) for r in found[:-1]), _default_cell(found[-1], best)))
    header = ("complevel / n_procs", *(str(n) for n in n_procs_list[:-1]), "default (what it used)")
    title = f"{complib}: multitables, {mode} access, engine {engine} (MB/s, ratio to the best single-process reader)"
    return Table(title, header, tuple(rows), _notes(seen))


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
        found = [_find(results, small.key, codec, Reader("multitables", "auto", m, None)) for m in modes]
        seen += [best, *found]
        met = best is not None and all(r is not None and r.mb_per_s >= SMALL_TARGET * best.mb_per_s for r in found)
        best_text = "n/a" if best is None else f"{cell(best)} ({best.reader.engine})"
        cells = (_default_cell(r, best) for r in found)
        rows.append((small.description, str(small.n_rows), best_text, *cells, "yes" if met else "NO"))
    title = "Small files: default multitables (engine auto) against the best single-process reader"
    return Table(title, header, tuple(rows), _notes(seen))


def _default_cell(result: "Result | None", best: "Result | None") -> str:
    """A default-n_procs cell: the rate and ratio, and where it read (in most passes)."""
    text = cell(result, best)
    if result is not None and result.n_procs_used is not None:
        where = "in-process" if result.n_procs_used == 0 else f"{result.n_procs_used} procs"
        text += f" ({where})"
    return text


def report_tables(results: Sequence[Result], ctx: Context) -> list[Table]:
    s = ctx.settings
    levels = s.complevels
    tables = []
    for complib in s.complibs:
        tables.append(baseline_table(results, complib, levels, single_engines(s.engines)))
        for engine in s.engines:
            for mode in s.modes:
                tables.append(scaling_table(results, complib, levels, engine, mode, s.max_procs))
    if any(r.target != "main" for r in results):
        tables.append(small_table(results, s.modes))
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
    return [
        ("machine", f"{m['cpu_model']}, {m['cpus']} CPUs ({m['usable_cpus']} usable), {mem}; {m['system']}"),
        ("file", f"{f.get('path', '?')} on {device} ({rot}{raid}{under}{model}), "
                 f"{f.get('fstype', '?')} mounted at {f.get('mount', '?')}"),
        ("data", f"{s.n_rows:,} rows of {ROW_VALUES} random normal float32 ({s.n_rows * ROW_NBYTES / GiB:.3g} GiB): "
                 "noise does not compress, so these figures show decompression overhead only, "
                 "not what compression saves on real data"),
        ("cache", ctx.cache_note),
        ("method", f"each pass reads the whole file once (multitables: start-up and shut-down included); median over {s.repeats} "
                   f"repeat(s) of {s.cycles} pass(es); MB = 10^6 bytes of uncompressed data (file bytes for O_DIRECT); "
                   "ratios are to the best single-process reader of the same file"),
        *((("quick", "a --quick run: the file is small, so starting reader processes weighs on multitables' figures; "
                      "they check that everything works, the full run gives the figures"),) if s.quick else ()),
        ("versions", ", ".join(f"{k} {v}" for k, v in ctx.versions.items())),
        *(("note", n) for n in ctx.notes),
    ]


def render_text(tables: Sequence[Table], ctx: Context) -> str:
    lines = ["multitables benchmark", ""] + [f"{k:>8}: {v}" for k, v in describe(ctx)]
    for t in tables:
        widths = [max(len(row[i]) for row in (t.header, *t.rows)) for i in range(len(t.header))]
        lines += ["", t.title, _text_row(t.header, widths), "-+-".join("-" * w for w in widths)]
        lines += [_text_row(row, widths) for row in t.rows] + list(t.notes)
    return "\n".join(lines) + "\n"


def _text_row(row: Sequence[str], widths: Sequence[int]) -> str:
    return " | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*")


def render_markdown(tables: Sequence[Table], ctx: Context) -> str:
    lines = ["## multitables benchmark", ""] + [f"- **{k}**: {_md_escape(v)}" for k, v in describe(ctx)]
    for t in tables:
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
    for t in tables:
        parts.append(f"<h2>{e(t.title)}</h2>")
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
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": asdict(ctx.settings),
        "cache": ctx.cache,
        "cache_note": ctx.cache_note,
        "cold_tolerance": COLD_TOLERANCE,
        "row_nbytes": ROW_NBYTES,
        "mb": MB,
        "machine": ctx.machine,
        "versions": ctx.versions,
        "notes": list(ctx.notes),
        "results": [_record(r) for r in results],
        "passes": [_record(p) for p in passes],
    }


def load_report(path: str) -> tuple[list[Pass], Context]:
    """The passes and context of a JSON report written by ``--json``."""
    with open(path) as f:
        d = json.load(f)
    saved: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d["settings"].items()}
    settings = Settings(**saved)
    derived = ("warm_start", "mb_per_s")
    passes = []
    for p in d["passes"]:
        fields = {k: v for k, v in p.items() if k not in derived}
        passes.append(Pass(**{**fields, "codec": Codec(**p["codec"]), "reader": Reader(**p["reader"])}))
    return passes, Context(settings, d["cache"], d["cache_note"], d["machine"], d["versions"], tuple(d["notes"]))


def plot(results: Sequence[Result], ctx: Context, path: str) -> None:
    """MB/s against n_procs, one panel per (complib, complevel), with the disk and single-process ceilings drawn in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    s = ctx.settings
    rows, cols = len(s.complibs), len(s.complevels)
    fig, axes = plt.subplots(rows, cols, figsize=(max(6.0, 4.5 * cols), 3.6 * rows + 0.6), squeeze=False, sharex=True)
    xs = list(range(1, s.max_procs + 1))
    for i, complib in enumerate(s.complibs):
        for j, level in enumerate(s.complevels):
            _plot_panel(axes[i][j], results, _codec(complib, level), s, xs)
    handles, _ = axes[0][0].get_legend_handles_labels()
    handles += [
        Line2D([], [], marker="*", linestyle="", color="grey", markersize=10, label="default n_procs"),
        Line2D([], [], marker="x", linestyle="", color="red", markersize=8, label="started warm (>1% cached)"),
    ]
    axes[0][0].legend(handles=handles, fontsize=7, loc="best")
    fig.suptitle(f"multitables: MB/s against n_procs (cache: {ctx.cache})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_panel(ax: Any, results: Sequence[Result], codec: Codec, s: Settings, xs: list[int]) -> None:
    odirect = _find(results, "main", codec, Reader("odirect"))
    best = best_single(results, "main", codec)
    if odirect is not None:
        ax.axhline(odirect.mb_per_s, color="black", linestyle="--", linewidth=1, label="disk (O_DIRECT)")
    if best is not None:
        ax.axhline(best.mb_per_s, color="grey", linestyle=":", linewidth=1.5, label=f"best 1 process ({best.reader.engine})")
    for engine in s.engines:
        for mode in s.modes:
            found = [_find(results, "main", codec, Reader("multitables", engine, mode, n)) for n in xs]
            pts = [(x, r) for x, r in zip(xs, found) if r is not None]
            if not pts:
                continue
            line = ax.plot([x for x, _ in pts], [r.mb_per_s for _, r in pts], marker="o", label=f"{engine} {mode}")[0]
            warm = [(x, r.mb_per_s) for x, r in pts if r.warm_start]
            if warm:
                ax.scatter(*zip(*warm), marker="x", s=80, color="red", zorder=3)
            default = _find(results, "main", codec, Reader("multitables", engine, mode, None))
            if default is not None and default.n_procs_used:
                ax.scatter([default.n_procs_used], [default.mb_per_s], marker="*", s=120, color=line.get_color(), zorder=3)
    ax.set_title("uncompressed" if codec.complevel == 0 else f"{codec.complib} level {codec.complevel}", fontsize=9)
    ax.set_xlabel("n_procs")
    ax.set_ylabel("MB/s")
    ax.set_xticks(xs)
    ax.set_ylim(bottom=0)


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
    """One decompression thread, so that "one process" means one core (multitables' readers do the same)."""
    for var in ("BLOSC_NTHREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[var] = "1"


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
    extra = [name for name in settings.sections if name != "main"]
    if extra:
        measure_sections(settings, extra)
        if "main" not in settings.sections:
            return
    workdir, main_path = _workdir(settings)
    passes: list[Pass] = []

    def log(msg: str) -> None:
        from tqdm import tqdm

        tqdm.write(msg, file=sys.stderr)

    try:
        _check_space(workdir, settings)
        cache, cache_note = resolve_cache(settings, workdir)
        log(f"cache: {cache_note}")
        machine = machine_info(workdir)
        notes: list[str] = []
        if machine["file"].get("fstype") in ("tmpfs", "ramfs") and cache != "warm":
            notes.append(f"the file is on {machine['file']['fstype']}, which lives in memory: no pass can read from a disk; "
                         "use --file on the disk under test")
            log("warning: " + notes[-1])
        try:
            measure(settings, workdir, main_path, cache, notes, log, passes)
        except KeyboardInterrupt:
            notes.append(f"interrupted after {len(passes)} passes: the figures are partial")
            log(notes[-1])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    machine["file"]["path"] = main_path
    ctx = Context(settings, cache, cache_note, machine, versions(), tuple(notes))
    emit(passes, ctx)


def measure_sections(settings: Settings, sections: Sequence[str]) -> None:
    """Run the training / random-access sections; print their Markdown tables (JSON beside ``--json``)."""
    from multitables_benchmark_sections import run_sections

    workdir, _ = _workdir(settings)
    rows = QUICK_SECTION_ROWS if settings.quick else SECTION_ROWS
    n_procs = settings.max_procs
    try:
        text, figures = run_sections(sections, workdir, rows, n_procs, settings.repeats, lambda m: print(m, file=sys.stderr))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.stdout.write(text + "\n\n")
    if settings.json:
        with open(settings.json + ".sections.json", "w") as f:
            json.dump([asdict(fig) for fig in figures], f, indent=1)


def report(settings: Settings) -> None:
    """Report an earlier run's JSON, to the outputs asked for now."""
    passes, ctx = load_report(settings.report_from or "")
    outputs = {k: getattr(settings, k) for k in ("json", "markdown", "html", "plot")}
    emit(passes, replace(ctx, settings=replace(ctx.settings, **outputs)))


def emit(passes: Sequence[Pass], ctx: Context) -> None:
    """Print the text report; write the JSON, Markdown, HTML and plot asked for."""
    s = ctx.settings
    results = summarize(passes)
    tables = report_tables(results, ctx)
    sys.stdout.write(render_text(tables, ctx))
    if s.markdown:
        _write(s.markdown, render_markdown(tables, ctx))
    if s.html:
        _write(s.html, render_html(tables, ctx))
    if s.json:
        with open(s.json, "w") as f:
            json.dump(report_json(passes, results, ctx), f, indent=1)
    if s.plot:
        plot(results, ctx, s.plot)


if __name__ == "__main__":
    main()
