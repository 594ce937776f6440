"""Batches: aligned rows of several datasets, every row once per epoch, deterministic, sharded, resumable."""

from __future__ import annotations

import inspect
import json
import os
import re
import resource
import signal
import sys
import tempfile
import textwrap
import threading
import traceback
import types
import typing
import warnings
from pathlib import Path
from typing import Callable, Sequence

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import multitables
from _typecheck import expected_of, mypy_says
from multitables._plan.epoch import EpochSettings
from multitables._plan.readers import split_readers
from multitables.batches import Batches


def write(path: Path, n_rows: int, chunk_rows: int = 64) -> Path:
    """/X rows are (i, -i, 0.5 i), /y is i: every row of a batch says where it came from."""
    i = np.arange(n_rows)
    with h5py.File(path, "w") as f:
        x = np.stack([i, -i, 0.5 * i], axis=1).astype("<f8")
        f.create_dataset("X", data=x, chunks=(min(chunk_rows, n_rows), 3), compression="gzip", shuffle=True)
        f.create_dataset("y", data=i.astype("<i8"), chunks=(min(4 * chunk_rows, n_rows),))
        f.create_dataset("short", data=i[:-1] if n_rows > 1 else i)
    return path


@pytest.fixture
def data_file(tmp_path: Path) -> Callable[[int], Path]:
    return lambda n_rows, chunk_rows=64: write(tmp_path / f"d{n_rows}_{chunk_rows}.h5", n_rows, chunk_rows)


def epoch_rows(batches: Batches) -> list[np.ndarray]:
    """One epoch (from the current position) as the row numbers of each batch, checking X and y agree."""
    out = []
    for x, y in batches:
        assert x.shape == (len(y), 3) and x.dtype == np.float64 and y.dtype == np.int64
        np.testing.assert_array_equal(x[:, 0], y, err_msg="X and y of a batch come from different rows")
        np.testing.assert_array_equal(x[:, 1], -y)
        out.append(y.copy())
    return out


def settings_of(b: Batches) -> EpochSettings:
    return b._settings


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_row_once_per_epoch_aligned_across_datasets(data_file, shuffle: bool, world_size: int, drop_last: bool) -> None:
    n, bs = 1000, 48
    stream = multitables.Streamer(data_file(n))
    seen, counts = [], []
    for rank in range(world_size):
        b = stream.get_batches(["/X", "/y"], batch_size=bs, shuffle=shuffle, drop_last=drop_last, seed=5,
                               n_procs=1, rank=rank, world_size=world_size, block_size=64, window=3)  # fmt: skip
        batches = epoch_rows(b)
        counts.append(len(batches))
        assert all(len(y) == bs for y in batches[:-1])
        assert 0 < len(batches[-1]) <= bs
        # The executed order is the planned one.
        planned = list(settings_of(b).rank_epoch(0, rank).batches())
        assert [y.tolist() for y in batches] == [p.tolist() for p in planned]
        seen.append(np.concatenate(batches))
    assert len(set(counts)) == 1, f"ranks got {counts} batches"
    rows = np.concatenate(seen)
    assert len(np.unique(rows)) == len(rows)
    if drop_last:
        assert len(rows) == world_size * counts[0] * bs and n - len(rows) < world_size * bs
    else:
        np.testing.assert_array_equal(np.sort(rows), np.arange(n))
    if not shuffle and world_size == 1:
        np.testing.assert_array_equal(rows, np.arange(len(rows)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 700),
    chunk_rows=st.integers(1, 100),
    blocks=st.integers(1, 40),
    batch_size=st.integers(1, 200),
    world_size=st.integers(1, 4),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    window=st.integers(1, 5),
    n_procs=st.sampled_from([0, 1, 2]),
    data=st.data(),
)
def test_any_shape_of_epoch_delivers_the_plan_and_resumes_anywhere(
    n, chunk_rows, blocks, batch_size, world_size, shuffle, drop_last, window, n_procs, data
) -> None:
    assume(not drop_last or n >= world_size * batch_size)
    block_size = max(1, min(n, blocks * chunk_rows))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty last batches are expected in some shapes
        stream = multitables.Streamer(write(Path(tmp) / "d.h5", n, chunk_rows))
        kwargs = dict(batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=9, n_procs=n_procs,
                      world_size=world_size, block_size=block_size, window=window)  # fmt: skip
        rank = data.draw(st.integers(0, world_size - 1))
        b = stream.get_batches(["/X", "/y"], rank=rank, **kwargs)
        planned = [p.tolist() for p in settings_of(b).rank_epoch(0, rank).batches()]
        k = data.draw(st.integers(0, len(planned)))
        first = list(iter_n(b, k))
        assert first == planned[:k]
        state = b.state_dict()
        again = multitables.Streamer(stream.filename).get_batches(["/X", "/y"], rank=rank, **kwargs)
        again.load_state_dict(json.loads(json.dumps(state)))
        assert again.epoch == (1 if k == len(planned) else 0)  # saved at the epoch's end: on at the next
        rest = [y.tolist() for y in epoch_rows(again)] if k < len(planned) else []
        assert first + rest == planned


def iter_n(b: Batches, k: int):
    """The row numbers of the next ``k`` batches; the iteration is then dropped (its readers stop)."""
    if k == 0:
        return
    for i, (x, y) in enumerate(b):
        np.testing.assert_array_equal(x[:, 0], y)
        yield y.tolist()
        if i + 1 == k:
            return


def test_the_order_does_not_depend_on_n_procs_and_changes_each_epoch(data_file) -> None:
    stream = multitables.Streamer(data_file(3000))
    orders = {}
    for n_procs in (0, 1, 2):
        b = stream.get_batches(["/X", "/y"], batch_size=100, seed=11, n_procs=n_procs, block_size=128, window=4)
        orders[n_procs] = [np.concatenate(epoch_rows(b)) for _ in range(3)]  # epochs 0, 1, 2
        assert b.epoch == 3
    for n_procs in (1, 2):
        for e in range(3):
            np.testing.assert_array_equal(orders[n_procs][e], orders[0][e])
    e0, e1, e2 = orders[0]
    assert not np.array_equal(e0, e1) and not np.array_equal(e1, e2)
    # set_epoch goes back to an epoch, and gives the same order again.
    b = stream.get_batches(["/X", "/y"], batch_size=100, seed=11, n_procs=1, block_size=128, window=4)
    b.set_epoch(1)
    np.testing.assert_array_equal(np.concatenate(epoch_rows(b)), e1)
    # Another seed, another order.
    b = stream.get_batches(["/X", "/y"], batch_size=100, seed=12, n_procs=0, block_size=128, window=4)
    assert not np.array_equal(np.concatenate(epoch_rows(b)), e0)


def test_the_default_plan_does_not_depend_on_the_machine(data_file, monkeypatch: pytest.MonkeyPatch) -> None:
    path = data_file(5000, 50)
    stream = multitables.Streamer(path)
    plans = []
    for cpus in (1, 2, 64):
        monkeypatch.setattr("multitables._plan.readers.available_cpus", lambda: cpus)
        b = stream.get_batches(["/X", "/y"], batch_size=10)
        plans.append(b.state_dict())
    assert plans[0] == plans[1] == plans[2]
    assert plans[0]["block_size"] % 50 == 0, "blocks are whole chunks"


