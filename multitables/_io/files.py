"""A local file as the readers see it: its name, its kind, and its identity while it is read.

NOTE [file identity]
    A file rewritten, truncated or replaced while readers stream it would give
    blocks of another file's bytes, silently. So the file's identity (``st_dev,
    st_ino, st_size, st_mtime_ns, st_ctime_ns``) is taken from the descriptor
    HDF5 described it through, each engine's open of the file is checked against
    it by its own descriptor (:func:`check_opened`: the name may mean another
    file by then, a symlink switched), and each reader compares it with a fresh
    ``os.stat`` of the path after reading each block, before publishing it: a
    block is only handed over if the file was still the same when its read had
    finished. Any change (or the path gone: deleted or renamed) is a
    :class:`~multitables.errors.FileChangedError` naming the path. A stat costs
    ~1-2 us against milliseconds per block. The change time (ctime) is there
    because the modification time can be set back (``cp -p``, ``rsync -t``
    writing in place, ``touch -r``): only the kernel sets ctime, at every write
    and every change of the inode (also chmod or a new hard link, which stop the
    stream too: better than a wrong row). Writes within one tick of the
    filesystem's clock that keep the size are below what either time can show.
    An object in a bucket or on an HTTP server has no ``stat``: its identity is
    its ETag (NOTE [object identity] in ``_io.objects.reader``), which every
    request checks itself.

    What a process learns of a file (its node's description, its chunk layout)
    it keeps under the identity of the file it learned it from (its
    descriptor's, never the name's of a moment before or after) and uses again
    while the name means a file of that identity, with no HDF5 open. That gap of
    the identity, a rewrite of the same size within one tick of the clock, is
    closed as git closes its "racy" index entries: only what was learned of a
    *settled* file is kept (:func:`settled`: its last change ``SETTLED_S``
    before the learning), so that any later write shows in its times. Files just
    written are learned again at each open.

    A file read with ``swmr=True`` is one an SWMR writer appends to and
    flushes while it is read: its size and times move at every flush, and
    HDF5's SWMR protocol keeps what was flushed readable. Its identity is a
    :class:`GrowingFile`: the same file while it keeps its device and inode, is
    no smaller than when it was described, and its superblock still allows
    SWMR (version 3, and no writer without SWMR holding it: flag bit 0 without
    bit 2). So the rows a stream or request planned with stay the rows read;
    a file replaced, cut short, or opened for writing without SWMR (or
    rewritten in an older format) still stops it. Cut short is smaller than
    the latest look at it that a check knows of: for a stream, its own; for a
    Reader's requests, the largest of the Reader's look and those of its
    ``get_dataset`` whose datasets their reader has read (so at least their
    own dataset's: ``_procs.serve``); for each file of a set, the readers' own
    look (NOTE [growing sets] in ``setref``). Nothing is learned and kept of
    it (it is no settled file). :func:`check_same_file` holds both rules.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass
from typing import Any, TypeGuard

from ..errors import FileChangedError, NotHDF5Error
from .objects.identity import ObjectIdentity

#: ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)`` of a file; see NOTE [file identity].
FileSignature = tuple[int, int, int, int, int]

#: Seconds a file must have gone unchanged for what is learned of it to be kept (NOTE [file identity]): more than
#: any filesystem's clock tick (FAT's is 2 s).
SETTLED_S = 3.0


@dataclass(frozen=True)
class GrowingFile:
    """The identity of a file read with ``swmr=True``, which its SWMR writer may append to (NOTE [file identity]):
    ``signature`` as it was described; a file that kept its device and inode and is no smaller is the same."""

    signature: FileSignature


def grew(later: object, than: object) -> TypeGuard[GrowingFile]:
    """Whether ``later``, a later look at the file read with ``swmr=True`` that ``than`` describes, saw it larger:
    smaller than that is cut short for every check after it (NOTE [file identity])."""
    return (isinstance(later, GrowingFile) and isinstance(than, GrowingFile)
            and later.signature[:2] == than.signature[:2] and later.signature[2] > than.signature[2])


def growing(identity: "FileSignature | ObjectIdentity",
            swmr: bool) -> "FileSignature | GrowingFile | ObjectIdentity":
    """A local file's ``identity`` as that of a file read with ``swmr`` (True: one that may grow) or without; an
    object's as it is (``swmr=True`` is refused for one)."""
    return GrowingFile(identity) if swmr and isinstance(identity, tuple) else identity


