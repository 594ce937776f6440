"""Byte ranges of one object, read into the caller's buffers: merged, split, many in flight, retried, checked.

NOTE [object identity]
    An object must not change under a stream: rows of two versions of a
    file mixed in one epoch would be wrong without a sign. What an object
    was when it was first looked at (in the consumer, before any reader
    starts) is its :class:`~multitables._io.objects.identity.ObjectIdentity`:
    its size, ETag, version and Last-Modified. That identity travels with
    the node to every reader, and every request any process makes for the
    object carries ``If-Match: <ETag>``: a server that has another version
    answers 412. Every answer's ETag, version and size (from
    ``Content-Range``) are also compared before a byte of its body is used,
    which catches servers that ignore ``If-Match``, and a 404 after the
    first look is a change too. Any difference is a
    :class:`~multitables.errors.FileChangedError` naming the URL, raised in
    the reader and delivered in the consumer as every reader error is.
    So no ``stat`` per block is needed (``_io.files.check_file_unchanged``
    lets objects pass): the check is in every request. A server that sends
    neither an ETag nor a Last-Modified is refused, since no change could be
    seen.

Reads: ranges closer than ``merge_gap`` are fetched by one GET (the bytes
between read and dropped), and no GET asks for more than ``part_size``: a
long range is split into parts fetched in parallel, at most ``max_inflight``
at once, on this reader's threads. A body is ``readinto`` the caller's memory
(no copy in Python). A failed request is retried with back-off (throttling,
5xx, resets, time-outs, a body cut short, which resumes where it stopped);
once one fails for good, the others are stopped and waited for before the
error is raised, so nothing writes into the caller's buffers after that.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import http.client
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ...errors import NotHDF5Error, ObjectStorageError
from ..._sys.forks import renew_lock_in_children
from .cache import DiskCache
from .config import Store
from .http import Endpoint, Retryable, content_range, lost, retrying, use_pool
from .identity import ObjectIdentity, changed
from .urls import parse_url, shown, unsigned

@dataclass(frozen=True)
class RemoteObject:
    """An object as the consumer first saw it: what any process needs to read it (no secret, NOTE [credentials])."""

    url: str
    store: Store
    identity: ObjectIdentity

    @property
    def shown(self) -> str:
        return shown(self.url)

    def open(self) -> "ObjectReader":
        """A reader of the object as it was (no request until the first read)."""
        return ObjectReader(self.url, self.store, self.identity)


#: The first bytes of the objects this process looked at lately (by URL and identity), so that a reader of one opened
#: later, here or in a forked reader, reads its superblock and first metadata with no request.
_HEADS: "collections.OrderedDict[tuple[str, str], bytes]" = collections.OrderedDict()
_HEADS_KEPT = 64
_HEADS_LOCK = threading.Lock()

renew_lock_in_children(globals(), "_HEADS_LOCK")


def _known_head(url: str, identity: ObjectIdentity) -> bytes:
    with _HEADS_LOCK:
        return _HEADS.get((url, identity.key), b"")


def _keep_head(url: str, identity: ObjectIdentity, head: bytes) -> None:
    if head:
        with _HEADS_LOCK:
            _HEADS[(url, identity.key)] = head
            _HEADS.move_to_end((url, identity.key))
            while len(_HEADS) > _HEADS_KEPT:
                _HEADS.popitem(last=False)


class _Group:
    """The bytes one GET fetches, ``[start, stop)``, and where they go: ``parts`` of (length, view or None for a gap)."""

    __slots__ = ("start", "stop", "parts", "done", "_i", "_pos", "_scratch")

    def __init__(self, start: int, stop: int, parts: "list[tuple[int, memoryview | None]]") -> None:
        self.start, self.stop, self.parts = start, stop, parts
        self.done, self._i, self._pos = 0, 0, 0
        self._scratch: "memoryview | None" = None

    def window(self) -> memoryview:
        """Where the next bytes of the body go (a gap goes to scratch)."""
        n, view = self.parts[self._i]
        if view is not None:
            return view[self._pos :]
        if self._scratch is None:
            self._scratch = memoryview(bytearray(min(n, 1 << 20)))
        return self._scratch[: min(len(self._scratch), n - self._pos)]

    def advance(self, k: int) -> None:
        self.done += k
        self._pos += k
        while self._i < len(self.parts) and self._pos >= self.parts[self._i][0]:
            self._pos -= self.parts[self._i][0]
            self._i += 1


def plan(ranges: "Sequence[tuple[int, int]]", outs: "Sequence[memoryview]", gap: int, cap: int) -> "list[_Group]":
    """The GETs for ``ranges`` (offset, length) into ``outs``: neighbours closer than ``gap`` merged, none over ``cap``."""
    pieces = []
    for (offset, n), out in zip(ranges, outs):
        for k in range(0, n, cap):
            m = min(cap, n - k)
            pieces.append((offset + k, m, out[k : k + m]))
    pieces.sort(key=lambda p: p[0])
    groups: list[_Group] = []
    last: "_Group | None" = None
    for offset, n, view in pieces:
        if last is not None and last.stop <= offset and offset - last.stop <= gap and offset + n - last.start <= cap:
            if offset > last.stop:
                last.parts.append((offset - last.stop, None))
            last.parts.append((n, view))
            last.stop = offset + n
        else:
            last = _Group(offset, offset + n, [(n, view)])
            groups.append(last)
    return groups


class ObjectReader:
    """Byte ranges of the object at ``url`` (``s3://...``, ``http(s)://...``) as it was when first looked at.

    ``identity``: as the consumer saw it (NOTE [object identity]); None:
    look now, with one GET of the object's first ``open_readahead`` bytes
    (a HEAD with a local cache), whose bytes are kept and serve later reads
    inside them, by this reader and by later ones of the same object in
    this process or its forked readers. Raises :class:`~multitables.errors.ObjectStorageError`
    (``FileNotFoundError`` and ``PermissionError`` too, where they apply).
    ``stats`` counts requests, bytes fetched and retries.
    """

    def __init__(self, url: str, store: Store, identity: "ObjectIdentity | None" = None) -> None:
        self._url = url
        self._parsed = parse_url(url)
        self.shown = self._parsed.shown
        self._store = store
        self._tuning = store.tuning
        self._pid = os.getpid()
        self._endpoint = Endpoint(self._parsed, store)  # resolves the credentials: raises before any request
        use_pool(self._endpoint.pool_key, +1)
        self._executor: "cf.ThreadPoolExecutor | None" = None
        self._lock = threading.Lock()
        self._closed = False
        self._head = b""
        self.stats: collections.Counter = collections.Counter()
        self._cache = DiskCache(store.cache_dir, store.cache_size) if store.cache_dir else None
        try:
            if identity is None:
                self._identity = self._look()
                _keep_head(url, self._identity, self._head)
            else:
                self._identity, self._head = identity, _known_head(url, identity)
        except BaseException:
            self.close()
            raise
        cacheable = self._identity.etag or self._identity.last_modified
        self._cache_key = DiskCache.key(unsigned(url), self._identity.key, self._tuning.part_size) if cacheable else None

    @property
    def size(self) -> int:
        return self._identity.size

    @property
    def identity(self) -> ObjectIdentity:
        return self._identity

    @property
    def remote(self) -> RemoteObject:
        return RemoteObject(self._url, self._store, self._identity)

    @property
    def head(self) -> bytes:
        """The object's first bytes, as the look fetched them (empty where it did not)."""
        return self._head

    def __repr__(self) -> str:
        return f"<ObjectReader {self.shown!r} ({self._identity.size} bytes)>"

    def __reduce__(self) -> Any:
        raise TypeError("an ObjectReader is not pickled: pickle its RemoteObject (reader.remote) and open that")

    def close(self) -> None:
        """Stop this reader's threads and let its connections go (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._pid == os.getpid():
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            use_pool(self._endpoint.pool_key, -1)
        self._executor = None

    def __enter__(self) -> "ObjectReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the first look --------------------------------------------------------------------------------------------

    def _look(self) -> ObjectIdentity:
        """The object's identity (and first bytes): one GET, or a HEAD where a local cache will serve the bytes."""
        if self._cache is not None:
            found = self._retrying(self._head_request, 0, 0)
            if found is not None:
                return self._usable(found)
        n = max(1, self._tuning.open_readahead)
        identity, self._head = self._retrying(lambda: self._first_bytes(n), 0, n)
        return self._usable(identity)

    def _usable(self, identity: ObjectIdentity) -> ObjectIdentity:
        if identity.size == 0:  # as an empty local file: S3's answer to a range of one (416) names no version either
            raise NotHDF5Error(f"{self.shown!r} is not an HDF5 file")
        if not identity.etag and not identity.last_modified:
            raise ObjectStorageError(f"{self.shown}: the server sends neither an ETag nor a Last-Modified, so a change "
                                     f"of the object during a stream could not be seen; it is not read")
        return identity

    def _head_request(self) -> "ObjectIdentity | None":
        ep = self._endpoint
        conn, resp = ep.request("HEAD", {})
        self.stats["requests"] += 1
        if resp.status in (403, 405):  # a presigned URL is signed for GET only
            resp.read()
            conn.close()
            return None
        if resp.status != 200:
            raise ep.error(conn, resp, 0, 0)
        resp.read()
        ep.release(conn, resp)
        length = resp.getheader("Content-Length") or ""
        if not length.strip().isdigit():  # a HEAD may leave out the size (chunked): a GET's Content-Range gives it
            return None
        return _identity(resp, int(length))

    def _first_bytes(self, n: int) -> "tuple[ObjectIdentity, bytes]":
        ep = self._endpoint
        conn, resp = ep.request("GET", {"Range": f"bytes=0-{n - 1}"})
        self.stats["requests"] += 1
        if resp.status == 416:  # an empty object
            resp.read()
            conn.close()
            return _identity(resp, 0), b""
        if resp.status not in (200, 206):
            raise ep.error(conn, resp, 0, n)
        ep.check_encoding(conn, resp, 0, n)
        if resp.status == 200:
            size = int(resp.getheader("Content-Length") or -1)
            if size < 0 or size > n:
                conn.close()
                raise ObjectStorageError(f"{self.shown}: the server ignores byte ranges (HTTP 200 for bytes=0-{n - 1}); "
                                         f"objects are read by ranges only")
        else:
            found = content_range(resp)
            if found is None or found[2] is None:
                conn.close()
                raise ObjectStorageError(f"{self.shown}: no usable Content-Range in the answer to bytes=0-{n - 1}")
            size = found[2]
        try:
            head = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise Retryable("the first bytes were cut short", lost=lost(exc)) from None
        ep.release(conn, resp)
        self.stats["bytes"] += len(head)
        return _identity(resp, size), head

    # -- reading ---------------------------------------------------------------------------------------------------

    def read(self, offset: int, n: int) -> bytearray:
        """Bytes ``[offset, offset + n)``."""
        buf = bytearray(n)
        self.read_into([(offset, n)], [buf])
        return buf

    def read_into(self, ranges: "Sequence[tuple[int, int]]", outs: "Sequence[Any]", inflight: "int | None" = None,
                  gap: "int | None" = None) -> None:
        """Fill each ``outs[i]`` (a writable buffer of ``ranges[i][1]`` bytes) with bytes ``ranges[i]`` = (offset, n).

        ``inflight``: requests at once, where more than ``max_inflight``
        (many small reads, as a chunk index's leaves: their time is the round
        trip, not the link's); ``gap``: ranges closer than this are one GET
        (``merge_gap`` where None). When this raises, what ``outs`` hold is
        undefined, and no thread of this reader writes into them any more.
        """
        if self._closed:
            raise ValueError(f"{self.shown}: the reader is closed")
        todo, views = [], []
        for (offset, n), out in zip(ranges, outs):
            view = memoryview(out).cast("B")
            if view.readonly or len(view) != n or offset < 0 or offset + n > self.size:
                raise ValueError(f"{self.shown}: cannot read bytes [{offset}, {offset + n}) of {self.size} into a "
                                 f"{'read-only' if view.readonly else str(len(view)) + '-byte'} buffer")
            if n and offset + n <= len(self._head):
                view[:] = self._head[offset : offset + n]
            elif n:
                todo.append((offset, n))
                views.append(view)
        if not todo:
            return
        if self._cache is not None and self._cache_key is not None:
            self._read_cached(todo, views)
            return
        groups = plan(todo, views, self._tuning.merge_gap if gap is None else gap, self._tuning.part_size)
        self._run([functools.partial(self._fetch, g) for g in groups], inflight)

    def _run(self, jobs: "list[Callable[[threading.Event | None], None]]", inflight: "int | None" = None) -> None:
        """Run ``jobs`` (each given an abort event), on this reader's threads where there are several (on threads of
        their own, ``inflight`` at once, where that is more than ``max_inflight``)."""
        if len(jobs) == 1:
            jobs[0](None)
            return
        if inflight is not None and inflight > self._tuning.max_inflight:
            with cf.ThreadPoolExecutor(min(inflight, len(jobs)), thread_name_prefix="multitables-get") as own:
                self._all(own, jobs)
            return
        if self._pid != os.getpid():  # forked: the parent's threads do not exist here
            self._pid, self._executor, self._lock = os.getpid(), None, threading.Lock()
        with self._lock:
            if self._executor is None:
                self._executor = cf.ThreadPoolExecutor(self._tuning.max_inflight, thread_name_prefix="multitables-get")
            executor = self._executor
        self._all(executor, jobs)

    @staticmethod
    def _all(executor: cf.ThreadPoolExecutor, jobs: "list[Callable[[threading.Event | None], None]]") -> None:
        """Run ``jobs`` on ``executor``; the first error, raised once none of them runs any more."""
        abort = threading.Event()
        futures = [executor.submit(job, abort) for job in jobs]
        first: "BaseException | None" = None
        for future in cf.as_completed(futures):
            if future.cancelled():
                continue
            error = future.exception()
            if error is not None and first is None:
                first = error
                abort.set()
                for other in futures:
                    other.cancel()
        if first is not None:
            cf.wait(futures)  # nothing writes into the caller's buffers once this raises
            raise first

    def _fetch(self, group: _Group, abort: "threading.Event | None") -> None:
        self._retrying(lambda: self._get(group, abort), group.start, group.stop, abort)

    def _get(self, group: _Group, abort: "threading.Event | None") -> None:
        """One GET of the rest of ``group`` into its parts; :class:`Retryable` or a final error where it fails."""
        ep, identity = self._endpoint, self._identity
        start, stop = group.start + group.done, group.stop
        headers = {"Range": f"bytes={start}-{stop - 1}"}
        if identity.if_match:
            headers["If-Match"] = identity.if_match
        conn, resp = ep.request("GET", headers)
        self.stats["requests"] += 1
        if resp.status != 206:
            if resp.status == 404:
                resp.read()
                conn.close()
                raise changed(self.shown, start, stop, "it is gone (HTTP 404)")
            if resp.status == 200:
                conn.close()
                raise ObjectStorageError(f"{self.shown} bytes [{start}, {stop}): the server ignored the range (HTTP 200)")
            raise ep.error(conn, resp, start, stop)
        ep.check_encoding(conn, resp, start, stop)
        found = content_range(resp)
        if found is None or found[0] != start or found[1] != stop - 1:
            conn.close()
            raise ObjectStorageError(f"{self.shown} bytes [{start}, {stop}): the server answered "
                                     f"Content-Range {resp.getheader('Content-Range')!r}")
        try:
            identity.check(self.shown, start, stop, resp, found[2])
        except BaseException:
            conn.close()
            raise
        try:
            while group.done < stop - group.start:
                if abort is not None and abort.is_set():
                    conn.close()
                    return
                k = resp.readinto(group.window())
                if not k:
                    raise http.client.IncompleteRead(b"", stop - group.start - group.done)
                group.advance(k)
                self.stats["bytes"] += k
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            kind = "timed out" if lost(exc) is TimeoutError else type(exc).__name__
            raise Retryable(f"body cut short ({kind}) at byte {group.start + group.done}", lost=lost(exc)) from None
        ep.release(conn, resp)

    def _retrying(self, attempt: "Callable[[], Any]", start: int, stop: int, abort: "threading.Event | None" = None) -> Any:
        return retrying(attempt, self._tuning, f"{self.shown} bytes [{start}, {stop})", self.stats, abort)

    # -- through the local cache (NOTE [object cache]) ---------------------------------------------------------------

    def _read_cached(self, ranges: "list[tuple[int, int]]", views: "list[memoryview]") -> None:
        cache, key, piece = self._cache, self._cache_key, self._tuning.part_size
        assert cache is not None and key is not None
        wanted = sorted({i for offset, n in ranges for i in range(offset // piece, (offset + n - 1) // piece + 1)})
        pieces: dict[int, memoryview] = {}
        missing = []
        for i in wanted:
            buf = memoryview(bytearray(min(piece, self.size - i * piece)))
            pieces[i] = buf
            if not cache.get(key, i, buf):
                missing.append(i)
        if missing:
            self._run([functools.partial(self._fill, i, pieces[i]) for i in missing])
        for (offset, n), view in zip(ranges, views):
            done = 0
            while done < n:
                i, at = divmod(offset + done, piece)
                k = min(n - done, len(pieces[i]) - at)
                view[done : done + k] = pieces[i][at : at + k]
                done += k

    def _fill(self, i: int, buf: memoryview, abort: "threading.Event | None") -> None:
        start = i * self._tuning.part_size
        group = _Group(start, start + len(buf), [(len(buf), buf)])
        self._fetch(group, abort)
        if group.done == len(buf):
            assert self._cache is not None and self._cache_key is not None
            try:
                self._cache.put(self._cache_key, i, buf)
            except OSError as exc:  # a full disk, another user's folder: the bytes are read all the same
                _cache_unwritable(self._cache.folder, exc)


_UNWRITABLE: "set[str]" = set()


def _cache_unwritable(folder: str, exc: OSError) -> None:
    """Say once per process and folder that the cache cannot keep what is read (the read goes on without it)."""
    if folder not in _UNWRITABLE:
        _UNWRITABLE.add(folder)
        warnings.warn(f"storage option cache_dir={folder!r}: pieces cannot be written there ({exc.strerror or exc}); "
                      f"objects are read from the server without being kept", RuntimeWarning, stacklevel=2)


def _identity(resp: Any, size: int) -> ObjectIdentity:
    return ObjectIdentity(size, resp.getheader("ETag"), resp.getheader("x-amz-version-id"),
                          resp.getheader("Last-Modified"))


def look_all(urls: "Sequence[str]", store: Store) -> "list[ObjectReader]":
    """An open reader of each of ``urls`` (each with its first bytes), looked at up to ``max_inflight`` at once.

    Raises the first URL's error in order, with every reader closed.
    """
    if len(urls) <= 1:
        return [ObjectReader(u, store) for u in urls]
    with cf.ThreadPoolExecutor(min(store.tuning.max_inflight, len(urls)), thread_name_prefix="multitables-look") as pool:
        futures = [pool.submit(ObjectReader, u, store) for u in urls]
        cf.wait(futures)
    readers = [f.result() for f in futures if f.exception() is None]
    for f in futures:
        if (exc := f.exception()) is not None:
            for r in readers:
                r.close()
            raise exc
    return readers
