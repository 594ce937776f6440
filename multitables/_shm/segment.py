"""Shared-memory segments: created by one owner, attached by readers, unlinked early.

NOTE [segment lifetime]
    The consumer process owns every segment. It creates it exclusively
    (O_CREAT | O_EXCL, mode 0600) under a fresh random name with the library's
    prefix, so a rerun after a crash never collides with, attaches to or
    overwrites another run's memory. Readers attach by name, each say so, and
    the owner then unlinks the name at once: the mappings keep working, and
    from then on a SIGKILL of every process involved leaves nothing in
    /dev/shm. If the owner dies before it could unlink, each reader unlinks
    the name when it notices (NOTE [shutdown] in ``_procs.pool``); the name is
    also registered with multiprocessing's resource tracker until the unlink
    (the owner's or a reader's), as a last safety net only. The semaphores
    shared with readers go the same way (NOTE [semaphore names] in
    ``semaphores``). A consumer SIGKILLed between creating a name and
    registering it leaves the name behind: the next process to create a
    segment removes names of this library whose creator is dead, that belong
    to its user and are older than any creation can take (NOTE [creation
    span], :func:`sweep_orphans`). Nothing else in /dev/shm is touched.

    No mapping holds a file descriptor (``mmap.mmap(fd)`` keeps a dup of
    ``fd`` for as long as the object lives, and rows lent to the caller
    keep the owner's alive): an anonymous mapping reserves the addresses
    and the segment is mapped over them with MAP_FIXED. When the owner closes a
    segment whose memory the caller still holds (rows lent by the
    generator), the ranges still in use are moved to private memory at the
    same addresses (mremap over the old mapping, one atomic step), so the
    caller's arrays stay valid while the segment is released at once. A
    block a guard gave that outlives its queue (a loop's ``with guard as
    block`` leaves ``block`` bound: a use after the close breaks the
    guard's contract, but a crash is no way to say so) is no buffer export:
    the ring counts the references to its slot's array instead, the pages
    of every other slot are freed at the close, and the slot's stay mapped,
    with its last block's bytes, until the last array on it goes (copying
    it, as for lent rows, would cost every such loop 0.5 ms a MiB of
    block; beside lent rows, or in a fork of the owner, it is copied).

    The space is checked against statvfs, and against the memory cgroup's
    limit (shared memory is charged to it, and past it the OOM killer ends
    a process instead of any error), before anything is created
    (``space.check_space``), and the pages are reserved with posix_fallocate
    when the segment is created, so a /dev/shm that is too small fails here
    with a clear error rather than with a SIGBUS on first touch, later, in
    some process; one out of inodes (creating the name fails with ENOSPC)
    gets the same error, saying so. (A filesystem that cannot reserve gets a
    plain ftruncate, as ``multiprocessing.shared_memory`` does.)

    At interpreter exit the streams still open are closed (their readers
    stopped, their names unlinked), but no segment is unmapped: a daemon
    thread may still be inside a block, and unmapping under it was a
    SIGSEGV. The process's end unmaps them a moment later.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import functools
import mmap
import multiprocessing.util  # noqa: F401 - imported first, for the place of its exit handler (below)
import os
import secrets
import sys
import time
import weakref
from typing import Sequence

from .._sys.signals import signals_deferred
from .space import SHM_DIR, check_space, inode_error, promise, shm_free_bytes, space_error

#: Every segment this library creates has a name starting with this.
SHM_PREFIX = "multitables_"

try:  # CPython's own binding of shm_open/shm_unlink, used by multiprocessing.shared_memory
    import _posixshmem
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None


_exiting = False


def _mark_exiting() -> None:
    global _exiting
    _exiting = True


def interpreter_exiting() -> bool:
    """Whether the interpreter's exit handlers have begun (they end every reader: multiprocessing's terminates them)."""
    return _exiting


# atexit runs the last handler registered first, and what closes the streams still open at exit is
# weakref.finalize's handler: have it registered (a finalize registers it), then ours, which runs before it,
# and before multiprocessing's (registered when it was imported, above), which ends every reader.
weakref.finalize(_mark_exiting, int).detach()
atexit.register(_mark_exiting)

_MAP_FIXED = 0x10  # Linux's value on most architectures (checked where used); Python's mmap module lacks it
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
_MAP_FAILED = ctypes.c_void_p(-1).value
_LOW_BIT = bytes(i & 1 for i in range(256))  # mincore's byte a page to its bit 0


def _load_libc() -> "ctypes.CDLL | None":
    """libc with mmap/mremap/munmap/madvise typed, on Linux; None elsewhere (plain mmap.mmap is used then)."""
    if not sys.platform.startswith("linux"):  # pragma: no cover
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mremap.restype = ctypes.c_void_p
        libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.restype = ctypes.c_int
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.mincore.restype = ctypes.c_int
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):  # pragma: no cover
        return None
    return libc


_libc = _load_libc()


def _address(buf: mmap.mmap) -> int:
    """Where ``buf`` is mapped (the export made to ask is released before returning)."""
    probe = ctypes.c_char.from_buffer(buf)
    try:
        return ctypes.addressof(probe)
    finally:
        del probe


#: ``madvise`` advice absent from Python's mmap module (Linux 5.14; the same value on every architecture).
_MADV_POPULATE_WRITE = 23


def _madvise(buf: mmap.mmap, advice: int, offset: int, nbytes: int) -> None:
    buf.madvise(advice, offset, nbytes)


@functools.lru_cache(maxsize=None)
def can_populate() -> bool:
    """Whether this kernel maps (and allocates) pages on request: MADV_POPULATE_WRITE, Linux 5.14."""
    region = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        _madvise(region, _MADV_POPULATE_WRITE, 0, mmap.PAGESIZE)
        return True
    except (OSError, AttributeError):
        return False
    finally:
        region.close()


def _map_without_fd(fd: int, nbytes: int) -> mmap.mmap:
    """Map ``fd`` shared and writable through an mmap object that keeps no descriptor of it."""
    if _libc is None:  # pragma: no cover
        return mmap.mmap(fd, nbytes)
    try:
        buf = mmap.mmap(-1, nbytes)  # reserves the addresses; unmapping it later unmaps whatever is there
    except OSError as exc:  # ENOMEM: the address space is capped (ulimit -v), or memory is overcommitted
        raise OSError(exc.errno, f"mapping a shared-memory segment of {nbytes} bytes: {exc.strerror}"
                      + (" (the address space this process may use, ulimit -v, may be too small for it: a smaller "
                         "read_ahead or block_size asks less)" if exc.errno == errno.ENOMEM else "")) from exc
    addr = _address(buf)
    flags = mmap.MAP_SHARED | _MAP_FIXED
    got = _libc.mmap(addr, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    if got == _MAP_FAILED:
        err = ctypes.get_errno()
        buf.close()
        raise OSError(err, f"mapping a shared-memory segment of {nbytes} bytes: {os.strerror(err)}")
    if got != addr:  # pragma: no cover - an architecture whose MAP_FIXED is another bit: plain mmap
        _libc.munmap(got, nbytes)
        buf.close()
        return mmap.mmap(fd, nbytes)
    return buf


def _move_to_private(buf: mmap.mmap, nbytes: int, keep: Sequence[tuple[int, int]]) -> None:
    """Replace ``buf``'s mapping by private memory holding the same bytes in ``keep`` (offset, length).

    Atomic for anyone reading those bytes: the copy is made elsewhere and
    moved over the old mapping in one mremap. Where that cannot be done the
    mapping stays as it was, which is safe (it goes with its last view).
    """
    if _libc is None:  # pragma: no cover
        return
    new = _libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if new == _MAP_FAILED:
        return
    addr = _address(buf)
    for offset, length in keep:
        ctypes.memmove(new + offset, addr + offset, length)
    if _libc.mremap(new, nbytes, nbytes, _MREMAP_MAYMOVE | _MREMAP_FIXED, addr) == _MAP_FAILED:
        _libc.munmap(new, nbytes)


def _free_all_but(buf: mmap.mmap, nbytes: int, keep: Sequence[tuple[int, int]]) -> None:
    """Free the pages of ``buf``'s segment outside ``keep`` (offset, length) in place (MADV_REMOVE: the shared
    memory's own pages, whoever maps them); the mapping stays. Where that cannot be done nothing changes, which is
    safe (the segment goes with the mapping). Through libc, which lets other threads run meanwhile, as an unmapping
    does (NOTE [release off the path])."""
    if _libc is None:  # pragma: no cover
        return
    page, addr, start = mmap.PAGESIZE, _address(buf), 0
    for offset, length in sorted(keep) + [(nbytes, 0)]:
        stop = offset // page * page
        if stop > start and _libc.madvise(addr + start, stop - start, mmap.MADV_REMOVE) != 0:
            return  # a kernel or file system without it
        start = max(start, -(-(offset + length) // page) * page)


def _reserve(fd: int, nbytes: int, what: str, lazy: "tuple[int, int] | None" = None) -> None:
    """Give the segment its size with every page reserved (but ``lazy``'s, offset and length, whose pages are
    populated before they are written), so touching it can never SIGBUS."""
    if lazy is None:
        ranges = [(0, nbytes)]
    else:
        os.ftruncate(fd, nbytes)
        ranges = [(0, lazy[0]), (lazy[0] + lazy[1], nbytes - lazy[0] - lazy[1])]
    try:
        for offset, length in ranges:
            if length:
                os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            os.ftruncate(fd, nbytes)  # a filesystem that cannot reserve: size it, as shared_memory does
            return
        raise space_error(sum(length for _, length in ranges), shm_free_bytes(), what) from exc


class Segment:
    """A shared-memory segment mapped into this process.

    The creating process owns it: it alone unlinks the name. ``buf`` is the
    mapping; arrays holding a buffer export of it (``np.frombuffer``) keep
    it mapped after :meth:`close`, until the last of them is gone.
    """

    def __init__(self, name: str, nbytes: int, buf: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.nbytes = nbytes
        self.buf = buf
        self.owner = owner
        self._made_in = os.getpid()  # a fork's copy shares the pages: only its own mapping is its to change
        self.promised = False  # made unreserved: its pages are allocated later, by whoever populates them
        # The owner's name goes with the object at the latest: dropped by an exception anywhere after creation.
        self._unlinker = weakref.finalize(self, _unlink, name) if owner else None

    @classmethod
    def create(
        cls, nbytes: int, what: str = "The ring", reserve: bool = True, lazy: "tuple[int, int] | None" = None
    ) -> "Segment":
        """Create a new private segment of ``nbytes`` bytes, reserving its pages now.

        ``reserve=False``: the pages are not allocated here, and the caller
        promises that every page is :meth:`populate`-d before it is written
        (NOTE [slots and page tables] in ``ring``), so that a full /dev/shm
        is an error rather than a SIGBUS. ``lazy``: ``(offset, length)``, page-aligned, of room that is
        rarely used whole (a stage's row positions): left out of the reservation and of the space check, and
        :meth:`populate`-d by the caller before it writes there; reserved with the rest where the kernel cannot
        populate.

        NOTE [creation span]: from ``shm_open`` until the returned object
        exists (whose finalizer unlinks the name), a Ctrl-C is held back
        (``_sys.signals.signals_deferred``) and any exception unlinks the name and
        closes the descriptor, so no instruction of creation can leave an
        entry in /dev/shm or an open fd. A SIGKILL in that span cannot be
        caught: the next process to create a segment removes such leftovers
        (:func:`sweep_orphans`).
        """
        if _posixshmem is None:  # pragma: no cover
            raise OSError("POSIX shared memory is not available on this platform")
        if lazy is not None and not can_populate():
            lazy = None
        check_space(nbytes - (lazy[1] if lazy else 0), what)
        _sweep_once()
        from multiprocessing import resource_tracker

        with signals_deferred():
            for _ in range(16):
                name = f"{SHM_PREFIX}{os.getpid()}_{secrets.token_hex(8)}"
                try:
                    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
                except FileExistsError:
                    continue
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:  # creating a file on tmpfs: out of inodes
                        raise inode_error(what) from exc
                    raise
                break
            else:  # pragma: no cover - 16 collisions of 64 random bits
                raise FileExistsError("could not find a free shared-memory name")
            try:
                resource_tracker.register("/" + name, "shared_memory")
                if reserve:
                    _reserve(fd, nbytes, what, lazy)
                else:
                    os.ftruncate(fd, nbytes)
                buf = _map_without_fd(fd, nbytes)
            except BaseException:
                os.close(fd)
                _unlink(name)
                raise
            os.close(fd)
            segment = cls(name, nbytes, buf, owner=True)
            if not reserve:  # its pages come later: the next segment is checked against them too
                segment.promised = True
                promise(segment)
            return segment

    @classmethod
    def private(cls, nbytes: int) -> "Segment":
        """Memory of this process alone, shaped as a segment (no name, nothing in /dev/shm): where no reader maps it
        (a Reader with ``n_procs=0``). Copy-on-write in a forked child, as any memory of the process."""
        return cls("", nbytes, mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE), owner=False)

    @classmethod
    def attach(cls, name: str, nbytes: int) -> "Segment":
        """Map an existing segment by name (a reader's side; never registers it anywhere)."""
        if _posixshmem is None:  # pragma: no cover
            raise OSError("POSIX shared memory is not available on this platform")
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            buf = _map_without_fd(fd, nbytes)
        finally:
            os.close(fd)
        return cls(name, nbytes, buf, owner=False)

    def populate(self, offset: int, nbytes: int, what: str = "The ring", need: "int | None" = None) -> None:
        """Put bytes ``offset .. offset + nbytes`` (``offset`` page-aligned) in this process's page tables, writable.

        One call instead of a fault a page; in a segment made with ``reserve=False`` it allocates the pages,
        and ``ShmSpaceError`` says /dev/shm has no room left (a write would be a SIGBUS). Where the kernel
        cannot (:func:`can_populate`), nothing: the pages fault as written.
        """
        try:
            _madvise(self.buf, _MADV_POPULATE_WRITE, offset, nbytes)
        except OSError as exc:
            if exc.errno in (errno.EFAULT, errno.ENOMEM):  # the tmpfs is full (SIGBUS), or the memory cgroup
                raise space_error(self.nbytes if need is None else need, shm_free_bytes(), what) from exc
            if exc.errno != errno.EINVAL:
                raise

    def unallocated(self) -> int:
        """Bytes of a segment made unreserved whose pages nobody has populated or written yet (mincore: the shared
        memory's own pages, whoever touched them); 0 for a reserved one, once closed, in a fork of the owner, or
        where it cannot be told."""
        buf = getattr(self, "buf", None)  # gone once closed with pages still held
        if not self.promised or _libc is None or buf is None or buf.closed or os.getpid() != self._made_in:
            return 0
        pages = -(-self.nbytes // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        try:
            if _libc.mincore(_address(buf), self.nbytes, vec) != 0:
                return 0
        except (ValueError, TypeError, BufferError):  # closed meanwhile, by another thread
            return 0
        return (pages - bytes(vec).translate(_LOW_BIT).count(1)) * mmap.PAGESIZE  # bit 0: allocated; the rest reserved

    def unlink(self) -> None:
        """Remove the name (owner only; idempotent). Existing mappings stay valid."""
        if self._unlinker is not None:
            # Held over: a Ctrl-C between the finalizer's pop and the unlink, or in the resource tracker's write,
            # left the name in /dev/shm, or on the tracker's list, until the interpreter's exit.
            with signals_deferred():
                self._unlinker()

    def close(
        self, keep: "Sequence[tuple[int, int]] | None" = None, held: "Sequence[tuple[int, int]]" = ()
    ) -> None:
        """Unmap; where exported views still use the mapping, the last of them unmaps it.

        ``keep`` (the owner's side): the byte ranges (offset, length) those
        views may use. They are moved to private memory first, so the
        segment is released now and the views keep their bytes. ``held``:
        ranges that arrays made with ``buffer=`` (no export: they hold the
        mapping object itself) may still use. Where there are no others,
        they stay where they are and every other page of the segment is
        freed now; else they are moved with ``keep``'s. Either way the
        mapping goes with the last of those arrays (NOTE [segment
        lifetime]). At interpreter exit nothing is unmapped.
        """
        if _exiting:
            return
        if held and self.owner:
            if os.getpid() == self._made_in and not keep:  # its readers are gone: the pages are its alone
                _free_all_but(self.buf, self.nbytes, held)
            else:  # exported views too, or a fork of the owner (which shares the pages with it): copies
                _move_to_private(self.buf, self.nbytes, [*held, *(keep or ())])
            del self.buf  # the arrays on it hold the mapping object: it goes with the last of them, not with this
            return
        try:
            self.buf.close()
        except BufferError:
            if keep is not None and self.owner:
                _move_to_private(self.buf, self.nbytes, keep)


def _unlink(name: str) -> None:
    from multiprocessing import resource_tracker

    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
    resource_tracker.unregister("/" + name, "shared_memory")


#: Seconds after which a name of this library whose creating process is gone is surely a leftover: a live
#: creation unlinks its name within ATTACH_TIMEOUT (120 s) of creating it.
ORPHAN_AGE = 300.0
_swept = False


def _creator_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans(age: "float | None" = None) -> list[str]:
    """Remove this user's names of this library whose creator is dead and that are ``age`` s old; return them.

    What a consumer killed while creating a segment (NOTE [creation span])
    leaves. A pid alive again (reused) keeps its names; another user's are
    not ours to remove.
    """
    age = ORPHAN_AGE if age is None else age
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    removed = []
    uid, now = os.getuid(), time.time()
    for name in names:
        if not name.startswith(SHM_PREFIX):
            continue
        pid_text = name[len(SHM_PREFIX) :].partition("_")[0]
        if not pid_text.isdigit() or _creator_alive(int(pid_text)):
            continue
        try:
            st = os.stat(os.path.join(SHM_DIR, name))
        except OSError:
            continue
        if st.st_uid != uid or now - st.st_mtime < age:
            continue
        unlink_orphan(name)
        removed.append(name)
    return removed


def _sweep_once() -> None:
    """Sweep at this process's first creation (a listing of /dev/shm, once)."""
    global _swept
    if not _swept:
        _swept = True
        sweep_orphans()


def unlink_orphan(name: str, tracked: bool = False) -> None:
    """Unlink a segment whose owner died before it could (a reader's last act, or a sweep's). ``tracked``: the name
    is on the resource tracker this process shares with the owner (a reader's: its owner registered the name before
    any reader learned it), which then forgets it if this unlink removed it; else, when the tracker's last holder
    exits (a pool's parent), it warned of a leaked segment, then of its failure to unlink it."""
    if _posixshmem is None:  # pragma: no cover
        return
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return
    if tracked:
        untrack("/" + name, "shared_memory")


def untrack(name: str, rtype: str) -> None:
    """Take ``name`` (as the tracker has it: ``/`` first) of type ``rtype`` off the resource tracker, unless its lock
    stays held: a reader forked while a thread of its consumer held it has it held for ever (its own threads take it
    only here, briefly), and a reader stuck in a read must still end (NOTE [stuck orphans]); nor where this process
    knows of no tracker (it would start one)."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    lock = getattr(tracker, "_lock", None)
    if getattr(tracker, "_fd", None) is None or lock is None or not lock.acquire(timeout=0.1):
        return
    lock.release()
    try:
        resource_tracker.unregister(name, rtype)
    except Exception:  # the tracker gone: nobody to warn
        pass
