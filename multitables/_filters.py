"""HDF5's filter pipeline, run in reverse on one stored chunk: the chunk engine's decoder.

A dataset's filters are applied in order when a chunk is written, so a
reader undoes them last to first. Each chunk records a *filter mask*: bit
``i`` set means filter ``i`` was skipped for that chunk (an optional filter
that failed, as blosc does on incompressible data); those are skipped here too.

Every stage writes into a buffer it is given where its library can (the last
stage writes into the caller's output, which may be the ring slot itself), so
a chunk costs one decode and no copy. The codecs, chosen by measurement on
256 KiB chunks of float32 noise, one core (see :data:`CHOICES`):

* deflate: libdeflate through ``imagecodecs.deflate_decode(out=)``, 2.4x
  ``zlib.decompress``; ``zlib`` where imagecodecs is missing.
* shuffle: c-blosc2's SIMD ``blosc2_unshuffle`` (from the library the
  ``blosc2`` wheel ships, by ctypes), 3.4x a per-byte numpy copy, which is the
  fall-back.
* fletcher32: HDF5's own sum (``imagecodecs.h5checksum_fletcher32``,
  2.5 GB/s), or an exact numpy version (1 GB/s); a mismatch is a
  :class:`ChunkDecodeError`.
* blosc (32001): c-blosc through imagecodecs (``blosc2.decompress`` where it
  is missing: same speed); blosc2 (32026): the ``blosc2`` package's frames,
  blocks put in C order with numpy.
* bitshuffle (32008, with its lz4 or zstd blocks): the bitshuffle library in
  hdf5plugin's own plugin, by ctypes (imagecodecs block by block where it
  cannot be loaded: 2.5x slower).
* lz4 (32004, HDF5's framing), zstd (32015), lzf (32000), bzip2 (307):
  imagecodecs (bzip2: ``bz2`` where it is missing).

:func:`build_pipeline` raises :class:`UnsupportedFilter` for anything else
(szip, scale-offset, n-bit, unknown plugins): the engine then leaves the
dataset to h5py, decided once at open.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .errors import MultitablesError

#: HDF5 filter ids.
DEFLATE, SHUFFLE, FLETCHER32, SZIP, NBIT, SCALEOFFSET = 1, 2, 3, 4, 5, 6
BZIP2, LZF, BLOSC, LZ4, BITSHUFFLE, ZSTD, BLOSC2 = 307, 32000, 32001, 32004, 32008, 32015, 32026

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


class ChunkDecodeError(MultitablesError, OSError):
    """A stored chunk could not be decoded: a checksum mismatch, a codec error or a wrong decoded size."""


class UnsupportedFilter(Exception):
    """The pipeline holds a filter (or a setting of one) that this module does not decode; the message says which."""


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


# ---------------------------------------------------------------------------
# Codec libraries, imported on first use (a spawned reader imports only what its dataset needs)
# ---------------------------------------------------------------------------

_cache: dict[str, Any] = {}


def _imagecodecs() -> Any:
    """The imagecodecs module, or None where it is not installed."""
    if "imagecodecs" not in _cache:
        try:
            import imagecodecs
        except ImportError:  # pragma: no cover - a declared dependency
            imagecodecs = None
        _cache["imagecodecs"] = imagecodecs
    return _cache["imagecodecs"]


def _codec(name: str) -> "Callable[..., Any] | None":
    """``imagecodecs.<name>``, or None where imagecodecs (or that codec in it) is missing."""
    ic = _imagecodecs()
    if ic is None:
        return None
    try:
        return getattr(ic, name)
    except (AttributeError, ImportError):  # pragma: no cover - a build without that codec
        return None


def _blosc2_library() -> "ctypes.CDLL | None":
    """c-blosc2 as shipped in the ``blosc2`` (or PyTables) wheel, found without importing either package."""
    if "libblosc2" not in _cache:
        lib = None
        for package, pattern in (("blosc2", "lib/libblosc2.so*"), ("tables", "libblosc2.so*"), ("blosc2", "lib/*blosc2*.dylib")):
            spec = importlib.util.find_spec(package)
            for folder in (spec.submodule_search_locations or []) if spec else []:
                for path in sorted(glob.glob(os.path.join(folder, pattern))):
                    try:
                        candidate = ctypes.CDLL(path)
                        fn = candidate.blosc2_unshuffle
                    except (OSError, AttributeError):
                        continue
                    fn.restype = ctypes.c_int32
                    fn.argtypes = [ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p]
                    lib = candidate
                    break
                if lib is not None:
                    break
            if lib is not None:
                break
        _cache["libblosc2"] = lib
    return _cache["libblosc2"]


_char_at = ctypes.c_char.from_buffer


def _bitshuffle_library() -> "ctypes.CDLL | None":
    """The bitshuffle library inside hdf5plugin's filter plugin (self-contained: it links only libc), or None.

    The very code h5py's bitshuffle filter runs; the ``bshuf_*`` functions
    are plain C, no HDF5 call among them.
    """
    if "libbshuf" not in _cache:
        lib = None
        spec = importlib.util.find_spec("hdf5plugin")
        for folder in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(glob.glob(os.path.join(folder, "plugins", "*h5bshuf*"))):
                try:
                    candidate = ctypes.CDLL(path)
                    fns = [candidate.bshuf_decompress_lz4, candidate.bshuf_decompress_zstd, candidate.bshuf_bitunshuffle]
                except (OSError, AttributeError):
                    continue
                for fn in fns:
                    fn.restype = ctypes.c_int64
                    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t]
                lib = candidate
                break
        _cache["libbshuf"] = lib
    return _cache["libbshuf"]


def _address(buf: Any) -> int:
    """The address of a bytes-like object's first byte (kept alive by the caller)."""
    try:
        return ctypes.addressof(_char_at(buf))  # 4x faster than ndarray.ctypes.data; needs a writable buffer
    except TypeError:
        return np.frombuffer(buf, np.uint8).ctypes.data


