"""One HTTP request to an object: keep-alive connections per process, the request signed, the answer judged.

Connections are ``http.client`` ones kept per host by this process
(``TCP_NODELAY``: headers and body go out in two writes, and Nagle with
delayed ACKs held small answers 40 ms). A process started by ``fork`` starts
with none: it closes its copies of its parent's sockets without a word on
them (no shutdown), so the parent's connections live on. A pool's idle
connections are closed when the last reader using it closes, so nothing is
left open between streams. No event loop, no runtime threads: nothing for
``fork`` to break.
"""

from __future__ import annotations

import datetime
import email.utils
import http.client
import logging
import os
import random
import re
import socket
import sys
import threading
import time
from typing import Any, Callable
from urllib.parse import urljoin, urlsplit

from ...errors import ObjectStorageError
from .config import Store, Tuning
from .credentials import Credentials, from_environment
from .identity import changed
from .sigv4 import sign
from .urls import ObjectURL, quote_key, shown

#: Answers worth another try: throttling, time-outs, the server's own failures.
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
RETRY_CODES = frozenset({"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "Throttling",
                         "ThrottlingException", "RequestTimeTooSkewed"})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")
#: Idle connections a pool keeps per host.
IDLE_KEPT = 32

log = logging.getLogger(__name__)


class Retryable(Exception):
    """A failure worth another attempt; ``reason`` says what, ``retry_after`` what the server asked for, ``lost``
    the builtin a connection's failure is (``ConnectionError``, ``TimeoutError``; None for the server's answer)."""

    def __init__(self, reason: str, retry_after: "float | None" = None,
                 lost: "type[ConnectionError] | type[TimeoutError] | None" = None) -> None:
        super().__init__(reason)
        self.reason, self.retry_after, self.lost = reason, retry_after, lost


class _Stale(Exception):
    """An idle connection reused, lost before any answer: the server closed it meanwhile (a new one is tried)."""


class ObjectNotFoundError(ObjectStorageError, FileNotFoundError):
    """No such object (or bucket)."""


class ObjectAccessError(ObjectStorageError, PermissionError):
    """The credentials (or their absence) do not allow reading the object."""


class ObjectConnectionError(ObjectStorageError, ConnectionError):
    """No connection, or none that answered, past the retries: refused, reset, a name that does not resolve."""


class ObjectTimeoutError(ObjectStorageError, TimeoutError):
    """The connection or its answer timed out, past the retries."""


def lost(exc: BaseException) -> "type[ConnectionError] | type[TimeoutError]":
    """The builtin a connection's failure ``exc`` is said as, once the retries are spent (what requests says too)."""
    return TimeoutError if isinstance(exc, (socket.timeout, TimeoutError)) else ConnectionError


#: The error raised past the retries, by what the last attempt's failure was (:attr:`Retryable.lost`).
_GIVEN_UP: "dict[Any, type[ObjectStorageError]]" = {
    None: ObjectStorageError, ConnectionError: ObjectConnectionError, TimeoutError: ObjectTimeoutError,
}


# -- connections ----------------------------------------------------------------------------------------------------


class _Pool:
    """Idle keep-alive connections of this process to one host, and how many readers use them."""

    def __init__(self, scheme: str, host: str, port: int, verify: "bool | str") -> None:
        self.scheme, self.host, self.port, self.verify = scheme, host, port, verify
        self.idle: list[http.client.HTTPConnection] = []
        self.users = 0
        self.lock = threading.Lock()
        self._context: Any = None  # ssl.SSLContext, made at the first https connection

    def connect(self, connect_timeout: float, read_timeout: float,
                fresh: bool = False) -> "tuple[http.client.HTTPConnection, bool]":
        """A connection, and whether it is an idle one reused (``fresh``: always a new one)."""
        if not fresh:
            with self.lock:
                if self.idle:
                    return self.idle.pop(), True
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            import ssl  # only where https is read: a local-files user never loads it

            if self._context is None:
                cafile = self.verify if isinstance(self.verify, str) else None
                self._context = ssl.create_default_context(cafile=cafile)
                if self.verify is False:
                    self._context.check_hostname = False
                    self._context.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=connect_timeout, context=self._context)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=connect_timeout)
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(read_timeout)
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, False

    def give_back(self, conn: http.client.HTTPConnection) -> None:
        with self.lock:
            if self.users > 0 and len(self.idle) < IDLE_KEPT:
                self.idle.append(conn)
                return
        conn.close()

    def close_idle(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


_POOLS: "dict[tuple[Any, ...], _Pool]" = {}
_POOLS_LOCK = threading.Lock()


def _forget_parent_connections() -> None:
    """In a forked child: release our copies of the parent's sockets (no shutdown: they stay the parent's)."""
    global _POOLS, _POOLS_LOCK
    for pool in _POOLS.values():
        for conn in pool.idle:
            sock = conn.sock
            if sock is not None:
                try:
                    os.close(sock.detach())
                except OSError:
                    pass
            conn.sock = None
    _POOLS, _POOLS_LOCK = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_connections)


