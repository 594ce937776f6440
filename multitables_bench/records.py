"""What the benchmark measures and reports, as frozen records, and the constants they share.

The bottom of the package: it imports nothing of it. A :class:`Pass` is one
timed read of a whole file; a :class:`Result` sums up the passes of one
(file, reader); :class:`Settings` is the parsed command line and
:class:`Context` everything a report says besides the results.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

ROW_VALUES = 1024
ROW_NBYTES = ROW_VALUES * np.dtype(np.float32).itemsize
NODE = "/data"
GiB = 1 << 30
#: Megabyte as reported: 10**6 bytes (the established benchmark used 2**20).
MB = 1e6
#: A cold pass that starts with more than this fraction of the file cached is marked.
COLD_TOLERANCE = 0.01

ENGINES = ("chunks", "h5py", "tables")
#: The single-process readers a user without multitables would write: the baselines of every ratio.
USER_ENGINES = ("h5py", "tables")
MODES = ("direct", "generator")
#: What the generated files hold (``--data``), written by :func:`multitables_bench.files.make_rows`.
DATA = {
    "noise": "random normal float32 (does not compress: the figures show decompression overhead only)",
    "smooth": "a random walk along each row in whole steps of -8..8, stored as float32 like sensor counts "
              "(compresses several times)",
}
#: The data of the established benchmark, and of a run that does not say.
DEFAULT_DATA = "noise"


@dataclass(frozen=True, order=True)
class Codec:
    """How a file is compressed; complevel 0 is stored uncompressed whatever the library (``complib='none'``).

    A user's dataset (``--read``) has complevel 0 and its HDF5 filters as ``complib`` (``shuffle+deflate(3)``).
    """

    complib: str
    complevel: int

    @property
    def label(self) -> str:
        return self.complib if self.complevel == 0 else f"{self.complib}-{self.complevel}"


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
    """A dataset read by every pass: ``key`` is ``"main"`` for the benchmark file, the small file's name, or a user's
    ``FILE:DATASET`` (``--read``)."""

    key: str
    path: str
    codec: Codec
    n_rows: int
    chunk_rows: "int | None" = None
    #: What the file holds: a key of :data:`DATA`, or :data:`READ_DATA`.
    data: str = DEFAULT_DATA
    #: The dataset in the file, the shape of one row and its numpy dtype.
    node: str = NODE
    row_shape: tuple[int, ...] = (ROW_VALUES,)
    dtype: Any = np.dtype(np.float32)
    #: Bytes the dataset takes in the file (the compression ratio's denominator); None: the whole file's size.
    stored_nbytes: "int | None" = None

    @property
    def data_nbytes(self) -> int:
        """Uncompressed bytes of the dataset."""
        return self.n_rows * int(np.prod(self.row_shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


#: The data of a user's dataset (``--read``): what it holds is the user's.
READ_DATA = "read"


@dataclass(frozen=True)
class Dataset:
    """A user's dataset measured by ``--read``, as the report names it: ``key`` is its passes' target."""

    key: str
    file: str
    path: str
    shape: tuple[int, ...]
    dtype: str
    #: Bytes it takes in the file (HDF5's storage size) and uncompressed.
    stored_nbytes: int
    data_nbytes: int
    #: HDF5's filters in pipeline order, ``+``-joined (``none`` without any); deflate with its level.
    filters: str
    chunks: "tuple[int, ...] | None" = None


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
    #: What the file holds: a key of :data:`DATA`.
    data: str = DEFAULT_DATA
    #: Size of the file read (None in reports written before it was recorded).
    file_nbytes: "int | None" = None

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
    data: str = DEFAULT_DATA
    #: The same median in MB/s of the file's bytes (the data rate over the compression ratio); None if not recorded.
    file_mb_per_s: "float | None" = None
    #: The file's compression ratio, uncompressed data bytes / file bytes (None for O_DIRECT or if not recorded).
    file_ratio: "float | None" = None


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
    #: What to measure: "main" (the streaming matrix), "training", "random" (:mod:`multitables_bench.sections`).
    sections: tuple[str, ...] = ("main",)
    #: The kinds of data written (keys of :data:`DATA`), one file of each per codec.
    data: tuple[str, ...] = (DEFAULT_DATA,)
    #: ``--read``: the user's ``FILE:DATASET`` to measure instead of generated files (none: generate them).
    read: tuple[str, ...] = ()

    @property
    def n_rows(self) -> int:
        return max(1, int(self.size_gib * GiB) // ROW_NBYTES)

    @property
    def codecs(self) -> tuple[Codec, ...]:
        """Files to generate: complevel 0 once, whatever the libraries."""
        found = {make_codec(lib, lvl) for lib in self.complibs for lvl in self.complevels}
        return tuple(sorted(found, key=lambda c: (c.complevel != 0, self._lib_order(c.complib), c.complevel)))

    def _lib_order(self, complib: str) -> int:
        return self.complibs.index(complib) if complib in self.complibs else -1

    @property
    def small_codec(self) -> Codec:
        """The small files' codec: the first library at the middle complevel."""
        levels = sorted(self.complevels)
        level = levels[len(levels) // 2]
        return make_codec(self.complibs[0], level)


@dataclass(frozen=True)
class Context:
    """Everything the report says besides the results."""

    settings: Settings
    cache: str
    cache_note: str
    machine: dict[str, Any]
    versions: dict[str, str]
    notes: tuple[str, ...] = ()
    created: str = ""  #: when the passes were measured (a report rendered again keeps its run's time); "": now
    #: ``--read``: the user's datasets, in the order given.
    datasets: tuple[Dataset, ...] = ()


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


def make_codec(complib: str, complevel: int) -> Codec:
    """The :class:`Codec` of ``complib`` at ``complevel`` (``none`` at level 0)."""
    return Codec("none", 0) if complevel == 0 else Codec(complib, complevel)


def data_path(path: str, data: str, kinds: Sequence[str]) -> str:
    """Where the file of ``data`` is written: ``path`` itself in a noise-only run, else ``path`` with ``-<data>`` before its extension."""
    if tuple(kinds) == (DEFAULT_DATA,):
        return path
    root, ext = os.path.splitext(path)
    return f"{root}-{data}{ext}"


def single_engines(engines: Sequence[str]) -> list[str]:
    """The single-process readers of a run: the users' baselines always, the chunk engine when it is measured."""
    return [e for e in ENGINES if e in USER_ENGINES or e in engines]
