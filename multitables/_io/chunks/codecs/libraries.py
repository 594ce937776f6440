"""The codec libraries, imported or loaded on first use: a spawned reader imports only what its dataset needs.

Each is looked up once per process and remembered in ``_cache`` (``None``
where it is missing); the tests replace ``_cache`` to play an install
without them.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
from typing import Any, Callable

import numpy as np

_cache: dict[str, Any] = {}


def imagecodecs() -> Any:
    """The imagecodecs module, or None where it is not installed."""
    if "imagecodecs" not in _cache:
        try:
            import imagecodecs

            _cache["imagecodecs"] = imagecodecs
        except ImportError:  # pragma: no cover - a declared dependency
            _cache["imagecodecs"] = None
    return _cache["imagecodecs"]


def imagecodecs_function(name: str) -> "Callable[..., Any] | None":
    """``imagecodecs.<name>``, or None where imagecodecs (or that codec in it) is missing."""
    ic = imagecodecs()
    if ic is None:
        return None
    try:
        return getattr(ic, name)
    except (AttributeError, ImportError):  # pragma: no cover - a build without that codec
        return None


#: Every imagecodecs function that a codec here takes (each codec's module names its own).
IMAGECODECS_FUNCTIONS = (
    "deflate_decode",
    "h5checksum_fletcher32",
    "blosc_decode",
    "bitshuffle_decode",
    "lz4_decode",
    "zstd_decode",
    "bz2_decode",
    "lz4h5_decode",
    "lzf_decode",
    "deflate_crc32",  # the object cache's sums (``_io.objects.cache``)
)


def load_codec_functions() -> None:
    """Have imagecodecs load every function of :data:`IMAGECODECS_FUNCTIONS` in this process now (NOTE [forking
    among threads] in ``_sys.forks``); those missing from its build stay missing."""
    for name in IMAGECODECS_FUNCTIONS:
        imagecodecs_function(name)


def blosc2_library() -> "ctypes.CDLL | None":
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


def bitshuffle_library() -> "ctypes.CDLL | None":
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


_char_at = ctypes.c_char.from_buffer


def address(buf: Any) -> int:
    """The address of a bytes-like object's first byte, for a ctypes call (the caller keeps ``buf`` alive)."""
    try:
        return ctypes.addressof(_char_at(buf))  # 4x faster than ndarray.ctypes.data; needs a writable buffer
    except TypeError:
        return np.frombuffer(buf, np.uint8).ctypes.data
