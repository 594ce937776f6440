"""Object URLs: telling one from a local path, taking one apart, and showing one without what it must not show.

``s3://bucket/key`` names an object of an S3-compatible store (where the
store is comes from :mod:`~multitables._io.objects.config`);
``http(s)://host/path`` names a file any HTTP server with byte ranges serves.
A URL is shown (in errors, logs, reprs) without user info and without its
query, since a presigned URL carries its signature there.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: Schemes read as objects; any other name is a local path.
SCHEMES = ("s3://", "s3a://", "http://", "https://")
#: Characters that make the key of an ``s3://`` URL a pattern (``train-*.h5``).
GLOB_CHARS = frozenset("*?[")


def is_url(name: Any) -> bool:
    """Whether ``name`` is a URL this library reads as an object (a ``str`` starting with one of :data:`SCHEMES`)."""
    return isinstance(name, str) and name[:8].lower().startswith(SCHEMES)


def shown(url: str) -> str:
    """``url`` as errors and logs show it: no user info, and ``?...`` in place of a query (which may hold a signature)."""
    p = urlsplit(url)
    if p.scheme.lower() not in ("http", "https"):
        if "@" in p.netloc:  # user info in a URL of another scheme (a mistyped endpoint): never shown either
            return urlunsplit((p.scheme, p.netloc.rpartition("@")[2], p.path, "..." if p.query else "", ""))
        return url
    host = p.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if p.port:
        netloc += f":{p.port}"
    return urlunsplit((p.scheme, netloc, p.path, "..." if p.query else "", ""))


@dataclass(frozen=True)
class ObjectURL:
    """A URL taken apart: ``kind`` ``"s3"`` (``bucket`` and ``key``) or ``"http"`` (``url`` as given, query and all)."""

    kind: str
    bucket: str = ""
    key: str = ""
    #: The full http(s) URL, presigned query included: never shown (see :attr:`shown`).
    url: str = field(default="", repr=False)

    @property
    def shown(self) -> str:
        """How messages name the object."""
        return f"s3://{self.bucket}/{self.key}" if self.kind == "s3" else shown(self.url)

    @property
    def is_pattern(self) -> bool:
        """Whether the key holds glob characters: the URL names the objects it matches (S3 only)."""
        return self.kind == "s3" and bool(GLOB_CHARS.intersection(self.key))

    def with_key(self, key: str) -> "ObjectURL":
        return ObjectURL("s3", self.bucket, key)


def parse_url(url: str) -> ObjectURL:
    """``url`` taken apart; ``ValueError`` naming what is wrong with it (shown without its query)."""
    p = urlsplit(url)
    scheme = p.scheme.lower()
    if scheme in ("s3", "s3a"):
        bucket, key = p.netloc, p.path.lstrip("/")
        if "?" in url and not p.fragment:  # an s3:// URL has no query: a '?' is the pattern's one character
            key = (p.path + "?" + p.query).lstrip("/")
        if not bucket or not key or key.endswith("/"):
            raise ValueError(f"an S3 URL names a bucket and an object: s3://bucket/path/file.h5, not {shown(url)!r}")
        if p.fragment:
            raise ValueError(f"an S3 URL has no fragment: {url.split('#')[0]!r}")
        return ObjectURL("s3", bucket, key)
    if scheme in ("http", "https"):
        if not p.hostname:
            raise ValueError(f"no host in {shown(url)!r}")
        if p.username or p.password:
            raise ValueError(f"user and password in an http(s) URL are refused (they would travel with every copy of "
                             f"the name): {shown(url)!r}")
        return ObjectURL("http", url=url)
    raise ValueError(f"{url!r} is not a URL this library reads (s3://, http://, https://)")


#: Query parameters that sign or date a URL rather than name what it serves: AWS (SigV4 ``X-Amz-*``; SigV2, with
#: ``Signature``), Google Cloud Storage (``X-Goog-*``) and Azure shared access signatures (with ``sig``).
_SIGNING_PREFIXES = ("x-amz-", "x-goog-")
_SIGV2 = frozenset({"awsaccesskeyid", "signature", "expires"})
_AZURE_SAS = frozenset({"sv", "ss", "srt", "sp", "se", "st", "spr", "sig", "sr", "si", "sip", "sdd", "ses", "skoid",
                        "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "scid"})


def unsigned(url: str) -> str:
    """``url`` without the query parameters of a presigned URL's signature (NOTE [object cache]: a key that stays
    the same when the URL is signed again; the object's identity, checked on each open, tells versions apart).
    Other parameters (``versionId``, ...) stay, in their order; an s3:// URL is as given."""
    p = urlsplit(url)
    if p.scheme.lower() not in ("http", "https") or not p.query:
        return url
    pairs = [(part, part.partition("=")[0].lower()) for part in p.query.split("&")]
    names = {name for _, name in pairs}
    dropped = set(_SIGV2) if "signature" in names else set()
    dropped |= _AZURE_SAS if "sig" in names else set()
    kept = [part for part, name in pairs if name not in dropped and not name.startswith(_SIGNING_PREFIXES)]
    return urlunsplit((p.scheme, p.netloc, p.path, "&".join(kept), ""))


def glob_prefix(key: str) -> str:
    """The part of a key pattern before its first glob character: what a listing asks for."""
    cut = min((key.index(c) for c in GLOB_CHARS if c in key), default=len(key))
    return key[:cut]


def matches(key: str, pattern: str) -> bool:
    """Whether object ``key`` matches ``pattern`` as a path matches a glob: ``*``, ``?`` and ``[...]`` stay within one
    ``/``-separated part (``data/*.h5`` does not take ``data/old/a.h5``)."""
    keys, parts = key.split("/"), pattern.split("/")
    return len(keys) == len(parts) and all(fnmatch.fnmatchcase(k, p) for k, p in zip(keys, parts))


#: Characters S3 keys may hold that a path quotes; see :func:`quote_key`.
_SAFE = re.compile(r"[A-Za-z0-9\-_.~/]")


def quote_key(key: str) -> str:
    """``key`` percent-encoded for a request path, as S3 and its signature expect (``/`` kept, everything else
    outside the unreserved set encoded, UTF-8)."""
    return "".join(c if _SAFE.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in key)