def pool_for(key: "tuple[Any, ...]") -> _Pool:
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = _Pool(*key)
        return pool


def use_pool(key: "tuple[Any, ...]", delta: int) -> None:
    """One more (``delta=1``) or one fewer reader of the pool ``key``; the last one out closes its idle connections."""
    pool = pool_for(key)
    with pool.lock:
        pool.users = max(0, pool.users + delta)
        last = pool.users == 0
    if last:
        pool.close_idle()


# -- requests -------------------------------------------------------------------------------------------------------


def retrying(attempt: "Callable[[], Any]", tuning: Tuning, where: str, stats: Any = None,
             abort: "threading.Event | None" = None) -> Any:
    """``attempt()``, tried again on :class:`Retryable` after a full-jitter back-off, ``tuning.attempts`` times in all.

    ``where`` names the object and range in the log and the final error;
    ``stats`` (a Counter) counts the retries. Returns None once ``abort`` is
    set during a back-off.
    """
    for k in range(1, tuning.attempts + 1):
        try:
            return attempt()
        except Retryable as exc:
            if stats is not None:
                stats["retries"] += 1
            if k == tuning.attempts:
                raise _GIVEN_UP[exc.lost](f"{where}: gave up after {k} attempts; last: {exc.reason}") from None
            delay = random.uniform(0, min(tuning.backoff_max, tuning.backoff_base * 2 ** (k - 1)))
            if exc.retry_after is not None:
                delay = max(delay, min(tuning.backoff_max, exc.retry_after))
            log.debug("%s: %s; attempt %d of %d in %.2f s", where, exc.reason, k + 1, tuning.attempts, delay)
            if abort is not None:
                if abort.wait(delay):
                    return None
            else:
                time.sleep(delay)
    return None


