"""Blosc2 (hdf5-blosc2's filter 32026): the ``blosc2`` package's frames, b2nd blocks put in C order with numpy."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...._sys.signals import raised_by_handler
from ...._sys.spares import spare_bytes
from .base import ChunkDecodeError, Codec, as_u8, check_size


class Blosc2(Codec):
    """hdf5-blosc2 (filter 32026, PyTables and hdf5plugin): each chunk is a Blosc2 frame holding one chunk.

    A frame with a ``b2nd`` layer stores the HDF5 chunk as an N-d array cut
    in blocks, block after block (each padded to whole blocks): unless its
    blocks are whole trailing slabs, the decompressed blocks are put in C
    order here with one strided numpy copy (20x faster than assembling it
    through ``blosc2.NDArray``).
    """

    name = "blosc2"

    def __init__(self) -> None:
        import blosc2

        self._blosc2 = blosc2
        # One thread, as every codec here (blosc2 < 3 takes a dict).
        self._dparams = blosc2.DParams(nthreads=1) if hasattr(blosc2, "DParams") else {"nthreads": 1}
        self._scratch = np.empty(0, np.uint8)

    def decode(self, src: Any, size: "int | None", dst: "np.ndarray | None") -> Any:
        assert dst is not None and size is not None
        try:
            schunk = self._blosc2.schunk_from_cframe(as_u8(src), copy=False)
            schunk.dparams = self._dparams
            if schunk.nchunks != 1:
                raise ChunkDecodeError(f"blosc2: a frame of {schunk.nchunks} chunks, expected 1")
            meta = schunk.meta
            layout = meta["b2nd"] if "b2nd" in meta else meta["caterva"] if "caterva" in meta else None
            if layout is None:
                check_size("blosc2", int(schunk.nbytes), size)
                schunk.decompress_chunk(0, dst)
            else:
                self._decode_b2nd(schunk, [int(n) for n in layout[2]], [int(n) for n in layout[3]], [int(n) for n in layout[4]], size, dst)
        except ChunkDecodeError:
            raise
        except Exception as exc:
            if raised_by_handler(exc):
                raise  # the user's own: NOTE [a handler's exception]
            raise ChunkDecodeError(f"blosc2: {exc}") from None
        return dst

    def _decode_b2nd(self, schunk: Any, shape: list[int], chunks: list[int], blocks: list[int], size: int, dst: np.ndarray) -> None:
        if shape != chunks or len(blocks) != len(shape) or not shape:
            raise ChunkDecodeError(f"blosc2: a b2nd array of shape {shape} in chunks {chunks}, expected one chunk")
        counts = [-(-s // b) for s, b in zip(shape, blocks)]
        padded = [n * b for n, b in zip(counts, blocks)]
        n_items, n_padded = int(np.prod(shape)), int(np.prod(padded))
        itemsize = size // n_items if n_items else 0
        check_size("blosc2", n_items * itemsize, size)
        check_size("blosc2", int(schunk.nbytes), n_padded * itemsize)
        if shape[1:] == blocks[1:] and shape[0] % blocks[0] == 0:
            schunk.decompress_chunk(0, dst)  # whole trailing slabs, no padding: already in C order
            return
        if len(self._scratch) < n_padded * itemsize:
            self._scratch = spare_bytes(n_padded * itemsize)  # NOTE [spare buffers]
        stored = self._scratch[: n_padded * itemsize]
        schunk.decompress_chunk(0, stored)
        item = np.dtype(f"V{itemsize}")
        rank = len(shape)
        # Blocks in C order of the block grid, each block in C order: axes (grid..., block...) -> (g0, b0, g1, b1, ...).
        tiles = stored.view(item).reshape(counts + blocks).transpose([k for d in range(rank) for k in (d, rank + d)])
        if padded == shape:
            np.copyto(dst.view(item).reshape([n for d in range(rank) for n in (counts[d], blocks[d])]), tiles)
        else:
            whole = tiles.reshape(padded)
            np.copyto(dst.view(item).reshape(shape), whole[tuple(slice(0, s) for s in shape)])
