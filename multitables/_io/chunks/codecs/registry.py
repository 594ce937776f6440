"""Which codec undoes which HDF5 filter, and the pipeline built from a dataset's filters.

:func:`build_pipeline` raises :class:`~.base.UnsupportedFilter` for anything
no codec here decodes (szip, scale-offset, n-bit, unknown plugins): the
chunk engine then leaves the dataset to h5py, decided once at open.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Callable, Sequence

from .base import (
    BITSHUFFLE,
    BLOSC,
    BLOSC2,
    BZIP2,
    DEFLATE,
    FLETCHER32,
    LZ4,
    LZF,
    SHUFFLE,
    ZSTD,
    Codec,
    FilterSpec,
    OutCodec,
    UnsupportedFilter,
)
from .bitshuffle import Bitshuffle
from .blosc import Blosc
from .blosc2 import Blosc2
from .bzip2 import Bzip2
from .deflate import Deflate
from .fletcher32 import Fletcher32
from .libraries import imagecodecs_function
from .pipeline import Pipeline
from .shuffle import Shuffle

#: What the measurements chose, for the record (MB/s of decoded bytes, one
#: core, 256 KiB chunks, medians of 7 interleaved rounds on the busy 2-core
#: development machine; ``bench`` scripts in the engine's report).
CHOICES = {
    "deflate": "imagecodecs.deflate_decode(out=) 1367 > deflate.zlib_decompress 741 > zlib_ng 658 > isal_zlib 600 > zlib 553",
    "shuffle (4-byte items)": "blosc2_unshuffle 7969 > numpy per-byte copy 2509 > numcodecs.Shuffle 2355 > imagecodecs.byteshuffle_decode 1810 > numpy .T copy 621",
    "blosc": "imagecodecs.blosc_decode(out=) 2493 = blosc2.decompress(dst=) 2485",
    "fletcher32": "imagecodecs.h5checksum_fletcher32 2528 > numpy (float64 block sums) 980",
    "blosc2 b2nd, 2 MiB chunks in 128x256 blocks": "decompress_chunk + numpy block reorder 2339 (whole read) > blosc2.NDArray[...] 1086",
    "bitshuffle-lz4 (8 KiB blocks)": "hdf5plugin's bshuf_decompress_lz4 1235 (whole read) > imagecodecs per block 511",
}


def codec_for(spec: FilterSpec, itemsize: int) -> Codec:
    """The codec undoing ``spec`` on elements of ``itemsize`` bytes; raises :class:`~.base.UnsupportedFilter`."""
    fid, cd = spec.id, spec.cd_values
    label = f"filter {fid}" + (f" ({spec.name.split(';')[0]})" if spec.name else "")

    def need(fn_name: str) -> Callable[..., Any]:
        fn = imagecodecs_function(fn_name)
        if fn is None:
            raise UnsupportedFilter(f"{label} needs imagecodecs (not installed)")
        return fn

    if fid == DEFLATE:
        return Deflate()
    if fid == SHUFFLE:
        return Shuffle(cd[0] if cd else itemsize)
    if fid == FLETCHER32:
        return Fletcher32()
    if fid == BZIP2:
        return Bzip2()
    if fid == BLOSC:
        return Blosc()
    if fid == BLOSC2:
        if importlib.util.find_spec("blosc2") is None:
            raise UnsupportedFilter(f"{label} needs the blosc2 package (not installed)")
        return Blosc2()
    if fid == LZ4:
        return OutCodec("lz4", need("lz4h5_decode"))
    if fid == ZSTD:
        return OutCodec("zstd", need("zstd_decode"))
    if fid == LZF:
        return OutCodec("lzf", need("lzf_decode"))
    if fid == BITSHUFFLE:
        compression = cd[4] if len(cd) > 4 else 0
        if compression not in (0, 2, 3):
            raise UnsupportedFilter(f"{label} with compression {compression} is not decoded here")
        if not Bitshuffle.available(compression):
            raise UnsupportedFilter(f"{label} needs imagecodecs (not installed)")
        return Bitshuffle(cd, itemsize)
    raise UnsupportedFilter(f"{label} is not decoded by the chunk engine")


def build_pipeline(specs: Sequence[FilterSpec], chunk_nbytes: int, itemsize: int) -> Pipeline:
    """The decoder for ``specs`` (chunks of ``chunk_nbytes``, elements of ``itemsize``); raises :class:`~.base.UnsupportedFilter`."""
    return Pipeline(specs, [codec_for(s, itemsize) for s in specs], chunk_nbytes)
