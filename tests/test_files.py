"""A local file's name (``multitables._io.files``): a relative name means the file it named when the stream or the
Reader was opened, in every process, whatever ``os.chdir`` comes later."""

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
    """``a/x.h5`` of ones and ``b/x.h5`` of twos, alike in size and layout; the test starts in ``a``."""
    dirs = []
    for name, value in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        with h5py.File(tmp_path / name / "x.h5", "w") as f:
            f.create_dataset("data", data=np.full((ROWS, 8), value, "<f4"), chunks=(BLOCK, 8), compression="gzip")
        dirs.append(tmp_path / name)
    monkeypatch.chdir(dirs[0])
    yield dirs[0], dirs[1]


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_stream_reads_the_file_its_name_meant_when_it_opened(two_dirs: tuple[Path, Path], n_procs: int,
                                                             no_leaks: None) -> None:
    """Readers keep the directory they started in; in-process reads used to follow the chdir and call the other
    file a replacement (FileChangedError)."""
    values = set()
    with multitables.Streamer("x.h5").get_queue("/data", n_procs=n_procs, block_size=BLOCK) as queue:
        for i, guard in enumerate(queue.iter()):
            if i == 2:
                os.chdir(two_dirs[1])
            with guard as block:
                values.update(np.unique(block).tolist())
    assert values == {1.0}
    assert set(np.concatenate(list(multitables.Streamer("x.h5").get_generator("/data", n_procs=n_procs))).tolist()) \
        == {2.0}, "a stream opened after the chdir reads the file named there"


def test_a_reader_reads_the_file_its_name_meant_when_made(two_dirs: tuple[Path, Path], no_leaks: None) -> None:
    with multitables.Reader("x.h5", n_procs=1) as reader:
        ds = reader.get_dataset("/data")
        os.chdir(two_dirs[1])
        assert set(reader.request(ds[:10], ds.create_stage(10)).get().ravel().tolist()) == {1.0}


def test_a_name_too_long_from_the_root_is_kept_as_given() -> None:
    assert from_root("x.h5") == os.path.join(os.getcwd(), "x.h5")
    assert from_root("/d/../x.h5") == "/x.h5"
    deep = "d/" * 2100 + "x.h5"  # past PATH_MAX from the root: the kernel would refuse it, relative it may open
    assert from_root(deep) == deep
