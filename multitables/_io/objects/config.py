"""Where objects are and how to reach them: ``storage_options`` read and resolved once, in the consumer, into a :class:`Store`.

Resolution follows the usual S3 clients (botocore's order), ``storage_options`` first:

* endpoint: ``endpoint_url``; else ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``,
  the profile's ``services`` section or ``endpoint_url`` (none of these with
  ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true``); else AWS itself;
* region: ``region``; else ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile's;
  else ``us-east-1``;
* credentials: NOTE [credentials] in ``credentials``;
* plain ``http://`` endpoints: on a loopback host, or with ``allow_http=True``
  (or ``AWS_ALLOW_HTTP=true``); refused elsewhere, where credentials would
  travel in clear.

The profile files are read through botocore (the ``[s3]`` extra), and only when
a profile is named (``profile=``, ``AWS_PROFILE``) or botocore is installed.
A :class:`Store` holds no secret: it travels to every reader inside the
nodes it describes, and is what ``pickle.dumps(streamer)`` writes.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .credentials import CredentialRef, botocore_session
from .urls import shown

MiB = 1 << 20


@dataclass(frozen=True)
class Tuning:
    """How requests are made: sizes, concurrency, retries, time-outs (each a ``storage_options`` key)."""

    #: Requests in flight at once, per reader (S3 gives its rate to about 16 requests of a few MiB in flight).
    max_inflight: int = 16
    #: The most bytes one GET asks for: longer reads are split into parts fetched in parallel; also the local
    #: cache's unit.
    part_size: int = 8 * MiB
    #: Stored chunks closer than this are fetched by one GET (the bytes between are read and dropped).
    merge_gap: int = 1 * MiB
    #: Tries per request, the first included; between them a back-off with full jitter, from ``backoff_base`` s
    #: doubling up to ``backoff_max`` s (a ``Retry-After`` is honoured up to that).
    attempts: int = 6
    backoff_base: float = 0.1
    backoff_max: float = 5.0
    #: Seconds to connect, and to wait for any byte of an answer (a stalled answer is retried).
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    #: Bytes the request that opens an object fetches from its start: the superblock and the metadata that
    #: follows it, read by HDF5 without more requests.
    open_readahead: int = 256 << 10


_INTS = ("max_inflight", "part_size", "merge_gap", "attempts", "open_readahead")
_FLOATS = ("backoff_base", "backoff_max", "connect_timeout", "read_timeout")
#: ``storage_options`` keys (s3fs's names are taken too: :data:`ALIASES`); anything else is an error.
KNOWN_OPTIONS = frozenset(
    ("endpoint_url", "region", "key", "secret", "token", "anon", "profile", "allow_http", "addressing", "verify",
     "cache_dir", "cache_size") + _INTS + _FLOATS
)
#: s3fs's and botocore's names for the same options.
ALIASES = {"aws_access_key_id": "key", "aws_secret_access_key": "secret", "aws_session_token": "token",
           "region_name": "region", "endpoint": "endpoint_url"}
#: Bytes the local cache holds by default (``cache_size``).
CACHE_SIZE = 16 << 30


@dataclass(frozen=True)
class Store:
    """Where ``s3://`` objects are and how requests reach any object: resolved settings, no secret (NOTE [credentials])."""

    #: ``scheme://host[:port][/base]`` of an S3-compatible endpoint; None: AWS, by region.
    endpoint: "str | None" = None
    region: str = "us-east-1"
    #: ``path`` (``endpoint/bucket/key``), ``virtual`` (``bucket.endpoint/key``) or ``auto`` (virtual on AWS
    #: where the bucket's name allows, path elsewhere).
    addressing: str = "auto"
    anon: bool = False
    allow_http: bool = False
    #: TLS verification: True, False, or a CA bundle's path.
    verify: "bool | str" = True
    profile: "str | None" = None
    #: Credentials given in ``storage_options``, by reference.
    given: "CredentialRef | None" = None
    tuning: Tuning = field(default_factory=Tuning)
    #: The local cache of object bytes (``_io.objects.cache``): its folder, and the bytes it may hold.
    cache_dir: "str | None" = None
    cache_size: int = CACHE_SIZE

    def base(self, bucket: str) -> "tuple[str, str, int, str]":
        """(scheme, host, port, path prefix) of requests for ``bucket``'s objects."""
        if self.endpoint is None:
            if self.addressing == "path" or "." in bucket:
                return "https", f"s3.{self.region}.amazonaws.com", 443, f"/{bucket}"
            return "https", f"{bucket}.s3.{self.region}.amazonaws.com", 443, ""
        p = urlsplit(self.endpoint)
        scheme, host = p.scheme, p.hostname or ""
        port = p.port or (443 if scheme == "https" else 80)
        prefix = p.path.rstrip("/")
        if self.addressing == "virtual":
            return scheme, f"{bucket}.{host}", port, prefix
        return scheme, host, port, f"{prefix}/{bucket}"


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine (plain http allowed there)."""
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_http(url: str, allow_http: bool, what: str) -> None:
    """Refuse a plain ``http://`` ``url`` off this machine unless allowed: whatever it carries travels in clear."""
    p = urlsplit(url)
    if p.scheme.lower() == "http" and not (allow_http or is_loopback(p.hostname or "")):
        raise ValueError(
            f"plain http:// {what} {shown(url)!r} refused: requests would travel unencrypted; use https, or "
            f"storage_options={{'allow_http': True}} (AWS_ALLOW_HTTP=true) on a network you trust"
        )


