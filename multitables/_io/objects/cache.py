"""A local cache of object bytes for the epochs after the first: pieces on disk, shared by every process of a machine.

NOTE [object cache]
    With ``storage_options={"cache_dir": ..., "cache_size": ...}`` every
    byte read from an object goes through the cache in *pieces*: the
    ``part_size`` bytes at each multiple of ``part_size`` (the last piece
    shorter). A piece missing is fetched whole, written, and used; a piece
    present is read from the local file, with no request. Epoch 2 of a
    training loop then reads nothing from the server.

    * Key: a piece lives in a folder named for the object's URL (a
      presigned URL's without its signature, which changes each time it is
      signed), its identity (size, ETag, version, Last-Modified: NOTE
      [object identity]) and the piece size, so a changed object is a new
      key and a stale piece is never read. An object whose server sends neither an ETag nor
      a Last-Modified is not cached.
    * Several processes fill it at once (the readers of one stream, other
      jobs on the machine): a piece is written to a temporary name, synced,
      and renamed into place, which is atomic; two processes that fetch the
      same piece write the same bytes, and the last rename wins. So no
      reader sees a piece half written, and a crash leaves at most a
      temporary file.
    * Checked: what can still happen to a piece is after its write (a bad
      disk, a program or a user writing into the cache, a file system that
      keeps a rename but loses its data in a power cut). Each piece ends
      with the CRC-32 of its bytes (4 bytes, little-endian), checked at
      every read: one cut short, grown, or with any byte changed is read as
      missing, fetched again and written anew (a warning says so once per
      process). libdeflate's CRC-32 (through imagecodecs) costs 0.17 ms on a
      4 MiB piece against 0.31 ms for its read from the page cache (one core;
      ``zlib.crc32`` 0.98 ms, ``hashlib.sha1`` 6.9 ms): the fall-back where
      imagecodecs lacks it is ``zlib.crc32``, the same sum. A piece written
      before pieces had a sum is 4 bytes short: fetched again.
    * Size: each process counts what it wrote since it last looked; when
      that could take the cache past ``cache_size``, it lists the cache and
      deletes the least recently used pieces (a read touches its piece)
      until it holds 90% of the limit. A piece deleted while another
      process reads it stays readable to that process (POSIX); one deleted
      before it is opened is fetched again. Temporary files older than an
      hour (left by a crash) go too.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
import warnings
import zlib
from typing import Any, Callable

from ..chunks.codecs.libraries import imagecodecs_function

#: A cache's size is looked at again after this many pieces written by this process.
RESCAN_EVERY = 256
#: Temporary files older than this (s) are a crashed writer's.
STALE_TMP_S = 3600.0
_SUFFIX = ".piece"
#: Bytes of the CRC-32 each piece ends with (NOTE [object cache]).
SUM_BYTES = 4
_crc32: "Callable[[Any], int] | None" = None


def piece_sum(data: Any) -> bytes:
    """The CRC-32 of ``data`` (bytes-like) as a piece ends with it: libdeflate's where imagecodecs has it (NOTE
    [object cache]), else zlib's, the same sum."""
    global _crc32
    if _crc32 is None:
        _crc32 = imagecodecs_function("deflate_crc32") or zlib.crc32
    return (_crc32(data) & 0xFFFFFFFF).to_bytes(SUM_BYTES, "little")