def test_a_small_shared_memory_fits_the_readers_slots_never_the_blocks_so_the_order_stands(
    data_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The readers' default slots fit into half of the shared memory free (NOTE [read plan]); the blocks, of which
    # an epoch's order is made, do not change. 256 KiB free: X's default ring (6 slots of 48 KiB) would need 288.
    from multitables._shm import space

    stream = multitables.Streamer(data_file(20_000))
    kw = dict(batch_size=500, seed=5, block_size=2048, window=3)
    plain = [np.concatenate(epoch_rows(stream.get_batches(["/X", "/y"], n_procs=0, **kw)))]
    monkeypatch.setattr(space, "shm_free_bytes", lambda: 256 << 10)
    monkeypatch.setattr(space, "cgroup_free_bytes", lambda: None)
    b = stream.get_batches(["/X", "/y"], n_procs=2, **kw)
    for epoch in range(2):
        got = np.concatenate(epoch_rows(b))
        if epoch == 0:
            np.testing.assert_array_equal(got, plain[0])
        assert sorted(got.tolist()) == list(range(20_000))
    b.close()
    with pytest.raises(multitables.ShmSpaceError, match="read_ahead or block_size"):
        epoch_rows(stream.get_batches(["/X", "/y"], n_procs=2, read_ahead=6, **kw))


def test_resume_in_a_fresh_streamer_neither_repeats_nor_skips(data_file) -> None:
    path = data_file(2000)
    kwargs = dict(batch_size=64, seed=3, n_procs=2, block_size=128, window=3)
    whole = [np.concatenate(epoch_rows(multitables.Streamer(path).get_batches(["/X", "/y"], **kwargs))) for _ in range(1)]
    b = multitables.Streamer(path).get_batches(["/X", "/y"], **kwargs)
    reference = multitables.Streamer(path).get_batches(["/X", "/y"], **kwargs)
    epochs = [np.concatenate(epoch_rows(reference)) for _ in range(2)]
    np.testing.assert_array_equal(epochs[0], whole[0])
    got = [[], []]
    b.set_epoch(0)
    for i, (x, y) in enumerate(b):  # stop after 7 batches of epoch 0, mid-window
        got[0].append(y.copy())
        if i == 6:
            break
    state = json.loads(json.dumps(b.state_dict()))  # a checkpoint survives JSON
    assert (state["epoch"], state["batch"]) == (0, 7)
    del b
    fresh = multitables.Streamer(path).get_batches(["/X", "/y"], **kwargs)
    fresh.load_state_dict(state)
    for epoch in range(2):  # the usual loop: set_epoch keeps the restored position
        fresh.set_epoch(epoch)
        got[epoch] += epoch_rows(fresh)
    for epoch in range(2):
        np.testing.assert_array_equal(np.concatenate(got[epoch]), epochs[epoch])
    assert fresh.epoch == 2


@pytest.mark.parametrize("draw", ["indices", "weights"])
def test_a_subset_or_a_draw_resumed_late_in_an_epoch_goes_on_into_the_next(data_file, draw: str) -> None:
    """A resume a few batches before an epoch's end: the loop reads the next epoch's first window meanwhile (a
    carry, partly pulled), whose pieces' selections the next epoch must find where they were."""
    path = data_file(2000, 50)
    kwargs = dict(batch_size=24, seed=3, indices=np.arange(0, 2000, 2)) if draw == "indices" else dict(
        batch_size=24, seed=3, weights=np.ones(2000))
    reference = multitables.Streamer(path).get_batches(["/X", "/y"], **kwargs)
    epochs = [epoch_rows(reference) for _ in range(3)]
    per_epoch = len(epochs[0])
    for stop in range(per_epoch - 6, per_epoch):
        b = multitables.Streamer(path).get_batches(["/X", "/y"], **kwargs)
        first = list(iter_n(b, stop))
        fresh = multitables.Streamer(path).get_batches(["/X", "/y"], **kwargs)
        fresh.load_state_dict(json.loads(json.dumps(b.state_dict())))
        b.close()
        got = [first, [], []]
        for epoch in range(fresh.epoch, 3):
            fresh.set_epoch(epoch)
            got[epoch] += [y.tolist() for y in epoch_rows(fresh)]
        fresh.close()
        assert got == [[y.tolist() for y in e] for e in epochs], f"resumed after batch {stop} of {per_epoch}"


def test_a_state_saved_at_an_epochs_last_batch_resumes_at_the_next_epoch(data_file) -> None:
    # The loop of the docs, for epoch in range(batches.epoch, n), must not run an empty epoch first.
    path = data_file(500)
    kwargs = dict(batch_size=64, seed=3, n_procs=0)
    b = multitables.Streamer(path).get_batches(["/X", "/y"], **kwargs)
    for i, (x, y) in enumerate(b):
        if i == len(b) - 1:
            state = json.loads(json.dumps(b.state_dict()))  # saved during the last batch's step
    assert (state["epoch"], state["batch"]) == (0, len(b))
    expected = epoch_rows(b)  # epoch 1, in full
    fresh = multitables.Streamer(path).get_batches(["/X", "/y"], **kwargs)
    fresh.load_state_dict(state)
    assert fresh.epoch == 1
    got = []
    for epoch in range(fresh.epoch, 2):
        fresh.set_epoch(epoch)
        got += epoch_rows(fresh)
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(expected))
    assert fresh.state_dict()["step"] == 2 * len(b)


def test_batches_and_mixes_are_neither_pickled_nor_copied_but_say_what_to_do(data_file) -> None:
    import copy
    import pickle

    stream = multitables.Streamer(data_file(300))
    b = stream.get_batches(["/X", "/y"], batch_size=50, n_procs=0)
    mix = multitables.mix_batches([b, stream.get_batches(["/X", "/y"], batch_size=50, n_procs=0)], [1, 1])
    for obj in (b, mix):
        for how in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="neither pickled nor copied: save its position with state_dict"):
                how(obj)
    assert len(epoch_rows(b)) == 6  # untouched


def test_an_iteration_goes_on_from_where_the_last_one_stopped(data_file) -> None:
    b = multitables.Streamer(data_file(500)).get_batches(["/X", "/y"], batch_size=50, seed=1, n_procs=0)
    planned = [p.tolist() for p in settings_of(b).rank_epoch(0, 0).batches()]
    first = list(iter_n(b, 3))
    second = list(iter_n(b, 2))
    rest = [y.tolist() for y in epoch_rows(b)]
    assert first + second + rest == planned
    assert b.epoch == 1 and b.state_dict()["batch"] == 0
    # A new iteration ends an unfinished one, which then says so (a loop nested in a loop over the same
    # batches would otherwise end the outer one without a word); the old one's position is where the new one starts.
    it1 = iter(b)
    next(it1)
    it2 = iter(b)
    with pytest.raises(RuntimeError, match="ended by a newer one: a Batches has one position"):
        next(it1)
    assert next(it2)[1].tolist() == list(settings_of(b).rank_epoch(1, 0).batches())[1].tolist()
    b.close()  # a close ends an iteration as its epoch's end would
    with pytest.raises(StopIteration):
        next(it2)


class Preempted(Exception):
    """What a job's SIGUSR1 handler raises to leave its loop and checkpoint (SLURM's ``--signal``)."""


class SignalAtCall:
    """A profile hook (``sys.setprofile``) that sends this process SIGUSR1 at the ``landing``-th call or return of the
    library's frames since :meth:`arm` (none at a generator's yield, where no handler runs, but in the frame it goes
    to), and ends at the loop's own frame ``loop``, which has the batch by then."""

    def __init__(self, loop: "types.CodeType") -> None:
        self.loop, self.ours = loop, os.path.dirname(multitables.__file__)
        self.landing = self.events = 0

    def arm(self) -> None:
        self.events = 0
        sys.setprofile(self)

    def __call__(self, frame: "types.FrameType", event: str, arg: object) -> None:
        if frame.f_code is self.loop:  # back in the loop: it has the batch
            sys.setprofile(None)
        elif not frame.f_code.co_filename.startswith(self.ours):
            return  # not in h5py's finalizers, where Python drops a handler's exception ("Exception ignored")
        elif event == "return" and frame.f_code.co_flags & inspect.CO_GENERATOR:
            return  # a yield: no handler runs there (nor at a generator's end), but in the frame it goes to
        elif self.events == self.landing:
            sys.setprofile(None)
            signal.raise_signal(signal.SIGUSR1)  # its handler runs here, as at a check in the library's frame
        self.events += 1


def test_a_signal_handler_that_raises_mid_batch_leaves_no_batch_counted_that_the_loop_did_not_get(data_file) -> None:
    """A signal's Python handler runs between two instructions of whatever runs then. Here a signal comes at each
    call and return in turn while the loop takes a batch (all the library does for it), and its handler raises:
    the position then counts exactly the batches the loop got, the one being delivered included or not, so a
    checkpoint saved in the ``except`` neither skips nor repeats (NOTE [delivered batches])."""
    import gc
    import signal
    import sys

    b = multitables.Streamer(data_file(300)).get_batches("/y", batch_size=20, seed=1, n_procs=0, epochs=None)
    planned = [p.tolist() for e in range(3) for p in settings_of(b).rank_epoch(e, 0).batches()]
    hook = SignalAtCall(sys._getframe().f_code)
    got: list[list[int]] = []

    def preempted(signum, frame):
        raise Preempted

    gc.collect()
    gc.disable()  # a collection runs finalizers anywhere: there Python drops a handler's exception too
    old = signal.signal(signal.SIGUSR1, preempted)
    try:
        armed = False
        while True:
            try:
                for y in b:
                    got.append(y.tolist())  # the loop has the batch (no check before this call ends)
                    if armed:  # a whole delivery went by with no signal: every call of it had one
                        break
                    if len(got) % 2 == 0:  # every other batch: through the next batch's delivery
                        hook.arm()
                        armed = True
            except Preempted:
                assert b.state_dict()["step"] == len(got), f"signal at call/return {hook.landing} of a delivery"
                hook.landing, armed = hook.landing + 1, False
                continue
            finally:
                sys.setprofile(None)
            break
    finally:
        signal.signal(signal.SIGUSR1, old)
        gc.enable()
        b.close()
    assert hook.landing > 10, "signals came at each call of a delivery"
    assert got[: len(planned)] == planned[: len(got)]


