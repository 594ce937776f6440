"""A spinning disk (or a RAID 0 of two) modelled under the reads of every process: what readers cost on an HDD.

Parallel readers that each read their own blocks make a disk's head seek
between them; the established benchmark's HDD table lost half its rate that
way. This VM has no spinning disk, so the benchmark can run its readers
through a model of one (``multitables-benchmark --disk-model hdd|raid0``).

The mechanism: an ``LD_PRELOAD`` shim (``diskmodel.c`` beside this file,
compiled with ``gcc`` on first use into a cache directory, never committed)
wraps ``read``, ``readv``, ``pread``, ``preadv``, ``preadv2`` (and their
``64`` and fortified ``_chk`` twins), ``posix_fadvise`` and ``syscall`` (for
``cachestat`` only). A read of a
regular file under the model's root directory, while the model is enabled,
is done for real, then charged to the model: each disk it touches takes it
in arrival order once its earlier requests are done (one FIFO queue per
disk), adds a **seek** (default 8 ms) unless it continues where that disk's
previous request ended, and transfers at the **rate** (default 150 MB/s);
the caller sleeps until its last disk is done. The heads, queues, page cache
and counters live in one state file that every process maps
(``$MULTITABLES_DISKMODEL``), updated under a lock, so all processes
reading the file share one head per disk: that is the point. **RAID 0**
stripes the file over two such disks at 64 KiB (stripe ``k`` on disk
``k % 2``); a read spanning stripes goes to both, each disk taking its part
as one request, in parallel. It needs no root and no FUSE, so it runs on CI
too; only processes started with the shim in their environment are
modelled, so the benchmark re-runs itself under it (:func:`run_modelled`),
and multiprocessing's children inherit it (fork and spawn are tested).

Three things a real disk behind Linux does are modelled, because without
them the model would misjudge exactly the readers it exists to compare:

* **a page cache in front** (``page_cache=True``, ``--no-disk-page-cache``
  to drop it): emptied before every pass; a read through it takes from the
  disk only the whole pages it lacks, so the file's metadata and chunk
  index, which every reader process reads again, cost seeks once per pass,
  not once per process. ``O_DIRECT`` reads bypass it.
* **``POSIX_FADV_WILLNEED``** (multitables' prefetch): the disk queues a
  read of the hinted pages not yet cached and the caller goes on; a later
  read of those pages waits until the disk has them. ``cachestat(2)``
  (how multitables asks whether bytes are cached before it hints them,
  through ``syscall(3)``) counts the pages the modelled page cache holds,
  arrived; otherwise it would count the real cache's, which holds the file.
* **the drive's read look-ahead** (``readahead``, default 1 MiB; 0 drops
  it): after a request the disk reads on while idle, so a request that
  starts at most that far past the previous one's end is no seek (the disk
  streams over the gap, at the rate), and a synchronous sequential reader
  that decodes between reads keeps the disk streaming, as real drives do.

What it does not model: seek time growing with distance and rotational
latency (every seek costs the same, 8 ms by default, a short one as a long
one); the drive's cache beyond its look-ahead (a re-read of bytes the page
cache no longer has is a fresh read); NCQ or an I/O scheduler reordering or
merging queued requests (FIFO per disk); the kernel's own readahead on
buffered reads, which would turn a reader's small sequential reads into
larger requests (the drive's look-ahead stands in for it for one stream,
not for several interleaved ones); memory pressure on the page cache (it
holds a whole file, up to 4 GiB, for the pass); ``mmap`` and asynchronous
I/O (never seen); writes. The real read under the model is served from
wherever the file is: the benchmark keeps it in this machine's page cache,
so that its own disk adds nothing.

Accounting, which the tests assert on: :meth:`DiskModel.stats` gives the
read calls seen and those the page cache served, the hints, the bytes the
disks transferred, the seeks (per disk and in all), the reads that spanned
more than one disk and the seconds callers slept.

FUSE was the alternative: a passthrough file system sees the kernel's
requests after the real page cache and readahead, but it needs
``fusermount`` and libfuse (on neither this VM nor CI) or root, and a
Python daemon on two cores would compete with the readers it measures.

Measured on this 2-core VM (``python -m multitables_bench.diskmodel_fidelity FILE
hdd|raid0``, a 1 GiB file in this machine's page cache, default
parameters; each pattern run in fresh processes):

=================================================================  =========  ==========  =====
pattern                                                            predicted  hdd         seeks
=================================================================  =========  ==========  =====
one process in order, 4 MiB reads                                  150 MB/s   149.4 MB/s  1
one process in order, 64 KiB reads                                 150        149.4       1
... the same with no look-ahead (``readahead=0``)                             135.9       1
one process, 4 MiB reads alternating between the file's halves     116.6      115.9       256
two processes at once, each its own half in order, 4 MiB reads     116.6      116.3       256
=================================================================  =========  ==========  =====

Predicted: 4 MiB / (8 ms + 4 MiB / 150 MB/s) for a seek per read. Without
look-ahead the disk idles ~50 us between a reader's small reads (its wake-up
and the next call), which is the 10% lost. ``raid0`` (two disks): in order,
297.4 MB/s with 4 MiB reads and 296.9 with 64 KiB (300 predicted; 2 seeks,
one per disk); alternating halves 189.1 MB/s and two processes 190.0 (each 4
MiB read is 2 MiB per disk: 4 MiB / (8 ms + 2 MiB / 150 MB/s) = 190.8
predicted; 512 seeks, 256 per disk). The disks are busy 99.3-99.8% of the
wall time in every pattern but the no-look-ahead one: the model's own
overhead (a lock, a clock read, an ``fstat`` and ``fcntl`` per call) is lost
in the sleeps.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import mmap
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Sequence

__all__ = [
    "KINDS",
    "SEEK_MS",
    "DISK_MBPS",
    "STRIPE",
    "READAHEAD",
    "DiskStats",
    "DiskModel",
    "build_shim",
    "current",
    "run_modelled",
]

#: The models: disks in the array (RAID 0 when more than one).
KINDS = {"hdd": 1, "raid0": 2}
#: Default seek: an average 7200 rpm seek plus half a rotation, about.
SEEK_MS = 8.0
#: Default sustained rate of one disk, MB/s (10**6 bytes).
DISK_MBPS = 150.0
#: Default bytes a disk reads on past a read into its buffer while idle (a drive's read look-ahead; 0: none).
READAHEAD = 1 << 20
#: RAID 0 stripe (chunk) size: mdadm's default chunk is 512 KiB, many controllers use 64 KiB.
STRIPE = 64 << 10
#: The environment variable naming the state file; the shim maps it in every process that has it.
ENV_STATE = "MULTITABLES_DISKMODEL"
SOURCE = Path(__file__).with_name("diskmodel.c")

_MAGIC = 0x4C444D44
_VERSION = 4
_MAX_DISKS = 8
_ROOT_MAX = 4096
_CACHE_FILES = 4
_CACHE_PAGES = 1 << 20
_INFLIGHT = 64


class _Disk(ctypes.Structure):
    """``struct dm_disk`` of ``diskmodel.c``."""

    _fields_ = [
        ("head_dev", ctypes.c_int64),
        ("head_ino", ctypes.c_int64),
        ("head_off", ctypes.c_int64),
        ("busy_until_ns", ctypes.c_int64),
        ("reads", ctypes.c_uint64),
        ("seeks", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("busy_ns", ctypes.c_uint64),
    ]


class _Inflight(ctypes.Structure):
    """``struct dm_inflight``: a hinted read, and when the disk is done with it."""

    _fields_ = [("start", ctypes.c_int64), ("end", ctypes.c_int64), ("done_ns", ctypes.c_int64)]


class _CachedFile(ctypes.Structure):
    """``struct dm_cached_file``: which pages of one file the page cache model holds, and the hinted reads in flight."""

    _fields_ = [
        ("dev", ctypes.c_int64),
        ("ino", ctypes.c_int64),
        ("next_inflight", ctypes.c_int64),
        ("inflight", _Inflight * _INFLIGHT),
        ("pages", ctypes.c_uint64 * (_CACHE_PAGES // 64)),
    ]


class _State(ctypes.Structure):
    """``struct dm_state`` of ``diskmodel.c`` (the shim checks the magic and version; the tests check the size)."""

    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("lock", ctypes.c_int32),
        ("enabled", ctypes.c_int32),
        ("seek_ns", ctypes.c_int64),
        ("bytes_per_s", ctypes.c_int64),
        ("stripe", ctypes.c_int64),
        ("readahead", ctypes.c_int64),
        ("n_disks", ctypes.c_int32),
        ("root_gen", ctypes.c_uint32),
        ("page_cache", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("calls", ctypes.c_uint64),
        ("cached_calls", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("seeks", ctypes.c_uint64),
        ("split_calls", ctypes.c_uint64),
        ("sleep_ns", ctypes.c_uint64),
        ("hints", ctypes.c_uint64),
        ("root", ctypes.c_char * _ROOT_MAX),
        ("disks", _Disk * _MAX_DISKS),
        ("cache", _CachedFile * _CACHE_FILES),
    ]


@dataclass(frozen=True)
class DiskCounters:
    """One disk's share: requests it served, seeks it made, bytes, seconds busy."""

    reads: int
    seeks: int
    bytes: int
    busy_s: float


