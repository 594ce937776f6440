"""Batches gathered into memory the caller gives (``Batches.iter_into``), and the PyTorch adapter's ``device=`` / ``pin_memory=``.

NOTE [batches on a device] in ``multitables._train.device``. The CUDA tests
run where PyTorch sees a GPU and are skipped elsewhere, saying so.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables
from _guards import hang_guard

torch = pytest.importorskip("torch")
mt = pytest.importorskip("multitables.torch")

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA: torch.cuda.is_available() is False on this machine")


@pytest.fixture(scope="module", autouse=True)
def cuda_context() -> None:
    """The CUDA context, made before any test's leak check: it opens the driver's descriptors once, for the process's life.

    Without it the first CUDA test is charged with them (``no_leaks``: fds ``/dev/nvidia*``, eventfds, a pipe).
    """
    if CUDA:
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.empty(1, pin_memory=True).to("cuda", non_blocking=True)
        torch.cuda.synchronize()


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "d.h5"
    i = np.arange(3000)
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=np.stack([i, -i], axis=1).astype("<f4"), chunks=(50, 2), compression="gzip")
        f.create_dataset("y", data=i.astype("<i8"), chunks=(100,))
        f.create_dataset("t", data=np.array([(k, 2.0 * k) for k in i], dtype=[("a", "<i4"), ("b", "<f8")]), chunks=(100,))
    return path


def batches(path: Path, paths: "str | list[str]" = ("/X", "/y"), **kw: object) -> multitables.Batches:  # type: ignore[assignment]
    kw = {"n_procs": 2, "block_size": 100, "window": 4, "seed": 1, **kw}
    return multitables.Streamer(path).get_batches(list(paths) if not isinstance(paths, str) else paths, 64, **kw)


@pytest.mark.parametrize("shuffle", [True, False])
def test_iter_into_writes_each_batch_into_the_callers_arrays(data_file: Path, shuffle: bool, no_leaks: None) -> None:
    reference = [tuple(a.copy() for a in b) for b in batches(data_file, shuffle=shuffle, n_procs=0)]
    made: list[list[np.ndarray]] = []

    def alloc(n: int) -> list[np.ndarray]:
        made.append([np.full((n, 2), -1, "<f4"), np.full(n, -1, "<i8")])
        return made[-1]

    b = batches(data_file, shuffle=shuffle)
    assert b.row_types == [(np.dtype("<f4"), (2,)), (np.dtype("<i8"), ())]
    got = list(b.iter_into(alloc))
    assert len(got) == len(reference) == len(made)
    for (x, y), (rx, ry), arrays in zip(got, reference, made):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
        assert np.shares_memory(x, arrays[0]) and np.shares_memory(y, arrays[1])  # no copy after the gather
    assert len(got[-1][1]) == 3000 % 64 and all(len(a[1]) == 64 for a in made)  # the short last one: the first rows
    b.close()


def test_the_delivery_path_gives_the_rows_of_the_plain_one(data_file: Path, no_leaks: None) -> None:
    """The gathering and sending of NOTE [batches on a device], on the CPU (page-locked memory needs CUDA)."""
    from multitables._train.device import Delivery

    plain = [tuple(t.clone() for t in b) for b in mt.TorchBatches(batches(data_file, n_procs=0))]
    b = batches(data_file)
    delivery = Delivery(None, False, b.row_types, b.paths)
    got = [delivery.send(batch, gathered=True) for batch in b.iter_into(delivery.alloc)]
    assert len(got) == len(plain)
    for mine, theirs in zip(got, plain):
        assert all(torch.equal(m, t) for m, t in zip(mine, theirs))
    mix = Delivery(None, False, None, ())
    assert torch.equal(mix.send(np.arange(6.0).reshape(3, 2), gathered=False), torch.arange(6.0, dtype=torch.float64).reshape(3, 2))
    assert torch.equal(mix.send({"a": np.arange(3)}, gathered=False)["a"], torch.arange(3))
    b.close()


def test_device_cpu_gives_cpu_tensors_as_without_it(data_file: Path) -> None:
    plain = [tuple(t.clone() for t in b) for b in mt.TorchBatches(batches(data_file, n_procs=0))]
    got = list(mt.get_batches(multitables.Streamer(data_file), ["/X", "/y"], 64, n_procs=0, block_size=100, window=4, seed=1,
                              device="cpu"))
    assert all(t.device.type == "cpu" for b in got for t in b)
    assert all(torch.equal(m, t) for mine, theirs in zip(got, plain, strict=True) for m, t in zip(mine, theirs))


class LateDevice:
    """A device in host memory for ``DeviceStaging`` (NOTE [windows on a device]) whose copies run as late as a GPU's may.

    A copy runs only at a wait for an event recorded after it. It fails where its source rows changed since it was
    queued (a window buffer written again under its copy), and a gather fails where a copy into the rows it reads
    was not waited for.
    """

    def __init__(self) -> None:
        self.queued: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        self.seq = 0
        self.ran = 0  # the last copy run
        self.locked: list[np.ndarray] = []
        self.memory: dict[int, int] = {}  # address -> bytes: slots page-locked where they lie
        self.gathered = 0  # rows

    def lock_memory(self, address: int, nbytes: int, what: str) -> None:
        assert not any(a <= address < a + n or address <= a < address + nbytes for a, n in self.memory.items()), \
            "locked twice"
        self.memory[address] = nbytes

    def unlock_memory(self, address: int) -> None:
        self.memory.pop(address)

    def done(self, event: int) -> bool:
        return event <= self.ran

    def drain(self) -> None:
        self.host_wait(self.seq)

    def lock(self, array: np.ndarray) -> None:
        assert not any(a is array for a in self.locked), "locked twice"
        self.locked.append(array)

    def unlock(self, array: np.ndarray) -> None:
        self.locked = [a for a in self.locked if a is not array]

    def empty(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        return np.full(shape, 77, dtype)  # not a row of the test files where it matters: it must be overwritten

    window = empty

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        self.seq += 1
        self.queued.append((self.seq, dst, src, src.copy()))

    def record(self) -> int:
        return self.seq

    def host_wait(self, event: int) -> None:
        for item in [q for q in self.queued if q[0] <= event]:
            _seq, dst, src, then = item
            assert np.array_equal(src, then), "a window buffer was written again before its copy ran"
            dst[...] = src
            self.queued.remove(item)
        self.ran = max(self.ran, event)

    device_wait = host_wait

    def training_mark(self) -> None:
        return None  # the fake's gathers run at once: nothing of them is left to wait for

    def copies_after(self, event: None) -> None:
        pass

    def index(self, perm: np.ndarray, buffer: int) -> np.ndarray:
        return np.asarray(perm, np.int64)

    def index_ahead(self, perm: np.ndarray, buffer: int) -> "tuple[np.ndarray, None]":
        return np.asarray(perm, np.int64), None  # the fake's copies of an order run at once

    def ordered(self, index: np.ndarray, copied: None) -> None:
        pass

    def gather(self, src: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
        assert not any(np.may_share_memory(dst, src) for _s, dst, _src, _then in self.queued), "gathered before its copy"
        np.take(src, index, axis=0, out=out)
        self.gathered += len(index)


def staged(b: multitables.Batches, ops: LateDevice) -> "object":
    from multitables._train.device import DeviceStaging

    return DeviceStaging(ops, b.row_types)


def epoch_rows(path: Path, epochs: int, **kw: object) -> list[list[tuple[np.ndarray, ...]]]:
    ref = batches(path, n_procs=0, **kw)
    out = []
    for e in range(epochs):
        ref.set_epoch(e)
        out.append([tuple(a.copy() for a in b) for b in ref])
    ref.close()
    return out


def same(got: "list", want: "list") -> None:
    assert len(got) == len(want)
    for mine, theirs in zip(got, want):
        for m, t in zip(mine, theirs):
            np.testing.assert_array_equal(m, t)


def test_windows_staged_on_a_device_give_the_rows_and_order_of_host_batches(data_file: Path, no_leaks: None) -> None:
    """Three epochs in one iteration: each next epoch's first window pulled during the last (a carry)."""
    want = epoch_rows(data_file, 3)
    ops = LateDevice()
    b = batches(data_file, epochs=3)
    staging = staged(b, ops)
    got = [tuple(a.copy() for a in batch) for batch in b.iter_into(staging.alloc, staging)]
    same(got, [batch for epoch in want for batch in epoch])
    assert ops.gathered == 2 * 3 * 3000  # every row of both paths, every epoch, gathered on the device
    staging.close()
    assert ops.locked == [] and ops.queued == []
    b.close()


