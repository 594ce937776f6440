"""A device staging's CUDA calls (``_train.cuda``): PyTorch's, or the runtime's own (NOTE [the runtime's own calls]).

Without CUDA, the runtime's calls are driven by a fake runtime that records
them; with it, the adapter's batches through either kind of calls are the
rows of CPU batches.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import h5py
import numpy as np
import pytest
from _forked import in_a_fork

torch = pytest.importorskip("torch")
mt = pytest.importorskip("multitables.torch")

import multitables  # noqa: E402
from multitables._train import cuda  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs CUDA: torch.cuda.is_available() is False on this machine")


class FakeRuntime:
    """The runtime's calls that :class:`cuda.Event` and :class:`cuda.RuntimeOps` make, recorded; events are numbered
    and belong to the device current where they were made."""

    def __init__(self, device: int = 0) -> None:
        self.device, self.calls, self.events, self.destroyed = device, [], {}, []
        self.pending: set = set()  # events whose work has not run

    def get_device(self, out: object) -> int:
        ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.device
        return 0

    def set_device(self, device: int) -> int:
        self.calls.append(("set_device", device))
        self.device = device
        return 0

    def event_create(self, out: object, flags: int) -> int:
        handle = 1000 + len(self.events)
        self.events[handle] = (self.device, flags)
        ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = handle
        return 0

    def event_destroy(self, handle: int) -> int:
        self.destroyed.append(handle)
        return 0

    def event_record(self, handle: int, stream: int) -> int:
        self.calls.append(("record", handle, stream))
        return 0

    def event_query(self, handle: int) -> int:
        return cuda._NOT_READY if handle in self.pending else 0

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> int:
        self.calls.append(("memcpy", dst, src, nbytes, kind, stream))
        return 0

    def stream_wait_event(self, stream: int, handle: int, flags: int) -> int:
        self.calls.append(("wait", stream, handle))
        return 0

    check = cuda.Runtime.check

    def _error(self, rc: int) -> bytes:
        return b"an error of the fake"


def test_an_event_is_made_on_the_stagings_device_and_the_current_one_kept() -> None:
    runtime = FakeRuntime(device=1)
    here = cuda.Event(runtime, cuda._BLOCKING, 1)  # type: ignore[arg-type]
    there = cuda.Event(runtime, cuda._NO_TIMING, 0)  # type: ignore[arg-type]
    assert runtime.events[here.handle] == (1, cuda._BLOCKING) and runtime.events[there.handle] == (0, cuda._NO_TIMING)
    assert runtime.calls == [("set_device", 0), ("set_device", 1)] and runtime.device == 1
    handles = [here.handle, there.handle]
    del here, there
    assert runtime.destroyed == handles


def test_a_forked_child_leaves_its_parents_events_alone() -> None:
    runtime = FakeRuntime()
    held = [cuda.Event(runtime, 0, 0)]  # type: ignore[arg-type]  # the one reference, dropped in the child
    handle = held[0].handle

    def drop() -> object:  # no call of a runtime the child may not have
        held.clear()
        return len(runtime.destroyed)

    assert in_a_fork(drop, seconds=20) == {"result": 0}
    held.clear()
    assert runtime.destroyed == [handle]


def test_a_failed_call_is_raised_with_the_runtimes_words() -> None:
    with pytest.raises(RuntimeError, match="cudaEventRecord failed: CUDA error 700, an error of the fake"):
        FakeRuntime().check(700, "cudaEventRecord")


def fake_ops(runtime: FakeRuntime) -> "cuda.RuntimeOps":
    """RuntimeOps over ``runtime``, with its streams numbered (no CUDA here: made without its __init__)."""
    ops = cuda.RuntimeOps.__new__(cuda.RuntimeOps)
    ops.device, ops._stream, ops._runtime, ops._ordinal, ops._raw = torch.device("cpu"), None, runtime, 0, 77
    ops._training_stream = lambda: 55
    return ops


def test_the_runtimes_copies_events_and_waits_go_where_pytorchs_did() -> None:
    runtime = FakeRuntime()
    ops = fake_ops(runtime)  # type: ignore[arg-type]
    src = np.arange(24, dtype=np.float32).reshape(6, 4)
    dst = torch.empty(10, 4)
    ops.copy(dst[2:8], src)
    assert runtime.calls.pop() == ("memcpy", dst[2:].data_ptr(), src.ctypes.data, src.nbytes, cuda._HOST_TO_DEVICE, 77)
    ops.copy(dst[0:0], src[:0])  # nothing to copy: no call
    with pytest.raises(RuntimeError, match="must match"):  # sizes that differ: PyTorch's copy, which refuses them
        ops.copy(dst[:3], src[:2])
    assert runtime.calls == []
    copied = ops.record()
    assert runtime.calls.pop() == ("record", copied.handle, 77) and runtime.events[copied.handle][1] == cuda._NO_TIMING | cuda._BLOCKING
    mark = ops.training_mark()
    assert runtime.calls.pop() == ("record", mark.handle, 55) and runtime.events[mark.handle][1] == cuda._NO_TIMING
    ops.device_wait(copied)
    ops.copies_after(mark)
    assert runtime.calls == [("wait", 55, copied.handle), ("wait", 77, mark.handle)]
    runtime.pending.add(copied.handle)
    assert not ops.done(copied) and ops.done(mark)


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    """``/X``: 2,000 rows of three float32 columns, zlib in chunks of 40 rows; ``/y``: their numbers, int32."""
    path = tmp_path / "rows.h5"
    i = np.arange(2000)
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=np.stack([i, 2 * i, -i], axis=1).astype("<f4"), chunks=(40, 3), compression="gzip")
        f.create_dataset("y", data=i.astype("<i4"), chunks=(80,))
    return path


@needs_cuda
@pytest.mark.parametrize("runtime", [True, False])
def test_shuffled_batches_on_the_gpu_through_either_calls_are_the_rows_of_cpu_batches(
        rows_file: Path, runtime: bool, monkeypatch: pytest.MonkeyPatch, no_leaks: None) -> None:
    if not runtime:
        monkeypatch.setattr(cuda, "_runtime_path", lambda: None)
    else:
        assert cuda._runtime_path() is not None, "no libcudart mapped: the runtime's own calls are not tried here"
    kw = dict(n_procs=2, block_size=80, window=3, seed=2, epochs=3)
    stream = multitables.Streamer(rows_file)
    plain = [tuple(t.clone() for t in b) for b in mt.get_batches(stream, ["/X", "/y"], 50, **kw)]
    gpu = mt.get_batches(stream, ["/X", "/y"], 50, device="cuda", **kw)
    got = [tuple(t.cpu() for t in b) for b in gpu]
    assert type(gpu._staging._ops) is (cuda.RuntimeOps if runtime else cuda.CudaOps)
    torch.cuda.synchronize()
    assert len(got) == len(plain)
    assert all(torch.equal(m, t) for mine, theirs in zip(got, plain) for m, t in zip(mine, theirs))
    gpu.close()


def test_the_runtime_taken_is_the_one_of_pytorchs_cuda_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    maps = tmp_path / "maps"
    lines = [
        "7f0000000000-7f0000001000 r-xp 00000000 fd:01 1 /opt/cupy/lib/libcudart.so.12.4.127",  # another library's
        "7f0000002000-7f0000003000 rw-p 00000000 00:00 0 ",  # anonymous: no path
        "7f0000004000-7f0000005000 r-xp 00000000 fd:01 2 /site/nvidia/cu13/lib/libcudart.so.13",
        "7f0000006000-7f0000007000 r-xp 00000000 fd:01 3 /usr/lib/libcudart.so.130.1",  # not version 13's name
    ]
    maps.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert cuda._runtime_path(str(maps)) == "/site/nvidia/cu13/lib/libcudart.so.13"
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert cuda._runtime_path(str(maps)) == "/opt/cupy/lib/libcudart.so.12.4.127"
    monkeypatch.setattr(torch.version, "cuda", "11.8")  # none of PyTorch's version: PyTorch's own calls
    assert cuda._runtime_path(str(maps)) is None
    monkeypatch.setattr(torch.version, "cuda", None)  # a PyTorch without CUDA
    assert cuda._runtime_path(str(maps)) is None
    assert cuda._runtime_path(str(tmp_path / "gone")) is None  # no /proc


def test_an_events_finalizer_is_quiet_where_the_runtime_is_gone() -> None:
    # At the interpreter's exit the library's functions may fail: the event has nothing left to free then.
    runtime = FakeRuntime()
    event = cuda.Event(runtime, 0, 0)  # type: ignore[arg-type]

    def gone(handle: int) -> int:
        raise OSError("the library is unloaded")

    runtime.event_destroy = gone  # type: ignore[method-assign]
    event.__del__()  # no error
