"""The scaling section (``multitables-benchmark --sections scaling``): multitables beside what a user would write instead.

Issue 29 asks how multitables scales with cores, against the two things a
user without it would write: ``N`` plain h5py processes each reading its
share, and PyTorch's ``DataLoader(num_workers=N, batch_size=None)`` over
h5py blocks. For each codec of :data:`CODECS` (zlib 3 + shuffle, blosc 3 +
shuffle, the benchmark's writers) a file of smooth float32 rows
(``--data smooth``: a random walk along each row) is written, or reused
when ``--file`` names one already written, and read, page cache warm, by:

* one h5py process in blocks (the baseline, 1.00x);
* multitables direct access for ``n_procs`` = 1, 2, 4, ... up to the CPUs
  (``--max_procs``), and the default, each with its efficiency
  rate(n) / (n x rate(1)) and the counters of :mod:`multitables_bench.counters`;
* ``N`` plain h5py processes and the ``DataLoader``, for the same ``N``;
* zlib only: the file's stored chunks inflated in memory by one process and
  by ``N`` at once: what the cores alone give, beside the readers' efficiency.

Beside them the machine's facts: cores, threads per core, memory, and the
memory copy rate of one process and of ``N`` at once. Every pass runs in a
fresh process (NOTE [a fresh process per pass] in
``multitables_bench.scaling_passes``); a figure is the median of
``--repeats`` passes, interleaved (every contender once, then again).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from multitables_bench.cache import resident_fraction
from multitables_bench.counters import FAULT_TARGET, pages_per_gib
from multitables_bench.files import h5py_with_filters, read_through_cache, write_file
from multitables_bench.machine import cpu_model, memory_bytes, usable_cpus
from multitables_bench.records import MB, NODE, ROW_NBYTES, Codec
from multitables_bench.scaling_passes import PassResult, PassSpec

CODECS = (Codec("zlib", 3), Codec("blosc", 3))
#: MiB of rows per file, by default and with --quick (--section-mib sets it).
DEFAULT_MIB, QUICK_MIB = 1024, 32
#: MiB of each memory-copy buffer, by default and with --quick.
MEMCPY_MIB, QUICK_MEMCPY_MIB = 256, 16
#: Rows per block for h5py, the plain processes and the DataLoader: whole chunks near this many bytes.
BLOCK_BYTES = 4 << 20
#: The attribute a reusable file carries, saying what it holds.
STAMP = "multitables_bench_scaling"
#: The server every pass is forked from.
PASS_MODULE = "multitables_bench.scaling_passes"


@dataclass(frozen=True)
class ScalingSettings:
    """What the section measures."""

    mib: int
    repeats: int
    max_procs: int
    memcpy_mib: int
    #: Where the files go (``<root>-scaling-<codec>.h5``, kept for the next run); None: a temporary directory.
    file: "str | None" = None


@dataclass(frozen=True)
class ScalingFigure:
    """One contender on one file (or one memcpy): the median over repeats."""

    codec: str
    kind: str
    n: "int | None"
    mb_per_s: float
    rates: tuple[float, ...]
    n_used: "int | None" = None
    engine: str = ""
    block_rows: "int | None" = None
    #: multitables: each counter per GiB, the median over repeats (None: no window, too few blocks).
    counters: "dict[str, float] | None" = None
    readers_counted: str = ""


def procs_list(max_procs: int) -> list[int]:
    """1, 2, 4, ... below ``max_procs``, and ``max_procs`` itself."""
    out = [1 << k for k in range(max_procs.bit_length()) if 1 << k < max_procs]
    return out + [max_procs]


def threads_per_core() -> "int | None":
    """Hardware threads per core: from ``lscpu`` where present, else ``/proc/cpuinfo`` (siblings / cpu cores)."""
    if shutil.which("lscpu"):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"}).stdout
        for line in out.splitlines():
            if line.startswith("Thread(s) per core:"):
                return int(line.split(":")[1])
    info: dict[str, int] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("siblings", "cpu cores") and key.strip() not in info:
                    info[key.strip()] = int(value)
    except OSError:  # pragma: no cover - not Linux
        return None
    return info["siblings"] // info["cpu cores"] if len(info) == 2 and info["cpu cores"] else None


def file_paths(base: str) -> dict[Codec, str]:
    """The file of each codec for ``--file base``: ``<root>-scaling-<codec>.h5``."""
    root, ext = os.path.splitext(base)
    return {c: f"{root}-scaling-{c.label}{ext or '.h5'}" for c in CODECS}


def _stamp(codec: Codec, n_rows: int) -> str:
    return f"smooth float32 rows, {codec.label} + shuffle, {n_rows} rows"


def ensure_file(path: str, codec: Codec, n_rows: int, log: Callable[[str], None]) -> None:
    """Write ``path`` (smooth rows, ``codec``), or reuse it if a run before wrote the same; refuse anything else."""
    import tables

    if os.path.exists(path):
        with tables.open_file(path) as f:
            found = getattr(f.root._v_attrs, STAMP, None)
        if found != _stamp(codec, n_rows):
            raise SystemExit(f"{path} exists and holds {found or 'something else'}, not {_stamp(codec, n_rows)}: "
                             "remove it, or give --file another name or --section-mib its size")
        log(f"scaling: reusing {path}")
        return
    write_file(path, n_rows, codec, data="smooth")
    with tables.open_file(path, "a") as f:
        setattr(f.root._v_attrs, STAMP, _stamp(codec, n_rows))


def block_rows(path: str) -> int:
    """Rows per block for the h5py readers: whole chunks, near :data:`BLOCK_BYTES`."""
    with h5py_with_filters().File(path, "r") as f:
        chunk = (f[NODE].chunks or (1,))[0]
    return max(1, round(BLOCK_BYTES / (ROW_NBYTES * chunk))) * chunk


def pass_env() -> dict[str, str]:
    """The pass servers' environment: this checkout on ``PYTHONPATH`` (for multitables_bench) after what is there, so
    that a ``PYTHONPATH`` naming another copy of multitables measures that one (an A/B), as the scripts in
    benchmarks/ do."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), root) if p)}


