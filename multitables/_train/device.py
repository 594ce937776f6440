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
    tensor: the caller's); the window's order is on the device by then,
    copied on this stream by the copy thread that made it (made by the
    window's first batch, it cost that batch 0.23-0.27 ms on a lent H200;
    ``benchmarks/window_waits.py``), and a host buffer is written with another
    window's rows only after its copies are done (the CPU waits on their
    event then: :meth:`DeviceStaging.reusing`); the copies into a device
    buffer wait on the GPU for the training stream's gathers out of its
    last window (an event recorded when that window is closed: waiting for
    all the training stream had queued held the next window's copies, and
    their slots, behind the steps in flight). The GPU holds two window
    buffers per dataset (2 x 256 MiB by default). The device calls are ``_train.cuda``'s; the tests drive
    :class:`DeviceStaging` on the CPU with calls that run each copy late,
    at its wait, and fail where a copy's rows changed before it ran or a
    gather read rows not yet copied.

NOTE [slots on a device]
    With the copy into the window buffer, the consumer still spent 3.25 CPU-seconds a second for 3.0 GB/s of batches
    on a lent H100, 0.36 of the 8.5 GB/s that the readers put into the ring. The readers' slots are shared memory
    that the consumer maps too, so they are page-locked where they lie instead (``Queue.slot_memory``,
    ``cudaHostRegister``, once per queue: the queues live across epochs) and each piece goes to the device buffer
    straight out of its slots: the host copies nothing, and its work per piece is a copy's launch and an event. A
    slot is held (``DeviceStaging.take_slots``) until the event of its copy has passed: given back before, a reader
    could write the next block into it under the copy. Held slots are given back as their events pass, at the latest
    when half of a queue's slots are held (a ``get()`` waits while its caller holds them all; so queues started for
    this staging get twice the default's slots: on a lent H200, 16 readers delivered 0.86 of their stream's rate
    with the default's, 0.95 with twice as many, in ``benchmarks/device_ratio.py``'s rounds), and before the queues
    are rewound or closed (no held slot may outlast that): when an iteration is left or fails, and when one drops a
    carry. A carry's slots stay held through its epoch's start, as within an epoch: giving them all back when an
    epoch ended made the host wait there for the copy just queued. The slots are unlocked before their queue unmaps
    them, whichever way it closes (``Queue.at_close``), once the copies out of them are done. A dataset read in the
    consumer (no readers: its blocks are not in shared memory), rows of another dtype, or slots that cannot be
    locked go through the window buffer as above; a carry whose rows are on the device only is dropped by a host
    iteration (``Carry.good_for``), which reads that window again.