def _retry_after(value: "str | None") -> "float | None":
    """Seconds a ``Retry-After`` header asks to wait: a number of seconds or an HTTP date (RFC 9110 allows both)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is in GMT
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - time.time())


class Endpoint:
    """Where the requests for one object go, signed for this process (its credentials resolved here, NOTE [credentials])."""

    def __init__(self, url: ObjectURL, store: Store) -> None:
        self.shown = url.shown
        self.anon = store.anon
        self.kind = url.kind  # an http(s) URL is never signed: credentials and anon mean nothing to it
        self.credentials: "Credentials | None" = None
        self.region = store.region
        tuning = store.tuning
        self.timeouts = (tuning.connect_timeout, tuning.read_timeout)
        if url.kind == "s3":
            scheme, host, port, prefix = store.base(url.bucket)
            self.path = f"{prefix}/{quote_key(url.key)}"
            self.credentials = None if store.anon else _credentials(store, self.shown)
        else:
            p = urlsplit(url.url)
            scheme, host = p.scheme.lower(), p.hostname or ""
            port = p.port or (443 if scheme == "https" else 80)
            self.path = (p.path or "/") + (f"?{p.query}" if p.query else "")
        default = 443 if scheme == "https" else 80
        self.host_header = host if port == default else f"{host}:{port}"
        if ":" in host and not host.startswith("["):  # an IPv6 literal
            self.host_header = f"[{host}]" if port == default else f"[{host}]:{port}"
        self.pool_key = (scheme, host, port, store.verify)

    def scrub(self, text: str) -> str:
        return self.credentials.scrub(text) if self.credentials is not None else text

    def request(self, method: str, headers: "dict[str, str]", path: "str | None" = None) -> "tuple[Any, Any]":
        """Send a request (signed where credentials are), return ``(connection, response)``; :class:`Retryable` where
        the connection fails."""
        path = self.path if path is None else path
        if self.credentials is not None:
            key, secret, token = self.credentials.current()
            headers = sign(method, self.host_header, path, headers, self.region, key, secret, token)
        else:
            headers = {"Host": self.host_header, **headers}
        pool = pool_for(self.pool_key)
        try:
            return self._send(pool, method, path, headers, fresh=False)
        except _Stale:  # an idle connection the server closed meanwhile: not a failed attempt, try a new one at once
            return self._send(pool, method, path, headers, fresh=True)

    def _send(self, pool: _Pool, method: str, path: str, headers: "dict[str, str]", fresh: bool) -> "tuple[Any, Any]":
        try:
            conn, reused = pool.connect(*self.timeouts, fresh=fresh)
        except (OSError, http.client.HTTPException) as exc:
            ssl = sys.modules.get("ssl")
            if ssl is not None and isinstance(exc, ssl.SSLCertVerificationError):  # no other attempt will pass
                raise ObjectStorageError(
                    f"{self.shown}: the server's TLS certificate is refused ({exc.verify_message}); give its CA with "
                    f"storage_options={{'verify': '/path/to/ca.pem'}}, or verify=False to skip the check"
                ) from None
            raise Retryable(f"connecting: {type(exc).__name__}: {self.scrub(str(exc))}", lost=lost(exc)) from None
        try:
            conn.request(method, path, headers=headers)
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            # RemoteDisconnected is a ConnectionResetError: on a kept-alive connection, the server closed it while idle
            if reused and isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
                raise _Stale() from None
            kind = "timed out" if lost(exc) is TimeoutError else type(exc).__name__
            raise Retryable(f"no answer ({kind}: {self.scrub(str(exc)) or 'connection lost'})", lost=lost(exc)) from None

    def release(self, conn: Any, resp: Any) -> None:
        """Give a connection whose answer was read whole back to the pool (or close it where it will not be reused)."""
        if resp.will_close or not resp.isclosed():
            conn.close()
        else:
            pool_for(self.pool_key).give_back(conn)

    def error(self, conn: Any, resp: Any, start: int, stop: int) -> Exception:
        """The exception for a failed answer (its small XML body read for the S3 error code, then dropped)."""
        try:
            body = resp.read(65536)
        except (OSError, http.client.HTTPException):
            body = b""
        conn.close()
        found = _CODE.search(body)
        code = found.group(1).decode("ascii", "replace") if found else ""
        status = resp.status
        label = f"HTTP {status}{' ' + code if code else ''}"
        where = f"{self.shown} bytes [{start}, {stop})"
        if status in RETRY_STATUS or code in RETRY_CODES:
            return Retryable(label, _retry_after(resp.getheader("Retry-After")))
        if status == 412:
            return changed(self.shown, start, stop, f"If-Match failed: {label}")
        if status in (401, 403):
            hint = ("the server refuses it; a presigned URL may have expired" if self.kind == "http" else
                    "it is not public: give credentials" if self.anon else
                    "check the credentials, or pass storage_options={'anon': True} for a public object")
            return ObjectAccessError(f"{self.shown}: {label}: access denied ({hint})")
        if status == 404:
            return ObjectNotFoundError(f"{self.shown}: {label}: no such {'bucket' if code == 'NoSuchBucket' else 'object'}")
        if status == 416:
            return ObjectStorageError(f"{where}: {label}: the range is past the object's end")
        region = resp.getheader("x-amz-bucket-region")
        if region and region != self.region and status in (301, 307, 400):  # PermanentRedirect, a wrong signing region
            return ObjectStorageError(f"{where}: {label}: the bucket is in region {region}, not {self.region}: pass "
                                      f"storage_options={{'region': {region!r}}} or set AWS_REGION")
        if status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
            to = shown(urljoin(f"{self.pool_key[0]}://{self.host_header}{self.path}", resp.getheader("Location")))
            return ObjectStorageError(f"{where}: {label}: the server redirects to {to}; redirects are not followed: "
                                      f"name that URL instead")
        return ObjectStorageError(f"{where}: {label}")

    def check_encoding(self, conn: Any, resp: Any, start: int, stop: int) -> None:
        """Refuse an answer whose body is encoded on the way (``Content-Encoding: gzip``...): its bytes are not the
        object's bytes ``[start, stop)``, and would be read as them."""
        encoding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            conn.close()
            raise ObjectStorageError(
                f"{self.shown} bytes [{start}, {stop}): the server sent them encoded (Content-Encoding: {encoding}), "
                f"not as stored; byte ranges of an object are read as they are: turn that encoding off for this file"
            )


def content_range(resp: Any) -> "tuple[int, int, int | None] | None":
    """(first, last, total or None) of an answer's ``Content-Range``; None where it has none that parses."""
    found = _CONTENT_RANGE.match(resp.getheader("Content-Range") or "")
    if not found:
        return None
    total = found.group(3)
    return int(found.group(1)), int(found.group(2)), None if total == "*" else int(total)


def _credentials(store: Store, shown: str) -> Credentials:
    if store.given is not None:
        given = store.given.get()
        if given is None:
            raise ValueError(
                f"the credentials given in storage_options for {shown} are not in this process: they never travel in "
                f"a pickle (NOTE [credentials]); pass storage_options again where the streamer is unpickled, or set "
                f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY there"
            )
        return given
    return from_environment(store.profile, shown)
