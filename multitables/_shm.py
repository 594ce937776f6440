"""Shared-memory segments: created by one owner, attached by readers, unlinked early.

NOTE [segment lifetime]
    The consumer process owns every segment. It creates it exclusively
    (O_CREAT | O_EXCL, mode 0600) under a fresh random name with the library's
    prefix, so a rerun after a crash never collides with, attaches to or
    overwrites another run's memory. Readers attach by name, each say so, and
    the owner then unlinks the name at once: the mappings keep working, and
    from then on a SIGKILL of every process involved leaves nothing in
    /dev/shm. If the owner dies before it could unlink, each reader unlinks
    the name when it notices (NOTE [shutdown] in ``_readers``); the name is
    also registered with multiprocessing's resource tracker until the unlink,
    as a last safety net only. Nothing ever sweeps /dev/shm for names it did
    not create itself.

    No mapping holds a file descriptor (``mmap.mmap(fd)`` keeps a dup of
    ``fd`` for as long as the object lives, and rows lent to the caller
    keep the owner's alive): an anonymous mapping reserves the addresses
    and the segment is mapped over them with MAP_FIXED. When the owner closes a
    segment whose memory the caller still holds (rows lent by the
    generator), the ranges still in use are moved to private memory at the
    same addresses (mremap over the old mapping, one atomic step), so the
    caller's arrays stay valid while the segment is released at once.

    The space is checked against statvfs before anything is created, and the
    pages are reserved with posix_fallocate when the segment is created, so a
    /dev/shm that is too small fails here with a clear error rather than with
    a SIGBUS on first touch, later, in some process; one out of inodes
    (creating the name fails with ENOSPC) gets the same error, saying so. (A
    filesystem that cannot reserve gets a plain ftruncate, as
    ``multiprocessing.shared_memory`` does.)
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import secrets
import sys
from typing import Sequence

from .errors import ShmSpaceError

#: Every segment this library creates has a name starting with this.
SHM_PREFIX = "multitables_"
_SHM_DIR = "/dev/shm"

try:  # CPython's own binding of shm_open/shm_unlink, used by multiprocessing.shared_memory
    import _posixshmem
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None


_MAP_FIXED = 0x10  # Linux's value on most architectures (checked where used); Python's mmap module lacks it
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
_MAP_FAILED = ctypes.c_void_p(-1).value


def _load_libc() -> "ctypes.CDLL | None":
    """libc with mmap/mremap/munmap typed, on Linux; None elsewhere (plain mmap.mmap is used then)."""
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


def _map_without_fd(fd: int, nbytes: int) -> mmap.mmap:
    """Map ``fd`` shared and writable through an mmap object that keeps no descriptor of it."""
    if _libc is None:  # pragma: no cover
        return mmap.mmap(fd, nbytes)
    buf = mmap.mmap(-1, nbytes)  # reserves the addresses; unmapping it later unmaps whatever is there
    addr = _address(buf)
    got = _libc.mmap(addr, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
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


def shm_free_bytes() -> "int | None":
    """Bytes free in /dev/shm, or None where it cannot be told."""
    try:
        st = os.statvfs(_SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


#: What the caller can make smaller, by what needs the memory (the ``what`` of :func:`check_space`).
_SMALLER = {
    "The ring": "a smaller read_ahead or block_size",
    "The stage": "a smaller stage or fewer stages",
    "The request inboxes": "fewer workers (n_procs)",
}


def _amount(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB ({nbytes:,} bytes)"  # the bytes: rounding could hide a few pages short


def _space_error(nbytes: int, free: "int | None", what: str) -> ShmSpaceError:
    short = ""
    if free is not None:  # enough free yet short: posix_fallocate failed, something took it meanwhile
        short = f": {nbytes - free:,} bytes short" if free < nbytes else ", yet it could not be reserved"
    smaller = _SMALLER.get(what)
    return ShmSpaceError(
        f"{what} needs {_amount(nbytes)} of shared memory but {_SHM_DIR} has "
        f"{'an unknown amount' if free is None else _amount(free)} free{short}. "
        f"{f'Use {smaller}, or give' if smaller else 'Give'} the machine or container more shared "
        f"memory (for Docker: --shm-size)."
    )


def _inode_error(what: str) -> ShmSpaceError:
    try:
        st = os.statvfs(_SHM_DIR)
        counts = f" ({st.f_favail:,} of {st.f_files:,} free)"
    except OSError:
        counts = ""
    return ShmSpaceError(
        f"{what} cannot be created: {_SHM_DIR} has no inode left for a new file{counts}, whatever space it has. "
        f"Remove files no longer needed from {_SHM_DIR}, or mount it with more inodes (tmpfs option nr_inodes)."
    )


def check_space(nbytes: int, what: str = "The ring") -> None:
    """Raise :class:`ShmSpaceError` now if ``nbytes`` cannot fit in the free space of /dev/shm."""
    free = shm_free_bytes()
    if free is not None and nbytes > free:
        raise _space_error(nbytes, free, what)


def _reserve(fd: int, nbytes: int, what: str) -> None:
    """Give the segment its size with every page reserved, so touching it can never SIGBUS."""
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            os.ftruncate(fd, nbytes)  # a filesystem that cannot reserve: size it, as shared_memory does
            return
        raise _space_error(nbytes, shm_free_bytes(), what) from exc


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
        self._linked = owner

    @classmethod
    def create(cls, nbytes: int, what: str = "The ring") -> "Segment":
        """Create a new private segment of ``nbytes`` bytes, reserving its pages now."""
        if _posixshmem is None:  # pragma: no cover
            raise OSError("POSIX shared memory is not available on this platform")
        check_space(nbytes, what)
        for _ in range(16):
            name = f"{SHM_PREFIX}{os.getpid()}_{secrets.token_hex(8)}"
            try:
                fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
            except FileExistsError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOSPC:  # creating a file on tmpfs: out of inodes
                    raise _inode_error(what) from exc
                raise
            break
        else:  # pragma: no cover - 16 collisions of 64 random bits
            raise FileExistsError("could not find a free shared-memory name")
        from multiprocessing import resource_tracker

        resource_tracker.register("/" + name, "shared_memory")
        try:
            _reserve(fd, nbytes, what)
            buf = _map_without_fd(fd, nbytes)
        except BaseException:
            os.close(fd)
            _unlink(name)
            raise
        os.close(fd)
        return cls(name, nbytes, buf, owner=True)

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

    def unlink(self) -> None:
        """Remove the name (owner only; idempotent). Existing mappings stay valid."""
        if self.owner and self._linked:
            self._linked = False
            _unlink(self.name)

    def close(self, keep: "Sequence[tuple[int, int]] | None" = None) -> None:
        """Unmap; where exported views still use the mapping, the last of them unmaps it.

        ``keep`` (the owner's side): the byte ranges (offset, length) those
        views may use. They are moved to private memory first, so the
        segment is released now and the views keep their bytes.
        """
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


def unlink_orphan(name: str) -> None:
    """Unlink a segment whose owner died before it could (a reader's last act)."""
    if _posixshmem is None:  # pragma: no cover
        return
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