class PassServers:
    """The pass servers (NOTE [a fresh process per pass] in ``multitables_bench.scaling_passes``), started when first
    needed: one with torch imported, for the DataLoader, one without, for the rest."""

    def __init__(self) -> None:
        self._servers: dict[bool, subprocess.Popen[str]] = {}

    def _server(self, torch: bool) -> "subprocess.Popen[str]":
        if torch not in self._servers:
            argv = [sys.executable, "-m", PASS_MODULE] + (["--torch"] if torch else [])
            self._servers[torch] = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=pass_env()
            )
        return self._servers[torch]

    def run(self, spec: PassSpec) -> PassResult:
        """``spec`` in a fresh process; its result, or ``RuntimeError`` with the pass's traceback."""
        server = self._server(spec.kind == "dataloader")
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(asdict(spec)) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        reply = json.loads(line) if line else {"error": f"the pass server ended with status {server.wait()}"}
        if "error" in reply:
            raise RuntimeError(f"{spec.kind} n={spec.n} on {spec.path} failed:\n{reply['error']}")
        d = reply["result"]
        return PassResult(**{**d, "readers_counted": tuple(d["readers_counted"]) if d["readers_counted"] else None})

    def close(self) -> None:
        for server in self._servers.values():
            if server.stdin is not None:
                server.stdin.close()
            server.wait(timeout=60)
        self._servers.clear()


