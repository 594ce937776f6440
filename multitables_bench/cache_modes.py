"""The benchmark's ``--cache`` modes: which one a run uses, the page cache before each pass, the Streamer's options.

The page-cache tools themselves are in :mod:`multitables_bench.cache`,
looked up there at each call (``pagecache.evict``), so that tests can
replace them.
"""

from __future__ import annotations

import functools
import os

from multitables_bench import cache as pagecache
from multitables_bench.files import read_through_cache
from multitables_bench.records import Settings

#: Bytes settled before a cold pass beyond the file's size: the ring and the readers' buffers.
SETTLE_EXTRA = 256 << 20
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
    evict_note = "evict: the file's pages are dropped from the page cache (fsync, POSIX_FADV_DONTNEED) before every pass"
    if settings.cache == "evict":
        return "evict", evict_note
    if settings.direct_off:
        return "evict", evict_note + " (--H5FD_DIRECT_OFF)"
    needed = sorted((set(settings.engines) | {"tables", "h5py"}) - {"chunks"})  # small files stream with engine auto
    lacking = [e for e in needed if not pagecache.direct_driver_available(e, directory)]
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
    memory settled (NOTE [free page reporting] in ``multitables_bench/cache.py``).
    """
    if cache == "warm":
        if pagecache.resident_fraction(path) < 1.0:
            read_through_cache(path)
    else:
        pagecache.evict(path)
        if _settles_memory():
            pagecache.settle_free_memory(os.path.getsize(path) + SETTLE_EXTRA)
    return pagecache.resident_fraction(path)


@functools.lru_cache(maxsize=1)
def _settles_memory() -> bool:
    """Whether cold passes settle memory first: on machines whose balloon reports free pages to the host."""
    return pagecache.free_page_reporting()


def open_kwargs_for(cache: str, engine: str) -> dict[str, str]:
    """The Streamer's options for this engine and cache mode: HDF5's direct driver, the chunk engine's O_DIRECT, or none."""
    if cache == "direct" or (cache == DIRECT_CHUNKS and engine == "chunks"):
        return dict(DIRECT_OPEN_KWARGS[engine])
    return {}
