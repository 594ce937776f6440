"""What fits in shared memory: /dev/shm's free space and the memory cgroup's, checked before a segment is made.

The free space of /dev/shm (statvfs) and the tightest memory limit of this
process's cgroup and its ancestors (shared memory is charged to it, and past
it the OOM killer ends a process instead of any error) are compared with what
a segment needs before anything is created (:func:`check_space`), and read by
the plan so that the defaults fit (:func:`shared_memory_free`; NOTE [read
plan] in ``_plan.readers``). NOTE [segment lifetime] in ``segment`` says how
the pages are then reserved.
"""

from __future__ import annotations

import errno
import os
import weakref
from contextlib import contextmanager
from typing import Any, Iterator

from .._sys.cgroups import cgroup_dirs
from ..errors import ShmSpaceError

SHM_DIR = "/dev/shm"


#: This process's segments whose pages are allocated after their creation, by the readers that map them (a ring's
#: slots: NOTE [slots and page tables] in ``ring``); each has ``unallocated()``, the bytes still to come.
_promised: "weakref.WeakSet[Any]" = weakref.WeakSet()


def promise(segment: Any) -> None:
    """Count ``segment``'s pages not yet allocated as taken, until they are (or it is closed): /dev/shm's statvfs
    and the memory cgroup see them only once its readers map them, after the stream that made it has started, so
    that a stream made right after another would be sized, and checked, against space the first one takes."""
    _promised.add(segment)


def promised_bytes() -> int:
    """Bytes this process's rings will still take from /dev/shm (and its memory cgroup) as their readers map them."""
    return sum(segment.unallocated() for segment in list(_promised))


def shm_free_bytes() -> "int | None":
    """Bytes free in /dev/shm, less what this process's rings will still take (:func:`promise`); None where it cannot
    be told."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return max(0, st.f_bavail * st.f_frsize - promised_bytes())


def shared_memory_free() -> "int | None":
    """Bytes of shared memory a new segment can take: /dev/shm's free space, or this process's memory cgroup's where
    less (what :func:`check_space` checks); None where neither can be told."""
    cgroup = cgroup_free_bytes()
    free = [n for n in (shm_free_bytes(), None if cgroup is None else cgroup[0]) if n is not None]
    return min(free) if free else None


#: What the caller can make smaller, by what needs the memory (the ``what`` of :func:`check_space`).
_SMALLER = {
    "The ring": "a smaller read_ahead or block_size",
    "The stage": "a smaller stage or fewer stages",
    "The stage's row positions": "fewer scattered rows a request (a slice needs none)",
    "The request inboxes": "fewer readers (n_procs)",
    "The Reader's semaphores": "a smaller max_stages or fewer readers (n_procs)",
}
#: What is many files, each an inode: fewer of them help a /dev/shm out of inodes too.
_FEWER_FILES = frozenset({"The Reader's semaphores"})


def _amount(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB ({nbytes:,} bytes)"  # the bytes: rounding could hide a few pages short


def space_error(nbytes: int, free: "int | None", what: str, advice: "str | None" = None) -> ShmSpaceError:
    """The error for ``what`` needing ``nbytes`` of /dev/shm where ``free`` are free (None: not known); ``advice``:
    what the caller can make smaller, where it says more than ``what`` alone."""
    short = ""
    if free is not None:  # enough free yet short: posix_fallocate failed, something took it meanwhile
        short = f": {nbytes - free:,} bytes short" if free < nbytes else ", yet it could not be reserved"
    smaller = advice or _SMALLER.get(what)
    return ShmSpaceError(
        f"{what} {_needs(what)} {_amount(nbytes)} of shared memory but {SHM_DIR} has "
        f"{'an unknown amount' if free is None else _amount(free)} free{short}. "
        f"{f'Use {smaller}, or give' if smaller else 'Give'} the machine or container more shared "
        f"memory (for Docker: --shm-size)."
    )


def inode_error(what: str) -> ShmSpaceError:
    """The error for ``what`` that could not be created: /dev/shm has no inode left (ENOSPC at the name)."""
    try:
        st = os.statvfs(SHM_DIR)
        counts = f" ({st.f_favail:,} of {st.f_files:,} free now)"
    except OSError:
        counts = ""
    fewer = f", use {_SMALLER[what]}" if what in _FEWER_FILES else ""
    return ShmSpaceError(
        f"{what} cannot be created: {SHM_DIR} ran out of inodes for new files{counts}, whatever space it has. "
        f"Remove files no longer needed from {SHM_DIR}{fewer}, or mount it with more inodes (tmpfs option nr_inodes)."
    )


@contextmanager
def semaphores_for(what: str) -> Iterator[None]:
    """Semaphores and locks shared with readers, made inside: each is a file in /dev/shm too, so a /dev/shm out of
    space or inodes is a :class:`ShmSpaceError` naming ``what`` rather than a bare ENOSPC that reads like a full
    disk; another OSError gets a note naming ``what`` and /dev/shm."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            where = f"(while making {what[0].lower()}{what[1:]} in {SHM_DIR})"
            if hasattr(exc, "add_note"):  # Python 3.11: the error as it came, with where it came from
                exc.add_note(where)
                raise
            # Python 3.10 has no notes: the same kind of error, saying where, with the one that came as its cause.
            raise OSError(exc.errno, f"{exc.strerror} {where}", exc.filename) from exc
        page, free = os.sysconf("SC_PAGE_SIZE"), shm_free_bytes()  # a semaphore takes a page
        if free is not None and free >= page:  # space enough: the inodes ran out (the count may be back meanwhile)
            raise inode_error(what) from exc
        raise space_error(page, free, what) from exc


