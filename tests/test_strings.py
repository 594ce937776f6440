"""Fixed-length strings made what h5py delivers (``_io/strings.py``): HDF5's rule, for any layout of strings in an
element, read a piece at a time in working memory of its own size."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multitables._io import strings
from multitables._io.strings import deliver_strings


def _hdf5s_rule(items: np.ndarray, pads: "list[strings.StringPad]") -> None:
    """HDF5's conversion, a byte at a time: a null-terminated string zeroed from its first NUL, a space-padded one
    zeroed along its trailing spaces."""
    for offset, size, count, pad in pads:
        for row in items:
            for k in range(count):
                s = row[offset + k * size : offset + (k + 1) * size]
                if pad == "nullterm":
                    nul = np.flatnonzero(s == 0)
                    if len(nul):
                        s[nul[0] :] = 0
                else:
                    end = size
                    while end and s[end - 1] == 32:
                        end -= 1
                    s[end:] = 0


@st.composite
def _layouts(draw: st.DrawFn) -> "tuple[int, list[strings.StringPad]]":
    """An element's size and its strings: sizes 1-9, runs of 1-3, gaps of 0-40 bytes, either padding."""
    pads, at = [], draw(st.integers(0, 20))
    for _ in range(draw(st.integers(1, 5))):
        size, count = draw(st.integers(1, 9)), draw(st.integers(1, 3))
        pads.append((at, size, count, draw(st.sampled_from(["nullterm", "nullterm", "spacepad"]))))
        at += size * count + draw(st.integers(0, 40))
    return at + draw(st.integers(0, 20)), pads


@settings(max_examples=300, deadline=None)
@given(_layouts(), st.integers(1, 70), st.integers(1, 300), st.integers(1, 30), st.data())
def test_strings_anywhere_in_an_element_are_made_as_hdf5_makes_them(
    layout: "tuple[int, list[strings.StringPad]]", n: int, piece_bytes: int, span_gap: int, data: st.DataObject
) -> None:
    """NULs, spaces and letters anywhere, strings near and far apart, pieces of any number of rows: the bytes HDF5's
    rule gives, every other byte untouched, twice over the same."""
    nbytes, pads = layout
    drawn = np.frombuffer(data.draw(st.binary(min_size=n * nbytes, max_size=n * nbytes)), np.uint8)
    raw = np.array([0, 0, 0, 32, 97], np.uint8)[drawn % 5].reshape(n, nbytes)
    expected = raw.copy()
    _hdf5s_rule(expected, pads)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(strings, "PIECE_BYTES", piece_bytes)
        patch.setattr(strings, "SPAN_GAP", span_gap)
        rows = raw.reshape(-1).view(f"V{nbytes}")
        deliver_strings(rows, tuple(pads))
        assert raw.tobytes() == expected.tobytes()
        deliver_strings(rows, tuple(pads))  # idempotent
        assert raw.tobytes() == expected.tobytes()


@pytest.mark.parametrize("nbytes, pads", [
    (136, ((4, 16, 1, "nullterm"), (28, 32, 1, "nullterm"), (64, 64, 1, "nullterm"))),  # mostly strings
    (32, ((20, 8, 1, "nullterm"),)),  # one string, gathered out of each element
])
def test_the_check_of_a_block_takes_working_memory_of_a_few_pieces_whatever_the_rows(nbytes: int, pads: tuple) -> None:
    """A block of 1 M rows, strings padded with NULs as PyTables writes them, one bad row among them: found and
    zeroed, in a few pieces' memory, where arrays as long as the block cost their pages' first touch each block."""
    n = 1 << 20
    raw = np.zeros((n, nbytes), np.uint8)
    raw[:, ::3] = 7  # numbers' bytes, NULs among them
    for offset, size, count, _ in pads:
        raw[:, offset : offset + size * count] = 0
        raw[:, offset : offset + size // 2] = 97  # a string of half its size, then NULs
    bad = (n // 2, pads[-1][0] + pads[-1][1] - 1)
    raw[bad] = 98  # a byte after the NULs of the last string
    expected = raw.copy()
    expected[bad] = 0
    tracemalloc.start()
    try:
        deliver_strings(raw.reshape(-1).view(f"V{nbytes}"), pads)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert raw.tobytes() == expected.tobytes()
    assert peak < 1 << 20, peak  # PIECE_BYTES: 128 KiB; the block: 32-136 MiB
