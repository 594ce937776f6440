"""Blosc 1 (filter 32001): c-blosc through imagecodecs, or ``blosc2.decompress`` (as fast) where it is missing; part of a
buffer through c-blosc2's ``blosc2_getitem`` (:meth:`Blosc.decode_part`)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ...._sys.signals import raised_by_handler
from .base import ChunkDecodeError, Codec, as_u8, check_size
from .libraries import blosc2_library, imagecodecs_function


class Blosc(Codec):
    """Blosc 1 buffers (PyTables' and hdf5plugin's filter 32001): self-describing, any sub-codec and shuffle."""

    name = "blosc"

    def __init__(self) -> None:
        self._fn = imagecodecs_function("blosc_decode")

    def decode(self, src: Any, size: int, dst: "np.ndarray | None") -> Any:
        assert dst is not None
        mv = _checked(src, size)
        try:
            if self._fn is not None:
                self._fn(mv, numthreads=1, out=dst)
            else:  # pragma: no cover - imagecodecs is a dependency
                import blosc2

                blosc2.decompress(mv, dst=dst)
        except Exception as exc:
            if raised_by_handler(exc):
                raise  # the user's own: NOTE [a handler's exception]
            raise ChunkDecodeError(f"blosc: {exc}") from None
        return dst

    def decode_part(self, src: Any, size: int, first: int, dst: np.ndarray) -> bool:
        """Decode bytes ``first .. first + len(dst)`` of the ``size`` bytes blosc buffer ``src`` holds into ``dst`` (a uint8
        array), decoding only the blosc blocks they fall in; False where c-blosc2 is missing or the range does not fall on
        whole items (the caller decodes otherwise). Raises :class:`ChunkDecodeError` as :meth:`decode`."""
        mv = _checked(src, size)
        getitem = _getitem()
        typesize = int(mv[3])
        if getitem is None or typesize == 0 or first % typesize or len(dst) % typesize or first + len(dst) > size:
            return False
        nitems = len(dst) // typesize
        got = getitem(mv.ctypes.data, len(mv), first // typesize, nitems, dst.ctypes.data, len(dst))
        if got != len(dst):
            raise ChunkDecodeError(f"blosc: decoding items {first // typesize}..{first // typesize + nitems} gave {got}")
        return True


def _checked(src: Any, size: int) -> np.ndarray:
    """``src`` as uint8, once its blosc header says it holds ``size`` bytes (else :class:`ChunkDecodeError`)."""
    mv = src if isinstance(src, np.ndarray) else as_u8(src)
    if len(mv) < 16:
        raise ChunkDecodeError(f"blosc: {len(mv)} bytes is shorter than a blosc header")
    check_size("blosc", int.from_bytes(mv[4:8].tobytes(), "little"), size)
    return mv


def _getitem() -> Any:
    """c-blosc2's ``blosc2_getitem`` (it reads blosc 1 buffers too), typed; None where the library is missing."""
    lib = blosc2_library()
    if lib is None:  # pragma: no cover - shipped in the blosc2 wheel, a dependency
        return None
    fn = lib.blosc2_getitem
    if fn.argtypes is None:
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int32]
        fn.restype = ctypes.c_int
    return fn
