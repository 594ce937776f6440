"""The windows' copier (NOTE [parallel copies] in ``multitables._train.copier``): split copies give the rows a
plain copy gives, and its threads go with it."""

from __future__ import annotations

import re
import threading
import time
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


@pytest.mark.parametrize("threads", [1, 3])
def test_later_gives_the_result_or_the_error_made_on_a_copy_thread_or_else_a_thread_of_its_own(threads: int) -> None:
    c = Copier(threads)
    try:
        ran_on = c.later(lambda: threading.current_thread().name).result()
        assert ran_on.startswith("multitables-copy" if threads > 1 else "multitables-later")
        small = c.later(lambda: threading.current_thread().name, small=True).result()  # not worth a thread of its own
        assert small.startswith("multitables-copy") if threads > 1 else small == threading.current_thread().name
        with pytest.raises(ZeroDivisionError):
            c.later(lambda: 1 / 0, small=True).result()
        np.testing.assert_array_equal(c.later(np.random.default_rng(5).permutation, 1000).result(),
                                      np.random.default_rng(5).permutation(1000))
        with pytest.raises(ZeroDivisionError):  # on a thread, by result(); inline, at once, as the call raises it
            c.later(lambda: 1 / 0).result()
    finally:
        c.close()
    assert not copy_threads_alive()


def test_later_work_without_copy_threads_goes_to_one_thread_kept_for_it_which_close_ends() -> None:
    """Starting a thread for each window's order cost the batch that asked 84-91 us of the consumer's CPU, handing it
    to one waiting 21-25 us (NOTE [parallel copies]): the copier keeps one, work handed to it while it is busy waits
    its turn, and close ends it."""
    def later_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("multitables-later")]

    c = Copier(1)
    try:
        first = c.later(threading.get_ident).result()
        time.sleep(0.01)  # the thread is idle again
        assert c.later(threading.get_ident).result() == first
        go = threading.Event()
        busy = c.later(go.wait, 5)
        queued = c.later(threading.get_ident)  # not a second thread: after the first's work
        time.sleep(0.05)
        assert not queued.done() and [t.ident for t in later_threads()] == [first]
        go.set()
        assert busy.result() and queued.result() == first
    finally:
        c.close()
    wait_until(lambda: not later_threads(), 5.0, "the copier's own thread ends")


def test_close_waits_for_later_work_on_threads_of_its_own() -> None:
    c = Copier(1)
    go, done = threading.Event(), []
    c.later(lambda: (go.wait(5), done.append(1)))
    threading.Timer(0.05, go.set).start()
    c.close()
    assert done == [1]  # close returned after the work, not before


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("large", [True, False], ids=["large-windows", "small-windows"])
def test_a_window_order_is_made_in_the_consumers_thread_only_where_a_thread_costs_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int, large: bool, no_leaks: None) -> None:
    """Each window's permutation is made while the window before it is delivered: on a copy thread where there are
    some, else on the copier's own thread, so that no batch waits for one (``test_batches_copied_by_threads_are_the_
    batches_of_one``: the same rows, in the same order); but at once where there are no copy threads and the
    window is smaller than ``ORDER_THREAD_ROWS`` (handing it to a thread would cost more)."""
    from multitables._plan.epoch import RankEpoch
    from multitables._train import windows

    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=np.arange(20000.0).reshape(5000, 4), chunks=(100, 4))
    made_on: list[str] = []
    perm = RankEpoch.window_perm
    monkeypatch.setattr(RankEpoch, "window_perm",
                        lambda self, w: (made_on.append(threading.current_thread().name), perm(self, w))[1])
    monkeypatch.setattr(buffers, "copy_threads", lambda: threads)
    monkeypatch.setattr(windows, "ORDER_THREAD_ROWS", 500 if large else 2000)  # windows of 1,500 rows and one of 500
    b = multitables.Streamer(path).get_batches("/X", 300, n_procs=2, block_size=250, window=6, seed=3, epochs=2)
    assert sum(len(x) for x in b) == 2 * 5000
    b.close()
    assert len(made_on) == 2 * 4  # 20 blocks in windows of 6: 4 windows an epoch, each ordered once
    where = {re.sub(r"[-_][0-9]+$", "", name) for name in made_on}  # a pool's numbered thread (copy or later)
    if threads > 1:
        assert where == {"multitables-copy"}
    else:
        assert where == ({"multitables-later"} if large else {"MainThread"}), where
