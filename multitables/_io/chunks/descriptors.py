"""Local files open for ``pread``: one descriptor per file, open flags and advice, in each process.

NOTE [shared descriptors]
    Batches over many datasets open a source per dataset, and a source of a
    set opens each of its files (up to ``MAX_OPEN``, NOTE [file sets] in
    ``_io.fileset``): 300 datasets over 4 files held 1,200 descriptors in the
    process that read them, past the common soft limit of 1,024 (EMFILE).
    Reads here are ``os.pread``/``os.preadv``, which take their offset and
    leave the file position alone, so any number of sources may read through
    one descriptor, from any thread. :func:`open_shared` gives every opener of
    a file (``st_dev``, ``st_ino``), with the same flags (``O_DIRECT`` or not)
    and advice (``POSIX_FADV_RANDOM`` or not: advice is the open file's, so
    openers that advise differently keep apart), the one descriptor this
    process holds for it, counted; the last :meth:`Lease.release` closes
    it. 300 datasets over 4 files: 4 descriptors.

    The file is looked up by a ``stat`` of its name, before anything is
    opened: a hit needs no free descriptor (at the limit, reading goes on)
    and costs a ``stat`` where an open cost an ``open``. While an entry is
    held its inode cannot be freed, so (``st_dev``, ``st_ino``) names that
    file and no other; a name that means another file now (replaced since)
    stats to another inode, and opens it, and the opener's identity check
    (NOTE [file identity] in ``_io.files``) says what changed, as before.

    Forks: a forked child inherits the descriptors and the objects that hold
    them, with the counts that go with them, so what it inherited it reads
    and releases as the parent would, each inherited descriptor closed once
    in the child. What the child opens itself it opens anew: the child
    forgets the table (not the entries), so a reader never shares an open
    file (its readahead state and advice) with the consumer it came from,
    and never closes a descriptor of the parent's that a later open of its
    own would have found. The lock is made anew in the child (NOTE [forking
    among threads] in ``_sys.forks``).
"""

from __future__ import annotations

import os
import threading

from ..._sys.forks import renew_lock_in_children

#: Every key's entry held in this process: (``st_dev``, ``st_ino``, open flags, random advice) -> entry.
_OPEN: "dict[tuple[int, int, int, bool], SharedFd]" = {}
_OPEN_LOCK = threading.Lock()
renew_lock_in_children(globals(), "_OPEN_LOCK")


class SharedFd:
    """One descriptor of a local file open for reading at offsets, held by ``count`` openers in this process (or, in a
    forked child, by the openers it inherited), each through a :class:`Lease` of its own."""

    __slots__ = ("fd", "key", "count")

    def __init__(self, fd: int, key: "tuple[int, int, int, bool]") -> None:
        self.fd = fd
        self.key = key
        self.count = 0


class Lease:
    """One opener's hold on a :class:`SharedFd` (made by :func:`open_shared`): ``fd`` to read through, and
    :meth:`release` once done."""

    __slots__ = ("fd", "_shared")

    def __init__(self, shared: SharedFd) -> None:
        shared.count += 1  # under _OPEN_LOCK, by open_shared
        self.fd = shared.fd
        self._shared: "SharedFd | None" = shared

    def release(self) -> None:
        """This opener is done with the descriptor; the last closes it. Idempotent, and whole or not at all where a
        signal handler's exception may land (between calls): the steps below make no call until the last, the close,
        so a release cut short before them is done again by the next (tests/test_landings.py)."""
        with _OPEN_LOCK:
            shared = self._shared
            if shared is None:
                return
            self._shared = None
            shared.count -= 1
            if shared.count > 0:
                return
            if shared.key in _OPEN and _OPEN[shared.key] is shared:  # not after a fork: the child forgot the parent's
                del _OPEN[shared.key]
            os.close(shared.fd)


def open_shared(filename: str, flags: int, random: bool = False) -> Lease:
    """This process's descriptor of ``filename`` opened with ``flags`` (``os.O_RDONLY`` and friends; ``O_CLOEXEC`` is
    added) and, with ``random``, ``POSIX_FADV_RANDOM`` advice: the one held already (NOTE [shared descriptors]), or a
    new one, as a lease the caller releases (:meth:`Lease.release`). Errors are ``os.open``'s, naming ``filename``."""
    flags |= getattr(os, "O_CLOEXEC", 0)
    try:
        st = os.stat(filename)
    except OSError:
        st = None  # the open says why, in its own words
    if st is not None:
        with _OPEN_LOCK:
            held = _OPEN.get((st.st_dev, st.st_ino, flags, random))
            if held is not None:
                return Lease(held)
    fd = os.open(filename, flags)
    try:
        st = os.fstat(fd)  # the file opened: its name may mean another file than a moment ago
        if random:
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            except OSError:  # pragma: no cover - advice is advice
                pass
    except BaseException:
        os.close(fd)
        raise
    key = (st.st_dev, st.st_ino, flags, random)
    with _OPEN_LOCK:
        held = _OPEN.get(key)
        if held is None:
            held = _OPEN[key] = SharedFd(fd, key)
            return Lease(held)
        lease = Lease(held)  # another thread opened it meanwhile: one descriptor still
    os.close(fd)
    return lease


def _forget_in_child() -> None:
    _OPEN.clear()


os.register_at_fork(after_in_child=_forget_in_child)