def contenders(path: str, n_rows: int, rows: int, procs: Sequence[int], torch: bool) -> list[PassSpec]:
    """Every pass of one file, in the order run."""
    specs = [PassSpec("h5py", path, 1, rows, n_rows)]
    specs += [PassSpec("multitables", path, n, rows, n_rows) for n in [*procs, None]]
    specs += [PassSpec("processes", path, n, rows, n_rows) for n in procs]
    if torch:
        specs += [PassSpec("dataloader", path, n, rows, n_rows) for n in procs]
    return specs


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def measure(files: dict[Codec, str], settings: ScalingSettings, log: Callable[[str], None]
            ) -> "tuple[list[ScalingFigure], list[dict[str, Any]]]":
    """Every contender on every file, the inflate and memcpy passes, ``repeats`` rounds interleaved: (figures, raw passes)."""
    procs = procs_list(settings.max_procs)
    n_rows = settings.mib * (1 << 20) // ROW_NBYTES
    plan = [(c.label, s) for c, path in files.items() for s in contenders(path, n_rows, block_rows(path), procs,
                                                                          torch_available())]
    ends = sorted({1, procs[-1]})
    plan += [(c.label, PassSpec("inflate", path, n, memcpy_mib=settings.memcpy_mib))
             for c, path in files.items() if c.complib == "zlib" for n in ends]
    plan += [("", PassSpec("memcpy", n=n, memcpy_mib=settings.memcpy_mib)) for n in ends]
    raw: list[dict[str, Any]] = []
    done: dict[int, list[PassResult]] = {}
    servers = PassServers()
    try:
        for r in range(settings.repeats):
            for i, (label, spec) in enumerate(plan):
                resident = 1.0
                if spec.path:
                    if resident_fraction(spec.path) < 0.99:
                        read_through_cache(spec.path)
                    resident = resident_fraction(spec.path)
                result = servers.run(spec)
                if spec.kind not in ("memcpy", "inflate") and result.rows != n_rows:
                    raise RuntimeError(f"{spec.kind} n={spec.n} read {result.rows} rows of {spec.path}, which has {n_rows}")
                done.setdefault(i, []).append(result)
                raw.append({"repeat": r, "codec": label, "spec": asdict(spec), "resident": resident, **asdict(result)})
                parts = ", ".join(f"{k} {v:.3f}" for k, v in (result.phases or {}).items())
                log(f"scaling {r + 1}/{settings.repeats} {label or 'memory'}: {spec.kind} n={spec.n}: "
                    f"{result.nbytes / result.seconds / MB:,.0f} MB/s ({result.seconds:.3f} s{': ' + parts if parts else ''})")
    finally:
        servers.close()
    return [_figure(label, spec, done[i]) for i, (label, spec) in enumerate(plan)], raw


def _figure(codec: str, spec: PassSpec, results: Sequence[PassResult]) -> ScalingFigure:
    rates = tuple(r.nbytes / r.seconds / MB for r in results)
    last = results[-1]
    counters = None
    windows = [r.counters for r in results if r.counters]
    if windows:
        counters = {k: statistics.median(w[k] for w in windows) for k in windows[0]}
    counted = [r.readers_counted for r in results if r.readers_counted]
    seen = f"{min(c for c, _ in counted)}/{counted[0][1]}" if counted else ""
    return ScalingFigure(codec, spec.kind, spec.n, statistics.median(rates), rates, last.n_used, last.engine,
                         last.block_rows or spec.block_rows, counters, seen)


def machine_facts(figures: Sequence[ScalingFigure]) -> dict[str, Any]:
    """Cores, threads per core, CPU, memory, the CPU quota (CPUs' worth; None: none) and the memory copy rates
    measured (GB/s)."""
    # Imported here: the GPU section's run against an older package (lent_machine.sh's gpu-before) imports this
    # module through the command line's, with a package that may not have this function.
    from multitables._sys.cgroups import cpu_quota

    copies = {f.n: f.mb_per_s * MB / 1e9 for f in figures if f.kind == "memcpy"}
    return {"cores": usable_cpus(), "cpus": os.cpu_count(), "threads_per_core": threads_per_core(), "cpu": cpu_model(),
            "memory_bytes": memory_bytes(), "cpu_quota": cpu_quota(), "memcpy_gb_per_s": copies}


@dataclass(frozen=True)
class ScalingRun:
    """A run of the section: its settings, figures, the machine's facts, and every pass as measured."""

    settings: ScalingSettings
    n_rows: int
    #: File bytes of each codec's file.
    file_nbytes: dict[str, int]
    figures: tuple[ScalingFigure, ...]
    machine: dict[str, Any]
    passes: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {"section": "scaling", "pages_per_gib": pages_per_gib(), "fault_target": FAULT_TARGET, **asdict(self)}


def run_scaling(settings: ScalingSettings, workdir: str, log: Callable[[str], None]) -> ScalingRun:
    """Write (or reuse) the files and measure.

    Files written in ``workdir`` (no ``--file``) are removed; those named
    after ``--file`` are kept for the next run to reuse.
    """
    n_rows = settings.mib * (1 << 20) // ROW_NBYTES
    files = file_paths(settings.file) if settings.file else {c: os.path.join(workdir, f"scaling-{c.label}.h5")
                                                              for c in CODECS}
    try:
        for codec, path in files.items():
            ensure_file(path, codec, n_rows, log)
        figures, raw = measure(files, settings, log)
        sizes = {c.label: os.path.getsize(p) for c, p in files.items()}
    finally:
        if not settings.file:
            for path in files.values():
                if os.path.exists(path):
                    os.remove(path)
    return ScalingRun(settings, n_rows, sizes, tuple(figures), machine_facts(figures), tuple(raw))