def test_a_windows_order_goes_to_the_device_from_the_thread_that_made_it(data_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        no_leaks: None) -> None:
    """With copy threads, each window's order is copied to the device by the thread that permuted it, before the
    window's first batch (``DeviceStaging.order``): the consumer's thread copies none (on a lent H200 that copy cost
    a window's first batch 0.23-0.27 ms). Three epochs: the next epoch's first order comes with its carry."""
    from multitables._train import buffers

    monkeypatch.setattr(buffers, "copy_threads", lambda: 2)

    class Recording(LateDevice):
        def __init__(self) -> None:
            super().__init__()
            self.ahead: list[threading.Thread] = []
            self.inline = 0

        def index_ahead(self, perm: np.ndarray, buffer: int) -> "tuple[np.ndarray, None]":
            self.ahead.append(threading.current_thread())
            return super().index_ahead(perm, buffer)

        def index(self, perm: np.ndarray, buffer: int) -> np.ndarray:
            self.inline += 1
            return super().index(perm, buffer)

    want = epoch_rows(data_file, 3)
    ops = Recording()
    b = batches(data_file, epochs=3)
    staging = staged(b, ops)
    same([tuple(a.copy() for a in batch) for batch in b.iter_into(staging.alloc, staging)],
         [batch for epoch in want for batch in epoch])
    assert ops.inline == 0
    assert len(ops.ahead) == 3 * 8 and threading.main_thread() not in ops.ahead  # 3,000 rows in windows of 400
    staging.close()
    b.close()


