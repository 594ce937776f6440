"""The windows' copier (NOTE [parallel copies] in ``multitables._train.copier``): split copies give the rows a
plain copy gives, and its threads go with it."""

from __future__ import annotations

import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables
from multitables._train import buffers
from multitables._train import copier as copier_module
from multitables._train.copier import Copier

from _guards import wait_until


def copy_threads_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("multitables-copy")]


@pytest.fixture
def copier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(Copier, "PART", 64)  # split even small copies, so that the tests see the parts
    c = Copier(request.param)
    yield c
    c.close()


@pytest.mark.parametrize("copier", [1, 2, 3, 4], indirect=True)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # one copier for all
@given(
    rows=st.integers(1, 300),
    row=st.sampled_from([(), (3,), (2, 5)]),
    dtype=st.sampled_from(["<f4", "<i8", "u1", "<c16"]),
    data=st.data(),
)
def test_split_copies_and_takes_are_the_plain_ones(copier: Copier, rows: int, row: tuple, dtype: str, data) -> None:
    src = np.arange(rows * int(np.prod(row, dtype=int)), dtype=np.int64).astype(dtype).reshape((rows,) + row)
    out = np.empty_like(src)
    copier.copy(out, src)
    np.testing.assert_array_equal(out, src)
    index = np.array(data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=300)), dtype=np.intp)
    taken = np.empty((len(index),) + row, dtype)
    copier.take(src, index, taken)
    np.testing.assert_array_equal(taken, src[index])


def test_a_copier_of_several_threads_ends_them_at_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Copier, "PART", 64)
    c = Copier(3)
    src = np.arange(4096.0).reshape(512, 8)
    out = np.empty_like(src)
    c.copy(out, src)  # the pool starts its threads on first use
    assert copy_threads_alive()
    c.close()
    assert not copy_threads_alive()
    c.copy(out, src[::-1].copy())  # closed: copies go on in the caller's thread
    np.testing.assert_array_equal(out, src[::-1])


def test_one_or_a_few_cpus_get_no_copy_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    for cpus, threads in [(1, 1), (2, 1), (7, 1), (8, 2), (16, 4), (64, 4)]:
        monkeypatch.setattr(copier_module.os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert copier_module.copy_threads() == threads


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_copied_by_threads_are_the_batches_of_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shuffle: bool,
                                                          no_leaks: None) -> None:
    path = tmp_path / "d.h5"
    i = np.arange(5000)
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=np.stack([i, -i], axis=1).astype("<f4"), chunks=(100, 2), compression="gzip")
        f.create_dataset("y", data=i, chunks=(250,))

    def epochs(threads: int) -> list[np.ndarray]:
        monkeypatch.setattr(buffers, "copy_threads", lambda: threads)  # as the windows' memory calls it
        b = multitables.Streamer(path).get_batches(["/X", "/y"], 300, n_procs=2, block_size=250, window=6, seed=3,
                                                   shuffle=shuffle)
        try:
            got = []
            for _ in range(2):
                for x, y in b:
                    np.testing.assert_array_equal(x, np.stack([y, -y], axis=1))  # aligned across datasets
                    got.append(y.copy())
            assert bool(copy_threads_alive()) == (threads > 1)
            return got
        finally:
            b.close()

    monkeypatch.setattr(Copier, "PART", 64)
    split, plain = epochs(3), epochs(1)
    assert len(split) == len(plain) == 2 * 17
    for a, b in zip(split, plain):
        np.testing.assert_array_equal(a, b)
    assert not copy_threads_alive()


def test_dropping_the_batches_ends_their_copy_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=np.arange(20000.0).reshape(5000, 4), chunks=(100, 4))
    monkeypatch.setattr(buffers, "copy_threads", lambda: 3)
    monkeypatch.setattr(Copier, "PART", 64)
    b = multitables.Streamer(path).get_batches("/X", 300, n_procs=2, block_size=250, window=6, seed=3)
    it = iter(b)
    next(it)
    assert copy_threads_alive()
    del it, b  # no close(): the last reference goes
    wait_until(lambda: not copy_threads_alive(), 10.0, "the copy threads end")
