"""Page-cache control for the benchmark: drop a file's pages, measure how much of it is cached, read it past the cache.

Linux only (``posix_fadvise``, ``mincore``, ``O_DIRECT``, sysfs). Nothing here
is part of the library; the benchmark (:mod:`multitables_bench.cache_modes`)
uses it to read from the disk rather than from memory, and, on virtual
machines that hand freed memory to their host, to start every cold pass in
the same state (NOTE [free page reporting]).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

__all__ = [
    "evict",
    "resident_fraction",
    "odirect_read_rate",
    "direct_driver_available",
    "free_page_reporting",
    "settle_free_memory",
    "PAGE_SIZE",
]

#: Bytes in one page of memory (the unit of the page cache).
PAGE_SIZE = mmap.PAGESIZE
#: Bytes per read in :func:`odirect_read_rate`.
ODIRECT_CHUNK = 4 << 20
#: Reads in flight in :func:`odirect_read_rate`: one synchronous stream leaves SSDs and RAID arrays idle between requests.
ODIRECT_DEPTH = 4

#: virtio device id of a memory balloon, and its feature bit "free page reporting".
_VIRTIO_BALLOON = 0x0005
_VIRTIO_BALLOON_F_REPORTING = 5

_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.restype = ctypes.c_int
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return libc


def _raise_errno(what: str, path: "str | os.PathLike[str]") -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}", os.fspath(path))


def evict(path: "str | os.PathLike[str]") -> None:
    """Drop ``path``'s pages from the page cache: ``fsync`` (dirty pages cannot be dropped), then ``POSIX_FADV_DONTNEED``.

    The kernel treats the advice as a hint: on tmpfs or ramfs the file *is*
    its pages and nothing is dropped. Check with :func:`resident_fraction`.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def free_page_reporting(sysfs: str = "/sys") -> bool:
    """Whether this machine is a virtual machine whose balloon reports free memory to the host.

    NOTE [free page reporting]
        A guest whose virtio balloon has the ``REPORTING`` feature hands the
        pages it frees back to the host a moment later (Linux batches them
        every ~2 s); the host drops them, and the guest's next use of each
        page faults on the host, which the guest sees as kernel time. A cold
        read fills the page cache with such pages, so on such a machine its
        speed depends on how long ago the memory it reuses was freed: on the
        development VM, ``benchmarks/free_page_reporting.py`` measured a
        buffered read of a 1 GiB file at about a third of the speed, with
        ten times the system time, when it started 5 s after the file's pages
        were dropped rather than at once (BENCHMARKS.md has the figures). In
        the benchmark that would make a pass's figure depend on the pass
        before it, not on the reader measured; :func:`settle_free_memory`
        evens that out.
    """
    root = os.path.join(sysfs, "bus", "virtio", "devices")
    try:
        devices = os.listdir(root)
    except OSError:
        return False
    for dev in devices:
        try:
            with open(os.path.join(root, dev, "device")) as f:
                if int(f.read().strip(), 16) != _VIRTIO_BALLOON:
                    continue
            with open(os.path.join(root, dev, "features")) as f:
                bits = f.read().strip()  # one '0' or '1' per feature bit, bit 0 first
        except (OSError, ValueError):
            continue
        if len(bits) > _VIRTIO_BALLOON_F_REPORTING and bits[_VIRTIO_BALLOON_F_REPORTING] == "1":
            return True
    return False