def _u8(buf: Any) -> np.ndarray:
    return np.frombuffer(buf, np.uint8)


def _check_size(what: str, got: int, size: int) -> None:
    if got != size:
        raise ChunkDecodeError(f"{what} decoded to {got} bytes, expected {size}")


# ---------------------------------------------------------------------------
# Stages: each undoes one filter
# ---------------------------------------------------------------------------


class _Stage:
    """Undo one filter. ``decode(src, size, dst)`` returns the ``size`` decoded bytes.

    ``writes_into``: given ``dst`` (a uint8 array of ``size``), the stage
    decodes into it and returns it; stages without it return a buffer of
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


class _Deflate(_Stage):
    name = "deflate"

    def __init__(self) -> None:
        self._decode = _codec("deflate_decode")
        self.writes_into = self._decode is not None

    def decode(self, src: Any, size: int, dst: "np.ndarray | None") -> Any:
        if self._decode is None:
            try:
                got = zlib.decompress(src, 15, max(size, 1))
            except zlib.error as exc:
                raise ChunkDecodeError(f"deflate: {exc}") from None
            _check_size("deflate", len(got), size)
            return got
        assert dst is not None
        try:
            got = self._decode(src, out=dst)
        except Exception as exc:  # imagecodecs.DeflateError: bad data, bad adler32, or more than size bytes
            raise ChunkDecodeError(f"deflate: {exc}") from None
        _check_size("deflate", len(got), size)
        return dst


class _Shuffle(_Stage):
    """HDF5's byte shuffle: byte ``j`` of element ``i`` was stored at ``j * n + i``; a leftover tail is stored as is."""

    name = "shuffle"
    compresses = False

    def __init__(self, itemsize: int) -> None:
        self.itemsize = itemsize
        lib = _blosc2_library() if 1 < itemsize <= 255 else None
        self._fn = lib.blosc2_unshuffle if lib is not None else None

    def decode(self, src: Any, size: "int | None", dst: "np.ndarray | None") -> Any:
        if size is None:
            size = memoryview(src).nbytes
        if dst is None:
            dst = np.empty(size, np.uint8)
        s = self.itemsize
        n = size // s
        if s <= 1 or n <= 1:  # HDF5 leaves such buffers as they are
            dst[:] = _u8(src)[:size]
            return dst
        if self._fn is not None:
            rc = self._fn(s, size, _address(src), _address(dst))
            if rc < 0:  # pragma: no cover - parameters are checked above
                raise ChunkDecodeError(f"shuffle: blosc2_unshuffle returned {rc}")
            return dst
        unshuffle_numpy(_u8(src)[:size], s, dst)
        return dst