@pytest.mark.parametrize("waits", [True, False])
def test_a_window_buffer_is_written_again_only_after_its_copies_ran(data_file: Path, waits: bool, no_leaks: None) -> None:
    """An iteration left while the next window's copies are queued; the next one first writes that buffer, other rows.

    Without the wait in ``reusing`` (``waits=False``) the late device sees the rows change under a queued copy.
    Blocks read in this process (``n_procs=0``), so that every piece goes through the window buffers: slots taken
    straight are given back, their copies run, before an iteration ends (next tests).
    """
    from multitables._train.device import DeviceStaging

    class NoWait(DeviceStaging):
        def reusing(self, buffer: int, arrays: list) -> None:
            self._copied[buffer] = 0

    want = epoch_rows(data_file, 2)[1]
    ops = LateDevice()
    b = batches(data_file, n_procs=0)
    staging = (DeviceStaging if waits else NoWait)(ops, b.row_types)
    it = b.iter_into(staging.alloc, staging)
    for _ in range(9):  # into window 1 (400 rows a window): window 2's first pieces are pulled into buffer 0, copies queued
        next(it)
    assert ops.queued
    it.close()
    b.set_epoch(1)
    if waits:
        same([tuple(a.copy() for a in batch) for batch in b.iter_into(staging.alloc, staging)], want)
    else:
        with pytest.raises(AssertionError, match="written again before its copy ran"):
            list(b.iter_into(staging.alloc, staging))
        ops.queued.clear()  # the rest of the broken copies: nothing to run
    b.close()
    staging.close()
    assert ops.locked == []


