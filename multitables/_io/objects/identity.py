"""What an object was when it was first looked at, and the error for one that changed since (NOTE [object identity] in ``reader``).

Apart from the request machinery (``http``, ``reader``) so that what only
carries or compares an identity (a node, a reader's request loop, the file
checks) imports no HTTP client: NOTE [objects on demand] in ``_io.objects``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import FileChangedError


def _norm(etag: "str | None") -> "str | None":
    return etag.strip().removeprefix("W/").strip('"') if etag else None


@dataclass(frozen=True)
class ObjectIdentity:
    """What an object was when it was opened: its size, ETag, version and Last-Modified (NOTE [object identity])."""

    size: int
    etag: "str | None" = None
    version: "str | None" = None
    last_modified: "str | None" = None

    @property
    def if_match(self) -> "str | None":
        """The ``If-Match`` header that makes every request fail (412) once the object changed; None for weak ETags."""
        if not self.etag or self.etag.strip().startswith("W/"):
            return None
        etag = self.etag.strip()
        return etag if etag.startswith('"') else f'"{etag}"'

    @property
    def key(self) -> str:
        """The identity as one string (a cache key's part)."""
        return f"{self.size}:{_norm(self.etag) or ''}:{self.version or ''}:{self.last_modified or ''}"

    def check(self, shown: str, start: int, stop: int, resp: Any, total: "int | None") -> None:
        """Raise :class:`~multitables.errors.FileChangedError` where the answer ``resp`` says another object answered."""
        etag, version, modified = (resp.getheader(h) for h in ("ETag", "x-amz-version-id", "Last-Modified"))
        why = None
        if self.etag and _norm(etag) != _norm(self.etag):
            why = f"its ETag is {etag}, was {self.etag}" if etag else "the answer carries no ETag"
        elif self.version and version and version != self.version:
            why = f"its version is {version}, was {self.version}"
        elif total is not None and total != self.size:
            why = f"its size is {total}, was {self.size}"
        elif not self.etag and self.last_modified and modified != self.last_modified:
            why = f"Last-Modified is {modified}, was {self.last_modified}"
        if why:
            raise changed(shown, start, stop, why)


def changed(shown: str, start: int, stop: int, why: str) -> FileChangedError:
    """The error for an object that is no longer the one opened: nothing of this read is used."""
    return FileChangedError(
        f"{shown} changed while it was being read ({why}); bytes [{start}, {stop}) of it are not used, and the "
        f"stream stops rather than mix rows of two versions"
    )