def unshuffle_numpy(src: np.ndarray, itemsize: int, dst: np.ndarray) -> None:
    """Undo HDF5's shuffle of ``src`` (uint8) into ``dst`` (uint8, same length) with numpy."""
    n = len(src) // itemsize
    body = n * itemsize
    planes = src[:body].reshape(itemsize, n)
    items = dst[:body].reshape(n, itemsize)
    if itemsize <= 16:
        for k in range(itemsize):  # one strided copy per byte: 4x faster than a transposed copy for small items
            items[:, k] = planes[k]
    else:
        np.copyto(items, planes.T)
    dst[body:] = src[body:]


class _Fletcher32(_Stage):
    """Check and strip the 4-byte checksum HDF5 appends (stored little-endian)."""

    name = "fletcher32"
    writes_into = False
    compresses = False

    def __init__(self) -> None:
        self._sum = _codec("h5checksum_fletcher32") or fletcher32_numpy

    def decode(self, src: Any, size: "int | None", dst: "np.ndarray | None") -> Any:
        mv = memoryview(src).cast("B")
        if size is None:
            size = len(mv) - 4
        if size < 0:
            raise ChunkDecodeError(f"fletcher32: {len(mv)} bytes cannot hold a checksum")
        _check_size("fletcher32", len(mv) - 4, size)
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
    raw = _u8(data)
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


class _OutCodec(_Stage):
    """A codec with an ``imagecodecs``-style ``decode(src, out=dst)``."""

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self._fn = fn

    def decode(self, src: Any, size: int, dst: "np.ndarray | None") -> Any:
        assert dst is not None
        try:
            got = self._fn(src, out=dst)
        except Exception as exc:
            raise ChunkDecodeError(f"{self.name}: {exc}") from None
        _check_size(self.name, len(got), size)
        return dst


class _Bzip2(_Stage):
    name = "bzip2"

    def __init__(self) -> None:
        self._fn = _codec("bz2_decode")
        self.writes_into = self._fn is not None

    def decode(self, src: Any, size: "int | None", dst: "np.ndarray | None") -> Any:
        try:
            if dst is not None and self._fn is not None:
                got = self._fn(src, out=dst)
            else:
                import bz2

                got = bz2.decompress(memoryview(src))
        except Exception as exc:
            raise ChunkDecodeError(f"bzip2: {exc}") from None
        if size is not None:
            _check_size("bzip2", len(got), size)
        return dst if dst is not None else got


class _Blosc(_Stage):
    """Blosc 1 buffers (PyTables' and hdf5plugin's filter 32001): self-describing, any sub-codec and shuffle."""

    name = "blosc"

    def __init__(self) -> None:
        self._fn = _codec("blosc_decode")

    def decode(self, src: Any, size: int, dst: "np.ndarray | None") -> Any:
        assert dst is not None
        mv = src if isinstance(src, np.ndarray) else _u8(src)
        if len(mv) < 16:
            raise ChunkDecodeError(f"blosc: {len(mv)} bytes is shorter than a blosc header")
        _check_size("blosc", int.from_bytes(mv[4:8].tobytes(), "little"), size)
        try:
            if self._fn is not None:
                self._fn(mv, numthreads=1, out=dst)
            else:  # pragma: no cover - imagecodecs is a dependency
                import blosc2

                blosc2.decompress(mv, dst=dst)
        except Exception as exc:
            raise ChunkDecodeError(f"blosc: {exc}") from None
        return dst