@pytest.fixture
def checked_releases(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every guard's release checks that no copy queued on the late devices (append them to the list) still reads
    its slot (NOTE [slots on a device]: a slot goes back to the readers only after its copy ran)."""
    from multitables._stream.queue import Guard

    devices: list = []
    release = Guard.release

    def checked(guard: Guard) -> None:
        if guard.block is not None:
            for ops in devices:
                assert not any(np.may_share_memory(src, guard.block) for _s, _dst, src, _then in ops.queued), \
                    "a slot was given back before its copy ran"
        release(guard)

    monkeypatch.setattr(Guard, "release", checked)
    return devices


def mapped(address: int) -> bool:
    """Whether ``address`` lies in a mapping of this process (``/proc/self/maps``)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


@pytest.mark.parametrize("eager", [False, True])
def test_slots_are_copied_straight_and_given_back_only_after_their_copies_ran(
        data_file: Path, checked_releases: list, eager: bool, no_leaks: None) -> None:
    """Both paths read by readers: each piece is copied to the device out of its slots, with nothing written to
    the window buffers, and every slot is held until its copy ran. Giving a slot back as soon as its copy is queued
    (``eager``) is caught: the readers may write the next block into it under the copy."""
    from multitables._train.device import DeviceStaging

    class Eager(DeviceStaging):
        def _give_back(self, keep: int) -> None:
            while self._held:
                for guard in self._held.popleft()[1]:
                    guard.release()

    want = epoch_rows(data_file, 2, paths=["/X"])
    ops = LateDevice()
    checked_releases.append(ops)
    b = batches(data_file, ["/X"], epochs=2, n_procs=2)
    staging = (Eager if eager else DeviceStaging)(ops, b.row_types)
    unlocked: list = []
    unlock = ops.unlock_memory
    ops.unlock_memory = lambda address: (unlocked.append(mapped(address)), unlock(address))  # type: ignore[method-assign]
    if eager:
        with pytest.raises(AssertionError, match="given back before its copy ran"):
            list(b.iter_into(staging.alloc, staging))
        ops.queued.clear()
    else:
        got = [tuple(a.copy() for a in batch) for batch in b.iter_into(staging.alloc, staging)]
        same(got, [batch for epoch in want for batch in epoch])
        assert len(ops.memory) == 1 and ops.locked == []  # the ring's slots page-locked, no window buffer
        assert not staging._held  # every slot given back at the iteration's end
        pids = b._feed.queues[0].reader_pids
        b.set_epoch(2)
        assert len(list(b.iter_into(staging.alloc, staging))) == 2 * len(want[0])  # epochs 2 and 3
        assert b._feed.queues[0].reader_pids == pids  # the same readers, the same slots: locked once
        assert len(ops.memory) == 1
    b.close()  # the queue unlocks its slots before it unmaps them (eager: the error closed it)
    assert ops.memory == {} and unlocked == [True]
    staging.close()


def test_slots_held_for_their_copies_with_the_fewest_slots_a_short_shared_memory_leaves(
        data_file: Path, checked_releases: list, no_leaks: None) -> None:
    """Where /dev/shm is short, the plan leaves one slot per reader and the consumer's (NOTE [read plan]), and a
    staging holds slots until their copies ran: the batches still come, right and in order, without a wait for
    ever."""
    from multitables._train.device import DeviceStaging

    want = epoch_rows(data_file, 2, paths=["/X"])
    for read_ahead in (3, 2):  # two readers' fewest; and fewer than that, asked for
        ops = LateDevice()
        checked_releases.append(ops)
        b = batches(data_file, ["/X"], epochs=2, n_procs=2, read_ahead=read_ahead)
        staging = DeviceStaging(ops, b.row_types)
        with hang_guard(60.0, f"batches through {read_ahead} slots"):
            got = [tuple(a.copy() for a in batch) for batch in b.iter_into(staging.alloc, staging)]
        same(got, [batch for epoch in want for batch in epoch])
        b.close()
        staging.close()


def test_queues_started_for_a_staging_that_holds_slots_get_as_many_more(data_file: Path, no_leaks: None) -> None:
    """A staging may hold half of each queue's slots while their copies run (NOTE [slots on a device]): queues it
    starts get twice the default's slots, so that the readers keep the default's; host batches keep the default's,
    and a ``read_ahead`` given is the slots, whoever iterates."""
    from multitables._plan.readers import default_read_ahead
    from multitables._train.device import DeviceStaging

    want = epoch_rows(data_file, 1, paths=["/X"])[0]
    for read_ahead, on_device, slots in [(None, True, 2 * default_read_ahead(2)), (None, False, default_read_ahead(2)),
                                         (5, True, 5)]:
        b = batches(data_file, ["/X"], epochs=1, n_procs=2, read_ahead=read_ahead)
        staging = DeviceStaging(LateDevice(), b.row_types) if on_device else None
        got = [tuple(a.copy() for a in batch) for batch in
               (b.iter_into(staging.alloc, staging) if staging is not None else b)]
        same(got, want)
        assert b._feed.queues[0].read_ahead == slots, (read_ahead, on_device)
        b.close()
        if staging is not None:
            staging.close()


def test_an_epochs_start_waits_for_no_copy_more_recent_than_one_a_batch_in_mid_epoch_waits_for(
        data_file: Path, checked_releases: list, no_leaks: None) -> None:
    """A loop of epochs pulls each next epoch's first window straight out of its slots during the last one. Those
    slots stay held through the epoch's boundary, as within an epoch, and go back as their copies pass: the host
    never waits there for a copy just queued (giving every held slot back when an epoch ended waited for the last
    one, the newest copy of all). The boundary: an epoch's last batch and the next one's first. Rows exact; no
    slot back before its copy ran."""
    from multitables._train.device import DeviceStaging

    want = epoch_rows(data_file, 3, paths=["/X"])
    ops = LateDevice()
    checked_releases.append(ops)
    lags: list[int] = []  # per wait: copies queued after the one waited for
    host_wait = ops.host_wait
    ops.host_wait = lambda event: (lags.append(ops.seq - event), host_wait(event))  # type: ignore[method-assign]
    b = batches(data_file, ["/X"], epochs=3, n_procs=2)
    n = len(b)
    staging = DeviceStaging(ops, b.row_types)
    it = b.iter_into(staging.alloc, staging)
    got, newest = [], []
    for _ in range(3 * n):
        lags.clear()
        got.append(tuple(a.copy() for a in next(it)))
        newest.append(min(lags, default=None))
    assert next(it, None) is None
    same(got, [batch for epoch in want for batch in epoch])
    boundary = [k for k in range(n - 1, 2 * n + 1) if k % n in (0, n - 1)]
    mid = [lag for k, lag in enumerate(newest) if k not in boundary and k not in (0, 3 * n - 1) and lag is not None]
    at_boundary = [newest[k] for k in boundary if newest[k] is not None]
    assert mid and min(at_boundary, default=min(mid)) >= min(mid), (at_boundary, min(mid))
    b.close()
    staging.close()
    assert ops.queued == [] and ops.memory == {}


def test_host_and_device_iterations_take_turns_on_the_same_windows(data_file: Path, no_leaks: None) -> None:
    """A host iteration after a device one waits for the device's copies first; a carry the host pulled is copied."""
    want = epoch_rows(data_file, 3)
    ops = LateDevice()
    b = batches(data_file)
    b.set_epoch(0)  # a loop of epochs: each reads ahead into the next
    staging = staged(b, ops)
    it = b.iter_into(staging.alloc, staging)
    first = [tuple(a.copy() for a in next(it)) for _ in range(3)]  # copies queued, left
    it.close()
    first += [tuple(a.copy() for a in batch) for batch in b]  # on the host: the rest of epoch 0, and a carry of epoch 1
    same(first, want[0])
    assert b._carry is not None and b._carry.staging is not staging  # pulled by the host's staging
    same([tuple(a.copy() for a in batch) for batch in b.iter_into(staging.alloc, staging)], want[1])
    same([tuple(a.copy() for a in batch) for batch in b], want[2])  # the device's carry, taken by the host
    b.close()
    staging.close()
    assert ops.locked == [] and ops.queued == []


#: Each test file's planned batches, by epoch, as examples reach them (the reference reading is the slow part).
WANT: dict = {}


def planned(path: Path, epoch: int) -> list:
    """The batches of ``epoch`` as one process reads them (cached in ``WANT``)."""
    key = (str(path), epoch)
    if key not in WANT:
        ref = batches(path, n_procs=0)
        ref.set_epoch(epoch)
        WANT[key] = [tuple(a.copy() for a in b) for b in ref]
        ref.close()
    return WANT[key]

#: One turn of a training script: iterate on the device or on the host for up to ``n`` batches (the rest of
#: the epoch at most), then maybe go to another epoch or back to a saved position.
TURNS = st.lists(
    st.tuples(st.sampled_from(["device", "host"]), st.integers(0, 60), st.sampled_from(["", "save", "load", "epoch"]),
              st.integers(0, 2)),
    min_size=1, max_size=6,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(turns=TURNS)
def test_any_turns_of_device_and_host_iterations_give_the_planned_batches(data_file: Path, turns: list) -> None:
    """Device and host iterations taking turns on one batches (left mid-window, epochs jumped, positions
    reloaded): each batch is the planned one, and the late device never sees a buffer written under a copy."""
    ops = LateDevice()
    b = batches(data_file)
    b.set_epoch(0)  # a loop of epochs: carries into the next
    staging = staged(b, ops)
    saved = b.state_dict()
    for mode, n, then, epoch in turns:
        e, k = b.epoch, b.state_dict()["batch"]
        it = b.iter_into(staging.alloc, staging) if mode == "device" else iter(b)
        got = [tuple(a.copy() for a in batch) for _, batch in zip(range(n), it)]
        it.close()
        same(got, planned(data_file, e)[k : k + n])  # an iteration ends with its epoch: epochs up to 9 or so
        if then == "save":
            saved = b.state_dict()
        elif then == "load":
            b.load_state_dict(saved)
        elif then == "epoch":
            b.set_epoch(epoch)
    b.close()
    staging.close()
    assert ops.locked == [] and ops.queued == []


def test_the_adapters_device_way_on_cpu_tensors_gives_the_rows_of_plain_batches(data_file: Path, no_leaks: None) -> None:
    """The adapter's way for a GPU (NOTE [windows on a device]) run with ``CudaOps``' copies, index and gather on CPU
    tensors: all of it but the stream, the events and the page-locking, which need CUDA."""
    from multitables._train.cuda import CudaOps

    class CpuTensorOps(CudaOps):
        def __init__(self) -> None:
            self.device, self._stream = torch.device("cpu"), None

        def lock(self, array: np.ndarray) -> None:
            pass

        unlock = lock

        def lock_memory(self, address: int, nbytes: int, what: str) -> None:
            pass

        def unlock_memory(self, address: int) -> None:
            pass

        def done(self, event: None) -> bool:
            return True  # the CPU's copies are done when they return

        def drain(self) -> None:
            pass

        def record(self) -> None:
            return None

        def host_wait(self, event: None) -> None:
            pass

        device_wait = host_wait

        def training_mark(self) -> None:
            return None

        def copies_after(self, event: None) -> None:
            pass

    plain = [tuple(t.clone() for t in b) for b in mt.TorchBatches(batches(data_file, n_procs=0, epochs=2))]
    adapter = mt.TorchBatches(batches(data_file, epochs=2))
    got = list(adapter._gathered_on_device(CpuTensorOps))
    assert len(got) == len(plain)
    for mine, theirs in zip(got, plain):
        assert all(isinstance(m, torch.Tensor) and m.dtype == t.dtype and torch.equal(m, t) for m, t in zip(mine, theirs))
    adapter.close()


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: the refusal cannot be seen")
def test_without_cuda_a_cuda_device_is_refused_before_any_reader(data_file: Path, no_leaks: None) -> None:
    with pytest.raises(RuntimeError, match="needs CUDA"):
        mt.get_batches(multitables.Streamer(data_file), "/X", 64, n_procs=2, device="cuda")


@pytest.mark.parametrize(
    "device, error, match",
    [
        ("xpu", RuntimeError, r"device='xpu' cannot be used by this PyTorch"),
        ("meta", ValueError, "tensors without data"),
        ("cuda:99", RuntimeError, "needs CUDA" if not CUDA else "CUDA device"),
    ],
)
def test_a_device_this_pytorch_cannot_fill_is_refused_before_any_reader(
    data_file: Path, device: str, error: type, match: str, no_leaks: None
) -> None:
    """Not at the first batch, after the readers started (an ``mps`` on Linux failed there, as ``xpu`` did)."""
    if device == "xpu" and getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        pytest.skip("this machine has an XPU")
    stream = multitables.Streamer(data_file)
    with pytest.raises(error, match=match):
        mt.get_batches(stream, "/X", 64, n_procs=2, device=device)


def test_a_path_in_place_of_a_streamer_is_refused_saying_so(data_file: Path) -> None:
    with pytest.raises(TypeError, match=r"stream must be a multitables.Streamer \(for a file: Streamer\(path\)\), not str"):
        mt.get_batches(str(data_file), "/X", 64)


def test_pin_memory_takes_1_or_0_as_dataloader_does_and_refuses_a_string(data_file: Path) -> None:
    stream = multitables.Streamer(data_file)
    assert mt.get_batches(stream, "/X", 64, pin_memory=0).pin_memory is False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without CUDA, pin_memory=True warns (the test below)
        assert mt.get_batches(stream, "/X", 64, pin_memory=1).pin_memory is CUDA
    with pytest.raises(TypeError, match="pin_memory must be True or False .* not 'False'"):
        mt.get_batches(stream, "/X", 64, pin_memory="False")


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: the batches would be page-locked")
@pytest.mark.parametrize("shuffle", [True, False])
def test_without_cuda_pinned_memory_warns_and_gives_the_plain_batches(data_file: Path, shuffle: bool, no_leaks: None) -> None:
    # As DataLoader(pin_memory=True) without an accelerator: the code written for a GPU node runs, and says why
    # its tensors are not page-locked; the warning points at the caller's line.
    kw = dict(n_procs=2, block_size=100, window=4, seed=3, shuffle=shuffle)
    stream = multitables.Streamer(data_file)
    plain = list(mt.get_batches(stream, ["/X", "/y"], 64, **kw))
    with pytest.warns(UserWarning, match="pin_memory=True, but this PyTorch cannot use CUDA") as caught:
        pinned = mt.get_batches(stream, ["/X", "/y"], 64, pin_memory=True, **kw)
    assert [w.filename for w in caught] == [__file__]
    assert pinned.pin_memory is False
    got = list(pinned)
    assert len(got) == len(plain)
    for mine, theirs in zip(got, plain):
        for m, t in zip(mine, theirs):
            assert m.device.type == "cpu" and not m.is_pinned() and torch.equal(m, t)
    pinned.close()


@needs_cuda
@pytest.mark.parametrize("paths", ["/X", ["/X", "/y"]])
@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_on_the_gpu_are_the_rows_of_cpu_batches(data_file: Path, paths: "str | list[str]", shuffle: bool, no_leaks: None) -> None:
    kw = dict(n_procs=2, block_size=100, window=4, seed=1, shuffle=shuffle)
    stream = multitables.Streamer(data_file)
    plain = list(mt.get_batches(stream, paths, 64, **kw))
    gpu = mt.get_batches(stream, paths, 64, device="cuda", **kw)
    got = list(gpu)
    torch.cuda.synchronize()
    assert len(got) == len(plain)
    for mine, theirs in zip(got, plain):
        mine, theirs = (mine, theirs) if isinstance(mine, tuple) else ((mine,), (theirs,))
        for m, t in zip(mine, theirs):
            assert m.device.type == "cuda"
            assert torch.equal(m.cpu(), t)
    gpu.close()


@needs_cuda
def test_slots_copied_straight_to_the_gpu_across_breaks_restarts_and_new_rings(data_file: Path, no_leaks: None) -> None:
    """NOTE [slots on a device] on a GPU: the readers' slots page-locked in place, left mid-epoch, the queues
    closed and made again (their rings may be mapped where the last ones lay), a second adapter: every batch
    right, and CUDA reports no error after."""
    kw = dict(n_procs=2, block_size=100, window=4, seed=1)
    stream = multitables.Streamer(data_file)
    plain = [tuple(t.clone() for t in b) for b in mt.get_batches(stream, ["/X", "/y"], 64, epochs=2, **kw)]
    for _ in range(2):
        gpu = mt.get_batches(stream, ["/X", "/y"], 64, device="cuda", **kw)
        got = [tuple(t.cpu() for t in b) for _, b in zip(range(10), gpu)]  # left in window 1
        assert gpu._staging._slots, "the slots were not taken straight"
        gpu.batches.close()  # the readers go; the next iteration starts others, in other rings, at batch 10
        got += [tuple(t.cpu() for t in b) for b in gpu]
        gpu.set_epoch(1)
        got += [tuple(t.cpu() for t in b) for b in gpu]
        torch.cuda.synchronize()
        assert len(got) == len(plain)
        assert all(torch.equal(m, t) for mine, theirs in zip(got, plain) for m, t in zip(mine, theirs))
        gpu.close()
    torch.cuda.synchronize()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])  # on the CPU too, so CI runs it
