"""Fixed-length strings as h5py delivers them: where an element holds them, and their bytes made so.

HDF5 converts a stored fixed-length string into numpy's form on read; an
engine that delivers stored bytes (the chunk engine, PyTables) converts them
itself with :func:`deliver_strings`, at the places :func:`find_string_pads` found
when the node was inspected (``NodeInfo.string_pads``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: ``(offset, size, count, pad)``: ``count`` consecutive fixed-length strings of
#: ``size`` bytes at byte ``offset`` of an element, padded as ``pad`` says
#: (``"nullterm"`` or ``"spacepad"``).
StringPad = tuple[int, int, int, str]


def deliver_strings(rows: np.ndarray, pads: "tuple[StringPad, ...]", element_nbytes: "int | None" = None) -> None:
    """Make the stored bytes of ``rows``' strings what h5py delivers, in place.

    HDF5 converts a null-terminated string to numpy's null padding by zeroing
    every byte from its first NUL, and a space-padded one by zeroing its
    trailing spaces (``b'sweet  '`` -> ``b'sweet'``); engines that deliver
    stored bytes (the chunk engine, PyTables) call this. ``pads`` are places
    in one element of ``element_nbytes`` bytes (default: ``rows``' item; an
    HDF5 array element spans several numpy items). Idempotent.
    """
    if not pads or rows.size == 0:
        return
    items = rows.reshape(-1).view(np.uint8).reshape(-1, element_nbytes or rows.dtype.itemsize)
    for offset, size, count, pad in pads:
        strings = items[:, offset : offset + size * count].reshape(len(items), count, size)
        if pad == "nullterm":  # only elements with a byte after a NUL that is not one (most are padded with NULs)
            nul = strings == 0
            after = np.flatnonzero((nul[:, :, :-1] & ~nul[:, :, 1:]).any(axis=(1, 2)))
            if len(after):  # an accumulate over every string cost 3-4x this check (1 M strings of 16 bytes)
                some = strings[after]
                some[np.logical_or.accumulate(some == 0, axis=2)] = 0
                strings[after] = some
        else:  # spacepad: the run of spaces at the end
            strings[np.logical_and.accumulate((strings == 32)[:, :, ::-1], axis=2)[:, :, ::-1]] = 0


def find_string_pads(tid: Any, offset: int = 0) -> list[StringPad]:
    """Where the HDF5 type ``tid`` holds fixed-length strings that h5py converts (null-terminated or space-padded)."""
    import h5py

    h5t = h5py.h5t
    cls = tid.get_class()
    if cls == h5t.STRING and not tid.is_variable_str():
        pad = {h5t.STR_NULLTERM: "nullterm", h5t.STR_SPACEPAD: "spacepad"}.get(tid.get_strpad())
        return [(offset, tid.get_size(), 1, pad)] if pad else []
    if cls == h5t.ARRAY:
        base = tid.get_super()
        size, count = base.get_size(), math.prod(tid.get_array_dims())
        inner = find_string_pads(base)
        if len(inner) == 1 and inner[0][:3] == (0, size, 1):  # an array of strings: one run
            return [(offset, size, count, inner[0][3])]
        return [(offset + k * size + o, n, c, p) for k in range(count) for o, n, c, p in inner]
    if cls == h5t.COMPOUND:
        return [
            pad
            for i in range(tid.get_nmembers())
            for pad in find_string_pads(tid.get_member_type(i), offset + tid.get_member_offset(i))
        ]
    return []