def make_store(storage_options: "dict[str, Any] | None") -> Store:
    """``storage_options`` read, checked and resolved (endpoint, region) into a :class:`Store`.

    ``TypeError`` for an unknown key (a typo must not pass silently),
    ``ValueError`` for a bad value. Credentials given here are registered
    (NOTE [credentials]), never kept in the store.
    """
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, not {type(storage_options).__name__}")
    opts: dict[str, Any] = {}
    for key, value in (storage_options or {}).items():
        key = ALIASES.get(key, key)
        if key not in KNOWN_OPTIONS:
            raise TypeError(f"unknown storage option {key!r} (known: {', '.join(sorted(KNOWN_OPTIONS))})")
        opts[key] = value
    if not opts:
        return _default_store(_environment())
    return _store(opts)


def _environment() -> "tuple[str | None, ...]":
    names = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_REGION",
             "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ALLOW_HTTP", "AWS_SKIP_SIGNATURE", "AWS_CONFIG_FILE")
    return tuple(os.environ.get(n) for n in names)


@functools.lru_cache(maxsize=4)
def _default_store(environment: "tuple[str | None, ...]") -> Store:
    """The store of no ``storage_options``, for this environment (asked once: a profile file is read for it)."""
    return _store({})


def _store(opts: dict[str, Any]) -> Store:
    tuning = Tuning(**{k: _number(k, opts[k], int if k in _INTS else float) for k in (*_INTS, *_FLOATS) if k in opts})
    if tuning.max_inflight < 1 or tuning.attempts < 1 or tuning.part_size < 64 << 10:
        raise ValueError("storage options: max_inflight and attempts are at least 1, part_size at least 64 KiB")
    addressing = opts.get("addressing", "auto")
    if addressing not in ("auto", "path", "virtual"):
        raise ValueError(f"storage option addressing={addressing!r} is not 'auto', 'path' or 'virtual'")
    given = None
    key, secret, token = (opts.get(k) for k in ("key", "secret", "token"))
    if key or secret or token:
        if not (isinstance(key, str) and isinstance(secret, str) and key and secret):
            raise ValueError("storage options: give 'key' and 'secret' together (and 'token' only with them)")
        given = CredentialRef.register(key, secret, token)
    profile = opts.get("profile")
    session = None
    region = opts.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    endpoint = opts.get("endpoint_url") or _endpoint_from_environment()
    if not region or endpoint is None:
        session = _session(profile)
        if session is not None:
            region = region or _profile_region(session)
            if endpoint is None and not _truthy(os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")):
                endpoint = _profile_endpoint(session)
    allow_http = opts.get("allow_http")
    allow_http = _truthy(os.environ.get("AWS_ALLOW_HTTP")) if allow_http is None else bool(allow_http)
    if endpoint is not None:
        p = urlsplit(endpoint)
        if p.scheme.lower() not in ("http", "https") or not p.hostname:
            raise ValueError(f"endpoint {shown(endpoint)!r} is not an http(s) URL")
        check_http(endpoint, allow_http, "endpoint")
    cache_dir = opts.get("cache_dir")
    if cache_dir is not None:
        cache_dir = _usable_folder(cache_dir)
    cache_size = _number("cache_size", opts.get("cache_size", CACHE_SIZE), int)
    anon = bool(opts.get("anon")) or _truthy(os.environ.get("AWS_SKIP_SIGNATURE"))
    verify = opts.get("verify", True)
    if isinstance(verify, os.PathLike):
        verify = os.fspath(verify)
    if not isinstance(verify, (bool, str)):
        raise TypeError("storage option verify is True, False or a CA bundle's path")
    if isinstance(verify, str) and not os.path.isfile(verify):  # else every connection fails, retried, unnamed
        raise ValueError(f"storage option verify={verify!r} is not a CA bundle's file (a PEM file of certificates)")
    return Store(
        endpoint=endpoint.rstrip("/") if endpoint else None, region=region or "us-east-1", addressing=addressing,
        anon=anon, allow_http=allow_http, verify=verify, profile=profile, given=given, tuning=tuning,
        cache_dir=cache_dir, cache_size=cache_size,
    )


def _usable_folder(folder: Any) -> str:
    """``folder`` as a path the cache can write in, made if missing; else ``ValueError`` naming the option: a
    ``FileNotFoundError`` here would read as a missing object."""
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"storage option cache_dir is a folder's path, not {type(folder).__name__}")
    folder = os.fspath(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=folder)  # root passes os.access: try it
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"storage option cache_dir={folder!r} cannot hold the cache: {exc.strerror or exc}") from exc
    return folder


def _number(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"storage option {name}={value!r} is not a number >= 0")
    return kind(value)


def _endpoint_from_environment() -> "str | None":
    if _truthy(os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")):
        return None
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _session(profile: "str | None") -> Any:
    """A botocore session for the profile files: None where botocore is missing and no profile is named."""
    try:
        return botocore_session(profile)
    except ImportError:
        if profile is not None or os.environ.get("AWS_PROFILE"):
            raise
        return None


def _profile_region(session: Any) -> "str | None":
    try:
        return session.get_config_variable("region")
    except Exception:  # a profile named but missing: the credentials say so, clearly
        return None


def _profile_endpoint(session: Any) -> "str | None":
    try:
        scoped, full = session.get_scoped_config(), session.full_config
    except Exception:
        return None
    if _truthy(scoped.get("ignore_configured_endpoint_urls")):
        return None
    services = scoped.get("services")
    if services:
        found = full.get("services", {}).get(services, {}).get("s3", {}).get("endpoint_url")
        if found:
            return found
    return scoped.get("endpoint_url")