#: A memory limit at or above this is "no limit" (cgroup v1 writes 2**63 rounded down to a page).
_NO_LIMIT = 1 << 62


def _read_int(path: str) -> "int | None":
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def _reclaimable(directory: str) -> int:
    """Page cache of files in a memory cgroup (shared memory is not part of it): the kernel frees it for us."""
    stat: dict[str, int] = {}
    try:
        with open(os.path.join(directory, "memory.stat")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                stat[key] = int(value)
    except (OSError, ValueError):
        return 0
    # v1 counts the subtree under total_* (as its usage does); v2 has only the plain names, for the subtree.
    prefix = "total_" if "total_active_file" in stat else ""
    return stat.get(prefix + "active_file", 0) + stat.get(prefix + "inactive_file", 0)


def cgroup_free_bytes() -> "tuple[int, int, int] | None":
    """``(free, limit, used)`` of the tightest memory cgroup this process is in, or None where none limits it.

    Shared memory is charged to the cgroup of the process that touches it;
    past the limit the kernel's OOM killer ends a process instead of any
    error. ``used`` leaves out the file cache the kernel would reclaim, and counts what this process's rings will
    still take (:func:`promise`).
    """
    tightest = None
    for directory, limit_file in cgroup_dirs("memory", "memory.limit_in_bytes", "memory.max"):
        usage_file = "memory.current" if limit_file == "memory.max" else "memory.usage_in_bytes"
        limit = _read_int(os.path.join(directory, limit_file))
        used = _read_int(os.path.join(directory, usage_file))
        if limit is None or used is None or limit >= _NO_LIMIT:
            continue
        used = max(0, used - _reclaimable(directory))
        free = max(0, limit - used)
        if tightest is None or free < tightest[0]:
            tightest = (free, limit, used)
    promised = promised_bytes() if tightest is not None else 0
    if promised and tightest is not None:  # charged to the cgroup once the readers map them (the readers are in it too)
        free, limit, used = tightest
        tightest = (max(0, free - promised), limit, used + promised)
    return tightest


def check_space(nbytes: int, what: str = "The ring", advice: "str | None" = None) -> None:
    """Raise :class:`ShmSpaceError` now if ``nbytes`` cannot fit in /dev/shm's free space or this process's memory
    cgroup; ``advice`` as for :func:`space_error`."""
    free = shm_free_bytes()
    if free is not None and nbytes > free:
        raise space_error(nbytes, free, what, advice)
    cgroup = cgroup_free_bytes()
    if cgroup is not None and nbytes > cgroup[0]:
        raise _cgroup_error(nbytes, cgroup, what, advice)


def _needs(what: str) -> str:
    """The verb for ``what``: its names of several things ("The Reader's semaphores") take "need"."""
    return "need" if what.endswith(("semaphores", "positions")) else "needs"


def _cgroup_error(nbytes: int, cgroup: tuple[int, int, int], what: str, advice: "str | None") -> ShmSpaceError:
    free, limit, used = cgroup
    smaller = advice or _SMALLER.get(what)
    return ShmSpaceError(
        f"{what} {_needs(what)} {_amount(nbytes)} of shared memory, which counts against this process's memory cgroup "
        f"(a container's memory limit): its limit is {_amount(limit)}, {_amount(used)} in use, so "
        f"{_amount(free)} free: {nbytes - free:,} bytes short (past the limit the kernel kills a process rather "
        f"than fail). {f'Use {smaller}, or raise' if smaller else 'Raise'} the container's memory limit."
    )
