"""The objects an ``s3://bucket/prefix/train-*.h5`` pattern names: the prefix listed (ListObjectsV2), the keys matched, sorted."""

from __future__ import annotations

import errno
import xml.etree.ElementTree as ET
from urllib.parse import quote

from .config import Store
from .http import Endpoint, retrying, use_pool
from .urls import ObjectURL, glob_prefix, matches, parse_url

#: Keys asked for per listing request (S3's most).
PAGE = 1000


def expand(url: str, store: Store) -> "list[str]":
    """The URLs ``url`` names: itself, or for an ``s3://`` pattern its matches in sorted order.

    ``FileNotFoundError`` when a pattern matches nothing. An http(s) URL is
    taken as it is: a web server has no listing to ask.
    """
    parsed = parse_url(url)
    if parsed.kind == "http":
        return [url]
    if not parsed.is_pattern:
        return [url]
    keys = [key for key in list_keys(parsed, store, glob_prefix(parsed.key)) if matches(key, parsed.key)]
    if not keys:
        raise FileNotFoundError(errno.ENOENT, "No object matches the pattern", parsed.shown)
    unnamed = [key for key in keys if not UNNAMED.isdisjoint(key) or not key.isprintable()]
    if unnamed:  # an s3:// URL would lose the rest of the key at a '?' or '#'
        raise ValueError(f"{parsed.shown!r} matches objects whose keys an s3:// URL cannot name (a '?', '#' or a "
                         f"control character): {unnamed[:3]}; rename them, or narrow the pattern to leave them out")
    return [f"s3://{parsed.bucket}/{key}" for key in sorted(keys)]


#: Characters of a key that its s3:// URL would take for a query or fragment.
UNNAMED = frozenset("?#")


def list_keys(where: ObjectURL, store: Store, prefix: str) -> "list[str]":
    """Every key of ``where``'s bucket that starts with ``prefix`` (signed GETs of ListObjectsV2, page by page, each
    retried as reads are)."""
    endpoint = Endpoint(ObjectURL("s3", where.bucket, "-"), store)
    base = endpoint.path[: -len("/-")]
    shown = endpoint.shown = f"listing s3://{where.bucket}/{prefix}*"  # what its errors name, not the "-" key
    keys: list[str] = []
    token = None
    use_pool(endpoint.pool_key, +1)
    try:
        while True:
            query = f"list-type=2&max-keys={PAGE}&prefix={quote(prefix, safe='-_.~')}"
            if token is not None:
                query = f"continuation-token={quote(token, safe='-_.~')}&{query}"
            root = ET.fromstring(retrying(lambda: _get(endpoint, f"{base or '/'}?{query}"), store.tuning, shown))
            ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            keys += [c.findtext(f"{ns}Key") or "" for c in root.iter(f"{ns}Contents")]
            token = root.findtext(f"{ns}NextContinuationToken")
            if (root.findtext(f"{ns}IsTruncated") or "false").lower() != "true" or not token:
                return keys
    finally:
        use_pool(endpoint.pool_key, -1)


def _get(endpoint: Endpoint, path: str) -> bytes:
    conn, resp = endpoint.request("GET", {}, path)
    if resp.status != 200:
        raise endpoint.error(conn, resp, 0, 0)
    body = resp.read()
    endpoint.release(conn, resp)
    return body