@pytest.mark.parametrize("move", ["set_epoch", "load_state_dict"])
def test_a_position_moved_inside_a_loop_is_an_error_of_that_loop_not_its_end(data_file, move: str) -> None:
    """set_epoch or load_state_dict in a loop's body move the position the loop goes on from: the loop raises,
    naming it, rather than end as if the epoch were over (a loop that trained on 4 of 10 batches without a word)."""
    b = multitables.Streamer(data_file(500)).get_batches(["/X", "/y"], batch_size=50, seed=1, n_procs=0)
    state = b.state_dict()
    seen = 0
    with pytest.raises(RuntimeError, match=rf"ended by {move}.*moved the position"):
        for seen, _ in enumerate(b, 1):
            if seen == 4:
                b.set_epoch(5) if move == "set_epoch" else b.load_state_dict(state)
    assert seen == 4
    if move == "set_epoch":
        assert b.epoch == 5 and b.state_dict()["batch"] == 0  # moved all the same: the next loop starts there
        b.set_epoch(5)  # no move: the loop goes on
        it = iter(b)
        next(it)
        b.set_epoch(5)
        assert sum(1 for _ in it) == len(b) - 1
    else:
        assert b.state_dict() == state


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_loop_left_after_an_epochs_last_batch_has_finished_that_epoch(data_file, n_procs: int) -> None:
    """``break`` (a step budget, say) right after an epoch's last batch: the epoch is done. The next batch comes
    from the next epoch, as ``epoch`` and the state say, and the next loop delivers that epoch in full (it
    delivered nothing, then that epoch, one loop later)."""
    b = multitables.Streamer(data_file(500)).get_batches(["/X", "/y"], batch_size=64, seed=2, n_procs=n_procs)
    for i, _ in enumerate(b):
        if i == len(b) - 1:
            break
    assert b.epoch == 1 and (b.state_dict()["epoch"], b.state_dict()["batch"]) == (1, 0)
    planned = [p.tolist() for p in settings_of(b).rank_epoch(1, 0).batches()]
    assert [y.tolist() for y in epoch_rows(b)] == planned
    for i, _ in enumerate(b):  # and a second time, the readers having read ahead into the next epoch
        if i == len(b) - 1:
            break
    assert [y.tolist() for y in epoch_rows(b)] == [p.tolist() for p in settings_of(b).rank_epoch(3, 0).batches()]
    b.close()


def test_a_single_path_gives_arrays_and_batches_are_yours(data_file) -> None:
    b = multitables.Streamer(data_file(300)).get_batches("/X", batch_size=32, n_procs=0, block_size=64, window=2)
    batches = list(b)
    assert all(isinstance(x, np.ndarray) and x.flags.writeable and x.flags.owndata for x in batches[:-1])
    assert len(batches) == 10 and len(batches[-1]) == 300 - 9 * 32
    np.testing.assert_array_equal(np.sort(np.concatenate(batches)[:, 0]), np.arange(300))
    batches[0][:] = -1  # writing to a batch touches nothing else
    b.set_epoch(0)
    assert (np.concatenate(list(b))[:, 0] >= 0).all()


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_kept_uncopied_across_epochs_keep_their_rows(data_file, shuffle: bool) -> None:
    """What an asynchronous consumer relies on (JAX's dispatch reads a batch after the loop moved on; jax.device_put
    may share its memory): no later batch, window or epoch writes into a batch delivered before it."""
    b = multitables.Streamer(data_file(300)).get_batches(
        ["/X", "/y"], batch_size=32, shuffle=shuffle, seed=1, n_procs=0, block_size=64, window=2, epochs=2
    )
    kept = list(b)  # the arrays themselves, as a queue of in-flight steps holds them
    assert len(kept) == 20
    for x, y in kept:
        np.testing.assert_array_equal(x[:, 0], y)
    for epoch in (kept[:10], kept[10:]):
        np.testing.assert_array_equal(np.sort(np.concatenate([y for _, y in epoch])), np.arange(300))
    arrays = [a for batch in kept for a in batch]
    assert not any(np.shares_memory(a, c) for i, a in enumerate(arrays) for c in arrays[i + 1 :])


def test_get_batches_function_and_properties(data_file) -> None:
    stream = multitables.Streamer(data_file(1000))
    b = stream.get_batches(["/y", "/X"], 100, rank=1, world_size=2, n_procs=0)
    assert isinstance(b, Batches) and b.paths == ["/y", "/X"] and b.n_rows == 1000
    assert (b.rank, b.world_size, b.batch_size, len(b), b.epoch) == (1, 2, 100, 5, 0)
    assert b.n_procs == [0, 0] and b.window >= 1 and b.block_size >= 1
    y, x = next(iter(b))
    np.testing.assert_array_equal(x[:, 0], y)
    b.close()


