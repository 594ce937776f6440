"""When the readers of training batches run and when they stop: ``break``, the next epoch, dropping, closing.

The rule (docs/training.rst, "Readers and the loop"), PyTorch's
``persistent_workers=True``: the readers belong to the batches, not to one
iteration. They start with the first batch, go on from epoch to epoch and
through a ``break`` (the next iteration goes on with them), and stop when the
batches are closed or dropped: at once, by reference counting alone, without
the cycle collector. Every test here runs with the cycle collector off.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np
import psutil
import pytest

import multitables

#: The promise of docs/failures.rst: readers exit within 2 s of the consumer stopping early.
STOP_TIMEOUT = 2.0


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("y", data=np.arange(4000), chunks=(50,), compression="gzip")
        f.create_dataset("z", data=-np.arange(4000), chunks=(50,), compression="gzip")
    return path


def children() -> set[int]:
    """This process's children but multiprocessing's resource tracker (started on first use of shared memory)."""
    out = set()
    for p in psutil.Process().children():
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def readers_started(before: set[int]) -> set[int]:
    """Our reader processes started since ``before`` was taken (the test's own children)."""
    started = children() - before
    assert started, "the batches started no reader process: the test proves nothing"
    return started


def wait_gone(pids: set[int]) -> set[int]:
    """The pids of ``pids`` still running after up to STOP_TIMEOUT s."""
    deadline = time.monotonic() + STOP_TIMEOUT
    while True:
        alive = {pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def batches(path: Path, **kwargs) -> multitables.Batches:
    kw = dict(n_procs=2, block_size=50, window=2, read_ahead=2, seed=3)
    kw.update(kwargs)
    return multitables.Streamer(path).get_batches("/y", 16, **kw)


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE}


@pytest.mark.parametrize("shuffle", [True, False])
def test_break_keeps_the_readers_and_the_next_iteration_goes_on_with_them(rows_file, no_cycle_collector, no_leaks, shuffle) -> None:
    reference = [y.copy() for y in batches(rows_file, n_procs=0, shuffle=shuffle)]
    b = batches(rows_file, shuffle=shuffle)
    before = children()
    got = []
    for k, y in enumerate(b):
        got.append(y)
        if k == 4:
            readers = readers_started(before)
            break
    got += list(b)  # the rest of the epoch
    assert children() - before == readers, "the next iteration started readers of its own"
    assert len(got) == len(reference)
    for mine, theirs in zip(got, reference):
        np.testing.assert_array_equal(mine, theirs)
    b.close()
    assert wait_gone(readers) == set(), "close() left the readers running"


def test_epochs_follow_each_other_on_the_same_readers(rows_file, no_cycle_collector, no_leaks) -> None:
    reference = batches(rows_file, n_procs=0)
    expected = [[y.copy() for y in reference] for _ in range(3)]  # epochs 0, 1, 2
    b = batches(rows_file)
    before = children()
    readers: set[int] = set()
    for epoch in range(3):
        b.set_epoch(epoch)
        got = [y.copy() for y in b]
        readers = readers or readers_started(before)
        assert children() - before == readers, f"epoch {epoch} started readers of its own"
        for mine, theirs in zip(got, expected[epoch], strict=True):
            np.testing.assert_array_equal(mine, theirs)
    del b
    assert wait_gone(readers) == set(), "dropping the batches left the readers running"


def test_break_then_another_epoch_goes_on_with_the_same_readers(rows_file, no_cycle_collector, no_leaks) -> None:
    reference = batches(rows_file, n_procs=0)
    reference.set_epoch(3)
    expected = [y.copy() for y in reference]
    b = batches(rows_file)
    before = children()
    for k, _ in enumerate(b):
        if k == 2:
            readers = readers_started(before)
            break
    b.set_epoch(3)  # a jump: what the readers read ahead of epoch 0 and 1 is dropped
    got = [y.copy() for y in b]
    assert children() - before == readers
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    del b
    assert wait_gone(readers) == set()


def test_dropping_batches_mid_epoch_stops_the_readers_at_once(rows_file, no_cycle_collector, no_leaks) -> None:
    b = batches(rows_file)
    before = children()
    it = iter(b)
    next(it)
    readers = readers_started(before)
    del b
    next(it)  # the iterator alone keeps the batches and their readers: it is still in use
    assert alive(readers) == readers
    del it
    assert wait_gone(readers) == set(), "dropping the last reference left the readers running"


def test_break_then_drop_stops_the_readers(rows_file, no_cycle_collector, no_leaks) -> None:
    b = batches(rows_file)
    before = children()
    for k, _ in enumerate(b):
        if k == 1:
            readers = readers_started(before)
            break
    assert alive(readers) == readers, "break stopped the readers: they belong to the batches"
    del b
    assert wait_gone(readers) == set()


@pytest.mark.parametrize("per", ["batch", "row"])
def test_a_mix_keeps_its_sources_readers_through_break_and_stops_them_when_dropped(
    rows_file, no_cycle_collector, no_leaks, per
) -> None:
    def mix(n_procs: int) -> multitables.MixedBatches:
        stream = multitables.Streamer(rows_file)
        one = stream.get_batches("/y", 16, n_procs=n_procs, block_size=50, window=2, read_ahead=2, seed=1)
        two = stream.get_batches("/z", 16, n_procs=n_procs, block_size=50, window=2, read_ahead=2, seed=2)
        return multitables.mix_batches([one, two], [0.5, 0.5], seed=5, per=per)

    reference = []
    for k, y in enumerate(mix(0)):
        reference.append(y.copy())
        if k == 59:
            break
    m = mix(1)
    before = children()
    got = []
    for k, y in enumerate(m):
        got.append(y)
        if k == 9:
            readers = readers_started(before)
            break
    for k, y in enumerate(m, start=10):
        got.append(y)
        if k == 59:
            break
    assert children() - before == readers, "the mix's second iteration started readers of its own"
    for mine, theirs in zip(got, reference, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    it = iter(m)
    next(it)
    del m, it
    assert wait_gone(readers) == set(), "dropping a mix mid-iteration left its sources' readers running"


def test_dropping_the_torch_adapter_mid_epoch_stops_the_readers(rows_file, no_cycle_collector, no_leaks) -> None:
    pytest.importorskip("torch")
    import multitables.torch as torch_batches
    dataset = torch_batches.get_batches(multitables.Streamer(rows_file), "/y", 16, n_procs=2, block_size=50, read_ahead=2)
    before = children()
    it = iter(dataset)
    next(it)
    readers = readers_started(before)
    del dataset, it
    assert wait_gone(readers) == set()


def test_the_step_goes_on_after_an_elastic_resume(rows_file) -> None:
    stream = multitables.Streamer(rows_file)
    two = [stream.get_batches("/y", 64, rank=r, world_size=2, epochs=None, n_procs=0) for r in range(2)]
    for b in two:
        for k, _ in enumerate(b, 1):
            if k == 5:
                break
    state = two[0].state_dict()
    assert state["step"] == 5
    three = stream.get_batches("/y", 64, rank=0, world_size=3, epochs=None, n_procs=0)
    three.load_state_dict(state)
    assert three.state_dict()["step"] == 5
    it = iter(three)
    for _ in range(3):
        next(it)
    assert three.state_dict()["step"] == 8
    # Through the end of that epoch (its rest shared by three ranks now) and into the next: one step per batch.
    steps = [three.state_dict()["step"]]
    for _ in range(len(three)):
        next(it)
        steps.append(three.state_dict()["step"])
    assert steps == list(range(8, 8 + len(three) + 1))
    assert three.epoch == 1
    # A saved step survives a resume at the same world size too.
    again = stream.get_batches("/y", 64, rank=0, world_size=3, epochs=None, n_procs=0)
    again.load_state_dict(three.state_dict())
    assert again.state_dict()["step"] == steps[-1]


def test_set_epoch_to_another_epoch_counts_its_steps_at_this_world_size(rows_file) -> None:
    b = multitables.Streamer(rows_file).get_batches("/y", 64, world_size=2, rank=1, n_procs=0)
    b.set_epoch(3)
    assert b.state_dict()["step"] == 3 * len(b)
    next(iter(b))
    assert b.state_dict()["step"] == 3 * len(b) + 1
    b.set_epoch(3)  # already in it: nothing changes
    assert b.state_dict()["step"] == 3 * len(b) + 1


def test_a_reader_killed_in_a_later_epoch_is_raised_and_the_next_iteration_starts_afresh(
    rows_file, no_cycle_collector, no_leaks
) -> None:
    import signal

    import itertools

    reference = batches(rows_file, n_procs=0)
    reference.set_epoch(5)
    expected = [y.copy() for y in reference]
    b = batches(rows_file, epochs=None)
    before = children()
    it = iter(b)
    list(itertools.islice(it, len(b)))  # epoch 0
    readers = readers_started(before)
    assert set(b.reader_pids) == readers
    next(it)  # epoch 1, on the same readers
    victim = min(readers)
    os.kill(victim, signal.SIGKILL)
    # A dying process can take a while to be gone (its memory unmapped: on a loaded machine, longer than three
    # epochs of these small batches take); the loop raises once it is, whatever epoch that falls in. Gone is when
    # waitid sees it: /proc shows a reader's main thread as a zombie while its other thread still holds the
    # pipes whose closing tells the pool (waitid waits for the whole thread group; WNOWAIT leaves it to the pool).
    waited = os.waitid(os.P_PID, victim, os.WEXITED | os.WNOWAIT)
    assert waited is not None and waited.si_pid == victim
    with pytest.raises(multitables.ReaderError, match=str(victim)):
        for _ in itertools.islice(it, 3 * len(b)):
            pass
    assert b.epoch < 4
    assert wait_gone(readers) == set(), "a reader's death left the others running"
    b.set_epoch(5)
    got = [y.copy() for y in itertools.islice(b, len(b))]  # new readers
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert not (children() - before) & readers
    b.close()


def test_a_reader_error_in_a_later_epoch_reaches_the_loop(tmp_path: Path, no_leaks) -> None:
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("y", data=np.arange(4000), chunks=(50,), compression="gzip")
    b = multitables.Streamer(path).get_batches("/y", 16, n_procs=2, block_size=50, epochs=None, shuffle=False)
    it = iter(b)
    for _ in range(len(b) + 3):  # into epoch 1: the readers read on from epoch 0
        next(it)
    with h5py.File(path, "r") as f:
        info = f["y"].id.get_chunk_info(70)
    with open(path, "r+b") as f:  # wreck a chunk the readers have not reached yet (keeping the file's identity)
        st = os.stat(path)
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises((multitables.ReaderError, multitables.FileChangedError)):
        for _ in it:
            pass
    b.close()


@pytest.mark.parametrize("windows", [1, 4])
def test_the_next_epochs_first_window_is_read_during_this_epoch(rows_file, no_leaks, windows: int, monkeypatch) -> None:
    """NOTE [window pipelining]: in a loop of epochs, an epoch's first window is in when the one before ends.

    Which pieces each epoch takes from its readers is recorded. A batches'
    first epoch reads nothing of the next (it may be a batches made for one
    pass); once an epoch went by, the next epoch's first window is taken
    during the epoch before it, and its rows are right.
    """
    from multitables._train.feed import Feed

    taken: list[tuple[int, int, int]] = []  # (epoch being delivered, epoch of the piece, piece)
    real_get = Feed.get
    watched: list[multitables.Batches] = []

    def get(feed: Feed):  # type: ignore[no-untyped-def]
        if watched and feed is watched[0]._feed:
            epoch, piece = feed._pending.next()
            taken.append((watched[0].epoch, epoch, piece))
        return real_get(feed)

    monkeypatch.setattr(Feed, "get", get)
    n_blocks = 80
    window = n_blocks // windows
    reference = batches(rows_file, n_procs=0, window=window)
    reference.set_epoch(2)
    expected = [y.copy() for y in reference]
    b = batches(rows_file, window=window, read_ahead=4)
    watched.append(b)
    list(b)  # epoch 0: nothing of epoch 1 is taken (a batches made for one pass)
    assert {epoch for now, epoch, _ in taken if now == 0} == {0}
    list(b)  # epoch 1: in a loop now, it takes epoch 2's first window
    got = [y.copy() for y in b]  # epoch 2
    first_window = set(range(window))  # one block per piece here: one rank, blocks of 50 rows
    assert {piece for now, epoch, piece in taken if epoch == 2 and now == 1} == first_window
    assert not [piece for now, epoch, piece in taken if epoch == 2 and now == 2 and piece in first_window]
    # An epoch loop says so with set_epoch from its first epoch on: epoch 0 takes epoch 1's first window.
    taken.clear()
    looped = batches(rows_file, window=window, read_ahead=4)
    watched[0] = looped
    looped.set_epoch(0)
    list(looped)
    assert {piece for now, epoch, piece in taken if epoch == 1 and now == 0} == first_window
    looped.close()
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    b.close()


@pytest.mark.parametrize("weighted", [False, True], ids=["every-row", "weighted"])
@pytest.mark.parametrize("windows", [1, 4])
def test_an_epochs_first_batch_plans_and_permutes_nothing_in_a_loop_of_epochs(rows_file, no_leaks, windows: int,
                                                                                weighted: bool, monkeypatch) -> None:
    """The next epoch is planned once this epoch's first batch is out, its pieces made with the plan (a weighted
    draw's spans too: made again, they cost an epoch's first batch 0.2-0.6 ms on the 2-core VM), and each window's
    order is made by the pull that starts it (the first window's: during the last epoch), so that an epoch's first
    batch waits for none of them (issue 30: no longer than a batch in mid-epoch). The batches are those of a fresh
    reading."""
    from multitables._plan.epoch import EpochSettings, RankEpoch
    from multitables._train.feed import EpochPieces

    made: list[str] = []
    real_plan, real_perm, real_pieces = EpochSettings.rank_epoch, RankEpoch.window_perm, EpochPieces.of
    monkeypatch.setattr(EpochSettings, "rank_epoch", lambda *a: (made.append("plan"), real_plan(*a))[1])
    monkeypatch.setattr(RankEpoch, "window_perm", lambda *a: (made.append("order"), real_perm(*a))[1])
    monkeypatch.setattr(EpochPieces, "of", classmethod(lambda cls, *a: (made.append("pieces"), real_pieces(*a))[1]))
    window = 80 // windows
    drawn = {"weights": np.arange(4000) % 3 + 1.0} if weighted else {}
    expected = []
    for epoch in range(4):
        reference = batches(rows_file, n_procs=0, window=window, **drawn)
        reference.set_epoch(epoch)
        expected.append([y.copy() for y in reference])
        reference.close()
    b = batches(rows_file, window=window, read_ahead=4, **drawn)
    b.set_epoch(0)  # a loop of epochs
    try:
        for epoch in range(4):
            it = iter(b)
            made.clear()
            first = next(it).copy()
            assert made == ([] if epoch else made), made  # the first epoch plans itself
            got = [first] + [y.copy() for y in it]
            for mine, theirs in zip(got, expected[epoch], strict=True):
                np.testing.assert_array_equal(mine, theirs)
    finally:
        b.close()


def _reference_epochs(rows_file, window: int, n: int) -> list[list[np.ndarray]]:  # type: ignore[no-untyped-def]
    """The batches of epochs ``0 .. n - 1`` read in this process, one list per epoch."""
    expected = []
    for epoch in range(n):
        reference = batches(rows_file, n_procs=0, window=window)
        reference.set_epoch(epoch)
        expected.append([y.copy() for y in reference])
        reference.close()
    return expected


def _read_epochs(rows_file, window: int, expected: list[list[np.ndarray]], calls: list[int]) -> None:  # type: ignore[no-untyped-def]
    """``expected``'s epochs in a loop of epochs, each reading ahead into the next, ``calls[0]`` counting the next()
    calls of the epoch being delivered: each epoch's rows exact, and each leaving the next one's first window pulled."""
    b = batches(rows_file, window=window, read_ahead=4)
    try:
        for epoch in range(len(expected)):
            b.set_epoch(epoch)
            calls[0] = 0
            got = []
            for y in b:
                got.append(y.copy())
                calls[0] += 1
            for mine, theirs in zip(got, expected[epoch], strict=True):
                np.testing.assert_array_equal(mine, theirs)
            assert b._carry is not None and b._carry.epoch == epoch + 1 and b._carry.pulled > 0
    finally:
        b.close()


@pytest.mark.parametrize("slow", [False, True], ids=["planned-at-once", "planned-slower-than-the-windows"])
def test_the_next_epoch_is_planned_off_the_consumers_thread_and_published_by_a_later_batch(
        rows_file, no_leaks, slow: bool, monkeypatch) -> None:
    """NOTE [the next epoch in steps]: no batch of an epoch both asks for the next epoch's plan and publishes it; the
    plan is made on the copier's thread; a plan that takes longer than the windows before the last is waited for
    there, so that the next epoch's first window is still read during this epoch's last, and its rows are right."""
    import threading

    from multitables._plan.epoch import EpochSettings
    from multitables._train.feed import Feed

    calls = [0]  # next() calls of the epoch being delivered, before this one
    planned: list[tuple[int, str]] = []  # (epoch, thread)
    published: list[tuple[int, int]] = []  # (epoch, call)
    real_plan, real_follow = EpochSettings.rank_epoch, Feed.follow

    def plan(self, epoch: int, rank: int):  # type: ignore[no-untyped-def]
        if slow and threading.current_thread() is not threading.main_thread():
            time.sleep(0.3)  # longer than the first three windows take here
        planned.append((epoch, threading.current_thread().name))
        return real_plan(self, epoch, rank)

    def follow(self, pieces, done=0, most=None):  # type: ignore[no-untyped-def]
        if done == 0:  # the first part (the test below: in parts)
            published.append((pieces.epoch, calls[0]))
        return real_follow(self, pieces, done, most)

    monkeypatch.setattr(EpochSettings, "rank_epoch", plan)
    monkeypatch.setattr(Feed, "follow", follow)
    window = 20  # 80 blocks: 4 windows an epoch
    expected = _reference_epochs(rows_file, window, 3)
    planned.clear()
    published.clear()
    _read_epochs(rows_file, window, expected, calls)
    assert [e for e, _ in planned] == [0, 1, 2, 3]
    assert [thread.startswith("multitables-later") for _, thread in planned] == [False, True, True, True]
    # Asked for after the first batch (in the second next()), published by the third at the earliest; a slow plan
    # by the last window's first batch (250 batches of 16 rows an epoch, windows of 1,000 rows).
    assert [e for e, _ in published] == [1, 2, 3]
    assert all(2 <= call <= (3 * 1000 // 16 if slow else 249) for _, call in published), published


@pytest.mark.parametrize("slow", [False, True], ids=["planned-at-once", "planned-slower-than-the-windows"])
def test_the_next_epoch_is_published_in_parts_one_a_batch_and_the_rest_in_the_last_window(
        rows_file, no_leaks, slow: bool, monkeypatch) -> None:
    """NOTE [the next epoch in steps]: at most ``PUBLISH_PIECES`` pieces a batch before the current epoch's last
    window, in order and each once; what is left when that window starts, at once; the rows of every epoch exact."""
    import threading

    from multitables._plan.epoch import EpochSettings
    from multitables._train import feed

    calls = [0]  # next() calls of the epoch being delivered, before this one
    parts: list[tuple[int, int, int, int]] = []  # (epoch, call, first piece, piece after the last) of each publication
    real_plan, real_publish = EpochSettings.rank_epoch, feed.Feed._publish

    def plan(self, epoch: int, rank: int):  # type: ignore[no-untyped-def]
        if slow and threading.current_thread() is not threading.main_thread():
            time.sleep(1.0)  # longer than the first three windows take here
        return real_plan(self, epoch, rank)

    def publish(self, pieces, skip, stop=None):  # type: ignore[no-untyped-def]
        parts.append((pieces.epoch, calls[0], pieces.first + skip, pieces.first + (len(pieces.starts) if stop is None else stop)))
        return real_publish(self, pieces, skip, stop)

    monkeypatch.setattr(EpochSettings, "rank_epoch", plan)
    monkeypatch.setattr(feed.Feed, "_publish", publish)
    monkeypatch.setattr(feed, "PUBLISH_PIECES", 7)
    window = 20  # 80 blocks: 4 windows an epoch, of 1,000 rows; 250 batches of 16 rows
    expected = _reference_epochs(rows_file, window, 3)
    _read_epochs(rows_file, window, expected, calls)
    last_window = 3 * 1000 // 16  # the call that delivers the last window's first batch
    for epoch in (1, 2, 3):
        mine = [p for p in parts if p[0] == epoch and p[1] > 0]  # after the first batch: the next epoch's
        assert [p[2] for p in mine] == [0] + [p[3] for p in mine[:-1]] and mine[-1][3] == 80, mine  # in order, once
        assert len({p[1] for p in mine}) == len(mine), mine  # one part a batch
        if slow:  # made once the last window started: all at once there, as its first batch goes out
            assert mine == [(epoch, last_window, 0, 80)], mine
        else:  # 11 parts of 7 and the last 3, from the batch after the one that asked for the plan
            assert [p[3] - p[2] for p in mine] == [7] * 11 + [3] and mine[-1][1] < last_window, mine


def test_a_failure_planning_the_next_epoch_on_the_thread_reaches_the_loop_with_its_traceback(
        rows_file, no_leaks, monkeypatch) -> None:
    """The next epoch is planned on the copier's thread (NOTE [the next epoch in steps]): an error there is raised in
    the loop, with the frames it came through on that thread, and the batches stop their readers as after any error
    in a step; the next iteration starts readers afresh and goes on with the epoch's rows."""
    import traceback

    from multitables._plan.epoch import EpochSettings

    real_plan = EpochSettings.rank_epoch

    def plan(self, epoch: int, rank: int):  # type: ignore[no-untyped-def]
        if epoch == 1:
            raise MemoryError("no room for the plan of epoch 1")
        return real_plan(self, epoch, rank)

    monkeypatch.setattr(EpochSettings, "rank_epoch", plan)
    b = batches(rows_file, window=20, read_ahead=4)
    b.set_epoch(0)  # a loop of epochs: epoch 0 plans epoch 1 on the thread
    before = children()
    it = iter(b)
    next(it)
    readers = readers_started(before)
    with pytest.raises(MemoryError, match="no room for the plan of epoch 1") as info:
        for _ in it:
            pass
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "_next_pieces" in frames and frames[-1] == "plan", frames  # made on the thread, raised here
    assert b.epoch == 0 and not wait_gone(readers)
    monkeypatch.setattr(EpochSettings, "rank_epoch", real_plan)
    reference = batches(rows_file, n_procs=0, window=20)
    expected = [y.copy() for y in reference]
    reference.close()
    delivered = b.state_dict()["batch"]  # the loop goes on after the last batch it got
    assert 0 < delivered < len(expected)
    for mine, theirs in zip(b, expected[delivered:], strict=True):
        np.testing.assert_array_equal(mine, theirs)
    b.close()


def test_a_ctrl_c_as_the_loop_takes_a_batch_lets_the_readers_stop_with_the_batches(
    rows_file, no_cycle_collector, no_leaks
) -> None:
    """A Ctrl-C lands between any two instructions. Here it lands, at each line in turn, in the frame that the loop
    steps for its next batch: the batches' generator itself, no frame of ours between (NOTE [delivered batches]
    in ``multitables/_train/iteration.py``). The handler drops the batches, as a program that stops does: the
    readers stop at once, though the traceback it handles holds that frame."""
    from multitables import batches as batches_module
    from multitables._train import iteration

    chain = {code for code in vars(iteration).values() if hasattr(code, "co_name")} | {
        f.__code__ for cls in (iteration.Iteration, iteration._End) for f in vars(cls).values() if hasattr(f, "__code__")}
    generators = {batches_module.Batches._iterate.__code__, iteration.run_epochs.__code__}  # the batches' own (epochs)
    chain -= generators
    landing = 0
    while True:
        events: "list[str]" = []

        def in_step(frame, event: str, arg):
            if len(got) != 3:  # the frame's later steps
                return None
            if event == "return":  # the yield: a signal's handler runs in the loop's frame then, which has the batch
                return in_step
            events.append(event)
            if len(events) - 1 == landing:
                raise KeyboardInterrupt
            return in_step

        def fourth_batch(frame, event: str, arg):
            if event == "call" and frame.f_back is not None and frame.f_back.f_code is loop:  # stepped by the loop
                assert frame.f_code not in chain, f"{frame.f_code.co_name} between"
                if frame.f_code not in generators:
                    return None  # what the loop's break closes
                taken.append(None)
                if len(taken) == 3:  # three batches went to the loop (the first before the trace)
                    return in_step(frame, event, arg)
            return None

        b = batches(rows_file, epochs=None)
        before = children()
        got, taken = [], []
        loop = sys._getframe().f_code
        try:
            for y in b:
                if not got:
                    readers = readers_started(before)
                    sys.settrace(fourth_batch)
                got.append(y.copy())
                if len(got) == 5:
                    break
        except KeyboardInterrupt:
            sys.settrace(None)
            b = None
            assert alive(readers) == set(), f"Ctrl-C at event {landing} of the step ({events[-1]})"
            assert len(got) == 3
            landing += 1
            continue
        finally:
            sys.settrace(None)
        break
    assert landing >= 1, "the interrupts landed on every line of the generator's step, and then the step ran through"
    assert alive(readers) == readers  # a break: they wait for the next iteration
    b.close()


@pytest.fixture
def three_epochs_pay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CPUs, and /y (4,000 int64) measured at a rate where an epoch read here forgoes a third of what starting
    readers costs (with the margin): three epochs read here pay for them (NOTE [readers bought])."""
    from multitables._plan import costs, readers as planner
    from multitables._stream.options import StreamOptions

    monkeypatch.setattr(planner, "available_cpus", lambda: 2)
    nbytes = 4000 * 8
    per_epoch = costs.MARGIN["measured"] * costs.start_cost("fork") / 2.5
    monkeypatch.setattr(StreamOptions, "measure_rate", lambda self, node, engine: nbytes * (1 - 1 / 2) / per_epoch)


@pytest.mark.parametrize("looped", ["epochs=None", "set_epoch"])
def test_readers_start_once_the_epochs_read_here_would_have_paid_for_them_and_the_rows_stay(
    rows_file, no_cycle_collector, no_leaks, three_epochs_pay, looped: str
) -> None:
    """NOTE [readers bought]: a dataset the default reads in this process gets readers from the epoch at which the
    epochs read so far would have paid for them, and keeps them; every epoch gives the rows it gives in-process."""
    reference = batches(rows_file, n_procs=0)
    expected = []
    for epoch in range(6):
        reference.set_epoch(epoch)
        expected.append([y.copy() for y in reference])
    b = batches(rows_file, n_procs=None, epochs=None if looped == "epochs=None" else 1)
    before, got, procs, pids = children(), [[] for _ in range(6)], [], []
    if looped == "epochs=None":
        for y in b:
            got[b.epoch].append(y.copy())
            if b.epoch == 5 and len(got[5]) == len(expected[5]):
                break
            if len(got[b.epoch]) == 1:
                procs.append(b.n_procs), pids.append(frozenset(children() - before))
    else:
        for epoch in range(6):
            b.set_epoch(epoch)
            for y in b:
                got[epoch].append(y.copy())
                if len(got[epoch]) == 1:
                    procs.append(b.n_procs), pids.append(frozenset(children() - before))
    for epoch, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert len(mine) == len(theirs), epoch
        for a, c in zip(mine, theirs):
            np.testing.assert_array_equal(a, c)
    assert procs == [[0], [0], [0], [2], [2], [2]]  # three epochs here, then readers
    assert pids[:3] == [frozenset()] * 3 and len(pids[3]) == 2 and pids[3] == pids[4] == pids[5]  # kept
    explicit = batches(rows_file, n_procs=0)
    for epoch in range(5):
        explicit.set_epoch(epoch)
        assert sum(1 for _ in explicit) and explicit.n_procs == [0]  # asked for: never bought
    b.close()
    assert wait_gone(set(pids[3])) == set()


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("taken", ["islice", "next"])
def test_an_epoch_taken_to_its_last_batch_and_no_further_counts_towards_readers(
    rows_file, no_cycle_collector, no_leaks, three_epochs_pay, taken: str, shuffle: bool
) -> None:
    """NOTE [readers bought]: a loop that takes exactly len(batches) batches an epoch and never asks for one more
    (itertools.islice, next() len(batches) times, zip with a range) reads each epoch to its end all the same: the
    epochs count, and readers start once they would have paid for them, with the rows of the epochs in-process."""
    import itertools

    reference = batches(rows_file, n_procs=0, shuffle=shuffle)
    expected = []
    for epoch in range(5):
        reference.set_epoch(epoch)
        expected.append([y.copy() for y in reference])
    b = batches(rows_file, n_procs=None, shuffle=shuffle)
    before, procs, pids = children(), [], []
    for epoch in range(5):
        b.set_epoch(epoch)
        it = itertools.islice(b, len(b)) if taken == "islice" else iter(b)
        got = [next(it)]
        procs.append(b.n_procs), pids.append(frozenset(children() - before))  # this epoch's, from its first batch
        got += [next(it) for _ in range(len(b) - 1)]
        assert len(got) == len(expected[epoch])
        for mine, theirs in zip(got, expected[epoch]):
            np.testing.assert_array_equal(mine, theirs)
    assert procs == [[0], [0], [0], [2], [2]]  # counted although the loop never asked past the last batch
    assert pids[:3] == [frozenset()] * 3 and len(pids[3]) == 2 and pids[3] == pids[4]
    b.close()
    assert wait_gone(set(pids[3])) == set()


@pytest.mark.parametrize("saved", ["mid-epoch", "after the switch", "without the count"])
def test_a_restored_loop_counts_the_epochs_its_state_read_here(
    rows_file, no_cycle_collector, no_leaks, three_epochs_pay, saved: str
) -> None:
    """NOTE [readers bought]: state_dict() records the epochs the loop read in its training process, and batches
    loading it count them as read here: a restored job starts readers at the epoch the saved one would have (a state
    written before the count, or by hand, counts none). The rows are those of the run that was never stopped."""
    reference = batches(rows_file, n_procs=0)
    expected = []
    for epoch in range(6):
        reference.set_epoch(epoch)
        expected.append([y.copy() for y in reference])
    first = batches(rows_file, n_procs=None)
    stop_at = (2, 5) if saved != "after the switch" else (4, 5)  # (epoch, batches taken in it)
    for epoch in range(stop_at[0] + 1):
        first.set_epoch(epoch)
        for k, y in enumerate(first):
            np.testing.assert_array_equal(y, expected[epoch][k])
            if (epoch, k + 1) == stop_at:
                break
    state = first.state_dict()
    first.close()
    assert state["epochs_here"] == min(stop_at[0], 3)  # readers from the fourth epoch on: three read here
    if saved == "without the count":
        del state["epochs_here"]
    again = batches(rows_file, n_procs=None)
    again.load_state_dict(state)
    procs = []
    for epoch in range(again.epoch, 6):
        again.set_epoch(epoch)
        procs.append(again.n_procs)  # as this epoch reads
        got = [y.copy() for y in again]
        start = stop_at[1] if epoch == stop_at[0] else 0
        assert len(got) == len(expected[epoch]) - start
        for mine, theirs in zip(got, expected[epoch][start:]):
            np.testing.assert_array_equal(mine, theirs)
    # epochs 2..5 (4..5): the saved run bought readers for its fourth epoch, 3; without the count, 3 epochs from here
    assert procs == {"mid-epoch": [[0], [2], [2], [2]], "after the switch": [[2], [2]],
                     "without the count": [[0], [0], [0], [2]]}[saved]
    assert again.state_dict()["epochs_here"] == 3
    again.close()


@pytest.mark.parametrize("handler", ["default", "inherited"])
def test_a_schedulers_warning_sent_to_the_whole_job_is_left_to_the_training_process(
    rows_file, no_cycle_collector, no_leaks, handler: str
) -> None:
    """SLURM's ``--signal=USR1@60`` (SGE's ``-notify`` too) signals every process of the job step, readers included.
    The training process decides what it means (its handler saves a checkpoint); the readers neither die of it (the
    default action) nor run the training loop's handler, which they would inherit through fork."""
    import signal

    def preempted(signum, frame):
        raise RuntimeError(f"the training loop's handler ran in process {os.getpid()}")

    old = signal.signal(signal.SIGUSR1, signal.SIG_DFL if handler == "default" else preempted)
    try:
        b = batches(rows_file, shuffle=False, epochs=1)
        before = children()
        got = []
        for y in b:
            if not got:
                readers = readers_started(before)
                signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the training process's own answer is not the point
                for pid in readers:
                    os.kill(pid, signal.SIGUSR1)
            got.append(y.copy())
        np.testing.assert_array_equal(np.concatenate(got), np.arange(4000))
        assert alive(readers) == readers
        b.close()
    finally:
        signal.signal(signal.SIGUSR1, old)


@pytest.mark.parametrize("kind", ["batches", "mix", "torch"])
def test_a_with_closes_the_batches_readers_at_its_end(rows_file, no_cycle_collector, no_leaks, kind: str) -> None:
    # As a Queue's and a Reader's with: left after a break, the readers are gone (they would wait for the next
    # iteration otherwise); the position stays.
    b = batches(rows_file)
    made: object = b
    if kind == "mix":
        made = multitables.mix_batches([b, batches(rows_file, seed=4)], [0.5, 0.5], steps=1000)
    elif kind == "torch":
        import multitables.torch as mt

        made = mt.TorchBatches(b)
    before = children()
    with made as entered:  # type: ignore[attr-defined]
        assert entered is made
        for _ in zip(range(3), entered):  # type: ignore[call-overload]
            pass
        readers = readers_started(before)
    assert not wait_gone(readers)
    assert (made.step if kind == "mix" else b.state_dict()["step"]) == 3  # type: ignore[attr-defined]