class _Blosc2(_Stage):
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
            schunk = self._blosc2.schunk_from_cframe(_u8(src), copy=False)
            schunk.dparams = self._dparams
            if schunk.nchunks != 1:
                raise ChunkDecodeError(f"blosc2: a frame of {schunk.nchunks} chunks, expected 1")
            meta = schunk.meta
            layout = meta["b2nd"] if "b2nd" in meta else meta["caterva"] if "caterva" in meta else None
            if layout is None:
                _check_size("blosc2", int(schunk.nbytes), size)
                schunk.decompress_chunk(0, dst)
            else:
                self._decode_b2nd(schunk, [int(n) for n in layout[2]], [int(n) for n in layout[3]], [int(n) for n in layout[4]], size, dst)
        except ChunkDecodeError:
            raise
        except Exception as exc:
            raise ChunkDecodeError(f"blosc2: {exc}") from None
        return dst

    def _decode_b2nd(self, schunk: Any, shape: list[int], chunks: list[int], blocks: list[int], size: int, dst: np.ndarray) -> None:
        if shape != chunks or len(blocks) != len(shape) or not shape:
            raise ChunkDecodeError(f"blosc2: a b2nd array of shape {shape} in chunks {chunks}, expected one chunk")
        counts = [-(-s // b) for s, b in zip(shape, blocks)]
        padded = [n * b for n, b in zip(counts, blocks)]
        n_items, n_padded = int(np.prod(shape)), int(np.prod(padded))
        itemsize = size // n_items if n_items else 0
        _check_size("blosc2", n_items * itemsize, size)
        _check_size("blosc2", int(schunk.nbytes), n_padded * itemsize)
        if shape[1:] == blocks[1:] and shape[0] % blocks[0] == 0:
            schunk.decompress_chunk(0, dst)  # whole trailing slabs, no padding: already in C order
            return
        if len(self._scratch) < n_padded * itemsize:
            self._scratch = np.empty(n_padded * itemsize, np.uint8)
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


class _Bitshuffle(_Stage):
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
        lib = _bitshuffle_library()
        self._lib = {0: lib.bshuf_bitunshuffle, 2: lib.bshuf_decompress_lz4, 3: lib.bshuf_decompress_zstd}[self.compression] if lib else None
        self._unshuffle = _codec("bitshuffle_decode")
        self._block_codec = {2: _codec("lz4_decode"), 3: _codec("zstd_decode")}.get(self.compression)
        self._scratch: "np.ndarray | None" = None

    @staticmethod
    def available(compression: int) -> bool:
        if _bitshuffle_library() is not None:
            return True
        return _codec("bitshuffle_decode") is not None and _codec({0: "bitshuffle_decode", 2: "lz4_decode", 3: "zstd_decode"}[compression]) is not None

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
            _check_size("bitshuffle", int.from_bytes(mv[:8], "big"), size)
            block = int.from_bytes(mv[8:12], "big") // elem
            body = mv[12:]
        try:
            if self._lib is not None:
                src_arr = _u8(body)
                got = self._lib(src_arr.ctypes.data, _address(dst), size // elem, elem, block)
                if got < 0:
                    raise ChunkDecodeError(f"bitshuffle: error {got} from the bitshuffle library")
            elif self.compression == 0:
                self._unshuffle(body, itemsize=elem, blocksize=block, out=dst)
            else:
                if self._scratch is None or len(self._scratch) < size:
                    self._scratch = np.empty(size, np.uint8)
                shuffled = self._scratch[:size]
                self._decompress_blocks(body, shuffled, size // elem, block)
                self._unshuffle(memoryview(shuffled), itemsize=elem, blocksize=block, out=dst)
        except ChunkDecodeError:
            raise
        except Exception as exc:
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
            _check_size("bitshuffle block", len(got), nbytes)
            pos += length
            at += nbytes
        leftover = n % 8 * elem
        out[at : at + leftover] = _u8(mv[pos : pos + leftover])
        _check_size("bitshuffle", at + leftover, len(out))


# ---------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------


def _stage(spec: FilterSpec, itemsize: int) -> _Stage:
    """The stage undoing ``spec``; raises UnsupportedFilter."""
    fid, cd = spec.id, spec.cd_values
    label = f"filter {fid}" + (f" ({spec.name.split(';')[0]})" if spec.name else "")

    def need(fn_name: str) -> Callable[..., Any]:
        fn = _codec(fn_name)
        if fn is None:
            raise UnsupportedFilter(f"{label} needs imagecodecs (not installed)")
        return fn

    if fid == DEFLATE:
        return _Deflate()
    if fid == SHUFFLE:
        return _Shuffle(cd[0] if cd else itemsize)
    if fid == FLETCHER32:
        return _Fletcher32()
    if fid == BZIP2:
        return _Bzip2()
    if fid == BLOSC:
        return _Blosc()
    if fid == BLOSC2:
        if importlib.util.find_spec("blosc2") is None:
            raise UnsupportedFilter(f"{label} needs the blosc2 package (not installed)")
        return _Blosc2()
    if fid == LZ4:
        return _OutCodec("lz4", need("lz4h5_decode"))
    if fid == ZSTD:
        return _OutCodec("zstd", need("zstd_decode"))
    if fid == LZF:
        return _OutCodec("lzf", need("lzf_decode"))
    if fid == BITSHUFFLE:
        compression = cd[4] if len(cd) > 4 else 0
        if compression not in (0, 2, 3):
            raise UnsupportedFilter(f"{label} with compression {compression} is not decoded here")
        if not _Bitshuffle.available(compression):
            raise UnsupportedFilter(f"{label} needs imagecodecs (not installed)")
        return _Bitshuffle(cd, itemsize)
    raise UnsupportedFilter(f"{label} is not decoded by the chunk engine")


class Pipeline:
    """Undo a dataset's filters on one stored chunk at a time, into the caller's buffer.

    ``chunk_nbytes``: bytes of one decoded (whole, padded) chunk. Not
    thread-safe: it keeps scratch buffers between calls.
    """

    def __init__(self, specs: Sequence[FilterSpec], chunk_nbytes: int, itemsize: int) -> None:
        self.specs = tuple(specs)
        self.chunk_nbytes = chunk_nbytes
        self._stages = [_stage(s, itemsize) for s in self.specs]
        self._scratch: list[np.ndarray] = []
        self._all = (1 << len(self._stages)) - 1
        self._steps: dict[int, list[tuple[_Stage, "int | None"]]] = {}
        for stage, size in self._steps_for(0):
            if size is None and stage.compresses:
                raise UnsupportedFilter(f"{stage.name} applied after another compressor is not decoded here")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._stages)

    def is_identity(self, mask: int) -> bool:
        """Whether a chunk with filter ``mask`` is stored as it is (no filters, or all of them skipped)."""
        return mask & self._all == self._all

    def _steps_for(self, mask: int) -> list[tuple[_Stage, "int | None"]]:
        """The stages to undo for a chunk with filter ``mask``, last applied first, with each one's decoded size."""
        steps = self._steps.get(mask)
        if steps is None:
            steps = []
            # Decoding stage i gives what stage i was given when writing: the chunk, plus any checksums
            # added before it; unknown (None) once a compressor came before it.
            size: "int | None" = self.chunk_nbytes
            for i, stage in enumerate(self._stages):
                if not mask >> i & 1:
                    steps.append((stage, size))
                    if stage.compresses:
                        size = None
                    elif stage.name == "fletcher32" and size is not None:
                        size += 4
            steps.reverse()
            self._steps[mask] = steps
        return steps

    def _buffer(self, k: int, size: int) -> np.ndarray:
        while len(self._scratch) <= k:
            self._scratch.append(np.empty(0, np.uint8))
        if len(self._scratch[k]) < size:
            self._scratch[k] = np.empty(size, np.uint8)
        return self._scratch[k][:size]

    def decode(self, raw: Any, mask: int, out: np.ndarray) -> None:
        """Decode the stored bytes ``raw`` of a chunk with filter ``mask`` into ``out`` (uint8, ``chunk_nbytes``)."""
        steps = self._steps_for(mask)
        buf: Any = raw
        held = -1  # which scratch buffer holds ``buf`` (-1: none)
        for pos, (stage, size) in enumerate(steps):
            last = pos == len(steps) - 1
            if size is None or not stage.writes_into:
                dst: "np.ndarray | None" = None
            elif last:
                dst = out
            else:
                dst = self._buffer(1 if held == 0 else 0, size)
            got = stage.decode(buf, size, dst)
            if dst is not None and got is dst:
                held = -1 if dst is out else (1 if held == 0 else 0)
            elif not isinstance(got, memoryview):
                held = -1  # a buffer of the stage's own
            buf = got
        if buf is not out:
            n = memoryview(buf).nbytes
            _check_size("chunk", n, self.chunk_nbytes)
            out[:] = _u8(buf)


def build_pipeline(specs: Sequence[FilterSpec], chunk_nbytes: int, itemsize: int) -> Pipeline:
    """The decoder for ``specs`` (chunks of ``chunk_nbytes``, elements of ``itemsize``); raises :class:`UnsupportedFilter`."""
    return Pipeline(specs, chunk_nbytes, itemsize)
