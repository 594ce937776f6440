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
            after = np.flatnonzero(_after_nul(items, offset, size, count))
            if len(after):  # an accumulate over every string cost 3-4x the check (1 M strings of 16 bytes)
                some = strings[after]
                some[np.logical_or.accumulate(some == 0, axis=2)] = 0
                strings[after] = some
        else:  # spacepad: the run of spaces at the end
            strings[np.logical_and.accumulate((strings == 32)[:, :, ::-1], axis=2)[:, :, ::-1]] = 0


#: Per byte of a word, the bits below its top one: ``(x & _LOW) + _LOW`` sets a byte's top bit where it is not 0.
_LOW = {w: np.uint64(int("7f" * w, 16)).astype(f"<u{w}") for w in (1, 2, 4, 8)}


def _after_nul(items: np.ndarray, offset: int, size: int, count: int) -> np.ndarray:
    """Which rows of ``items`` (an element's bytes a row, C-contiguous) hold, in one of the ``count`` strings of
    ``size`` bytes at ``offset``, a byte that is not NUL after one that is.

    A string's bytes are read as little-endian words of 8 bytes (the tail in 4, 2, 1) in place, each word's nonzero
    bytes and NULs marked by their top bit, and the NULs' marks shifted one byte on: 4.5x faster than comparing
    bytes (2 M strings of 8 bytes in 32-byte rows: 10 ms against 46, where PyTables reads the table in 16 ms)."""
    n, stride = len(items), items.strides[0]
    flat = items.reshape(-1)
    found = np.zeros(n, bool)
    for k in range(count):
        start, end = offset + k * size, offset + (k + 1) * size
        before: "np.ndarray | None" = None  # the previous word's last byte, marked: 0x80 where it is NUL
        while start < end:
            w = next(w for w in (8, 4, 2, 1) if w <= end - start)
            low = _LOW[w]
            word = np.array(np.ndarray((n,), f"<u{w}", flat, start, (stride,)))  # one pass over the rows' memory
            marks = word & low
            marks += low
            marks |= word
            marks &= ~low  # 0x80 in each byte that is not NUL
            nuls = np.invert(marks, out=word)
            nuls &= ~low  # 0x80 in each NUL
            last = nuls >> np.uint8(8 * (w - 1)) if start + w < end else None  # for the next word
            nuls = np.left_shift(nuls, 8, out=nuls) if w > 1 else np.zeros_like(nuls)  # each NUL on its next byte
            if before is not None:
                nuls |= before
            nuls &= marks  # a byte not NUL after a NUL
            np.logical_or(found, nuls, out=found)
            before = last
            start += w
    return found


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


def stored_strings_type(tid: Any, mtype: Any) -> Any:
    """The file's type ``tid``, where reading with it in place of the memory type ``mtype`` differs only in that HDF5
    leaves fixed-length strings as stored (for :func:`deliver_strings` to convert); else None.

    HDF5 converts a compound holding a null-terminated string member by member, 4x slower than reading it as stored:
    64 MiB of a PyTables table of 32-byte rows, an 8-byte string among them, 40 ms against 8, with 10 of
    :func:`deliver_strings` (``benchmarks/table_strings.py``).
    """
    return tid if find_string_pads(tid) and _nullpadded(tid).equal(mtype) else None


def _nullpadded(tid: Any) -> Any:
    """``tid`` with every fixed-length string in it null-padded, as h5py makes numpy's strings in memory."""
    import h5py

    h5t = h5py.h5t
    cls = tid.get_class()
    if cls == h5t.STRING and not tid.is_variable_str():
        copy = tid.copy()
        copy.set_strpad(h5t.STR_NULLPAD)
        return copy
    if cls == h5t.ARRAY:
        return h5t.array_create(_nullpadded(tid.get_super()), tid.get_array_dims())
    if cls == h5t.COMPOUND:
        copy = h5t.create(h5t.COMPOUND, tid.get_size())
        for i in range(tid.get_nmembers()):
            copy.insert(tid.get_member_name(i), tid.get_member_offset(i), _nullpadded(tid.get_member_type(i)))
        return copy
    return tid
