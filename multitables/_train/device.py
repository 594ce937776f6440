"""Training batches delivered in page-locked memory or on a GPU, for the PyTorch adapter (NOTE [batches on a device]).

Imported by :mod:`multitables.torch` only: it needs PyTorch.

NOTE [batches on a device]
    Measured on a lent machine with an H200 (issue 30): ``torch.from_numpy(
    batch).to("cuda")`` moves 4.0-4.3 GB/s, since a pageable array is copied
    through a bounce buffer and the copy waits; from page-locked memory the
    copy runs at 47-53 GB/s and, with ``non_blocking=True`` on a stream of
    its own, leaves the training stream free. So with ``pin_memory=True``,
    and with ``device=`` unshuffled (shuffled: NOTE [windows on a device]),
    each batch's rows are gathered straight into page-locked memory
    (``Batches.iter_into``: the one copy out of a window buffer or a slot
    that every batch takes, made into PyTorch's caching
    host allocator's blocks instead of fresh pages), and for a GPU copied on
    this adapter's stream. The training stream waits for that copy on the
    GPU (``wait_stream``), never the CPU; the device tensor is marked as used
    by the training stream (``record_stream``), and PyTorch's host allocator
    keeps the page-locked block until the copy is done (it records the copy's
    event), so neither block is reused under a copy or a step. A batch on
    the device is a new tensor: the caller's. The slots and window buffers
    are given back as soon as their rows are gathered, as for CPU batches.
    A mix's batches are made of its sources' (per row: joined), so they are
    copied once more, into page-locked memory, before they go.

NOTE [windows on a device]
    Shuffled batches for a GPU take another way (:class:`DeviceStaging`, a
    staging of NOTE [staging] in ``_train.windows``). On a lent H100 the
    consumer was the limit of shuffled batches: each row was copied twice
    on the host, out of its slot into the window buffer and out of the
    window into the batch, at 3-4 GB/s together, while 16 readers decoded
    9-12 GB/s. Here the host copies a row once, into the window buffer;
    the gather runs on the GPU. The two window buffers are page-locked
    where they lie (``cudaHostRegister``, once per buffer, undone at
    :meth:`DeviceStaging.close`); each piece of a window is copied to a
    device buffer of the same size on this staging's stream as soon as it
    is pulled, with ``non_blocking=True``, and an event recorded after it.
    The training stream waits for a window's last event on the GPU before
    its first gather (``index_select`` out of the device buffer, into a new
    tensor: the caller's), and a host buffer is written with another
    window's rows only after its copies are done (the CPU waits on their
    event then: :meth:`DeviceStaging.reusing`); the copies into a device
    buffer wait on the GPU for the training stream's gathers out of its
    last window. The GPU holds two window buffers per dataset (2 x 256 MiB
    by default). The device calls are :class:`CudaOps`'; the tests drive
    :class:`DeviceStaging` on the CPU with calls that run each copy late,
    at its wait, and fail where a copy's rows changed before it ran or a
    gather read rows not yet copied.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np
import torch

from .windows import Staging, Window


def _torch_dtype(dtype: np.dtype, path: str) -> torch.dtype:
    if not dtype.isnative:
        raise TypeError(
            f"rows of {path!r} are stored in non-native byte order ({dtype}); device= and pin_memory= need "
            f"native rows: leave them out (the batches are then converted on the CPU)"
        )
    try:
        return torch.from_numpy(np.empty(0, dtype)).dtype
    except TypeError as exc:
        raise TypeError(f"rows of {path!r} have dtype {dtype}, which PyTorch cannot hold in a tensor") from exc


class Delivery:
    """Where the adapter's batches go: page-locked CPU tensors, or a device through them.

    ``types``: each path's delivered dtype and row shape, for the page-locked
    arrays that batches are gathered into (None: the batches come made, from
    a mix, and are copied into page-locked memory).
    """

    def __init__(self, device: "torch.device | None", pin_memory: bool, types: "Sequence[tuple[np.dtype, tuple[int, ...]]] | None",
                 paths: Sequence[str]) -> None:
        self.device = device
        self._on_gpu = device is not None and device.type == "cuda"
        self._pin = pin_memory or self._on_gpu
        self._types = None if types is None else [(_torch_dtype(np.dtype(d), p), tuple(s)) for (d, s), p in zip(types, paths)]
        self._stream = torch.cuda.Stream(device=device) if self._on_gpu else None
        self._current: "list[torch.Tensor]" = []  # the page-locked tensors of the batch being gathered

    def alloc(self, n: int) -> "list[np.ndarray]":
        """Page-locked arrays for a batch of ``n`` rows (``Batches.iter_into``'s ``alloc``)."""
        assert self._types is not None
        self._current = [torch.empty((n,) + shape, dtype=dtype, pin_memory=self._pin) for dtype, shape in self._types]
        return [t.numpy() for t in self._current]

    def send(self, batch: Any, gathered: bool) -> Any:
        """``batch`` (an array, a tuple of them or a dict of columns) as tensors where they go.

        ``gathered``: its arrays are those of the last :meth:`alloc` (or their first rows).
        """
        if isinstance(batch, dict):  # columns, copied out of the gathered rows: page-locked afresh
            return {name: self._go(self._locked(a)) for name, a in batch.items()}
        arrays = [batch] if isinstance(batch, np.ndarray) else list(batch)
        if gathered:
            hosts = [t[: len(a)] for t, a in zip(self._current, arrays)]
        else:
            hosts = [self._locked(a) for a in arrays]
        self._current = []
        out = [self._go(h) for h in hosts]
        return out[0] if isinstance(batch, np.ndarray) else tuple(out)

    def _locked(self, array: np.ndarray) -> torch.Tensor:
        host = torch.empty(array.shape, dtype=_torch_dtype(array.dtype, ""), pin_memory=self._pin)
        host.numpy()[...] = array
        return host

    def _go(self, host: torch.Tensor) -> torch.Tensor:
        if self.device is None or self.device.type == "cpu":
            return host
        if self._stream is None:  # another accelerator: its own copy, as PyTorch does it
            return host.to(self.device, non_blocking=self._pin)
        with torch.cuda.stream(self._stream):
            moved = host.to(self.device, non_blocking=True)
        training = torch.cuda.current_stream(self.device)
        training.wait_stream(self._stream)
        moved.record_stream(training)
        return moved


#: ``cudaHostRegisterPortable``: the memory is page-locked for every CUDA context, whichever device is current.
_PORTABLE = 1


class CudaOps:
    """The CUDA calls of a :class:`DeviceStaging` (NOTE [windows on a device]): page-locking in place, copies on a
    stream of their own, events, and the gather."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream = torch.cuda.Stream(device=device)
        self._cudart = torch.cuda.cudart()

    def lock(self, array: np.ndarray) -> None:
        """Page-lock ``array``'s memory where it lies, until :meth:`unlock` (for every device: "portable")."""
        if array.nbytes:
            try:
                torch.cuda.check_error(self._cudart.cudaHostRegister(array.ctypes.data, array.nbytes, _PORTABLE))
            except torch.cuda.CudaError as exc:
                raise RuntimeError(f"device={str(self.device)!r}: a shuffle window's buffer ({array.nbytes:,} bytes) "
                                   f"could not be page-locked in place (cudaHostRegister: {exc})") from exc

    def unlock(self, array: np.ndarray) -> None:
        if array.nbytes:
            self._cudart.cudaHostUnregister(array.ctypes.data)

    def empty(self, shape: "tuple[int, ...]", dtype: np.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=_torch_dtype(np.dtype(dtype), ""), device=self.device)

    def window(self, shape: "tuple[int, ...]", dtype: np.dtype) -> torch.Tensor:
        """A window buffer's copy on the device."""
        try:
            return self.empty(shape, dtype)
        except torch.cuda.OutOfMemoryError as exc:
            raise torch.cuda.OutOfMemoryError(
                f"the shuffle window's copy on {self.device} ({int(np.prod(shape)) * np.dtype(dtype).itemsize:,} bytes, "
                f"two per dataset: NOTE [windows on a device]) does not fit; give get_batches a smaller window=. {exc}"
            ) from exc

    def copy(self, dst: torch.Tensor, src: np.ndarray) -> None:
        """``dst[...] = src``, queued on this staging's stream (``src`` page-locked: the CPU does not wait)."""
        with torch.cuda.stream(self._stream):
            dst.copy_(torch.from_numpy(src), non_blocking=True)

    def record(self) -> Any:
        """An event after the copies queued so far."""
        event = torch.cuda.Event()
        event.record(self._stream)
        return event

    def host_wait(self, event: Any) -> None:
        event.synchronize()

    def device_wait(self, event: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)

    def after_training(self) -> None:
        """Copies queued from now on run after what the training stream has queued so far."""
        self._stream.wait_stream(torch.cuda.current_stream(self.device))

    def index(self, perm: np.ndarray) -> torch.Tensor:
        # Through page-locked memory: from pageable memory the copy would first wait for the training stream (on the
        # CPU, where the tests run these calls, the array itself).
        host = torch.from_numpy(np.ascontiguousarray(perm, dtype=np.int64))
        return host.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else host

    def gather(self, src: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
        torch.index_select(src, 0, index, out=out)


class DeviceWindow(Window):
    """A window's rows on the device; ``take`` gathers a run of them, in delivered order, on the training stream."""

    def __init__(self, ops: Any, rows: "list[Any]", index: Any, n: int) -> None:
        self._ops, self._rows, self._index = ops, rows, index
        self.rows = n

    def take(self, a: int, b: int, out: "list[Any]") -> None:
        for src, o in zip(self._rows, out):
            self._ops.gather(src, self._index[a:b], o)


class DeviceStaging(Staging):
    """Shuffled windows copied to a device as their pieces are pulled, and gathered there (NOTE [windows on a device]).

    ``ops``: the device's calls (:class:`CudaOps`); ``types``: the delivered
    dtype and row shape of each path, for :meth:`alloc`. Owned by one
    adapter over one batches; :meth:`close` waits for the copies, unlocks
    the host buffers and lets the device's go.
    """

    def __init__(self, ops: Any, types: "Sequence[tuple[np.dtype, tuple[int, ...]]]") -> None:
        self._ops, self._types = ops, [(np.dtype(d), tuple(s)) for d, s in types]
        self._host: "list[list[np.ndarray] | None]" = [None, None]  # each window buffer's arrays, page-locked
        self._device: "list[list[Any]]" = [[], []]  # their copies on the device
        self._copied = [0, 0]  # rows of each buffer's window on the device (or queued)
        self._done: "list[Any]" = [None, None]  # the event after each buffer's last copy
        # Dropped without close(): the host buffers are unlocked before they can be freed (the finalizer holds them).
        weakref.finalize(self, _unlock_all, ops, self._host)

    def alloc(self, n: int) -> "list[Any]":
        """Device arrays for a batch of ``n`` rows (``Batches.iter_into``'s ``alloc``)."""
        return [self._ops.empty((n,) + shape, dtype) for dtype, shape in self._types]

    def reusing(self, buffer: int, arrays: "list[np.ndarray]") -> None:
        if self._done[buffer] is not None:
            self._ops.host_wait(self._done[buffer])  # the copies out of these rows have run
        self._copied[buffer] = 0

    def pulled(self, buffer: int, arrays: "list[np.ndarray]", a: int, b: int) -> None:
        self._bind(buffer, arrays)
        if a == 0:  # the device buffer's last window may still be gathered from: after that
            self._ops.after_training()
        assert a == 0 or a == self._copied[buffer], (a, self._copied[buffer])
        for host, dev in zip(arrays, self._device[buffer]):
            self._ops.copy(dev[a:b], host[a:b])
        self._copied[buffer] = b
        self._done[buffer] = self._ops.record()

    def window(self, buffer: int, arrays: "list[np.ndarray]", rows: int, perm: "np.ndarray | None") -> Window:
        if not rows:  # nothing to gather (nor, maybe, anything copied)
            return DeviceWindow(self._ops, [], None, 0)
        assert self._copied[buffer] >= rows, (self._copied[buffer], rows)
        self._ops.device_wait(self._done[buffer])
        index = self._ops.index(np.arange(rows) if perm is None else perm)
        return DeviceWindow(self._ops, [d[:rows] for d in self._device[buffer]], index, rows)

    def settle(self) -> None:
        """Return once every copy queued has run (an iteration's end: another may write the buffers next)."""
        for event in self._done:
            if event is not None:
                self._ops.host_wait(event)

    def close(self) -> None:
        """Wait for the copies, unlock the host buffers, drop the device's (idempotent)."""
        for buffer in range(2):
            self._unbind(buffer)

    def _bind(self, buffer: int, arrays: "list[np.ndarray]") -> None:
        bound = self._host[buffer]
        if bound is not None and len(bound) == len(arrays) and all(x is y for x, y in zip(bound, arrays)):
            return
        self._unbind(buffer)
        locked: "list[np.ndarray]" = []
        try:
            for host in arrays:
                self._ops.lock(host)
                locked.append(host)
            self._device[buffer] = [self._ops.window(host.shape, host.dtype) for host in arrays]
        except BaseException:
            for host in locked:
                self._ops.unlock(host)
            raise
        self._host[buffer] = list(arrays)

    def _unbind(self, buffer: int) -> None:
        if self._done[buffer] is not None:
            self._ops.host_wait(self._done[buffer])
        for host in self._host[buffer] or ():
            self._ops.unlock(host)
        self._host[buffer], self._device[buffer], self._copied[buffer], self._done[buffer] = None, [], 0, None


def _unlock_all(ops: Any, hosts: "list[list[np.ndarray] | None]") -> None:
    for arrays in hosts:
        for host in arrays or ():
            ops.unlock(host)
    hosts[:] = [None] * len(hosts)