def test_datasets_of_different_lengths_are_refused(data_file) -> None:
    stream = multitables.Streamer(data_file(100))
    with pytest.raises(ValueError, match=r"same number of rows: '/X' has 100, '/short' has 99"):
        stream.get_batches(["/X", "/short"], batch_size=10)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(batch_size=2.5), TypeError, "batch_size"),
        (dict(batch_size=10, seed=-1), ValueError, "seed"),
        (dict(batch_size=10, shuffle="yes"), TypeError, "shuffle"),
        (dict(batch_size=10, rank=1), ValueError, "both rank and world_size"),
        (dict(batch_size=10, rank=2, world_size=2), ValueError, "rank must be in"),
        (dict(batch_size=10, block_size=101), ValueError, "block_size"),
        (dict(batch_size=60, world_size=2, rank=0, drop_last=True), ValueError, "no batch"),
        (dict(batch_size=10, read_ahead=0), ValueError, "read_ahead"),
    ],
)
def test_bad_arguments_fail_before_anything_starts(data_file, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        multitables.Streamer(data_file(100)).get_batches(["/X", "/y"], **kwargs)


def test_missing_node_and_empty_paths(data_file) -> None:
    stream = multitables.Streamer(data_file(100))
    with pytest.raises(KeyError, match="/nope"):
        stream.get_batches(["/X", "/nope"], batch_size=10)
    with pytest.raises(ValueError, match="empty"):
        stream.get_batches([], batch_size=10)


def test_a_state_with_another_order_is_refused(data_file) -> None:
    stream = multitables.Streamer(data_file(1000))
    state = stream.get_batches(["/X", "/y"], batch_size=10, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed=1"):
        stream.get_batches(["/X", "/y"], batch_size=10, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        stream.get_batches(["/X", "/y"], batch_size=10, seed=1).load_state_dict({"epoch": 1})
    with pytest.raises(ValueError, match="beyond"):
        stream.get_batches(["/X", "/y"], batch_size=10, seed=1).load_state_dict({**state, "batch": 101})
    # A hand-written part of an epoch run at another world size: refused past that epoch, as a batch is.
    with pytest.raises(ValueError, match=r"elastic segment \[2, 51\] is not a part of an epoch: 51 batches at world_size=2, of 50"):
        stream.get_batches(["/X", "/y"], batch_size=10, seed=1).load_state_dict({**state, "elastic": [[2, 51]]})
    with pytest.raises(ValueError, match=r"elastic segment \[0, 1\]"):
        stream.get_batches(["/X", "/y"], batch_size=10, seed=1).load_state_dict({**state, "elastic": [[0, 1]]})
    # Rank 0's checkpoint loads on every rank.
    r0 = stream.get_batches(["/X", "/y"], batch_size=10, rank=0, world_size=2)
    r1 = stream.get_batches(["/X", "/y"], batch_size=10, rank=1, world_size=2)
    list(iter_n(r0, 3))
    r1.load_state_dict(r0.state_dict())
    assert r1.state_dict()["batch"] == 3 and r1.rank == 1


def test_empty_last_batches_are_announced_and_delivered(data_file) -> None:
    # 1001 rows over 4 ranks in batches of 50: the last step has 1 row left for 4 ranks.
    stream = multitables.Streamer(data_file(1001))
    with pytest.warns(UserWarning, match="empty"):
        bs = [stream.get_batches(["/X", "/y"], batch_size=50, rank=r, world_size=4, n_procs=0) for r in range(4)]
    sizes = [[len(y) for _, y in b] for b in bs]
    assert sizes == [[50] * 5 + [1]] + [[50] * 5 + [0]] * 3
    x, y = list(bs[1])[-1]  # the next epoch; shapes of an empty batch
    assert x.shape == (0, 3) and y.shape == (0,)


def test_stopping_early_leaves_nothing_behind(data_file, no_leaks) -> None:
    stream = multitables.Streamer(data_file(5000))
    for shuffle in (True, False):
        b = stream.get_batches(["/X", "/y"], batch_size=64, shuffle=shuffle, n_procs=2, block_size=128, window=4)
        for i, _ in enumerate(b):
            if i == 5:
                break
        list(iter_n(b, 2))
        it = iter(b)
        next(it)
        b.close()
        del it, b


def test_a_reader_error_reaches_the_loop(data_file) -> None:
    """A chunk that cannot be decoded (the file wrecked before the batches were made: wrecked after, it is a file
    changed since its description, FileChangedError at the next open)."""
    path = data_file(2000)
    with h5py.File(path, "r") as f:
        info = f["X"].id.get_chunk_info(5)
    with open(path, "r+b") as f:  # wreck one compressed chunk of /X
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    b = multitables.Streamer(path).get_batches(["/X", "/y"], batch_size=64, n_procs=1, block_size=128)
    with pytest.raises(multitables.ReaderError, match="/X"):
        list(b)


def test_a_file_wrecked_after_the_batches_were_made_stops_them(data_file) -> None:
    path = data_file(2000)
    b = multitables.Streamer(path).get_batches(["/X", "/y"], batch_size=64, n_procs=1, block_size=128)
    with h5py.File(path, "r") as f:
        info = f["X"].id.get_chunk_info(5)
    with open(path, "r+b") as f:
        f.seek(info.byte_offset)
        f.write(b"\xff" * info.size)
    with pytest.raises(multitables.FileChangedError, match="d2000"):
        list(b)


def test_tables_work_too(table_file) -> None:
    path, rows = table_file
    b = multitables.Streamer(path).get_batches("/table", batch_size=64, seed=2, n_procs=0)
    got = np.concatenate(list(b))
    assert got.dtype == rows.dtype
    np.testing.assert_array_equal(np.sort(got["a"]), rows["a"])
    np.testing.assert_array_equal(got["b"], got["a"] * 0.5)


@pytest.mark.parametrize("shuffle", [True, False])
def test_columns_of_a_one_row_batch_are_each_their_own_memory(table_file, shuffle: bool) -> None:
    """numpy calls a view of one element contiguous whatever its strides: the last batch of one row (or batches of
    one) still gets columns of their own memory, with their own strides, as torch.from_numpy takes them."""
    path, rows = table_file
    stream = multitables.Streamer(path)
    for size in (len(rows) - 1, 1):
        batches = list(stream.get_batches("/table", batch_size=size, fields=["a", "v"], shuffle=shuffle, seed=2,
                                          n_procs=0))
        assert len(batches[-1]["a"]) == 1
        for batch in batches[-2:]:
            for name, array in batch.items():
                assert array.base is None and array.strides == np.empty_like(array).strides, (size, name)
        got = np.concatenate([b["a"] for b in batches])
        np.testing.assert_array_equal(np.sort(got), np.sort(rows["a"]))


@pytest.mark.parametrize("n_procs", [0, 2], ids=["in-process", "readers"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_a_column_or_columns_of_a_table_come_in_the_order_of_its_rows(table_file, n_procs: int, shuffle: bool) -> None:
    path, rows = table_file
    stream = multitables.Streamer(path)
    kw = dict(batch_size=48, seed=5, shuffle=shuffle, n_procs=n_procs, block_size=64)
    whole = list(stream.get_batches("/table", **kw))
    one = list(stream.get_batches("/table", field="v", **kw))
    several = list(stream.get_batches("/table", fields=["b", "a"], **kw))
    assert len(whole) == len(one) == len(several) == -(-len(rows) // 48)
    for records, column, columns in zip(whole, one, several):
        np.testing.assert_array_equal(column, records["v"])  # the same rows, in the same order
        assert column.shape == (len(records), 3) and column.dtype == np.float32
        assert list(columns) == ["b", "a"]  # the order asked for
        for name, array in columns.items():
            np.testing.assert_array_equal(array, records[name])
            assert array.flags.c_contiguous and array.flags.writeable and array.base is None  # each its own memory
    np.testing.assert_array_equal(np.sort(np.concatenate([c["a"] for c in several])), rows["a"])


@pytest.mark.parametrize("n_procs", [0, 2], ids=["in-process", "readers"])
def test_a_column_of_a_nested_column_by_its_pytables_path(tmp_path: Path, n_procs: int) -> None:
    """``field='outer/inner'`` and ``fields=['a', 'outer/inner']`` (PyTables' path into a nested column): those
    columns of the same rows; a path that is not there is refused naming what is."""
    import tables

    dtype = np.dtype([("a", "<i4"), ("outer", [("p", "u1"), ("q", "<f4", (2,))])])
    rows = np.zeros(500, dtype)
    rows["a"] = np.arange(500)
    rows["outer"]["p"] = np.arange(500) % 251
    rows["outer"]["q"] = np.arange(1000).reshape(500, 2) / 4
    path = tmp_path / "nested.h5"
    with tables.open_file(path, "w") as f:
        f.create_table("/", "table", rows, filters=tables.Filters(1, "zlib"), chunkshape=(32,))
    stream = multitables.Streamer(path)
    kw = dict(batch_size=48, seed=3, n_procs=n_procs, block_size=64)
    whole = list(stream.get_batches("/table", **kw))
    one = list(stream.get_batches("/table", field="outer/q", **kw))
    several = list(stream.get_batches("/table", fields=["outer/p", "a"], **kw))
    assert len(whole) == len(one) == len(several) == -(-500 // 48)
    for records, column, columns in zip(whole, one, several):
        np.testing.assert_array_equal(column, records["outer"]["q"])
        assert list(columns) == ["outer/p", "a"]
        np.testing.assert_array_equal(columns["outer/p"], records["outer"]["p"])
        np.testing.assert_array_equal(columns["a"], records["a"])
        assert columns["outer/p"].flags.c_contiguous and columns["outer/p"].base is None
    with pytest.raises(KeyError, match=re.escape("the fields of 'outer' are ['p', 'q']")):
        stream.get_batches("/table", fields=["a", "outer/r"], **kw)


def test_columns_resume_where_they_stopped(table_file) -> None:
    path, _rows = table_file
    stream = multitables.Streamer(path)
    b = stream.get_batches("/table", batch_size=100, seed=1, fields=["a"], n_procs=0)
    first = [next(iter(b))["a"] for _ in range(1)]
    state = b.state_dict()
    rest = [batch["a"] for batch in stream.get_batches("/table", batch_size=100, seed=1, fields=["a"], n_procs=0)][1:]
    again = stream.get_batches("/table", batch_size=100, seed=1, fields=["a"], n_procs=0)
    again.load_state_dict(state)
    resumed = [batch["a"] for batch in again]
    assert len(resumed) == len(rest)
    for x, y in zip(resumed, rest):
        np.testing.assert_array_equal(x, y)
    assert not set(np.concatenate(resumed)) & set(first[0])


@pytest.mark.parametrize(
    "paths, kwargs, error, match",
    [
        ("/table", dict(field="a", fields=["b"]), ValueError, "not both"),
        (["/table"], dict(field="a"), ValueError, "one path"),
        ("/table", dict(fields="a"), TypeError, "sequence of column names"),
        ("/table", dict(fields=[]), ValueError, "empty"),
        ("/table", dict(fields=["a", "a"]), ValueError, "twice"),
        ("/table", dict(fields=["a", "nope"]), KeyError, "no column 'nope'; its columns: \\['a', 'b', 'v'\\]"),
        ("/table", dict(field="nope"), KeyError, "nope"),
        ("/table", dict(field=3), TypeError, "field must be a str"),
    ],
)
def test_bad_columns_are_refused_before_anything_starts(table_file, paths, kwargs: dict, error: type, match: str) -> None:
    path, _rows = table_file
    with pytest.raises(error, match=match):
        multitables.Streamer(path).get_batches(paths, batch_size=10, **kwargs)


def test_the_columns_snippet_of_the_training_docs_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    import tables

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.rst").read_text()
    section = text[text.index("Columns of a table") :]
    snippet = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section).group(1)  # type: ignore[union-attr]
    rows = np.zeros(1000, [("image", "u1", (8, 8)), ("label", "<i8")])
    rows["label"] = np.arange(1000)
    rows["image"] = (np.arange(1000) % 256).astype("u1")[:, None, None]
    monkeypatch.chdir(tmp_path)
    with tables.open_file("samples.h5", "w") as f:
        f.create_table("/", "samples", rows, filters=tables.Filters(3, "zlib"))
    scope: dict = {}
    exec(textwrap.dedent(snippet), scope)
    assert scope["images"].shape == (1000 % 256, 8, 8) and scope["images"].dtype == np.uint8
    np.testing.assert_array_equal(scope["images"][:, 0, 0], scope["labels"] % 256)
    assert sorted(np.concatenate(list(scope["labels_only"])).tolist()) == list(range(1000))


def test_fields_of_an_array_without_columns_are_refused(data_file) -> None:
    with pytest.raises(KeyError, match="not a table"):
        multitables.Streamer(data_file(100)).get_batches("/X", batch_size=10, fields=["a"])


@pytest.mark.parametrize("n_procs", [0, 2], ids=["in-process", "readers"])
def test_endless_epochs_follow_each_other_each_in_its_own_order(data_file, n_procs: int) -> None:
    stream = multitables.Streamer(data_file(500))
    kw = dict(batch_size=64, seed=3, n_procs=n_procs)
    one = stream.get_batches(["/X", "/y"], **kw)
    per_epoch = len(one)
    expected = []
    for epoch in range(3):  # what set_epoch gives, epoch by epoch
        one.set_epoch(epoch)
        expected.extend(epoch_rows(one))
    endless = stream.get_batches(["/X", "/y"], epochs=None, **kw)
    got = []
    for step, (_x, y) in enumerate(endless):
        got.append(y.copy())
        if step + 1 == 3 * per_epoch:
            break
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
    # Left after epoch 2's last batch: that epoch is done, the next batch is epoch 3's (a state saved during
    # that batch's step, (2, its number of batches), is the same position).
    assert endless.state_dict()["epoch"] == 3 and endless.state_dict()["step"] == 3 * per_epoch
    for e in range(3):  # every row once per epoch, and a new order each epoch
        rows = np.concatenate(got[e * per_epoch : (e + 1) * per_epoch])
        assert sorted(rows.tolist()) == list(range(500))
    assert not np.array_equal(np.concatenate(got[:per_epoch]), np.concatenate(got[per_epoch : 2 * per_epoch]))


def test_a_step_based_run_resumes_mid_epoch_with_the_next_step(data_file) -> None:
    stream = multitables.Streamer(data_file(300))
    kw = dict(batch_size=32, seed=9, epochs=None, n_procs=0)
    reference = []
    for step, (_x, y) in enumerate(stream.get_batches(["/X", "/y"], **kw)):
        reference.append(y.copy())
        if step == 24:
            break
    first = stream.get_batches(["/X", "/y"], **kw)
    for step, _batch in enumerate(first):
        if step == 14:
            break
    state = json.loads(json.dumps(first.state_dict()))  # a checkpoint survives JSON
    assert state["epoch"] == 1 and state["step"] == 15 and state["batch"] == 15 - len(first)
    resumed = stream.get_batches(["/X", "/y"], **kw)
    resumed.load_state_dict(state)
    for step, (_x, y) in enumerate(resumed, start=15):
        np.testing.assert_array_equal(y, reference[step])
        if step == 24:
            break


def test_the_step_based_snippet_of_the_training_docs_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.rst").read_text()
    section = text[text.index("Step-based training") :]
    snippet = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section).group(1)  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.h5", 3000, 64)
    scope: dict = {}
    exec(textwrap.dedent(snippet), scope)
    state = scope["checkpoint"]
    assert state["step"] == 1000 and state["epoch"] == 1000 // len(scope["batches"])


def test_the_subsets_snippet_of_the_training_docs_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.rst").read_text()
    section = text[text.index("\nSubsets\n") :]
    snippet = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section).group(1)  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.h5", 3000, 64)
    scope: dict = {}
    exec(textwrap.dedent(snippet), scope)
    mask = scope["validation"]
    train = np.concatenate([y for _x, y in scope["train"]])
    check = np.concatenate([y for _x, y in scope["check"]])
    half = np.concatenate([y for _x, y in scope["first_half"]])
    assert sorted(train.tolist()) == np.flatnonzero(~mask).tolist()
    assert check.tolist() == np.flatnonzero(mask).tolist()  # unshuffled: in file order
    assert sorted(half.tolist()) == list(range(1500))


def test_a_given_number_of_epochs_runs_that_many_then_stops(data_file) -> None:
    stream = multitables.Streamer(data_file(200))
    b = stream.get_batches(["/X", "/y"], batch_size=64, seed=0, epochs=3, n_procs=0)
    assert len(list(b)) == 3 * len(b)
    assert b.state_dict()["epoch"] == 3 and b.state_dict()["batch"] == 0
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        stream.get_batches(["/X", "/y"], batch_size=64, epochs=0)
    with pytest.raises(TypeError, match="epochs must be an int or None"):
        stream.get_batches(["/X", "/y"], batch_size=64, epochs=2.5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 400),
    batch_size=st.integers(1, 50),
    world_size=st.integers(1, 3),
    shuffle=st.booleans(),
    n_procs=st.sampled_from([0, 2]),
    kind=st.sampled_from(["mask", "array", "slice"]),
    data=st.data(),
)
def test_a_subset_is_planned_as_a_dataset_of_its_rows_and_resumes_anywhere(
    n, batch_size, world_size, shuffle, n_procs, kind, data
) -> None:
    if kind == "slice":
        start, stop = sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=2)))
        assume(stop > start)
        indices = slice(start, stop, data.draw(st.integers(1, 5)))
    else:
        mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
        assume(mask.any())
        indices = mask if kind == "mask" else data.draw(st.permutations(np.flatnonzero(mask).tolist()))
    rows = np.arange(n)[indices] if kind == "slice" else np.flatnonzero(mask)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty last batches are expected in some shapes
        stream = multitables.Streamer(write(Path(tmp) / "d.h5", n, 16))
        kwargs = dict(batch_size=batch_size, shuffle=shuffle, seed=4, n_procs=n_procs, world_size=world_size,
                      indices=indices, block_size=max(1, min(len(rows), data.draw(st.integers(1, 40)))))  # fmt: skip
        seen = []
        for rank in range(world_size):
            b = stream.get_batches(["/X", "/y"], rank=rank, **kwargs)
            assert b.n_rows == len(rows)
            planned = [rows[p].tolist() for p in settings_of(b).rank_epoch(0, rank).batches()]
            k = data.draw(st.integers(0, len(planned)))
            first = list(iter_n(b, k))
            assert first == planned[:k]
            again = stream.get_batches(["/X", "/y"], rank=rank, **kwargs)
            again.load_state_dict(json.loads(json.dumps(b.state_dict())))
            assert again.epoch == (1 if k == len(planned) else 0)  # saved at the epoch's end: on at the next
            rest = [y.tolist() for y in epoch_rows(again)] if k < len(planned) else []
            assert first + rest == planned
            following = [rows[p].tolist() for p in settings_of(b).rank_epoch(1, rank).batches()]
            assert [y.tolist() for y in epoch_rows(again)] == following  # read ahead while the first one ended
            seen.extend(r for batch in planned for r in batch)
        assert sorted(seen) == rows.tolist()  # every row of the subset once an epoch, and no other