@dataclass(frozen=True)
class DiskStats:
    """What the model charged since it was created or last reset."""

    #: Read calls seen (a call spanning two disks counts once here, once on each disk).
    calls: int
    #: ... of which the page cache model served every byte (no disk touched).
    cached_calls: int
    #: Bytes the disks transferred (whole pages, with the page cache model).
    bytes: int
    #: Seeks on all disks together.
    seeks: int
    #: Calls that spanned more than one disk (RAID 0).
    split_calls: int
    #: Seconds the callers slept, all together.
    sleep_s: float
    disks: tuple[DiskCounters, ...]
    #: ``POSIX_FADV_WILLNEED`` hints seen (each queues a read of the pages not yet cached).
    hints: int = 0

    def summary(self) -> str:
        """One line for a log: seeks (per disk with RAID), reads, bytes."""
        per_disk = "" if len(self.disks) == 1 else " (" + " + ".join(str(d.seeks) for d in self.disks) + ")"
        return (f"model: {self.seeks} seeks{per_disk}, {self.calls} reads ({self.cached_calls} cached), {self.hints} hints, "
                f"{self.bytes / 1e6:,.0f} MB")


def _cache_dir() -> Path:
    """Where the compiled shim is kept: ``$MULTITABLES_BENCH_CACHE``, else ``$XDG_CACHE_HOME``/``~/.cache``."""
    explicit = os.environ.get("MULTITABLES_BENCH_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "multitables_bench"


def build_shim(cache_dir: "str | os.PathLike[str] | None" = None, cc: str = "gcc") -> Path:
    """The compiled shim, built from ``diskmodel.c`` if this source has not been built into ``cache_dir`` yet.

    Named by the source's hash, written under a temporary name and renamed,
    so that concurrent builds and edits of the source never see a stale or
    half-written library. Raises ``RuntimeError`` with the compiler's
    message if it fails, or if there is no compiler.
    """
    source = SOURCE.read_bytes()
    directory = Path(cache_dir) if cache_dir is not None else _cache_dir()
    target = directory / f"diskmodel-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".diskmodel-", suffix=".so", dir=directory)
    os.close(fd)
    cmd = [cc, "-O2", "-Wall", "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-ldl"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        os.unlink(tmp)
        raise RuntimeError(f"the disk model needs a C compiler to build its shim; {cc!r} was not found") from None
    if done.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"building the disk model's shim failed ({' '.join(cmd)}):\n{done.stderr}")
    os.replace(tmp, target)
    return target


class DiskModel:
    """The model's shared state: create it (:meth:`create`), hand :meth:`env` to the processes to model, read :meth:`stats`.

    The process that creates the state file owns it and removes it on
    :meth:`close`; processes that find it in their environment attach
    (:func:`current`). Charging is off until :meth:`charging` turns it on,
    so that writing a file or warming the page cache costs no model time.
    """

    def __init__(self, path: "str | os.PathLike[str]", shim: "Path | None", owner: bool) -> None:
        self.path = os.fspath(path)
        self.shim = shim
        self._owner = owner
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._mm = mmap.mmap(fd, ctypes.sizeof(_State))
        finally:
            os.close(fd)
        self._state: "_State | None" = _State.from_buffer(self._mm)
        s = self._state
        if s.magic != _MAGIC or s.version != _VERSION:
            self.close()
            raise ValueError(f"{self.path} is not a version {_VERSION} disk-model state file")

    @classmethod
    def create(
        cls,
        directory: "str | os.PathLike[str]",
        kind: str = "hdd",
        seek_ms: float = SEEK_MS,
        mbps: float = DISK_MBPS,
        stripe: int = STRIPE,
        readahead: int = READAHEAD,
        page_cache: bool = True,
        shim: "Path | None" = None,
    ) -> "DiskModel":
        """A new model of ``kind`` (a key of :data:`KINDS`) with its state file in ``directory``, charging off.

        ``page_cache``: model a page cache in front of the disks (reads not
        opened ``O_DIRECT`` read a page from the disk once per pass).
        ``shim`` is the compiled library (:func:`build_shim` when None).
        """
        if kind not in KINDS:
            raise ValueError(f"unknown disk model {kind!r}; the models are {', '.join(KINDS)}")
        if seek_ms < 0 or mbps <= 0 or stripe <= 0 or readahead < 0:
            raise ValueError("the disk model needs seek_ms >= 0, mbps > 0, stripe > 0 and readahead >= 0; "
                             f"got {seek_ms}, {mbps}, {stripe}, {readahead}")
        shim = shim if shim is not None else build_shim()
        state = _State(magic=_MAGIC, version=_VERSION, seek_ns=round(seek_ms * 1e6), bytes_per_s=round(mbps * 1e6),
                       stripe=stripe, readahead=readahead, n_disks=KINDS[kind],
                       page_cache=int(page_cache))
        for disk in state.disks:
            disk.head_ino = -1
        fd, path = tempfile.mkstemp(prefix="diskmodel-", suffix=".state", dir=directory)  # O_EXCL, 0600
        try:
            os.ftruncate(fd, ctypes.sizeof(_State))  # the page cache's bitmaps stay sparse until used
            os.pwrite(fd, bytes(state)[: _State.cache.offset], 0)
        finally:
            os.close(fd)
        return cls(path, shim, owner=True)

    @property
    def _s(self) -> _State:
        if self._state is None:
            raise ValueError(f"the disk model {self.path} is closed")
        return self._state

    @property
    def kind(self) -> str:
        return next((k for k, n in KINDS.items() if n == self._s.n_disks), f"raid0 x{self._s.n_disks}")

    def describe(self) -> str:
        """The model's parameters in words, for a report."""
        s = self._s
        disk = f"{s.seek_ns / 1e6:g} ms per seek, {s.bytes_per_s / 1e6:g} MB/s, {s.readahead >> 10} KiB read-ahead"
        cache = "a page cache in front, emptied before every pass" if s.page_cache else "no page cache in front"
        if s.n_disks == 1:
            return f"hdd: one disk, {disk}; {cache}"
        return f"raid0: {s.n_disks} disks striped at {s.stripe >> 10} KiB, each {disk}; {cache}"

    def env(self, base: "Mapping[str, str] | None" = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) with the shim preloaded and the state file named: for processes to model."""
        if self.shim is None:
            raise ValueError("this model was attached without its shim's path; only its creator hands out environments")
        env = dict(os.environ if base is None else base)
        preload = env.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = f"{self.shim}:{preload}" if preload else str(self.shim)
        env[ENV_STATE] = self.path
        return env

    def set_root(self, root: "str | os.PathLike[str]") -> None:
        """Charge reads of files under ``root`` (a directory, or one file)."""
        encoded = os.fsencode(os.path.abspath(root))
        if len(encoded) >= _ROOT_MAX:
            raise ValueError(f"the disk model's root is limited to {_ROOT_MAX - 1} bytes: {root!r}")
        s = self._s
        s.root = encoded
        s.root_gen += 1

    @property
    def enabled(self) -> bool:
        return bool(self._s.enabled)

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._s.enabled = int(on)

    @contextlib.contextmanager
    def charging(self, root: "str | os.PathLike[str] | None" = None) -> Iterator["DiskModel"]:
        """Reset the heads and counters, then charge reads (under ``root`` if given) until the block ends."""
        if root is not None:
            self.set_root(root)
        self.reset()
        self.enabled = True
        try:
            yield self
        finally:
            self.enabled = False

    def reset(self) -> None:
        """Zero the counters, forget the heads, empty the queues and the page cache; call it with no read in flight."""
        s = self._s
        s.calls = s.cached_calls = s.bytes = s.seeks = s.split_calls = s.sleep_ns = s.hints = 0
        ctypes.memset(ctypes.addressof(s.cache), 0, ctypes.sizeof(s.cache))
        for disk in s.disks:
            disk.head_dev, disk.head_ino, disk.head_off, disk.busy_until_ns = 0, -1, 0, 0
            disk.reads = disk.seeks = disk.bytes = disk.busy_ns = 0

    def stats(self) -> DiskStats:
        s = self._s
        disks = tuple(DiskCounters(d.reads, d.seeks, d.bytes, d.busy_ns / 1e9) for d in s.disks[: s.n_disks])
        return DiskStats(s.calls, s.cached_calls, s.bytes, s.seeks, s.split_calls, s.sleep_ns / 1e9, disks, s.hints)

    def close(self) -> None:
        """Unmap the state; its creator also removes the file. Idempotent."""
        self._state = None
        if not self._mm.closed:
            self._mm.close()
        if self._owner:
            self._owner = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> "DiskModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_current: "list[DiskModel | None]" = []


def shim_loaded() -> bool:
    """Whether this process runs with the disk model's shim preloaded (its library is mapped)."""
    try:
        with open("/proc/self/maps") as f:
            return any("/diskmodel-" in line and line.rstrip().endswith(".so") for line in f)
    except OSError:  # pragma: no cover - not Linux
        return False


def current() -> "DiskModel | None":
    """The model this process was started under (``$MULTITABLES_DISKMODEL`` with the shim loaded), or None.

    Raises ``RuntimeError`` if the variable is set but the shim is not
    loaded: the loader refused it, and reads would silently go unmodelled.
    """
    if not _current:
        path = os.environ.get(ENV_STATE)
        if not path:
            _current.append(None)
        elif not shim_loaded():
            raise RuntimeError(f"${ENV_STATE} is set ({path}) but the disk model's shim is not loaded (LD_PRELOAD="
                               f"{os.environ.get('LD_PRELOAD', '')!r}): the loader refused it, see its message above")
        else:
            _current.append(DiskModel(path, None, owner=False))
    return _current[0]


def run_modelled(
    argv: Sequence[str],
    kind: str,
    seek_ms: float = SEEK_MS,
    mbps: float = DISK_MBPS,
    readahead: int = READAHEAD,
    page_cache: bool = True,
    module: str = "multitables_benchmark",
) -> int:
    """Run ``python -m module argv`` with every process it starts reading through a new model; return its exit code.

    The model's state file lives in a temporary directory removed afterwards.
    The package's parent directory goes on ``PYTHONPATH``, after what is
    there, so the child imports this same code wherever it was started from,
    or the copy of multitables a given ``PYTHONPATH`` names (an A/B).
    """
    with tempfile.TemporaryDirectory(prefix="multitables_diskmodel_") as tmp:
        with DiskModel.create(tmp, kind, seek_ms, mbps, readahead=readahead, page_cache=page_cache) as model:
            env = model.env()
            here = str(Path(__file__).resolve().parents[1])
            env["PYTHONPATH"] = (env["PYTHONPATH"] + os.pathsep if env.get("PYTHONPATH") else "") + here
            return subprocess.run([sys.executable, "-m", module, *argv], env=env).returncode
