"""The CUDA calls of a device staging (``_train.device.DeviceStaging``): page-locking in place, copies on a stream of
its own, events, and the gather.

Imported by ``_train.device`` only: it needs PyTorch.

NOTE [the runtime's own calls]
    On a lent H200 (thirty-ninth session, ``benchmarks/window_waits.py``) the
    calls the staging makes through PyTorch cost the consumer tens of
    microseconds each: a piece's copy queued on the staging's stream
    (``Tensor.copy_`` in a ``torch.cuda.stream`` block) 0.05-0.06 ms, an event
    after it 0.01 ms, at a window's start an event after the last window's
    gathers 0.04 ms and the training stream's waits for the window's copies
    and order 0.05-0.07 ms: a third of a batch's 0.27 ms in mid-epoch, and most
    of what a window's first batch adds. What they do is one call of the CUDA
    runtime each, of a microsecond or two. So where the runtime that PyTorch
    loaded is a library of its own in this process (a ``libcudart`` of
    ``torch.version.cuda``'s major version, mapped),
    :class:`RuntimeOps` makes those calls there, through ctypes, on the same
    streams (PyTorch's training stream, this staging's), with events of its
    own (:class:`Event`: destroyed with the last reference to it, in the
    process that made it; made on the staging's device). The GIL is kept
    through the calls that return at once and let go through the one that
    waits (an event's synchronize). The index's ``record_stream`` (PyTorch's
    allocator keeps its memory until the training stream's gathers ran), the
    index's copy (into memory of that allocator) and the gather stay
    PyTorch's. Where no such library is mapped (a PyTorch that links the
    runtime in), :class:`CudaOps` makes them through PyTorch, as before.
    On the H200 with them (a later call, BENCHMARKS.md): a piece's copy
    0.018-0.022 ms, an event 0.012, the training stream's wait 0.011, the
    event after a window's gathers 0.012-0.014; a batch in mid-epoch came in
    0.19 ms against 0.27. ``ordered`` took 0.09 ms against 0.03 (its wait
    0.011, ``record_stream`` 0.010, the rest not placed).
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from typing import Any

import numpy as np
import torch

#: ``cudaHostRegisterPortable``: the memory is page-locked for every CUDA context, whichever device is current.
_PORTABLE = 1


def torch_dtype(dtype: np.dtype, path: str) -> torch.dtype:
    """The tensors' dtype for rows of ``dtype`` (of ``path``, for the error): ``TypeError`` where their byte order is
    not native, or PyTorch has no such dtype."""
    if not dtype.isnative:
        raise TypeError(
            f"rows of {path!r} are stored in non-native byte order ({dtype}); device= and pin_memory= need "
            f"native rows: leave them out (the batches are then converted on the CPU)"
        )
    try:
        return torch.from_numpy(np.empty(0, dtype)).dtype
    except TypeError as exc:
        raise TypeError(f"rows of {path!r} have dtype {dtype}, which PyTorch cannot hold in a tensor") from exc


class CudaOps:
    """The CUDA calls of a device staging (NOTE [windows on a device] in ``_train.device``), through PyTorch."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream = torch.cuda.Stream(device=device)
        self._cudart = torch.cuda.cudart()
        #: Per window buffer, and whether copied ahead: a page-locked index, and its last copy's event.
        self._index: "dict[tuple[int, bool], tuple[torch.Tensor, Any]]" = {}
        self._indexing = threading.Lock()

    def lock(self, array: np.ndarray) -> None:
        """Page-lock ``array``'s memory where it lies, until :meth:`unlock` (for every device: "portable")."""
        if array.nbytes:
            self.lock_memory(array.ctypes.data, array.nbytes, "a shuffle window's buffer")

    def unlock(self, array: np.ndarray) -> None:
        if array.nbytes:
            self.unlock_memory(array.ctypes.data)

    def lock_memory(self, address: int, nbytes: int, what: str) -> None:
        """Page-lock ``nbytes`` bytes at ``address`` where they lie, until :meth:`unlock_memory`; ``what`` they are, for
        the error."""
        try:
            torch.cuda.check_error(self._cudart.cudaHostRegister(address, nbytes, _PORTABLE))
        except torch.cuda.CudaError as exc:
            raise RuntimeError(f"device={str(self.device)!r}: {what} ({nbytes:,} bytes) could not be page-locked in "
                               f"place (cudaHostRegister: {exc})") from exc

    def unlock_memory(self, address: int) -> None:
        self._cudart.cudaHostUnregister(address)

    def done(self, event: Any) -> bool:
        """Whether the copies before ``event`` have run (the CPU does not wait)."""
        return bool(event.query())

    def drain(self) -> None:
        """Return once every copy queued on this staging's stream has run."""
        self._stream.synchronize()

    def empty(self, shape: "tuple[int, ...]", dtype: np.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=torch_dtype(np.dtype(dtype), ""), device=self.device)

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
        """An event after the copies queued so far (a CPU waiting for it sleeps: the readers need the cores)."""
        return self._event_on(self._stream, blocking=True)

    def host_wait(self, event: Any) -> None:
        self._synchronize(event)

    def device_wait(self, event: Any) -> None:
        self._training_waits(event)

    def training_mark(self) -> Any:
        """An event after what the training stream has queued so far."""
        return self._event_on(torch.cuda.current_stream(self.device), blocking=False)

    def copies_after(self, event: Any) -> None:
        """Copies queued from now on run after ``event`` (on the GPU: the CPU does not wait)."""
        self._stream.wait_event(event)

    def _event_on(self, stream: Any, blocking: bool) -> Any:
        """An event recorded on ``stream`` (``blocking``: a CPU waiting for it sleeps)."""
        event = torch.cuda.Event(blocking=blocking)
        event.record(stream)
        return event

    # What the calls above share, made under names of their own (the scripts that time the calls above time each once).
    def _synchronize(self, event: Any) -> None:
        event.synchronize()

    def _training_waits(self, event: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)

    def index(self, perm: np.ndarray, buffer: int) -> torch.Tensor:
        """``perm`` on the device, for the gathers out of window buffer ``buffer``, copied on the training stream.

        Through page-locked memory, kept per buffer: from pageable memory the copy would first wait for the training
        stream, and a fresh page-locked array (``pin_memory()``) cost 6.5 ms a window on the lent H200. On the CPU
        (where the tests run these calls): the array itself."""
        return self._copied_index(perm, buffer, ahead=False)[0]

    def index_ahead(self, perm: np.ndarray, buffer: int) -> "tuple[torch.Tensor, Any]":
        """As :meth:`index`, from any thread, before the window is delivered: copied on this staging's stream; the
        index, and the event after its copy, for :meth:`ordered`."""
        return self._copied_index(perm, buffer, ahead=True)

    def ordered(self, index: torch.Tensor, copied: Any) -> None:
        """The training stream waits for :meth:`index_ahead`'s copy (on the GPU), and is its user: the index's
        memory, made on this staging's stream, is not reused before the training stream's gathers out of it ran."""
        if copied is None:  # on the CPU
            return
        self._training_waits(copied)
        index.record_stream(torch.cuda.current_stream(self.device))

    def _copied_index(self, perm: np.ndarray, buffer: int, ahead: bool) -> "tuple[torch.Tensor, Any]":
        perm = np.ascontiguousarray(perm, dtype=np.int64)
        if self.device.type != "cuda":
            return torch.from_numpy(perm), None
        stream = self._stream if ahead else torch.cuda.current_stream(self.device)
        with self._indexing:  # copy threads: an abandoned iteration's order, a new one's, for one buffer
            host, copied = self._index.get((buffer, ahead), (None, None))
            if copied is not None:
                self._synchronize(copied)  # the last copy out of it has run (a window ago: long done)
            if host is None or len(host) < len(perm):
                host = torch.empty(len(perm), dtype=torch.int64, pin_memory=True)
            host[: len(perm)].numpy()[...] = perm
            with torch.cuda.stream(stream):
                on_device = host[: len(perm)].to(self.device, non_blocking=True)
            copied = self._event_on(stream, blocking=True)
            self._index[buffer, ahead] = (host, copied)
        return on_device, copied

    def gather(self, src: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
        torch.index_select(src, 0, index, out=out)


def cuda_ops(device: torch.device) -> CudaOps:
    """The staging's CUDA calls for ``device``: the runtime's own where PyTorch's is a library of this process (NOTE
    [the runtime's own calls]), else PyTorch's."""
    path = _runtime_path()
    return CudaOps(device) if path is None else RuntimeOps(device, Runtime.at(path))


def _runtime_path(maps: str = "/proc/self/maps") -> "str | None":
    """The file of the CUDA runtime library of PyTorch's CUDA version that this process mapped, or None: none mapped
    (a PyTorch that links it in), no ``/proc``, or none of that version (another library's runtime, not PyTorch's)."""
    major = (torch.version.cuda or "").split(".")[0]
    if not major.isdigit():
        return None
    name = re.compile(rf"libcudart\.so\.{major}(\.|$)")  # libcudart.so.13, or a file it links to: libcudart.so.13.0.96
    try:
        with open(maps) as lines:
            for line in lines:
                fields = line.rstrip("\n").split(maxsplit=5)
                if len(fields) == 6 and name.match(os.path.basename(fields[5])):
                    return fields[5]
    except OSError:
        pass
    return None


#: ``cudaEventBlockingSync`` (a CPU waiting for the event sleeps) and ``cudaEventDisableTiming``.
_BLOCKING, _NO_TIMING = 0x01, 0x02
_NOT_READY = 600  # cudaErrorNotReady: the event's work has not run yet
_HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice


class Runtime:
    """The CUDA runtime's calls that :class:`RuntimeOps` makes, bound in the library at ``path`` (one per path)."""

    _bound: "dict[str, Runtime]" = {}

    @classmethod
    def at(cls, path: str) -> "Runtime":
        if path not in cls._bound:
            cls._bound[path] = cls(path)
        return cls._bound[path]

    def __init__(self, path: str) -> None:
        quick, waits = ctypes.PyDLL(path), ctypes.CDLL(path)  # the GIL kept through a call, or let go (one that waits)
        vp, i, u = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        self.memcpy_async = _bind(quick.cudaMemcpyAsync, vp, vp, ctypes.c_size_t, i, vp)
        self.event_create = _bind(quick.cudaEventCreateWithFlags, ctypes.POINTER(vp), u)
        self.event_record = _bind(quick.cudaEventRecord, vp, vp)
        self.event_query = _bind(quick.cudaEventQuery, vp)
        self.event_destroy = _bind(quick.cudaEventDestroy, vp)
        self.event_synchronize = _bind(waits.cudaEventSynchronize, vp)
        self.stream_wait_event = _bind(quick.cudaStreamWaitEvent, vp, vp, u)
        self.get_device = _bind(quick.cudaGetDevice, ctypes.POINTER(i))
        self.set_device = _bind(quick.cudaSetDevice, i)
        self._error = quick.cudaGetErrorString
        self._error.argtypes, self._error.restype = [i], ctypes.c_char_p

    def check(self, rc: int, call: str) -> None:
        """Raise ``RuntimeError`` for a failed call (``rc``: its error code)."""
        if rc:
            raise RuntimeError(f"{call} failed: CUDA error {rc}, {self._error(rc).decode(errors='replace')}")


def _bind(fn: Any, *argtypes: Any) -> Any:
    fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
    return fn


_getpid = os.getpid  # kept here: a finalizer at the interpreter's exit may find the os module's names gone


class Event:
    """A CUDA event of the runtime's own, made on device ``ordinal`` (``flags``: ``cudaEventCreateWithFlags``'),
    destroyed with the last reference to it in the process that made it (a forked child leaves it alone)."""

    __slots__ = ("handle", "_runtime", "_pid")

    def __init__(self, runtime: Runtime, flags: int, ordinal: int) -> None:
        self.handle, self._runtime, self._pid = None, runtime, os.getpid()
        handle, current = ctypes.c_void_p(), ctypes.c_int()
        runtime.check(runtime.get_device(ctypes.byref(current)), "cudaGetDevice")
        if current.value != ordinal:  # an event belongs to the device current where it is made: the stream's
            runtime.check(runtime.set_device(ordinal), "cudaSetDevice")
        try:
            runtime.check(runtime.event_create(ctypes.byref(handle), flags), "cudaEventCreateWithFlags")
        finally:
            if current.value != ordinal:
                runtime.set_device(current.value)
        self.handle = handle.value

    def __del__(self) -> None:
        if self.handle is not None and self._pid == _getpid():
            try:
                self._runtime.event_destroy(self.handle)
            except Exception:  # noqa: BLE001 - at the interpreter's exit the library may be gone: nothing to free then
                pass


#: PyTorch's current stream of a device, as the runtime's handle, in one C call (None: a PyTorch without it).
_CURRENT_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class RuntimeOps(CudaOps):
    """:class:`CudaOps` with the copies, events and waits made by the CUDA runtime itself (NOTE [the runtime's own
    calls]); ``runtime``: the library PyTorch loaded."""

    def __init__(self, device: torch.device, runtime: Runtime) -> None:
        super().__init__(device)
        self._runtime = runtime
        self._ordinal = self._stream.device_index  # the stream's device: the staging's
        self._raw = self._stream.cuda_stream

    def _training_stream(self) -> int:
        """The current stream of the staging's device: the training stream (a method: a lambda kept here would make
        this object a cycle, left to the collector, whose page-locked index would be freed in a reader)."""
        if _CURRENT_RAW_STREAM is not None:  # a C call
            return int(_CURRENT_RAW_STREAM(self._ordinal))
        return int(torch.cuda.current_stream(self.device).cuda_stream)

    def copy(self, dst: torch.Tensor, src: np.ndarray) -> None:
        nbytes = src.nbytes
        if nbytes != dst.numel() * dst.element_size() or not (src.flags.c_contiguous and dst.is_contiguous()):
            super().copy(dst, src)  # as PyTorch copies it (no such copy is queued here: a guard)
            return
        if nbytes:
            self._runtime.check(self._runtime.memcpy_async(dst.data_ptr(), src.__array_interface__["data"][0], nbytes,
                                                           _HOST_TO_DEVICE, self._raw), "cudaMemcpyAsync")

    def done(self, event: Any) -> bool:
        rc = self._runtime.event_query(event.handle)
        if rc == _NOT_READY:
            return False
        self._runtime.check(rc, "cudaEventQuery")
        return True

    def _synchronize(self, event: Any) -> None:
        self._runtime.check(self._runtime.event_synchronize(event.handle), "cudaEventSynchronize")

    def _training_waits(self, event: Any) -> None:
        self._runtime.check(self._runtime.stream_wait_event(self._training_stream(), event.handle, 0), "cudaStreamWaitEvent")

    def training_mark(self) -> Any:
        return self._recorded(self._training_stream(), _NO_TIMING)

    def copies_after(self, event: Any) -> None:
        self._runtime.check(self._runtime.stream_wait_event(self._raw, event.handle, 0), "cudaStreamWaitEvent")

    def _event_on(self, stream: Any, blocking: bool) -> Any:
        return self._recorded(stream.cuda_stream, _NO_TIMING | (_BLOCKING if blocking else 0))

    def record(self) -> Any:
        return self._recorded(self._raw, _NO_TIMING | _BLOCKING)

    def _recorded(self, stream: int, flags: int) -> Event:
        event = Event(self._runtime, flags, self._ordinal)
        self._runtime.check(self._runtime.event_record(event.handle, stream), "cudaEventRecord")
        return event
