"""A file's sum (``multitables._io.sums``, NOTE [data sums]): a copy has its file's, a value changed in a file of at
most ``SAMPLED`` units gives another whatever the layout, a change in compressed data outside the sampled chunks is
seen by its chunk's size, and nothing is summed where the file may grow."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multitables._io.fileset import inspect_files
from multitables._io.sums import SAMPLED, file_sum

LAYOUTS: "dict[str, dict[str, Any]]" = {
    "deflate": dict(chunks=(8, 3), compression="gzip", shuffle=True, maxshape=(None, 3)),  # an edge chunk too
    "chunked": dict(chunks=(8, 3), maxshape=(None, 3)),
    "chunks split along a row": dict(chunks=(8, 1), maxshape=(None, 3)),
    "contiguous": {},
}


def _sum(path: Path, **kw: Any) -> "int | None":
    """The sum the inspection takes with the file open; the same read again from a node described without it."""
    summed = inspect_files(str(path), "/x", vlen=True, summed=True, **kw).data_sum
    assert file_sum(inspect_files(str(path), "/x", vlen=True, **kw)) == summed
    return summed


def _write(path: Path, x: np.ndarray, layout: str) -> Path:
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, **LAYOUTS[layout])
        f.create_dataset("other", data=np.arange(5))
    return path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.sampled_from(sorted(LAYOUTS)), n_rows=st.integers(1, 8 * SAMPLED), data=st.data())
def test_a_value_changed_anywhere_in_a_file_of_few_units_changes_its_sum_and_a_copy_keeps_it(
    tmp_path_factory: pytest.TempPathFactory, layout: str, n_rows: int, data: st.DataObject
) -> None:
    folder = tmp_path_factory.mktemp("sums")
    x = np.arange(3 * n_rows, dtype="<f8").reshape(n_rows, 3)
    row, col = data.draw(st.integers(0, n_rows - 1)), data.draw(st.integers(0, 2))
    new = data.draw(st.floats(allow_nan=False).filter(lambda v: v != x[row, col]))
    original = _write(folder / "a.h5", x, layout)
    copy = shutil.copyfile(original, folder / "elsewhere-b.h5")
    again = _write(folder / "c.h5", x, layout)  # the same values written anew: the same stored bytes
    changed = x.copy()
    changed[row, col] = new
    other = _write(folder / "d.h5", changed, layout)
    assert _sum(original) is not None
    assert _sum(copy) == _sum(again) == _sum(original)
    assert _sum(other) != _sum(original)


def test_a_change_outside_the_sampled_chunks_of_compressed_data_is_seen_by_its_chunks_size(tmp_path: Path) -> None:
    """100 chunks, of which 4 are read; chunk 50's values made noise: the same file size would not tell, its chunk's
    size does."""
    x = np.repeat(np.arange(800, dtype="<i8")[:, None] // 7, 3, axis=1)
    noisy = x.copy()
    noisy[400:408] = np.random.default_rng(0).integers(0, 1 << 40, (8, 3))
    a, b = _write(tmp_path / "a.h5", x, "deflate"), _write(tmp_path / "b.h5", noisy, "deflate")
    assert _sum(a) != _sum(b)


def test_variable_length_rows_are_summed_as_read(tmp_path: Path) -> None:
    """Their stored bytes are references into a heap, the same for other values of the same lengths."""
    def write(name: str, last: float) -> Path:
        with h5py.File(tmp_path / name, "w") as f:
            d = f.create_dataset("x", (3,), dtype=h5py.vlen_dtype(np.dtype("<f8")), chunks=(2,))
            for i, v in enumerate([[1.0], [2.0, 3.0], [4.0, last]]):
                d[i] = np.array(v)
        return tmp_path / name

    assert _sum(write("a.h5", 5.0)) == _sum(write("b.h5", 5.0)) != _sum(write("c.h5", 6.0))


def test_a_file_read_for_swmr_is_not_summed(tmp_path: Path) -> None:
    """It may grow: its last rows, and its chunks' sizes, are not what the state will meet."""
    path = tmp_path / "grows.h5"
    with h5py.File(path, "w", libver="latest") as f:
        f.create_dataset("x", data=np.arange(30.0).reshape(10, 3), chunks=(4, 3), maxshape=(None, 3))
    assert _sum(path, swmr=True) is None


def test_a_change_in_the_middle_of_a_large_deflated_chunk_is_seen_by_the_sum_its_stream_ends_with(
    tmp_path: Path,
) -> None:
    """Of a chunk over ``2 * EDGE_BYTES`` only its ends are read: a deflated one ends with the Adler-32 of it all."""
    x = np.random.default_rng(1).random((4096, 4))  # one chunk of 128 KiB, noise: its compressed size hardly moves
    changed = x.copy()
    changed[2048, 2] += 1.0
    layout = dict(chunks=(4096, 4), compression="gzip")
    paths = []
    for name, data in (("a.h5", x), ("b.h5", changed)):
        with h5py.File(tmp_path / name, "w") as f:
            f.create_dataset("x", data=data, **layout)
        paths.append(tmp_path / name)
    assert _sum(paths[0]) != _sum(paths[1])
