"""Bzip2 (filter 307, hdf5plugin's): imagecodecs, or the standard library's ``bz2`` where it is missing."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...._sys.signals import raised_by_handler
from .base import ChunkDecodeError, Codec, check_size
from .libraries import imagecodecs_function


class Bzip2(Codec):
    name = "bzip2"

    def __init__(self) -> None:
        self._fn = imagecodecs_function("bz2_decode")
        self.writes_into = self._fn is not None

    def decode(self, src: Any, size: "int | None", dst: "np.ndarray | None") -> Any:
        try:
            if dst is not None and self._fn is not None:
                got = self._fn(src, out=dst)
            else:
                import bz2

                got = bz2.decompress(memoryview(src))
        except Exception as exc:
            if raised_by_handler(exc):
                raise  # the user's own: NOTE [a handler's exception]
            raise ChunkDecodeError(f"bzip2: {exc}") from None
        if size is not None:
            check_size("bzip2", len(got), size)
        return dst if dst is not None else got
