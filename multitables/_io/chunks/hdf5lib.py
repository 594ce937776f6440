"""The HDF5 library h5py runs on, for the few calls h5py does not wrap (through ``ctypes``), and where its version differs."""

from __future__ import annotations

import contextlib
import ctypes
import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def hdf5_library() -> "ctypes.CDLL | None":
    """The HDF5 library h5py runs on (already loaded).

    Looked up once per process, through h5py's own extension: a handle's
    symbols include its dependencies', libhdf5's among them (0.05 ms). Scanning
    /proc/self/maps, the fall-back, costs ~1-3 ms: every fresh process paid it
    in its first stream.
    """
    try:
        from h5py import h5

        lib = _with_chunk_opts(ctypes.CDLL(h5.__file__))
        if lib is not None:
            return lib
    except (ImportError, OSError, AttributeError, TypeError):  # pragma: no cover - a build without a file
        pass
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "libhdf5-" in line or "libhdf5.so" in line})
    except OSError:  # pragma: no cover - not Linux
        return None
    for path in paths:
        if "hdf5_hl" in path:
            continue
        try:
            lib = _with_chunk_opts(ctypes.CDLL(path))
        except OSError:  # pragma: no cover
            continue
        if lib is not None:
            return lib
    return None  # pragma: no cover


def _with_chunk_opts(lib: "ctypes.CDLL") -> "ctypes.CDLL | None":
    """``lib`` with ``H5Pget_chunk_opts`` typed, or None where it has no such symbol."""
    try:
        fn = lib.H5Pget_chunk_opts
    except AttributeError:
        return None
    fn.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_uint)]
    fn.restype = ctypes.c_int
    return lib


class _Token(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint8 * 16)]  # H5O_token_t


def header_address(dsid: Any) -> "int | None":
    """Where the object header of dataset ``dsid`` is in its file (relative to the userblock), None if HDF5 will not say.

    h5py's ``h5o.get_info`` asks for everything, the size of the chunk index
    included, and HDF5 walks the whole B-tree to count it: the seeks
    :mod:`.btree` exists to avoid. This asks for the basic fields only.
    """
    lib = hdf5_library()
    if lib is None:  # pragma: no cover
        return None
    try:
        get_info, to_addr = lib.H5Oget_info3, lib.H5VLnative_token_to_addr
    except AttributeError:  # pragma: no cover - an HDF5 before 1.12
        return None
    get_info.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_uint]
    get_info.restype = ctypes.c_int
    to_addr.argtypes = [ctypes.c_int64, _Token, ctypes.POINTER(ctypes.c_uint64)]  # the token by value
    to_addr.restype = ctypes.c_int
    info = (ctypes.c_char * 256)()  # H5O_info2_t: fileno, then the 16-byte token; room to spare
    addr = ctypes.c_uint64(0)
    with _hdf5_lock():
        if get_info(dsid.id, info, 0x0001) < 0:  # H5O_INFO_BASIC  # pragma: no cover
            return None
        token = _Token.from_buffer(info, ctypes.sizeof(ctypes.c_ulong))
        if to_addr(dsid.id, token, ctypes.byref(addr)) < 0:  # pragma: no cover
            return None
    return int(addr.value)


#: The first HDF5 whose chunk listings (``H5Dchunk_iter``, ``H5Dget_chunk_info``) give file offsets: before it, they
#: leave out the userblock (HDF5 issue 3003), as h5py 3.10-3.11's wheels' HDF5 1.14.2 does.
CHUNK_ADDRESSES_IN_FILE_FROM = (1, 14, 4)


def chunk_address_base(dsid: Any) -> int:
    """What to add to the chunk addresses HDF5 lists for dataset ``dsid`` to have file offsets: the userblock's size
    where this HDF5 leaves it out (a chunk read at HDF5's address was another's bytes: wrong rows, or a decode error)."""
    import h5py

    if h5py.version.hdf5_version_tuple >= CHUNK_ADDRESSES_IN_FILE_FROM:
        return 0
    fid = h5py.h5i.get_file_id(dsid)
    try:
        return int(fid.get_create_plist().get_userblock())
    finally:
        fid.close()  # the dataset holds the file


def leaves_edge_chunks_unfiltered(dcpl: Any) -> bool:
    """Whether the dataset was written with ``H5D_CHUNK_DONT_FILTER_PARTIAL_CHUNKS`` (not visible through h5py)."""
    lib = hdf5_library()
    if lib is None:  # pragma: no cover - assume HDF5's default
        return False
    opts = ctypes.c_uint(0)
    with _hdf5_lock():
        if lib.H5Pget_chunk_opts(dcpl.id, ctypes.byref(opts)) < 0:  # pragma: no cover
            return False
    return bool(opts.value & 0x0002)


def _hdf5_lock() -> Any:
    """h5py's lock over every call into HDF5, held around ours.

    h5py's HDF5 is built without HDF5's own thread safety, so h5py calls it
    under one lock. A call through ``ctypes`` releases the GIL and takes no
    such lock: two threads opening streams at once ran HDF5 in both, and
    HDF5's state broke ("no VOL object wrap context", or a crash).
    """
    try:
        from h5py._objects import phil
    except ImportError:  # pragma: no cover - an h5py without it: no lock to share, as before
        return contextlib.nullcontext()
    return phil
