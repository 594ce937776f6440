"""Bitshuffle (filter 32008, with its lz4 or zstd blocks): hdf5plugin's own bitshuffle library, or imagecodecs block by block."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...._sys.signals import raised_by_handler
from ...._sys.spares import spare_bytes
from .base import ChunkDecodeError, Codec, as_u8, check_size
from .libraries import address, bitshuffle_library, imagecodecs_function


class Bitshuffle(Codec):
    """The bitshuffle filter (32008): bit-transposed blocks, optionally each lz4- or zstd-compressed.

    Compressed chunks start with the decoded size (8 bytes) and the block
    size in bytes (4 bytes), both big-endian, then each block as a 4-byte
    big-endian length and its compressed bytes; the last ``n % 8`` elements
    follow as they are. Decoded by the bitshuffle library of hdf5plugin's
    own plugin where it can be loaded, else block by block with imagecodecs
    (2.5x slower on 8 KiB blocks: a Python loop).
    """

    name = "bitshuffle"

    def __init__(self, cd_values: tuple[int, ...], itemsize: int) -> None:
        self.elem = cd_values[2] if len(cd_values) > 2 and cd_values[2] else itemsize
        self.block = cd_values[3] if len(cd_values) > 3 else 0
        self.compression = cd_values[4] if len(cd_values) > 4 else 0
        self.compresses = self.compression != 0
        lib = bitshuffle_library()
        self._lib = {0: lib.bshuf_bitunshuffle, 2: lib.bshuf_decompress_lz4, 3: lib.bshuf_decompress_zstd}[self.compression] if lib else None
        self._unshuffle = imagecodecs_function("bitshuffle_decode")
        self._block_codec = {2: imagecodecs_function("lz4_decode"), 3: imagecodecs_function("zstd_decode")}.get(self.compression)
        self._scratch: "np.ndarray | None" = None

    @staticmethod
    def available(compression: int) -> bool:
        if bitshuffle_library() is not None:
            return True
        needed = {0: "bitshuffle_decode", 2: "lz4_decode", 3: "zstd_decode"}[compression]
        return imagecodecs_function("bitshuffle_decode") is not None and imagecodecs_function(needed) is not None

    def decode(self, src: Any, size: "int | None", dst: "np.ndarray | None") -> Any:
        assert dst is not None and size is not None
        mv = memoryview(src).cast("B")
        elem = self.elem
        if size % elem:
            raise ChunkDecodeError(f"bitshuffle: {size} bytes is not a whole number of {elem}-byte elements")
        block = self.block
        body = mv
        if self.compression:
            if len(mv) < 12:
                raise ChunkDecodeError(f"bitshuffle: {len(mv)} bytes is shorter than its header")
            check_size("bitshuffle", int.from_bytes(mv[:8], "big"), size)
            block = int.from_bytes(mv[8:12], "big") // elem
            body = mv[12:]
        try:
            if self._lib is not None:
                src_arr = as_u8(body)
                got = self._lib(src_arr.ctypes.data, address(dst), size // elem, elem, block)
                if got < 0:
                    raise ChunkDecodeError(f"bitshuffle: error {got} from the bitshuffle library")
            # Else imagecodecs: _unshuffle is not None, as the registry makes this codec only where available() says so.
            elif self.compression == 0:
                self._unshuffle(body, itemsize=elem, blocksize=block, out=dst)  # type: ignore[misc]
            else:
                if self._scratch is None or len(self._scratch) < size:
                    self._scratch = spare_bytes(size)  # NOTE [spare buffers]
                shuffled = self._scratch[:size]
                self._decompress_blocks(body, shuffled, size // elem, block)
                self._unshuffle(shuffled.data, itemsize=elem, blocksize=block, out=dst)  # type: ignore[misc]
        except ChunkDecodeError:
            raise
        except Exception as exc:
            if raised_by_handler(exc):
                raise  # the user's own: NOTE [a handler's exception]
            raise ChunkDecodeError(f"bitshuffle: {exc}") from None
        return dst

    def _decompress_blocks(self, mv: memoryview, out: np.ndarray, n: int, block: int) -> None:
        assert self._block_codec is not None
        elem, pos, at = self.elem, 0, 0
        last = n % block - n % block % 8
        sizes = [block] * (n // block) + ([last] if last else [])
        for b in sizes:
            length = int.from_bytes(mv[pos : pos + 4], "big")
            pos += 4
            nbytes = b * elem
            got = self._block_codec(mv[pos : pos + length], out=out[at : at + nbytes])
            check_size("bitshuffle block", len(got), nbytes)
            pos += length
            at += nbytes
        leftover = n % 8 * elem
        out[at : at + leftover] = as_u8(mv[pos : pos + leftover])
        check_size("bitshuffle", at + leftover, len(out))
