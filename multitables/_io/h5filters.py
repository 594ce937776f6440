"""The HDF5 filters h5py's library decodes: hdf5plugin's, registered once a process; those a node lacks, named."""

from __future__ import annotations

import functools
import importlib

from .node import NodeInfo


@functools.cache
def register_filters() -> None:
    """Give h5py's HDF5 hdf5plugin's filters (blosc, blosc2, bzip2, lz4, zstd, bitshuffle...): importing it registers them.

    Once per process: ``import_module`` of a loaded module still walks a dozen frames, twice a small file's pass."""
    importlib.import_module("hdf5plugin")


def h5py_lacks(node: NodeInfo) -> list[int]:
    """The filters of ``node`` that h5py's HDF5 (with hdf5plugin's filters) cannot decode."""
    import h5py

    register_filters()
    return [fid for fid in node.filter_ids if not h5py.h5z.filter_avail(fid)]


def filter_label(node: NodeInfo, fid: int) -> str:
    """How messages name filter ``fid`` of ``node``: its name as the file gives it, and its id."""
    names = dict(zip(node.filter_ids, node.filter_names))
    name = names.get(fid) or "unnamed"
    return f"{name!r} (id {fid})"
