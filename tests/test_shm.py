"""Shared-memory segments: the owner's mapping holds no descriptor, and memory still in use survives close."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from multitables._shm import Segment


def test_the_owners_mapping_keeps_no_file_descriptor_open(
    shm_mappings: Callable[[], list[str]], fds_on: Callable[[Path], int]
) -> None:
    seg = Segment.create(1 << 16, "test")
    try:
        assert fds_on(Path("/dev/shm") / seg.name) == 0
        assert any(seg.name in m for m in shm_mappings())  # mapped all the same
    finally:
        seg.unlink()
        seg.close()
    assert not any(seg.name in m for m in shm_mappings())


def test_what_an_attached_mapping_writes_the_owner_reads() -> None:
    owner = Segment.create(1 << 16, "test")
    other = Segment.attach(owner.name, 1 << 16)
    try:
        np.frombuffer(other.buf, np.int64, count=4, offset=8192)[:] = [1, 2, 3, 4]
        assert np.frombuffer(owner.buf, np.int64, count=4, offset=8192).tolist() == [1, 2, 3, 4]
    finally:
        owner.unlink()
        other.close()
        owner.close()


def test_kept_ranges_outlive_close_in_private_memory(shm_mappings: Callable[[], list[str]]) -> None:
    seg = Segment.create(1 << 16, "test")
    seg.unlink()
    kept = np.frombuffer(seg.buf, np.float64, count=512, offset=4096)  # holds an export of the mapping
    kept[:] = np.arange(512)
    seg.close(keep=[(4096, kept.nbytes)])
    assert not any(seg.name in m for m in shm_mappings())  # the segment itself is released now
    np.testing.assert_array_equal(kept, np.arange(512))  # and the view still reads its bytes
    kept[:] = -1  # writable, private memory
    assert (kept == -1).all()


def test_close_without_keep_leaves_a_used_mapping_alone(shm_mappings: Callable[[], list[str]]) -> None:
    seg = Segment.create(1 << 16, "test")
    seg.unlink()
    view = np.frombuffer(seg.buf, np.uint8, count=16)
    view[:] = 7
    seg.close()
    name = seg.name
    del seg
    assert any(name in m for m in shm_mappings())  # still in use: not unmapped under the view
    assert (view == 7).all()
    del view  # the last user: the mapping goes with it
    assert not any(name in m for m in shm_mappings())
