"""A local file's name (``multitables._io.files``): a relative name means the file it named when the Streamer or the
Reader was made, in every process, whatever ``os.chdir`` comes later."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np
import pytest

import multitables
from multitables._io.files import from_root

ROWS, BLOCK = 4000, 500


@pytest.fixture
def two_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """``a/x.h5``: ``ROWS`` rows of ones; ``b/x.h5``: half as many rows of twos; the test starts in ``a``."""
    dirs = []
    for name, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        with h5py.File(tmp_path / name / "x.h5", "w") as f:
            n = ROWS if name == "a" else ROWS // 2  # b's shape differs too
            f.create_dataset("data", data=np.full((n, 8), value, "<f4"), chunks=(BLOCK, 8), compression="gzip")
        dirs.append(tmp_path / name)
    monkeypatch.chdir(dirs[0])
    yield dirs[0], dirs[1]


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_stream_reads_the_file_its_name_meant_when_the_streamer_was_made(
    two_dirs: tuple[Path, Path], n_procs: int, no_leaks: None
) -> None:
    """Readers keep the directory they started in; in-process reads used to follow the chdir and call the other
    file a replacement (FileChangedError)."""
    stream = multitables.Streamer("x.h5")
    values = set()
    with stream.get_queue("/data", n_procs=n_procs, block_size=BLOCK) as queue:
        for i, guard in enumerate(queue.iter()):
            if i == 2:
                os.chdir(two_dirs[1])
            with guard as block:
                values.update(np.unique(block).tolist())
    assert values == {1.0}
    assert stream.filename == str(two_dirs[0] / "x.h5")
    assert set(np.concatenate(list(stream.get_generator("/data", n_procs=n_procs))).tolist()) == {1.0}, \
        "a stream opened after the chdir reads the same file"
    assert set(np.concatenate(list(multitables.Streamer("x.h5").get_generator("/data", n_procs=n_procs))).tolist()) \
        == {2.0}, "a Streamer made after it, the file named there"


@pytest.mark.parametrize("chdir_before", ["get_dataset", "request"])
def test_a_reader_reads_the_file_its_name_meant_when_made(two_dirs: tuple[Path, Path], chdir_before: str,
                                                          no_leaks: None) -> None:
    """Its readers start with it; its look at a dataset used to follow the chdir (another file's shape, read by the
    readers from where they started)."""
    with multitables.Reader("x.h5", n_procs=1) as reader:
        if chdir_before == "get_dataset":
            os.chdir(two_dirs[1])
        ds = reader.get_dataset("/data")
        os.chdir(two_dirs[1])
        assert ds.shape == (ROWS, 8)
        assert set(reader.request(ds[:10], ds.create_stage(10)).get().ravel().tolist()) == {1.0}


def test_a_name_too_long_from_the_root_is_kept_as_given() -> None:
    assert from_root("x.h5") == os.path.join(os.getcwd(), "x.h5")
    assert from_root("/d/../x.h5") == "/x.h5"
    deep = "d/" * 2100 + "x.h5"  # past PATH_MAX from the root: the kernel would refuse it, relative it may open
    assert from_root(deep) == deep


def test_a_family_of_member_files_is_refused_saying_so(tmp_path: Path) -> None:
    """HDF5's family driver splits a file into members named by a pattern (``data%d.h5``); PyTables 3.x refuses the
    driver, so the pattern given as a file is named as what it is, with what to do, not as a file that is missing."""
    pattern = str(tmp_path / "data%d.h5")
    with h5py.File(pattern, "w", driver="family", memb_size=1 << 16) as f:
        f["x"] = np.arange(100_000.0)
    assert (tmp_path / "data1.h5").exists()
    with pytest.raises(FileNotFoundError, match=r"a family of member files .*h5py opens it with driver='family'"):
        multitables.Streamer(pattern).get_queue("/x")
    with pytest.raises(FileNotFoundError, match=r"No such HDF5 file: '"):
        multitables.Streamer(str(tmp_path / "other%d.h5")).get_queue("/x")