"""

from __future__ import annotations

import functools
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from .cuda import torch_dtype
from .windows import Order, Staging, Window

if TYPE_CHECKING:
    from .._stream.queue import Guard, Queue


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
        self._types = None if types is None else [(torch_dtype(np.dtype(d), p), tuple(s)) for (d, s), p in zip(types, paths)]
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
        host = torch.empty(array.shape, dtype=torch_dtype(array.dtype, ""), pin_memory=self._pin)
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


class DeviceWindow(Window):
    """A window's rows on the device; ``take`` gathers a run of them, in delivered order, on the training stream.

    ``closed(mark)``: told, at :meth:`close`, an event after its last gather.
    """

    def __init__(self, ops: Any, rows: "list[Any]", index: Any, n: int, closed: "Callable[[Any], None]") -> None:
        self._ops, self._rows, self._index, self._closed = ops, rows, index, closed
        self.rows = n

    def take(self, a: int, b: int, out: "list[Any]") -> None:
        for src, o in zip(self._rows, out):
            self._ops.gather(src, self._index[a:b], o)

    def close(self) -> None:
        if self._rows:
            self._rows = []
            self._closed(self._ops.training_mark())


class DeviceStaging(Staging):
    """Shuffled windows copied to a device as their pieces are pulled, and gathered there (NOTE [windows on a device]).

    ``ops``: the device's calls (``_train.cuda.cuda_ops``); ``types``: the delivered
    dtype and row shape of each path, for :meth:`alloc`. Owned by one
    adapter over one batches; :meth:`close` waits for the copies, unlocks
    the host buffers and the slots, and lets the device's go.
    """

    held = 0.5

    def __init__(self, ops: Any, types: "Sequence[tuple[np.dtype, tuple[int, ...]]]") -> None:
        self._ops, self._types = ops, [(np.dtype(d), tuple(s)) for d, s in types]
        self._host: "list[list[np.ndarray] | None]" = [None, None]  # each window buffer's arrays, page-locked
        self._device: "list[list[Any]]" = [[], []]  # their copies on the device
        self._shapes: "list[Any]" = [None, None]  # the shape and dtype of each path's window buffer, on the device
        self._copied = [0, 0]  # rows of each buffer's window on the device (or queued)
        self._done: "list[Any]" = [None, None]  # the event after each buffer's last copy
        self._gathered: "list[Any]" = [None, None]  # on the training stream, after the last gather out of each
        self._held: "deque[tuple[Any, list[Guard]]]" = deque()  # guards taken (take_slots), with their copies' event
        #: Queues' slots (NOTE [slots on a device]): address -> (the queue, whether they could be page-locked).
        self._slots: "dict[int, tuple[weakref.ref[Queue], bool]]" = {}
        # Dropped without close(): the host buffers are unlocked before they can be freed (the finalizer holds them).
        weakref.finalize(self, _unlock_all, ops, self._host, self._slots)

    def alloc(self, n: int) -> "list[Any]":
        """Device arrays for a batch of ``n`` rows (``Batches.iter_into``'s ``alloc``)."""
        return [self._ops.empty((n,) + shape, dtype) for dtype, shape in self._types]

    def reusing(self, buffer: int, arrays: "list[np.ndarray]") -> None:
        if self._done[buffer] is not None:
            self._ops.host_wait(self._done[buffer])  # the copies out of these rows have run
        self._copied[buffer] = 0

    def pulled(self, buffer: int, arrays: "list[np.ndarray]", a: int, b: int) -> None:
        self._bind(buffer, arrays, lock=True)
        self._queue_copies(buffer, [host[a:b] for host in arrays], a, b)

    def take_slots(self, buffer: int, arrays: "list[np.ndarray]", queues: "Sequence[Queue]", guards: "list[Guard]",
                   a: int, b: int) -> bool:
        blocks = [guard.block for guard in guards]
        direct = [self._slots_locked(queue) and block.dtype == host.dtype and block.shape[1:] == host.shape[1:]
                  and block.flags.c_contiguous for queue, block, host in zip(queues, blocks, arrays)]
        if not any(direct):
            return False
        self._bind(buffer, arrays, lock=not all(direct))
        sources, held = [], []
        for took, guard, block, host in zip(direct, guards, blocks, arrays):
            if took:
                sources.append(block)
                held.append(guard)
            else:  # a dataset read in this process, say: through its window buffer, as pulled() takes it
                np.copyto(host[a:b], block, casting="unsafe")
                guard.release()
                sources.append(host[a:b])
        self._queue_copies(buffer, sources, a, b)
        self._held.append((self._done[buffer], held))
        # A get() waits while this thread's guards hold every slot: keep at most half of the fewest slots.
        self._give_back(int(min(queue.read_ahead for queue in queues) * self.held))
        return True

    def let_go(self) -> None:
        self._give_back(0)

    def order(self, buffer: int, perm: "np.ndarray | None") -> Order:
        """The window's order on the device already, copied from the copy thread that made ``perm``."""
        return Order(perm) if perm is None else Order(perm, self._ops.index_ahead(perm, buffer), self)

    def window(self, buffer: int, arrays: "list[np.ndarray]", rows: int, order: Order) -> Window:
        if not rows:  # nothing to gather (nor, maybe, anything copied)
            return DeviceWindow(self._ops, [], None, 0, lambda mark: None)
        assert self._copied[buffer] >= rows, (self._copied[buffer], rows)
        self._ops.device_wait(self._done[buffer])
        if order.by is self:  # copied ahead (a carry's order made by another staging is not)
            index = order.prepared[0]
            self._ops.ordered(*order.prepared)
        else:
            index = self._ops.index(np.arange(rows) if order.perm is None else order.perm, buffer)
        return DeviceWindow(self._ops, [d[:rows] for d in self._device[buffer]], index, rows,
                            functools.partial(self._gathered.__setitem__, buffer))

    def settle(self) -> None:
        """Return once every copy queued has run, and no slot is held (an iteration's end: another may write the
        buffers next, or rewind the queues)."""
        for event in self._done:
            if event is not None:
                self._ops.host_wait(event)
        self.let_go()

    def close(self) -> None:
        """Wait for the copies, unlock the host buffers and the slots, drop the device's (idempotent)."""
        self.let_go()
        for buffer in range(2):
            self._unbind(buffer)
        _unlock_slots(self._ops, self._slots)

    def _queue_copies(self, buffer: int, sources: "list[np.ndarray]", a: int, b: int) -> None:
        """Copy ``sources`` (page-locked, one per path) to rows ``a .. b - 1`` of ``buffer``'s device copy."""
        if a == 0 and self._gathered[buffer] is not None:  # the device buffer's last window's gathers first
            self._ops.copies_after(self._gathered[buffer])
            self._gathered[buffer] = None
        assert a == 0 or a == self._copied[buffer], (a, self._copied[buffer])
        for source, dev in zip(sources, self._device[buffer]):
            self._ops.copy(dev[a:b], source)
        self._copied[buffer] = b
        self._done[buffer] = self._ops.record()

    def _give_back(self, keep: int) -> None:
        """Release the guards whose copies have run, and wait for the oldest until at most ``keep`` are held."""
        while self._held and (len(self._held) > keep or self._ops.done(self._held[0][0])):
            event, guards = self._held[0]
            self._ops.host_wait(event)
            self._held.popleft()
            for guard in guards:
                guard.release()

    def _slots_locked(self, queue: "Queue") -> bool:
        """Whether ``queue``'s slots are page-locked: made so the first time (False where they cannot be)."""
        for ref, locked in self._slots.values():  # a piece at a time: asked once per queue, not per piece
            if ref() is queue:
                return locked
        memory = queue.slot_memory()
        if memory is None:  # read in this process: a block is ordinary memory
            return False
        address, nbytes = memory
        try:
            self._ops.lock_memory(address, nbytes, "a queue's slots")
        except RuntimeError:  # (no room to lock them, say): the blocks are copied into the window buffers
            self._slots[address] = (weakref.ref(queue), False)
            return False
        self._slots[address] = (weakref.ref(queue), True)
        # Unlocked before the queue unmaps them, once the copies out of them ran (and at close()).
        queue.at_close(functools.partial(_unlock_slots, self._ops, self._slots, address))
        return True

    def _bind(self, buffer: int, arrays: "list[np.ndarray]", lock: bool) -> None:
        """Give window buffer ``buffer`` (``arrays``) a device copy of its shape; ``lock``: rows are copied out of
        ``arrays`` (not out of slots), which are page-locked first."""
        shapes = [(host.shape, host.dtype) for host in arrays]
        if self._shapes[buffer] != shapes:
            self._unbind(buffer)
            self._device[buffer] = [self._ops.window(shape, dtype) for shape, dtype in shapes]
            self._shapes[buffer] = shapes
        bound = self._host[buffer]
        if not lock or (bound is not None and len(bound) == len(arrays) and all(x is y for x, y in zip(bound, arrays))):
            return
        self._unlock_host(buffer)
        locked: "list[np.ndarray]" = []
        try:
            for host in arrays:
                self._ops.lock(host)
                locked.append(host)
        except BaseException:
            for host in locked:
                self._ops.unlock(host)
            raise
        self._host[buffer] = locked

    def _unlock_host(self, buffer: int) -> None:
        if self._done[buffer] is not None:
            self._ops.host_wait(self._done[buffer])
        for host in self._host[buffer] or ():
            self._ops.unlock(host)
        self._host[buffer] = None

    def _unbind(self, buffer: int) -> None:
        self._unlock_host(buffer)
        self._device[buffer], self._shapes[buffer], self._copied[buffer], self._done[buffer] = [], None, 0, None


def _unlock_all(ops: Any, hosts: "list[list[np.ndarray] | None]", slots: "dict[int, Any]") -> None:
    for arrays in hosts:
        for host in arrays or ():
            ops.unlock(host)
    hosts[:] = [None] * len(hosts)
    _unlock_slots(ops, slots)


def _unlock_slots(ops: Any, slots: "dict[int, Any]", address: "int | None" = None) -> None:
    """Unlock the slots at ``address`` (None: all) once the copies queued out of them have run."""
    addresses = [a for a in slots if address is None or a == address]
    if any(slots[a][1] for a in addresses):
        ops.drain()
    for a in addresses:
        if slots.pop(a)[1]:
            ops.unlock_memory(a)
