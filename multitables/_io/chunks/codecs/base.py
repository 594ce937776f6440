"""What every codec shares: HDF5's filter ids, a filter as HDF5 records it, the errors, and the codec interface."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...._sys.signals import raised_by_handler
from ....errors import MultitablesError

#: HDF5 filter ids.
DEFLATE, SHUFFLE, FLETCHER32, SZIP, NBIT, SCALEOFFSET = 1, 2, 3, 4, 5, 6
BZIP2, LZF, BLOSC, LZ4, BITSHUFFLE, ZSTD, BLOSC2 = 307, 32000, 32001, 32004, 32008, 32015, 32026


class ChunkDecodeError(MultitablesError, OSError):
    """A stored chunk could not be decoded: a checksum mismatch, a codec error or a wrong decoded size."""


class UnsupportedFilter(Exception):
    """The pipeline holds a filter (or a setting of one) that this package does not decode; the message says which."""


@dataclass(frozen=True)
class FilterSpec:
    """One filter of a dataset's pipeline, as HDF5 records it."""

    id: int
    flags: int
    cd_values: tuple[int, ...]
    name: str = ""


def filters_of(dcpl: Any) -> tuple[FilterSpec, ...]:
    """The filter pipeline of an h5py dataset creation property list, in the order they were applied."""
    specs = []
    for i in range(dcpl.get_nfilters()):
        fid, flags, values, name = dcpl.get_filter(i)
        specs.append(FilterSpec(int(fid), int(flags), tuple(int(v) for v in values), name.decode("ascii", "replace")))
    return tuple(specs)


def as_u8(buf: Any) -> np.ndarray:
    """A bytes-like object as a uint8 array over the same memory (no copy)."""
    return np.frombuffer(buf, np.uint8)


def check_size(what: str, got: int, size: int) -> None:
    """Raise :class:`ChunkDecodeError` unless ``what`` decoded to ``size`` bytes."""
    if got != size:
        raise ChunkDecodeError(f"{what} decoded to {got} bytes, expected {size}")


class Codec:
    """Undo one filter. ``decode(src, size, dst)`` returns the ``size`` decoded bytes.

    ``writes_into``: given ``dst`` (a uint8 array of ``size``), the codec
    decodes into it and returns it; codecs without it return a buffer of
    their own (or a view of ``src``), and the pipeline copies where it must.
    ``size`` is None where it is not known before decoding (a checksum or a
    shuffle applied after a compressor); then ``dst`` is None too.
    """

    writes_into = True
    #: Whether the filter's output size depends on the data (so the size of what the next filter was given is unknown).
    compresses = True
    name = "?"

    def decode(self, src: Any, size: int, dst: "np.ndarray | None") -> Any:
        raise NotImplementedError


class OutCodec(Codec):
    """A codec with an ``imagecodecs``-style ``decode(src, out=dst)``: lz4 (HDF5's framing), zstd and lzf."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self._fn = fn

    def decode(self, src: Any, size: int, dst: "np.ndarray | None") -> Any:
        assert dst is not None
        try:
            got = self._fn(src, out=dst)
        except Exception as exc:
            if raised_by_handler(exc):
                raise  # the user's own: NOTE [a handler's exception]
            raise ChunkDecodeError(f"{self.name}: {exc}") from None
        check_size(self.name, len(got), size)
        return dst