def test_a_subset_default_block_spans_about_a_default_block_of_the_file(data_file) -> None:
    stream = multitables.Streamer(data_file(20_000, 64))
    whole = stream.get_batches(["/X", "/y"], batch_size=100)
    every_tenth = stream.get_batches(["/X", "/y"], batch_size=100, indices=slice(None, None, 10))
    assert every_tenth.n_rows == 2000 and every_tenth.block_size == max(1, whole.block_size // 10)
    got = np.concatenate([y for _x, y in every_tenth])
    assert sorted(got.tolist()) == list(range(0, 20_000, 10))


def test_a_state_only_loads_into_batches_over_the_same_subset(data_file) -> None:
    stream = multitables.Streamer(data_file(300))
    b = stream.get_batches(["/X", "/y"], batch_size=10, indices=np.arange(0, 300, 2))
    state = b.state_dict()
    for other in (np.arange(1, 300, 2), None):
        with pytest.raises(ValueError, match="subset="):
            stream.get_batches(["/X", "/y"], batch_size=10, indices=other).load_state_dict(state)
    whole = stream.get_batches(["/X", "/y"], batch_size=10).state_dict()
    del whole["subset"]  # a state saved before subsets existed: the whole dataset
    stream.get_batches(["/X", "/y"], batch_size=10).load_state_dict(whole)


@pytest.mark.parametrize(
    "indices, error, match",
    [
        (np.array([3, 3]), ValueError, "more than once.*weights="),
        (np.array([300]), IndexError, "out of range for 300 rows"),
        (np.zeros(299, bool), ValueError, "one value per row"),
        (np.zeros(300, bool), ValueError, "select none"),
        (slice(5, 5), ValueError, "select none"),
        ([], ValueError, "select none"),  # numpy makes an empty list float: still no row, not a type error
        (np.array([1.5]), TypeError, "integer array, a slice or a boolean mask"),
        ("rows", TypeError, "integer array, a slice or a boolean mask"),
    ],
)
def test_bad_indices_are_refused_before_anything_starts(data_file, indices, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        multitables.Streamer(data_file(300)).get_batches(["/X", "/y"], batch_size=10, indices=indices)


def test_negative_indices_count_from_the_end(data_file) -> None:
    b = multitables.Streamer(data_file(300)).get_batches(["/X", "/y"], batch_size=10, indices=[-1, 0, -300 + 5])
    assert sorted(np.concatenate([y for _x, y in b]).tolist()) == [0, 5, 299]


@pytest.mark.parametrize("n_procs", [0, 2], ids=["in-process", "readers"])
def test_a_weighted_draw_takes_rows_in_proportion_anew_each_epoch(data_file, n_procs: int) -> None:
    stream = multitables.Streamer(data_file(1000))
    weights = np.zeros(1000)
    weights[:10] = 9.0  # ten rows with nearly half the weight: 90 against 990 x 0.1
    weights[10:] = 0.1
    kw = dict(batch_size=100, seed=2, weights=weights, num_samples=2000, n_procs=n_procs)
    b = stream.get_batches(["/X", "/y"], **kw)
    assert b.n_rows == 2000 and len(b) == 20
    epochs = []
    for epoch in range(2):
        b.set_epoch(epoch)
        rows = np.concatenate(epoch_rows(b))  # X and y of every batch agree, row by row
        assert len(rows) == 2000
        epochs.append(np.sort(rows))
        heavy = np.isin(rows, np.arange(10)).mean()
        assert 0.42 < heavy < 0.53  # expected 90 / 189 = 0.476 (sd 0.011); a uniform draw gives 0.01
    assert not np.array_equal(epochs[0], epochs[1])  # a fresh draw each epoch
    again = stream.get_batches(["/X", "/y"], **kw)  # ... the same one for the same seed
    np.testing.assert_array_equal(np.sort(np.concatenate(epoch_rows(again))), epochs[0])


@pytest.mark.filterwarnings("ignore:block_size=50 cuts each compressed chunk")  # draws, not speed
@pytest.mark.parametrize("n_procs", [0, 2], ids=["in-process", "readers"])
def test_in_a_loop_of_epochs_each_draw_is_made_once_on_a_thread_of_its_own(
        data_file, n_procs: int, monkeypatch: pytest.MonkeyPatch, no_leaks) -> None:
    """The next epoch's rows are drawn while this one is read, on a thread, and not drawn again when it starts: a
    draw (0.2 s for a million rows) is no batch's wait. The batches are those of batches that draw each epoch
    afresh in the caller's thread (one epoch at a time, in another process's order of events)."""
    import multitables._plan.subset as subset

    stream = multitables.Streamer(data_file(1000))
    kw = dict(batch_size=100, seed=4, weights=np.arange(1, 1001, dtype=float), num_samples=1500, block_size=50,
              window=4, n_procs=n_procs)
    want = []
    for epoch in range(3):
        ref = stream.get_batches(["/X", "/y"], **kw)
        ref.set_epoch(epoch)
        want.append(epoch_rows(ref))
        ref.close()
    draws: list[tuple[int, str]] = []
    draw = subset.weighted_draw
    monkeypatch.setattr(subset, "weighted_draw",
                        lambda *a: (draws.append((a[3], threading.current_thread().name)), draw(*a))[1])
    b = stream.get_batches(["/X", "/y"], epochs=3, **kw)
    got = epoch_rows(b)
    assert [g.tolist() for g in got] == [w.tolist() for e in want for w in e]
    assert sorted(draws) == [(0, "MainThread"), (1, "multitables-draw"), (2, "multitables-draw")]
    b.close()


@pytest.mark.filterwarnings("ignore:block_size=50 cuts each compressed chunk")  # draws, not speed
def test_a_draw_that_fails_on_its_thread_reaches_the_loop_with_its_traceback_and_leaves_nothing(
        data_file, monkeypatch: pytest.MonkeyPatch, no_leaks) -> None:
    import multitables._plan.subset as subset

    draw = subset.weighted_draw

    def fails_for_epoch_1(weights, n_samples, seed, epoch):  # noqa: ANN001, ANN202
        if epoch == 1:
            raise MemoryError("no room to draw epoch 1")
        return draw(weights, n_samples, seed, epoch)

    monkeypatch.setattr(subset, "weighted_draw", fails_for_epoch_1)
    b = multitables.Streamer(data_file(1000)).get_batches(
        ["/X", "/y"], 100, weights=np.ones(1000), block_size=50, window=4, n_procs=2, epochs=2)
    delivered = 0
    with pytest.raises(MemoryError, match="no room to draw epoch 1") as info:
        for _ in b:
            delivered += 1
    assert delivered < len(b)  # raised during epoch 0, where the next epoch's rows are taken
    assert "fails_for_epoch_1" in "".join(traceback.format_tb(info.value.__traceback__))  # the thread's frames
    b.close()


def test_a_weighted_draw_is_the_same_on_every_rank_and_split_between_them(data_file) -> None:
    stream = multitables.Streamer(data_file(500))
    weights = np.arange(500, dtype=float)  # row 0 is never drawn
    one = np.sort(np.concatenate(epoch_rows(stream.get_batches(["/X", "/y"], batch_size=50, weights=weights, n_procs=0))))
    shares = [
        np.concatenate(epoch_rows(stream.get_batches(["/X", "/y"], batch_size=50, weights=weights, rank=r, world_size=2, n_procs=0)))
        for r in range(2)
    ]
    np.testing.assert_array_equal(np.sort(np.concatenate(shares)), one)
    assert 0 not in one and len(one) == 500


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(weights=np.ones(299)), ValueError, "one value per row"),
        (dict(weights=-np.ones(300)), ValueError, "not negative"),
        (dict(weights=np.zeros(300)), ValueError, "all 0"),
        (dict(weights=np.array(["a"] * 300)), TypeError, "array of numbers"),
        (dict(weights=np.ones(300), indices=slice(0, 10)), ValueError, "not both"),
        (dict(num_samples=10), ValueError, "give weights= too"),
        (dict(weights=np.ones(300), num_samples=0), ValueError, "num_samples"),
    ],
)
def test_bad_weights_are_refused_before_anything_starts(data_file, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        multitables.Streamer(data_file(300)).get_batches(["/X", "/y"], batch_size=10, **kwargs)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 300),
    batch_size=st.integers(1, 20),
    sizes=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    shuffle=st.booleans(),
    data=st.data(),
)
def test_an_elastic_resume_neither_repeats_nor_skips_a_row(n, batch_size, sizes, shuffle, data) -> None:
    """Saved at one world size and resumed at others, in the same epoch: every row once (drop_last=False)."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty last batches are expected in some shapes
        stream = multitables.Streamer(write(Path(tmp) / "d.h5", n, 16))
        kw = dict(batch_size=batch_size, shuffle=shuffle, seed=6, n_procs=0, block_size=max(1, min(n, 24)), window=2)
        delivered: list[int] = []
        state = None
        for i, world in enumerate(sizes):
            ranks = [stream.get_batches(["/X", "/y"], rank=r, world_size=world, **kw) for r in range(world)]
            if state is not None:
                for b in ranks:
                    b.load_state_dict(json.loads(json.dumps(state)))  # rank 0's checkpoint, on every rank
            if ranks[0].epoch > 0:
                break  # the epoch was over
            last = i == len(sizes) - 1
            left = sum(1 for _ in ranks[0]._epoch_plan(0)[0].rank_epoch(0, 0).batches()) - ranks[0].state_dict()["batch"]
            steps = left if last else data.draw(st.integers(0, left))
            for b in ranks:  # every rank takes the same number of steps
                delivered.extend(r for batch in iter_n(b, steps) for r in batch)
            state = ranks[0].state_dict()
            if steps == left and not last:
                for b in ranks:
                    list(b)  # the rest of the epoch (empty last batches): the position moves on
                state = ranks[0].state_dict()
        else:
            for b in ranks:
                assert b.epoch == 1 or len(list(b)) == 0
        assert sorted(delivered) == list(range(n))


def test_an_elastic_resume_at_another_world_size_goes_on_with_the_rows_left(data_file) -> None:
    stream = multitables.Streamer(data_file(1000))
    kw = dict(batch_size=25, seed=3, n_procs=0)
    two = [stream.get_batches(["/X", "/y"], rank=r, world_size=2, **kw) for r in range(2)]
    seen = [r for b in two for batch in iter_n(b, 8) for r in batch]  # 2 ranks x 8 steps x 25 rows
    state = two[0].state_dict()
    three = [stream.get_batches(["/X", "/y"], rank=r, world_size=3, **kw) for r in range(3)]
    for b in three:
        b.load_state_dict(state)
        assert b.state_dict()["elastic"] == [[2, 8]] and b.state_dict()["batch"] == 0
    rest = [np.concatenate(epoch_rows(b)) for b in three]
    assert sorted(seen + np.concatenate(rest).tolist()) == list(range(1000))
    assert {len(r) for r in rest} == {200} and all(b.epoch == 1 for b in three)  # 600 rows left, shared evenly
    np.testing.assert_array_equal(  # the next epoch is planned as usual, at the new size
        np.concatenate(epoch_rows(three[1])),
        np.concatenate(epoch_rows(_at_epoch(stream.get_batches(["/X", "/y"], rank=1, world_size=3, **kw), 1))),
    )


def test_the_elastic_snippet_of_the_training_docs_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.rst").read_text()
    section = text[text.index("A state saved at one **world size**") :]
    snippet = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section).group(1)  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.h5", 2000, 64)
    scope: dict = {}
    exec(textwrap.dedent(snippet), scope)
    assert scope["checkpoint"]["batch"] == 10
    rest = np.concatenate(scope["rest"])
    assert len(rest) == 2000 - 2 * 10 * 32 and len(set(rest.tolist())) == len(rest)


def _at_epoch(b: Batches, epoch: int) -> Batches:
    b.set_epoch(epoch)
    return b


BIG = 1 << 30


@pytest.mark.parametrize(
    "nbytes, pays, n_procs, cpus, expected",
    [
        ([BIG, 10], [True, False], None, 8, [8, 0]),  # labels read in-process
        ([10, 10], [False, False], None, 8, [0, 0]),  # nothing pays: all in-process
        ([10, 20], [False, False], 3, 8, [0, 3]),  # an explicit n_procs goes to the largest
        ([3 * BIG, BIG, 5], [True, True, False], None, 8, [6, 2, 0]),
        ([3 * BIG, BIG, 2 * BIG], [True, True, True], 2, 8, [1, 0, 1]),  # more big datasets than processes
        ([BIG, BIG], [True, True], 0, 8, [0, 0]),
    ],
)
def test_split_readers(nbytes: list[int], pays: list[bool], n_procs: "int | None", cpus: int, expected: list[int]) -> None:
    assert split_readers(nbytes, pays, n_procs, cpus) == expected
    if any(expected):
        assert sum(expected) == (cpus if n_procs is None else n_procs)


# -- window buffers and fork (NOTE [window buffers and fork] in _train.buffers) -----------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_finds_a_window_buffer_zeroed_and_the_parents_untouched() -> None:
    from multitables._train.buffers import empty_window_buffer

    buf = empty_window_buffer((1024, 16), np.float32)
    buf[...] = 7
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if not buf.any() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert (buf == 7).all()


def test_later_epochs_write_the_window_buffers_without_copy_on_write_faults(tmp_path: Path) -> None:
    # Each epoch forks its readers; private buffers would then fault once per page on the next write.
    path = tmp_path / "w.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.ones((8192, 1024), np.float32), chunks=(256, 1024), compression="gzip")
    buffer_pages = 8192 * 1024 * 4 // 4096  # the whole file is one window

    def faults_of_an_epoch(batches: Batches) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        assert sum(len(b) for b in batches) == 8192
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    shuffled = multitables.Streamer(str(path)).get_batches("data", 256, seed=0, n_procs=2)
    plain = multitables.Streamer(str(path)).get_batches("data", 256, n_procs=2, shuffle=False)  # no window buffers
    assert shuffled.window * shuffled.block_size == 8192
    faults_of_an_epoch(shuffled), faults_of_an_epoch(plain)  # first epochs: first touches
    later, baseline = faults_of_an_epoch(shuffled), faults_of_an_epoch(plain)
    assert later - baseline < buffer_pages // 4, (later, baseline)


def test_a_block_size_that_cuts_compressed_chunks_of_a_shuffled_epoch_warns(data_file) -> None:
    """A shuffled epoch reads the blocks of a chunk apart, each decoding the whole chunk (a helper found 38x the
    time with 256-row blocks of 65,536-row chunks): a block_size that cuts compressed chunks warns, naming the
    dataset and what to give (so does one of more than a chunk that is no multiple of it: its boundaries cut chunks);
    whole chunks, the default, an uncompressed dataset and an ordered epoch do not."""
    stream = multitables.Streamer(data_file(1000))  # /X: gzip, chunks of 64 rows; /y: no filter
    with pytest.warns(UserWarning, match=r"block_size=16 cuts each compressed chunk of '/X' in '.*' \(64 rows\) into 4 "
                                         r"blocks.*Give a multiple of 64 rows, or leave block_size out"):
        stream.get_batches(["/X", "/y"], batch_size=10, block_size=16, n_procs=0)
    # 96 rows: the block boundary at row 96 cuts the chunk of rows 64..127, and so every other one.
    with pytest.warns(UserWarning, match=r"block_size=96 cuts compressed chunks of '/X' in '.*' \(64 rows\) between "
                                         r"two blocks.*Give a multiple of 64 rows, or leave block_size out"):
        stream.get_batches(["/X", "/y"], batch_size=10, block_size=96, n_procs=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kw in ({"block_size": 128}, {}, {"block_size": 16, "shuffle": False}):
            stream.get_batches(["/X", "/y"], batch_size=10, n_procs=0, **kw)
        stream.get_batches("/y", batch_size=10, block_size=16, n_procs=0)
    path = data_file(1000).with_name("grown.h5")  # 50 rows of a dataset made to grow, in a chunk of 64
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=np.zeros((50, 3)), maxshape=(None, 3), chunks=(64, 3), compression="gzip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        multitables.Streamer(path).get_batches("/X", 10, block_size=50, n_procs=0)  # one block of every row cuts none


# -- what a user's type checker sees (read here from the annotations: the tests run no type checker) ------------

#: typing.get_overloads is Python 3.11's; on 3.10 the overloads are the same, only not listed.
needs_overloads = pytest.mark.skipif(not hasattr(typing, "get_overloads"), reason="typing.get_overloads is Python 3.11's")


def keywords(function: Callable[..., object]) -> dict[str, object]:
    """``function``'s keyword-only parameters in order, with their defaults (``inspect.Parameter.empty``: required)."""
    return {p.name: p.default for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_batches_are_generic_in_the_kind_of_batch_they_yield() -> None:
    """``Batches[np.ndarray]`` in an annotation: batches of one array each; a mix yields what its sources yield."""
    assert typing.get_origin(Batches[np.ndarray]) is Batches
    assert typing.get_origin(multitables.MixedBatches[np.ndarray]) is multitables.MixedBatches
    (kind,) = Batches.__parameters__
    assert typing.get_type_hints(Batches.__iter__)["return"] == typing.Iterator[kind]
    hints = typing.get_type_hints(multitables.mix_batches, localns={"Batches": Batches})
    assert typing.get_args(hints["sources"]) == (Batches[kind],)
    assert hints["return"] == multitables.MixedBatches[kind]


@needs_overloads
@pytest.mark.parametrize("function", [Batches.__init__, multitables.Streamer.get_batches], ids=["Batches", "get_batches"])
def test_the_overloads_spell_out_every_keyword_of_batches_with_its_default(function: Callable[..., object]) -> None:
    """A type checker sees each keyword as ``Batches`` takes it (a typo is an error, not ``**kwargs: Any``);
    ``fields`` is required where it makes the batches dicts of columns."""
    expected = keywords(Batches.__init__)
    overloads = typing.get_overloads(function)
    assert len(overloads) == 4
    for overload in overloads:
        given = keywords(overload)
        assert list(given) == list(expected)
        assert {k: v for k, v in given.items() if k != "fields"} == {k: v for k, v in expected.items() if k != "fields"}
    fields = [keywords(overload)["fields"] for overload in overloads]
    assert fields.count(inspect.Parameter.empty) == 1 and fields.count(None) == 3


@needs_overloads
@pytest.mark.parametrize("function", [Batches.__init__, multitables.Streamer.get_batches], ids=["Batches", "get_batches"])
def test_the_arguments_decide_the_kind_of_batch_a_type_checker_sees(function: Callable[..., object]) -> None:
    """One path (a string): arrays; a sequence of paths: tuples of arrays; ``fields=``: dicts of columns; one path
    with ``fields`` a variable that may be None: arrays or dicts. Columns of several paths match no
    overload (they raise ``ValueError``): a type checker reports them."""
    kinds = {}
    for overload in typing.get_overloads(function):
        hints = typing.get_type_hints(overload, localns={"Streamer": multitables.Streamer})
        kinds[hints["paths"], hints["fields"]] = hints["self" if function is Batches.__init__ else "return"]
        if hints["paths"] is not str:
            assert hints["field"] is type(None) and hints["fields"] is type(None)
    assert kinds == {
        (str, type(None)): Batches[np.ndarray],
        (str, Sequence[str]): Batches[dict[str, np.ndarray]],
        (Sequence[str], type(None)): Batches[tuple[np.ndarray, ...]],
        (str, Sequence[str] | None): Batches[np.ndarray | dict[str, np.ndarray]],
    }


#: What ``mypy --strict`` says of each line of USER_CODE marked ``# reveal`` or ``# error``.
USER_CODE = """
from typing import Any, Sequence
import multitables

def train(stream: multitables.Streamer, fields: Sequence[str] | None, field: str | None, opts: dict[str, Any]) -> None:
    reveal_type(stream.get_batches("/x", 8))  # reveal: Batches[ndarray]
    reveal_type(stream.get_batches("/t", 8, field="a"))  # reveal: Batches[ndarray]
    reveal_type(stream.get_batches("/t", 8, fields=["a", "b"]))  # reveal: Batches[dict[str, ndarray]]
    reveal_type(stream.get_batches(["/x", "/y"], 8))  # reveal: Batches[tuple[ndarray, ...]]
    reveal_type(stream.get_batches(("/x", "/y"), 8, transform={"/x": abs}))  # reveal: Batches[tuple[ndarray, ...]]
    reveal_type(stream.get_batches("/t", 8, fields=fields))  # reveal: Batches[ndarray | dict[str, ndarray]]
    stream.get_batches("/t", 8, field=field, fields=fields)  # error: arg-type
    reveal_type(multitables.Batches(stream, "/t", 8, fields=["a"]))  # reveal: Batches[dict[str, ndarray]]
    reveal_type(multitables.Batches(stream, ["/x", "/y"], 8))  # reveal: Batches[tuple[ndarray, ...]]
    reveal_type(stream.get_batches("/x", 8, **opts))  # reveal: Batches[Any]
    for x, y in stream.get_batches(["/x", "/y"], 8):
        reveal_type(x)  # reveal: ndarray
    stream.get_batches(["/x", "/y"], 8, fields=["a"])  # error: call-overload
    stream.get_batches(("/x", "/y"), 8, fields=("a",))  # error: call-overload
    stream.get_batches(["/x", "/y"], 8, field="a")  # error: call-overload
    multitables.Batches(stream, ["/x", "/y"], 8, fields=["a"])  # error: call-overload
    stream.get_batches("/t", 8, field="a", fields=["a"])  # error: call-overload
    stream.get_batches("/x", 8, batchsize=3)  # error: call-overload
    stream.get_batches("/x", "8")  # error: call-overload
"""


def test_a_type_checker_sees_the_kind_of_batch_and_reports_columns_of_several_paths(tmp_path: Path) -> None:
    """What a user's ``mypy --strict`` says of get_batches: the kind of batch each call gives, and an error for the
    calls that raise, ``fields=`` with several paths among them."""
    assert mypy_says(USER_CODE, tmp_path) == expected_of(USER_CODE)


def test_batches_and_their_mix_say_what_they_are(data_file: Callable[[int], Path]) -> None:
    path = data_file(1000)
    stream = multitables.Streamer(path)
    batches = stream.get_batches(["/X", "/y"], 100, rank=1, world_size=2, n_procs=0)
    assert repr(batches) == f"<multitables.Batches '/X', '/y' of {str(path)!r}: 5 batches of 100 rows an epoch (rank 1 of 2), epoch 0>"
    batches.set_epoch(3)
    assert repr(batches).endswith("epoch 3>")
    mixed = multitables.mix_batches([stream.get_batches("/y", 10), stream.get_batches("/y", 10, seed=1)], [3, 1])
    assert repr(mixed) == "<multitables.MixedBatches of 2 sources (0.75, 0.25, per batch) at step 0>"


def test_ranks_launched_but_not_joined_are_warned_that_each_reads_every_row(data_file, monkeypatch) -> None:
    """torchrun sets WORLD_SIZE and RANK; without init_process_group, batches cannot know the ranks (rank 0 of 1:
    every process reads every row, a run twice as long that no error shows). DistributedSampler raises there; a
    warning says it, and what to do. Given ranks, or a world of one, say nothing."""
    import warnings

    path = data_file(100)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.warns(UserWarning, match=r"WORLD_SIZE=2 and RANK=1 .* not initialised: these batches are rank 0 of 1"):
        b = multitables.Streamer(path).get_batches("/y", 10, n_procs=0)
    assert (b.rank, b.world_size) == (0, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        multitables.Streamer(path).get_batches("/y", 10, n_procs=0, rank=1, world_size=2)
        monkeypatch.setenv("WORLD_SIZE", "1")
        multitables.Streamer(path).get_batches("/y", 10, n_procs=0)


def test_batches_over_more_datasets_than_open_files_say_why_and_what_to_do(tmp_path: Path) -> None:
    """Batches over 300 datasets, read in this process with its table of descriptors full (they hold one per dataset
    and file no more: NOTE [shared descriptors]), failed at their first batch with a bare "[Errno 24] Too many open
    files". The error says what holds descriptors, the limit and the ways out, names the file and the count, keeps the
    original as its cause, and leaves no open."""
    import subprocess

    with h5py.File(tmp_path / "many.h5", "w") as f:
        for i in range(300):
            f[f"d{i:03d}"] = np.arange(40, dtype="<i4") + i
    script = textwrap.dedent("""
        import errno, os, resource, sys, multitables
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        stream = multitables.Streamer(sys.argv[1])
        with stream.get_batches("/d000", 10, n_procs=0) as warm:  # what the first batches import, imported
            next(iter(warm))
        batches = stream.get_batches([f"/d{i:03d}" for i in range(300)], 10, n_procs=0)
        before = len(os.listdir("/proc/self/fd"))
        taken = []
        try:  # the table full: what else this process holds (a caller's files, sockets)
            while True:
                taken.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE, exc
        try:
            next(iter(batches))
        except OSError as exc:
            for fd in taken:
                os.close(fd)
            assert exc.errno == errno.EMFILE and exc.filename == sys.argv[1], exc
            assert type(exc.__cause__) is OSError and exc.__cause__.errno == errno.EMFILE, repr(exc.__cause__)
            assert len(os.listdir("/proc/self/fd")) == before, "the datasets opened before stay open"
            print(exc)
        batches.close()
    """)
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "many.h5")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    said = run.stdout
    assert re.search(r"could not open dataset \d+ of 300, '/d\d+', for batches", said), said
    assert "this process reached its limit of 200 open files" in said, said
    assert "one per file that this process reads" in said and "`ulimit -n`" in said, said
    assert "resource.setrlimit(resource.RLIMIT_NOFILE" in said and "or read fewer datasets at once" in said, said
    assert str(tmp_path / "many.h5") in said, said
