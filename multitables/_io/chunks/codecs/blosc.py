"""Blosc 1 (filter 32001): c-blosc through imagecodecs, or ``blosc2.decompress`` (as fast) where it is missing."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import ChunkDecodeError, Codec, as_u8, check_size
from .libraries import imagecodecs_function


class Blosc(Codec):
    """Blosc 1 buffers (PyTables' and hdf5plugin's filter 32001): self-describing, any sub-codec and shuffle."""

    name = "blosc"

    def __init__(self) -> None:
        self._fn = imagecodecs_function("blosc_decode")

    def decode(self, src: Any, size: int, dst: "np.ndarray | None") -> Any:
        assert dst is not None
        mv = src if isinstance(src, np.ndarray) else as_u8(src)
        if len(mv) < 16:
            raise ChunkDecodeError(f"blosc: {len(mv)} bytes is shorter than a blosc header")
        check_size("blosc", int.from_bytes(mv[4:8].tobytes(), "little"), size)
        try:
            if self._fn is not None:
                self._fn(mv, numthreads=1, out=dst)
            else:  # pragma: no cover - imagecodecs is a dependency
                import blosc2

                blosc2.decompress(mv, dst=dst)
        except Exception as exc:
            raise ChunkDecodeError(f"blosc: {exc}") from None
        return dst