def test_a_batch_on_the_gpu_is_the_callers_nothing_overwrites_it(data_file: Path, device: str, no_leaks: None) -> None:
    gpu = mt.get_batches(multitables.Streamer(data_file), "/y", 64, n_procs=2, block_size=100, device=device, epochs=None)
    per_epoch = -(-3000 // 64)  # endless batches have no len(): 46 of 64 rows and one of 56 an epoch
    kept = [b for _, b in zip(range(3 * per_epoch), gpu)]  # three epochs, every batch kept
    if device == "cuda":
        torch.cuda.synchronize()
    for epoch in range(3):
        rows = torch.cat([b.cpu() for b in kept[epoch * per_epoch : (epoch + 1) * per_epoch]])
        assert sorted(rows.tolist()) == list(range(3000))
    gpu.close()


@needs_cuda
def test_pinned_cpu_batches_and_a_mix_and_columns(data_file: Path, no_leaks: None) -> None:
    stream = multitables.Streamer(data_file)
    pinned = list(mt.get_batches(stream, ["/X", "/y"], 64, n_procs=2, block_size=100, pin_memory=True))
    assert all(t.is_pinned() and t.device.type == "cpu" for b in pinned for t in b)
    assert sorted(torch.cat([b[1] for b in pinned]).tolist()) == list(range(3000))
    cols = list(mt.get_batches(stream, "/t", 64, n_procs=2, block_size=100, fields=["a", "b"], device="cuda"))
    torch.cuda.synchronize()
    a = torch.cat([c["a"].cpu() for c in cols])
    b = torch.cat([c["b"].cpu() for c in cols])
    assert sorted(a.tolist()) == list(range(3000)) and torch.equal(b, 2.0 * a.double())
    one = stream.get_batches("/y", 64, n_procs=1, block_size=100, seed=1)
    two = stream.get_batches("/y", 64, n_procs=1, block_size=100, seed=2)
    mixed = mt.TorchBatches(multitables.mix_batches([one, two], [0.5, 0.5], steps=20), device="cuda")
    got = list(mixed)
    assert len(got) == 20 and all(t.device.type == "cuda" and t.shape == (64,) for t in got)
    mixed.close()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])  # on the CPU too, so CI runs it