def settle_free_memory(nbytes: int) -> int:
    """Touch ``nbytes`` of fresh memory and free it again, so that the next ``nbytes`` the kernel hands out are backed.

    Under free page reporting (NOTE [free page reporting]) this makes every
    cold pass start alike: the page cache it fills reuses pages the host
    backs now, whatever ran before. Never touches more than half the
    available memory; returns the bytes touched. Costs ~0.3 s per GiB,
    outside any timer.
    """
    available = _available_memory()
    if available is not None:
        nbytes = min(nbytes, available // 2)
    if nbytes <= 0:
        return 0
    block = np.empty(nbytes, np.uint8)
    block[::PAGE_SIZE] = 1  # one write per page faults every page in
    del block
    return nbytes


def _available_memory() -> "int | None":
    """Bytes of memory available without swapping (``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):  # pragma: no cover - not Linux
        pass
    return None  # pragma: no cover


def resident_fraction(path: "str | os.PathLike[str]") -> float:
    """Fraction (0.0 to 1.0) of ``path``'s pages now in the page cache, from ``mincore`` on a mapping of the file.

    An empty file has no pages: 0.0. Mapping the file reads none of it.
    """
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    libc = _libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            _raise_errno("mmap", path)
        try:
            n_pages = (size + PAGE_SIZE - 1) // PAGE_SIZE
            vec = (ctypes.c_ubyte * n_pages)()
            if libc.mincore(addr, size, vec) != 0:
                _raise_errno("mincore", path)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    # Only the lowest bit of each byte says "resident"; the others are reserved.
    resident = int(np.count_nonzero(np.frombuffer(bytes(vec), dtype=np.uint8) & 1))
    return resident / n_pages


def odirect_read_rate(
    path: "str | os.PathLike[str]",
    chunk: int = ODIRECT_CHUNK,
    depth: int = ODIRECT_DEPTH,
    progress: "Callable[[int], object] | None" = None,
) -> float:
    """Read all of ``path`` with ``O_DIRECT`` (past the page cache, straight from the device); return bytes/s.

    ``depth`` threads each read every ``depth``-th ``chunk`` (bytes, a multiple
    of the page size) into their own anonymous mapping, page aligned as
    ``O_DIRECT`` requires, so that many requests are in flight as SSDs and
    RAID need. ``progress(n)`` is called with the bytes of each read (from the
    reading threads). Raises ``OSError`` (``EINVAL``) where the filesystem
    refuses ``O_DIRECT`` (tmpfs before Linux 6.6).
    """
    if chunk <= 0 or chunk % PAGE_SIZE:
        raise ValueError(f"chunk must be a positive multiple of {PAGE_SIZE} bytes, got {chunk}")
    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        with ThreadPoolExecutor(depth) as pool:
            t0 = time.perf_counter()
            total = sum(pool.map(lambda k: _read_stripe(fd, size, chunk, depth, k, progress), range(depth)))
            elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
    return total / max(elapsed, 1e-9)


def _read_stripe(fd: int, size: int, chunk: int, depth: int, k: int, progress: "Callable[[int], object] | None") -> int:
    """Read chunks ``k``, ``k + depth``, ... of the file; return the bytes read."""
    buf = mmap.mmap(-1, chunk)
    total = 0
    try:
        for offset in range(k * chunk, size, depth * chunk):
            n = os.preadv(fd, [buf], offset)
            total += n
            if progress is not None:
                progress(n)
    finally:
        buf.close()
    return total


def direct_driver_available(engine: str = "tables", directory: "str | os.PathLike[str] | None" = None) -> bool:
    """Whether HDF5's direct driver (``H5FD_DIRECT``, uncached reads) can be used by ``engine`` in ``directory``.

    The PyTables and h5py wheels are built without it. For ``tables`` this
    opens a scratch file in ``directory`` (default: the temporary directory)
    with ``driver="H5FD_DIRECT"``, so a filesystem that refuses ``O_DIRECT``
    also answers False; for ``h5py`` it asks ``h5py.registered_drivers()``.
    """
    if engine == "h5py":
        import h5py

        return "direct" in h5py.registered_drivers()
    if engine != "tables":
        raise ValueError(f"engine must be 'tables' or 'h5py', not {engine!r}")
    import tables

    with tempfile.TemporaryDirectory(prefix="multitables_direct_", dir=directory) as tmp:
        try:
            f = tables.open_file(os.path.join(tmp, "probe.h5"), "w", driver="H5FD_DIRECT")
        except Exception:  # "The H5FD_DIRECT driver is not available", or O_DIRECT refused
            return False
        f.close()
        return True
