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
    HDF5 array element spans several numpy items); ``rows`` is C-contiguous.
    Idempotent. Working memory: a few :data:`PIECE_BYTES`, whatever the rows.
    """
    if not pads or rows.size == 0:
        return
    items = rows.reshape(-1).view(np.uint8).reshape(-1, element_nbytes or rows.dtype.itemsize)
    nullterm = tuple(pad for pad in pads if pad[3] == "nullterm")
    after = _after_nul(items, nullterm) if nullterm else np.empty(0, np.intp)  # rows to zero, in any of them
    for offset, size, count, pad in pads:
        if pad == "nullterm" and not len(after):  # clean (most are padded with NULs): a table of 500 string
            continue                              # columns need not slice each of them each block
        strings = items[:, offset : offset + size * count].reshape(len(items), count, size)
        if pad == "nullterm":  # only elements with a byte after a NUL that is not one
            if len(after):  # an accumulate over every string cost 3-4x the check (1 M strings of 16 bytes)
                some = strings[after]
                some[np.logical_or.accumulate(some == 0, axis=2)] = 0
                strings[after] = some
        else:  # spacepad: the run of spaces at the end
            strings[np.logical_and.accumulate((strings == 32)[:, :, ::-1], axis=2)[:, :, ::-1]] = 0


#: The bytes of elements :func:`_after_nul` looks at a piece at a time: its arrays stay in the CPU's cache, and
#: are made once a call (a block's worth of them, made anew each block, cost their pages' first touch).
PIECE_BYTES = 1 << 17
#: Bytes between two strings under which :func:`_after_nul` looks at both in one span (a span costs a copy a piece).
SPAN_GAP = 16


def _after_nul(items: np.ndarray, pads: "tuple[StringPad, ...]") -> np.ndarray:
    """The rows of ``items`` (an element's bytes a row, C-contiguous) holding, in one of the null-terminated strings
    ``pads`` places, a byte that is not NUL after one that is; sorted.

    Such a byte follows a NUL that lies in a string before its last byte: three passes over a piece's bytes in
    numpy's vector loops (is it NUL; and inside a string; and the next byte not NUL), where a dozen over each 8-byte
    word of each string a row cost 2.8x the CPU time (3 strings of 16-64 bytes in 136-byte rows, a block of 30832
    rows: 1.4 ms against 4.0). Where the strings fill less than half an element, only their spans are looked at,
    gathered from each element."""
    n, nbytes = items.shape
    spans = _spans(pads, nbytes)
    width = sum(hi - lo for lo, hi in spans)
    inside = np.zeros(width, bool)  # a string's bytes but its last, in the gathered spans
    at = 0
    for lo, hi in spans:
        for offset, size, count, _ in pads:
            for k in range(count if lo <= offset < hi else 0):
                inside[at + offset - lo + k * size : at + offset - lo + (k + 1) * size - 1] = True
        at += hi - lo
    rows = max(1, min(n, PIECE_BYTES // width))
    inside = np.tile(inside, rows)
    # Each span as one numpy item: copied out 10x faster than as a row of bytes (8 of 32 bytes).
    parts = [items[:, lo:hi].view(f"V{hi - lo}")[:, 0] for lo, hi in spans] if width < nbytes else []
    gathered = np.empty((rows, width), np.uint8)
    nul, found = np.empty(rows * width, bool), np.empty(rows * width, bool)
    after: list[np.ndarray] = []
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        m = (stop - start) * width
        if not parts:
            piece = items[start:stop].reshape(-1)
        else:
            at = 0
            for (lo, hi), part in zip(spans, parts):
                np.copyto(gathered[: stop - start, at : at + hi - lo].view(f"V{hi - lo}")[:, 0], part[start:stop])
                at += hi - lo
            piece = gathered[: stop - start].reshape(-1)
        np.equal(piece, 0, out=nul[:m])
        hit = np.logical_and(nul[: m - 1], inside[: m - 1], out=found[: m - 1])
        np.greater(hit, nul[1:m], out=hit)  # and the next byte not NUL
        if hit.any():
            after.append(np.unique(np.flatnonzero(hit) // width) + start)
    return np.concatenate(after) if after else np.empty(0, np.intp)


def _spans(pads: "tuple[StringPad, ...]", nbytes: int) -> "list[tuple[int, int]]":
    """The byte ranges of an element of ``nbytes`` that :func:`_after_nul` looks at: strings less than
    :data:`SPAN_GAP` apart in one; the whole element where they fill half of it."""
    spans: list[tuple[int, int]] = []
    for offset, size, count, _ in sorted(pads):
        if spans and offset - spans[-1][1] < SPAN_GAP:
            spans[-1] = (spans[-1][0], max(spans[-1][1], offset + size * count))
        else:
            spans.append((offset, offset + size * count))
    return [(0, nbytes)] if 2 * sum(hi - lo for lo, hi in spans) >= nbytes else spans


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
    """The type to read the file's type ``tid`` with in place of the memory type ``mtype``, where that differs only
    in that HDF5 leaves fixed-length strings as stored (for :func:`deliver_strings` to convert); else None: ``tid``
    itself for whole elements, else ``mtype`` with the strings padded as the same members of ``tid`` (a column).

    HDF5 converts a compound holding a null-terminated string member by member, 4x slower than reading it as stored:
    64 MiB of a PyTables table of 32-byte rows, an 8-byte string among them, 40 ms against 8, with 10 of
    :func:`deliver_strings` (``benchmarks/table_strings.py``); a column of 64-byte strings, 2.4x.
    """
    if find_string_pads(tid) and _nullpadded(tid).equal(mtype):
        return tid
    stored = _padded_as(mtype, tid)
    return stored if find_string_pads(stored) and _nullpadded(stored).equal(mtype) else None


def _padded_as(mtype: Any, tid: Any) -> Any:
    """``mtype`` with each fixed-length string padded as the string of its size in the same place of ``tid`` (members
    matched by name, as HDF5 matches them)."""
    import h5py

    h5t = h5py.h5t
    cls, fixed = mtype.get_class(), lambda t: t.get_class() == h5t.STRING and not t.is_variable_str()
    if fixed(mtype) and fixed(tid) and tid.get_size() == mtype.get_size():
        copy = mtype.copy()
        copy.set_strpad(tid.get_strpad())
        return copy
    if cls == h5t.ARRAY and tid.get_class() == h5t.ARRAY and tid.get_array_dims() == mtype.get_array_dims():
        return h5t.array_create(_padded_as(mtype.get_super(), tid.get_super()), mtype.get_array_dims())
    if cls == h5t.COMPOUND and tid.get_class() == h5t.COMPOUND:
        members = {tid.get_member_name(j): tid.get_member_type(j) for j in range(tid.get_nmembers())}
        copy = h5t.create(h5t.COMPOUND, mtype.get_size())
        for i in range(mtype.get_nmembers()):
            name, member = mtype.get_member_name(i), mtype.get_member_type(i)
            copy.insert(name, mtype.get_member_offset(i), _padded_as(member, members[name]) if name in members else member)
        return copy
    return mtype


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