def test_readers_bought_after_some_epochs_on_a_device_keep_every_batch(
    data_file: Path, device: str, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """NOTE [readers bought] where batches go to a device (on a GPU the staging holds the readers' slots, NOTE
    [slots on a device]): the epochs before the readers start, the one that starts them, and those after give the
    batches of ``n_procs=0``."""
    from multitables._plan import costs, readers as planner
    from multitables._stream.options import StreamOptions

    monkeypatch.setattr(planner, "available_cpus", lambda: 2)
    per_epoch = costs.MARGIN["measured"] * costs.start_cost("fork") / 2.5  # three epochs read here pay for readers
    monkeypatch.setattr(StreamOptions, "measure_rate", lambda self, node, engine: 3000 * 2 * 4 * (1 - 1 / 2) / per_epoch)
    stream, kw = multitables.Streamer(data_file), dict(block_size=100, window=4, seed=1)
    plain = mt.get_batches(stream, "/X", 64, n_procs=0, **kw)
    moved = mt.get_batches(stream, "/X", 64, device=device, **kw)
    procs = []
    for epoch in range(5):
        plain.set_epoch(epoch)
        moved.set_epoch(epoch)
        want = [b.clone() for b in plain]
        got = [b.cpu() for b in moved]
        procs.append(moved.batches.n_procs)
        assert len(got) == len(want) and all(torch.equal(m, t) for m, t in zip(got, want)), f"epoch {epoch}"
    assert procs == [[0], [0], [2], [2], [2]]
    moved.close()
    plain.close()


@pytest.mark.parametrize("leave", ["end", "break"])
def test_the_adapters_device_iteration_settles_its_copies_when_it_ends(data_file: Path, leave: str, no_leaks: None) -> None:
    """A host iteration may come next and write the window buffers again: the device's copies have all run by then,
    at the end of the device iteration (read to its end, or left and closed), not at the next device one."""
    ops = LateDevice()
    adapter = mt.TorchBatches(batches(data_file, epochs=2))
    it = adapter._gathered_on_device(lambda: ops)
    if leave == "end":
        list(it)
    else:  # left after the first epoch: the second's first window is being copied (NOTE [window pipelining])
        for _ in range(len(adapter.batches)):
            next(it)
        it.close()  # type: ignore[attr-defined]
    assert ops.queued == []
    host = [tuple(a.copy() for a in b) for b in adapter.batches]  # a copy left queued would fail here, in LateDevice
    assert host
    adapter.close()
