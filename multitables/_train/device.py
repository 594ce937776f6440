"""Training batches delivered in page-locked memory or on a GPU, for the PyTorch adapter (NOTE [batches on a device]).

Imported by :mod:`multitables.torch` only: it needs PyTorch.

NOTE [batches on a device]
    Measured on a lent machine with an H200 (issue 30): ``torch.from_numpy(
    batch).to("cuda")`` moves 4.0-4.3 GB/s, since a pageable array is copied
    through a bounce buffer and the copy waits; from page-locked memory the
    copy runs at 47-53 GB/s and, with ``non_blocking=True`` on a stream of
    its own, leaves the training stream free. So with ``device=`` or
    ``pin_memory=True`` each batch's rows are gathered straight into
    page-locked memory (``Batches.iter_into``: the one copy out of a window
    buffer or a slot that every batch takes, made into PyTorch's caching
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
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch


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
