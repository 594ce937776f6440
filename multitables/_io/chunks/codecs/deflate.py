"""Deflate (HDF5 filter 1): libdeflate through ``imagecodecs.deflate_decode(out=)``, 2.4x ``zlib``, which is the fall-back."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from ...._sys.signals import raised_by_handler
from .base import ChunkDecodeError, Codec, check_size
from .libraries import imagecodecs_function


class Deflate(Codec):
    name = "deflate"

    def __init__(self) -> None:
        self._decode = imagecodecs_function("deflate_decode")
        self.writes_into = self._decode is not None

    def decode(self, src: Any, size: int, dst: "np.ndarray | None") -> Any:
        if self._decode is None:
            try:
                got = zlib.decompress(src, 15, max(size, 1))
            except zlib.error as exc:
                raise ChunkDecodeError(f"deflate: {exc}") from None
            check_size("deflate", len(got), size)
            return got
        assert dst is not None
        try:
            got = self._decode(src, out=dst)
        except Exception as exc:  # imagecodecs.DeflateError: bad data, bad adler32, or more than size bytes
            if raised_by_handler(exc):
                raise  # the user's own: NOTE [a handler's exception]
            raise ChunkDecodeError(f"deflate: {exc}") from None
        check_size("deflate", len(got), size)
        return dst