class DiskCache:
    """Pieces of objects in ``folder``, at most about ``limit`` bytes (NOTE [object cache])."""

    def __init__(self, folder: str, limit: int) -> None:
        self.folder = folder
        self.limit = limit
        os.makedirs(folder, exist_ok=True)

    @staticmethod
    def key(url: str, identity_key: str, piece: int) -> str:
        """The folder name of one object's pieces (a hash: URLs hold characters paths do not)."""
        return hashlib.sha256(f"{url}\0{identity_key}\0{piece}".encode("utf-8", "surrogateescape")).hexdigest()[:40]

    def _path(self, key: str, index: int) -> str:
        return os.path.join(self.folder, key, f"{index}{_SUFFIX}")

    def get(self, key: str, index: int, into: memoryview) -> bool:
        """Fill ``into`` with piece ``index`` of object ``key``; False where the cache lacks it whole and intact
        (``into`` may then hold anything)."""
        path = self._path(key, index)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return False
        try:
            if os.fstat(fd).st_size != len(into) + SUM_BYTES:  # cut short, grown, or a piece written without a sum
                return False
            got = 0
            while got < len(into):
                k = os.preadv(fd, [into[got:]], got)
                if k == 0:
                    return False
                got += k
            stored = os.pread(fd, SUM_BYTES, got)
        finally:
            os.close(fd)
        if piece_sum(into) != stored:
            _corrupt(path)
            return False
        try:
            os.utime(path)  # least recently used goes first
        except OSError:
            pass
        return True

    def put(self, key: str, index: int, data: Any) -> None:
        """Write piece ``index`` of object ``key``: under a temporary name, then renamed into place."""
        folder = os.path.join(self.folder, key)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{index}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        view = memoryview(data).cast("B")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            for part in (view, memoryview(piece_sum(view))):  # the bytes, then their sum (NOTE [object cache])
                done = 0
                while done < len(part):
                    done += os.write(fd, part[done:])
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _remove(tmp)
            raise
        os.close(fd)
        os.replace(tmp, self._path(key, index))
        _counted(self, len(view) + SUM_BYTES)


_CORRUPT: "set[str]" = set()


def _corrupt(path: str) -> None:
    """Say once per process and cache that a piece failed its check (``path``, the first): it is fetched again."""
    folder = os.path.dirname(os.path.dirname(path))
    if folder not in _CORRUPT:
        _CORRUPT.add(folder)
        warnings.warn(f"cache_dir={folder!r}: the cached piece {path} does not match its CRC-32 (changed on disk since "
                      f"it was written); it is fetched again, as any other that fails", RuntimeWarning, stacklevel=3)


_WRITTEN: "dict[str, list[int]]" = {}  # folder -> [bytes written since the last look, pieces written, bytes found]
_WRITTEN_LOCK = threading.Lock()


def _counted(cache: DiskCache, nbytes: int) -> None:
    """Note ``nbytes`` more in ``cache``; evict where the cache may be over its limit (NOTE [object cache])."""
    with _WRITTEN_LOCK:
        seen = _WRITTEN.setdefault(cache.folder, [0, RESCAN_EVERY, 0])
        seen[0] += nbytes
        seen[1] += 1
        look = seen[1] >= RESCAN_EVERY or seen[2] + seen[0] > cache.limit
    if look:
        total = evict(cache.folder, cache.limit)
        with _WRITTEN_LOCK:
            _WRITTEN[cache.folder] = [0, 0, total]


def evict(folder: str, limit: int) -> int:
    """Delete the least recently used pieces of the cache in ``folder`` until it holds at most 90% of ``limit``
    (nothing where it holds no more than ``limit``); the bytes it holds after."""
    pieces: list[tuple[float, int, str]] = []
    now = time.time()
    try:
        objects = list(os.scandir(folder))
    except FileNotFoundError:
        return 0
    for entry in objects:
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            files = list(os.scandir(entry.path))
        except FileNotFoundError:
            continue
        for f in files:
            try:
                st = f.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if f.name.endswith(".tmp"):
                if now - st.st_mtime > STALE_TMP_S:
                    _remove(f.path)
                continue
            if f.name.endswith(_SUFFIX):
                pieces.append((st.st_mtime, st.st_size, f.path))
        if not files:
            try:
                os.rmdir(entry.path)
            except OSError:
                pass
    total = sum(size for _, size, _ in pieces)
    if total <= limit:
        return total
    pieces.sort()
    for _mtime, size, path in pieces:
        if total <= 0.9 * limit:
            break
        _remove(path)
        total -= size
    return total


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _reset_in_child() -> None:
    global _WRITTEN_LOCK
    _WRITTEN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_in_child)