def identity_size(identity: "FileSignature | GrowingFile | ObjectIdentity | None") -> "int | None":
    """The bytes of the file or object ``identity`` describes: the part of it a copy keeps (a copy has its own device,
    inode and times); None for a file read with ``swmr=True``, which may grow, or an identity not taken."""
    if isinstance(identity, ObjectIdentity):
        return identity.size
    return identity[2] if isinstance(identity, tuple) else None


def file_signature(filename: "str | int") -> FileSignature:
    """The identity of ``filename`` now (a path, or an open file descriptor); see NOTE [file identity]."""
    return _signature_of(os.stat(filename))


def _signature_of(st: os.stat_result) -> FileSignature:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def settled(signature: FileSignature) -> bool:
    """Whether the file whose identity was ``signature`` (taken just now) had gone unchanged for ``SETTLED_S``: what is
    learned of it may be kept while it keeps that identity (NOTE [file identity])."""
    return time.time() - max(signature[3], signature[4]) / 1e9 > SETTLED_S


#: When a change was seen, and what it stops: a stream's reads, a Reader's requests.
STREAMED = "while it was being streamed; blocks read from it now could hold other data, so the stream stops"
REQUESTED = ("since the Reader was made; rows read from it now could hold other data, so its requests fail: make a new "
             "Reader to read it as it is now")


def check_file_unchanged(filename: str, expected: "FileSignature | GrowingFile | ObjectIdentity | None",
                         since: str = STREAMED) -> None:
    """Raise :class:`FileChangedError` if ``filename`` is no longer the file ``expected`` describes (``since``: when,
    and what that stops).

    An object passes: every request for it checks its identity (NOTE [object identity] in ``_io.objects.reader``).
    """
    if expected is None or isinstance(expected, ObjectIdentity):
        return
    try:
        now = file_signature(filename)
    except FileNotFoundError:
        raise FileChangedError(f"{filename!r} was deleted or renamed {since}") from None
    check_same_file(filename, now, expected, since)


def check_opened(filename: str, opened: "int | FileSignature",
                 expected: "FileSignature | GrowingFile | ObjectIdentity | None") -> None:
    """Raise :class:`FileChangedError` unless the file opened by the name ``filename`` (``opened``: its descriptor,
    or its identity from that) is the file ``expected`` describes: a name can come to mean another file between a
    ``stat`` and an ``open`` (a symlink switched, a file replaced), and what was learned of one file must not be read
    out of the other."""
    if expected is not None and not isinstance(expected, ObjectIdentity):
        check_same_file(filename, file_signature(opened) if isinstance(opened, int) else opened, expected, _DESCRIBED)


_DESCRIBED = ("after it was described (its rows, where its chunks lie): that description is not read out of another "
              "file; read it again once it is written")


def check_same_file(filename: str, now: FileSignature, expected: "FileSignature | GrowingFile",
                    since: str = STREAMED) -> None:
    """Raise :class:`FileChangedError` saying how ``filename`` changed if its identity ``now`` is not ``expected``
    (``since``: when, and what that stops); a :class:`GrowingFile` may have grown (NOTE [file identity])."""
    if isinstance(expected, GrowingFile):
        expected = expected.signature
        if now[:2] == expected[:2] and now[2] >= expected[2]:
            if now[2:] == expected[2:]:
                return
            problem = _not_swmr(filename)
            if problem is None:
                return
            raise FileChangedError(f"{filename!r} was {problem} {since}")
        if now[:2] == expected[:2]:
            raise FileChangedError(f"{filename!r} was cut short from {expected[2]} to {now[2]} bytes {since}")
    if now == expected:
        return
    if now[:2] != expected[:2]:
        what = "replaced by another file"
    elif now[2] != expected[2]:
        what = f"resized from {expected[2]} to {now[2]} bytes"
    elif now[3] != expected[3]:
        what = "modified (its modification time changed)"
    else:
        what = "changed (its change time moved: a write with the modification time set back, or a chmod)"
    raise FileChangedError(f"{filename!r} was {what} {since}")


