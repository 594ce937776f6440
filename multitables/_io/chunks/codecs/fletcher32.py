"""Fletcher-32 (HDF5 filter 3): check and strip the checksum; HDF5's own sum from imagecodecs, or an exact numpy one."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import ChunkDecodeError, Codec, as_u8, check_size
from .libraries import imagecodecs_function


class Fletcher32(Codec):
    """Check and strip the 4-byte checksum HDF5 appends (stored little-endian)."""

    name = "fletcher32"
    writes_into = False
    compresses = False

    def __init__(self) -> None:
        self._sum = imagecodecs_function("h5checksum_fletcher32") or fletcher32_numpy

    def decode(self, src: Any, size: "int | None", dst: "np.ndarray | None") -> Any:
        mv = memoryview(src).cast("B")
        if size is None:
            size = len(mv) - 4
        if size < 0:
            raise ChunkDecodeError(f"fletcher32: {len(mv)} bytes cannot hold a checksum")
        check_size("fletcher32", len(mv) - 4, size)
        body = mv[:size]
        stored = int.from_bytes(mv[size : size + 4], "little")
        computed = int(self._sum(body))
        # HDF5 before 1.6.3 stored the sum with the bytes of each 16-bit half swapped; HDF5 accepts both.
        swapped = ((computed & 0x00FF00FF) << 8) | ((computed >> 8) & 0x00FF00FF)
        if stored not in (computed, swapped):
            raise ChunkDecodeError(f"fletcher32 checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")
        return body


def fletcher32_numpy(data: Any) -> int:
    """HDF5's Fletcher-32 (``H5_checksum_fletcher32``), bit for bit: big-endian 16-bit words, sums folded every 360.

    The folds keep each sum's value modulo 65535 and keep a positive sum
    positive, so the result is the sums' residues (65535 for a positive
    multiple), unless a 32-bit sum can wrap within a block (words near 0xffff
    throughout): then the blocks are added up one by one as the C code does.
    """
    raw = as_u8(data)
    odd = len(raw) % 2
    words = raw[: len(raw) - odd].view(">u2")
    n_blocks = -(-len(words) // 360)
    # Block sums and weighted sums in one float64 product: exact, as both stay below 2**53.
    blocks = np.zeros((n_blocks, 360), np.float64)
    blocks.reshape(-1)[: len(words)] = words
    weights = np.ones((360, 2))
    weights[:, 0] = np.arange(360, 0, -1)
    both = (blocks @ weights).astype(np.uint64)
    lengths = np.full(n_blocks, 360, np.uint64)
    if len(words) % 360:
        lengths[-1] = len(words) % 360
    sums = both[:, 1]
    # Within a block, word j adds to sum2 once for itself and once for each word after it: (length - j) times.
    weighted = both[:, 0] - (360 - lengths) * sums
    if odd:  # the last byte, as the high byte of one more word, folded on its own
        tail = np.array([int(raw[-1]) << 8], np.uint64)
        lengths, sums, weighted = (np.concatenate([a, b]) for a, b in ((lengths, [1]), (sums, tail), (weighted, tail)))
        lengths, sums, weighted = lengths.astype(np.uint64), sums.astype(np.uint64), weighted.astype(np.uint64)
    n = int(lengths.sum())
    worst = 0x1FFFE * (lengths + 1) + weighted  # the most sum2 can reach within each block, from folded sums
    if (worst <= 0xFFFFFFFF).all():
        after = (n - np.cumsum(lengths)) % 65535  # words after each block
        s1 = int(sums.sum() % 65535)
        s2 = int(((after * (sums % 65535)) % 65535 + weighted % 65535).sum() % 65535)
        any_word = bool(sums.any())
        sum1 = (s1 - 1) % 65535 + 1 if any_word else 0
        sum2 = (s2 - 1) % 65535 + 1 if any_word else 0
        return (sum2 << 16) | sum1
    sum1 = sum2 = 0
    for length, s, w in zip(lengths.tolist(), sums.tolist(), weighted.tolist()):
        sum2 = (sum2 + length * sum1 + w) & 0xFFFFFFFF
        sum1 = (sum1 + s) & 0xFFFFFFFF
        sum1 = (sum1 & 0xFFFF) + (sum1 >> 16)
        sum2 = (sum2 & 0xFFFF) + (sum2 >> 16)
    sum1 = (sum1 & 0xFFFF) + (sum1 >> 16)
    sum2 = (sum2 & 0xFFFF) + (sum2 >> 16)
    return ((sum2 << 16) | sum1) & 0xFFFFFFFF