#: Where HDF5 looks for the superblock: at 0, else at 512 and each power of two above (after a user block).
_SUPERBLOCK_AT = (0,) + tuple(512 << k for k in range(24))
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _not_swmr(filename: str) -> "str | None":
    """How the file at ``filename``, grown since it was described, is no longer one that SWMR reads (None: it still
    is): a superblock of a version below 3 (rewritten without SWMR), or held by a writer without SWMR (flag bit 0,
    write access, without bit 2, SWMR write access)."""
    try:
        with open(filename, "rb") as f:
            for offset in _SUPERBLOCK_AT:
                head = os.pread(f.fileno(), 12, offset)
                if len(head) < 12:
                    break
                if head[:8] == _HDF5_SIGNATURE:
                    if head[8] < 3:
                        return f"rewritten without SWMR (its superblock is of version {head[8]} now)"
                    if head[11] & 0b101 == 0b001:
                        return "opened for writing without SWMR"
                    return None
    except FileNotFoundError:
        return "deleted or renamed"
    except OSError:  # not to be read (a chmod): its readers read it through their open descriptors
        return None
    return "rewritten: it has no HDF5 superblock now"


def as_filename(filename: Any) -> str:
    """``filename`` as a str, from what ``open()`` and h5py take: str, bytes or ``os.PathLike``.

    Bytes that do not decode in the file system's encoding are kept as
    surrogates (``os.fsdecode``); ``os.fsencode`` gives them back exactly.
    """
    try:
        return os.fsdecode(filename)
    except TypeError:
        raise TypeError(f"filename must be a str, bytes or os.PathLike, not {type(filename).__name__}") from None


#: The longest path the kernel opens (Linux's PATH_MAX).
_PATH_MAX = 4096


def from_root(filename: str) -> str:
    """``filename`` from the root: what a Streamer or Reader reads is the file its name meant when it was made,
    whatever ``os.chdir`` comes later (readers keep the directory they started in; the consumer's would move). A
    name that would be too long from the root (past PATH_MAX, in a very deep working directory) is kept as it is."""
    try:
        full = os.path.abspath(filename)
    except FileNotFoundError:  # os.getcwd(): the working directory was removed
        raise FileNotFoundError(errno.ENOENT, "a relative name, and the working directory was removed", filename) from None
    return full if len(os.fsencode(full)) < _PATH_MAX else filename


_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def check_regular(filename: str, readable: bool = False) -> FileSignature:
    """Raise unless ``filename`` is a regular file, before anything opens it: opening a FIFO waits for a writer.
    Returns its identity, from the same ``stat`` (NOTE [file identity]). ``readable``: raise ``PermissionError`` naming
    it, as ``open()`` does, where this process may not read it (HDF5 names it only inside a sentence of its own)."""
    try:
        st = os.stat(filename)
    except FileNotFoundError:
        if "%d" in os.path.basename(filename) and os.path.exists(filename.replace("%d", "0")):
            # A family of member files (HDF5's family driver), whose driver PyTables 3.x refuses.
            raise FileNotFoundError(errno.ENOENT, "No such HDF5 file: a family of member files ('%d' in the name) "
                                    "is not read; copy it into one file first (h5py opens it with driver='family')", filename) from None
        raise FileNotFoundError(errno.ENOENT, "No such HDF5 file", filename) from None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "Expected an HDF5 file, got a directory", filename)
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
        raise NotHDF5Error(
            f"{filename!r} is {kind}, not a regular file: HDF5 files are read at offsets, which only a regular "
            f"file allows"
        )
    if readable:
        try:
            os.close(os.open(filename, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        except PermissionError as exc:
            raise PermissionError(errno.EACCES, "Permission denied: this process may not read the HDF5 file",
                                  filename) from exc
    return _signature_of(st)


def will_need_file(filename: str) -> None:
    """Start reading the whole of a local file into the page cache (``POSIX_FADV_WILLNEED``), with no HDF5 open;
    returns at once. A hint: a file that cannot be opened now is not hinted, and its read says why."""
    if not hasattr(os, "posix_fadvise"):  # pragma: no cover - not Linux
        return
    try:  # non-blocking: a path swapped for a FIFO since it was checked must not wait for a writer
        fd = os.open(filename, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:  # pragma: no cover - a filesystem without readahead
        pass
    finally:
        os.close(fd)
