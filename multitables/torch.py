"""PyTorch adapter: :class:`Batches <multitables.batches.Batches>` (or a mix of them) as tensors, for training loops and ``DataLoader``.

Needs PyTorch (``pip install 'multitables[torch]'``); ``import multitables``
alone never imports it.

NOTE [DataLoader uses]
    The items are whole batches, so the only right ``DataLoader`` is one that
    does not batch again: ``DataLoader(dataset, batch_size=None)`` (extra
    options such as ``pin_memory`` are fine), or no loader at all
    (``for x, y in dataset``). Two mistakes would go by silently otherwise,
    and are refused instead, when ``iter(dataset)`` is called (so at
    ``iter(loader)``, before any batch is read):

    * automatic batching (``DataLoader(dataset)``, whose ``batch_size`` is 1
      by default, or any other ``batch_size``) would stack batches into a
      batch of them: shape ``(1, 256, 64)``. PyTorch has no public flag for
      it; its fetcher (``torch.utils.data._utils.fetch``) is what calls
      ``iter(dataset)``, and holds ``dataset`` and ``auto_collation``.
      :func:`_auto_batching` looks for that object in the caller's frames, by
      those two attributes (torchdata's ``StatefulDataLoader`` has the same
      fetchers). Refusing is cheaper than undoing: PyTorch would also report
      ``len(loader)`` in its own batches. ``tests/test_torch.py`` pins the
      detection against the installed PyTorch.
    * ``num_workers > 0``: each worker would iterate a copy, delivering every
      row once per worker, and the position (``epoch``, ``state_dict``) would
      move in the workers, not here. The reading already runs in parallel in
      reader processes (``n_procs``). A forked worker finds
      :func:`~torch.utils.data.get_worker_info` set and raises, which the
      loader re-raises at the first ``next(loader)``; with the ``spawn`` or
      ``forkserver`` start method (Python 3.14's default on Linux) the
      dataset is refused when it is pickled for the worker, at
      ``iter(loader)``.
    * Accelerate's ``accelerator.prepare(loader)`` gives an
      ``IterableDataset`` to a ``DataLoaderDispatcher`` by default: process 0
      iterates it and splits each batch between the ranks, and the other
      ranks never iterate theirs. Batches split between ranks
      (``world_size > 1``, from ``torch.distributed`` as Accelerate sets it
      up) hold rank 0's part only, so every epoch would train on
      ``1 / world_size`` of the rows. :func:`_dispatched` finds the
      dispatcher's ``__iter__`` among the frames above ``iter(dataset)`` (it
      calls ``iter`` on a ``DataLoader`` of the dataset, six frames up in
      PyTorch 2.x), by its module (``accelerate``) and its code, which calls
      ``_fetch_batches`` (only code and globals are read: no frame's
      locals), and the dataset refuses, on every rank, before any batch is
      read. Without ``dispatch_batches``, Accelerate's ``IterableDatasetShard``
      fails on ``batch_size=None`` by itself (``TypeError``).
"""

from __future__ import annotations

import functools
import sys
import warnings
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union, cast, overload

import numpy as np

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("multitables.torch needs PyTorch: pip install 'multitables[torch]'") from exc

from .batches import Batches, MixedBatches
from .streamer import Streamer  # for the annotations only, but at run time: typing.get_type_hints resolves them
from ._sys.checks import check_bool
from ._train.batch import BatchT, as_batch, refuse_dataloader_keywords
from ._train.iteration import Closing

__all__ = ["TorchBatches", "get_batches", "to_tensor"]

#: A batch as tensors: one per dataset, a single one when one path was given,
#: or one per column (a dict) with ``fields``.
TensorBatch = Union[torch.Tensor, tuple[torch.Tensor, ...], dict[str, torch.Tensor]]

# The kind of batch a TorchBatches yields; a bare ``TorchBatches`` means ``TorchBatches[TensorBatch]`` (as BatchT in
# ``_train.batch``: typing's TypeVar takes a default from Python 3.13, typing_extensions' is for type checkers only).
if TYPE_CHECKING:
    from typing_extensions import TypeVar

    TensorBatchT = TypeVar("TensorBatchT", covariant=True, default=TensorBatch)
else:
    from typing import TypeVar

    TensorBatchT = TypeVar("TensorBatchT", covariant=True)

#: Frames above ``__iter__`` searched for PyTorch's fetcher: it calls
#: ``iter(dataset)`` itself (one frame up); the rest is room for a wrapper.
_FETCHER_FRAMES = 3

#: Frames above ``__iter__`` searched for Accelerate's ``DataLoaderDispatcher.__iter__`` (NOTE [DataLoader uses]).
_DISPATCHER_FRAMES = 10

_NO_WORKERS = (
    "TorchBatches cannot run in DataLoader worker processes (num_workers > 0): every row would come "
    "once per worker, and the position (epoch, state_dict) lives in this process. The reading "
    "already runs in parallel in multitables' own reader processes (n_procs=). "
    "Write DataLoader(dataset, batch_size=None) with num_workers=0 (the default)"
)


def _auto_batching(dataset: object, frame: Optional[FrameType]) -> bool:
    """Whether a ``DataLoader`` that batches automatically is calling ``iter(dataset)`` (see NOTE [DataLoader uses]).

    ``frame`` is the caller of ``iter``. PyTorch's fetcher is recognised by
    its attributes, ``dataset`` (this very object) and ``auto_collation``.
    Only frames of PyTorch's own modules (``torch``, ``torchdata``) are
    looked into: reading a frame's ``f_locals`` keeps a snapshot of its
    locals until the frame ends (before Python 3.13), which would keep a
    caller's dropped batches, and their readers, alive.
    """
    for _ in range(_FETCHER_FRAMES):
        if frame is None:
            break
        if not str(frame.f_globals.get("__name__", "")).startswith("torch"):
            frame = frame.f_back
            continue
        owner = frame.f_locals.get("self")
        if owner is not None and owner is not dataset and getattr(owner, "dataset", None) is dataset:
            flag = getattr(owner, "auto_collation", None)
            if flag is not None:
                return bool(flag)
        frame = frame.f_back
    return False


def _dispatched(frame: Optional[FrameType]) -> bool:
    """Whether Accelerate's ``DataLoaderDispatcher`` is iterating the dataset (see NOTE [DataLoader uses]); ``frame``
    is the caller of ``iter``."""
    for _ in range(_DISPATCHER_FRAMES):
        if frame is None:
            return False
        code = frame.f_code
        if (str(frame.f_globals.get("__name__", "")).startswith("accelerate.") and code.co_name == "__iter__"
                and "_fetch_batches" in code.co_names):
            return True
        frame = frame.f_back
    return False


def to_tensor(array: np.ndarray, path: str = "") -> torch.Tensor:
    """``torch.from_numpy(array)``: the tensor shares the array's memory, no copy.

    Arrays in non-native byte order are converted first (one copy): PyTorch
    has no such tensors. Dtypes PyTorch cannot hold (records, strings) raise
    ``TypeError`` naming ``path``.
    """
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    try:
        return torch.from_numpy(array)
    except TypeError as exc:
        raise _not_held(array.dtype, path) from exc


def _not_held(dtype: np.dtype, path: str) -> TypeError:
    where = f" of {path!r}" if path else ""
    return TypeError(
        f"rows{where} have dtype {dtype}, which PyTorch cannot hold in a tensor; "
        f"stream numeric datasets, or numeric columns of a table (get_batches' field= or fields=), to get tensors"
    )


class TorchBatches(Closing, IterableDataset[TensorBatchT]):
    """The batches of a :class:`~multitables.batches.Batches`, or of a mix of them (:func:`multitables.mix_batches`), as tensors.

    Iterate over it directly in a training loop, or give it to
    ``torch.utils.data.DataLoader(dataset, batch_size=None)``: the items are
    batches already. A ``DataLoader`` that batches again (``batch_size``
    left at its default of 1, or any number) and ``num_workers > 0`` are
    refused with ``RuntimeError`` before any batch is read, saying what to
    write (see NOTE [DataLoader uses]). Each tensor is made with
    ``torch.from_numpy`` on the fresh array of the batch, so it costs no copy
    and is yours. With ``device`` (``"cuda"``) the tensors are on that
    device, copied there without holding up the training stream; with
    ``pin_memory=True`` they are CPU tensors in page-locked memory (see
    :func:`get_batches`). Where PyTorch has no CUDA, ``device="cuda"`` is
    refused with ``RuntimeError`` before any reader starts (as is a device
    it cannot make tensors on, or a CUDA index past the machine's), and
    ``pin_memory=True`` warns and gives ordinary CPU tensors, as
    ``DataLoader`` does. Rows a tensor cannot hold (strings, a table's
    records without ``fields``) are refused with ``TypeError`` naming the
    path when the adapter is made, not at the first batch.

    :meth:`set_epoch`, :meth:`state_dict`, :meth:`load_state_dict` and
    :meth:`check_state_dict` are
    those of the wrapped batches (``set_epoch`` as on
    ``DistributedSampler``; a mix has no epochs, and no length unless it
    was given ``steps``).
    """

    # What a type checker sees: the tensors follow the arrays of the batches wrapped.
    # fmt: off
    @overload
    def __init__(self: TorchBatches[torch.Tensor], batches: Batches[np.ndarray] | MixedBatches[np.ndarray],
                 device: str | torch.device | None = None, pin_memory: bool = False) -> None: ...
    @overload
    def __init__(self: TorchBatches[tuple[torch.Tensor, ...]],
                 batches: Batches[tuple[np.ndarray, ...]] | MixedBatches[tuple[np.ndarray, ...]],
                 device: str | torch.device | None = None, pin_memory: bool = False) -> None: ...
    @overload
    def __init__(self: TorchBatches[dict[str, torch.Tensor]],
                 batches: Batches[dict[str, np.ndarray]] | MixedBatches[dict[str, np.ndarray]],
                 device: str | torch.device | None = None, pin_memory: bool = False) -> None: ...
    @overload  # generic: mypy would make TorchBatches(Batches[np.ndarray]) Any, ndarray's parameters being Any
    def __init__(self: TorchBatches[TensorBatch], batches: Batches[BatchT] | MixedBatches[BatchT],
                 device: str | torch.device | None = None, pin_memory: bool = False) -> None: ...
    # fmt: on

    def __init__(
        self, batches: "Batches[Any] | MixedBatches[Any]", device: "str | torch.device | None" = None, pin_memory: bool = False
    ) -> None:
        if not isinstance(batches, (Batches, MixedBatches)):
            raise TypeError(f"TorchBatches wraps multitables Batches (or a mix of them), not {type(batches).__name__}")
        pin_memory = check_bool("pin_memory", pin_memory)
        _check_tensor_rows(batches)
        self.batches = batches
        #: Where the batches go (None: CPU tensors).
        self.device = None if device is None else torch.device(device)
        #: Whether CPU batches are in page-locked memory (batches for a GPU always pass through it: each batch, or,
        #: shuffled, its window).
        self.pin_memory = pin_memory
        self._staging: Any = None  # NOTE [windows on a device]: made by the first shuffled iteration for a GPU
        if self.device is not None:
            _check_device(self.device)
        if pin_memory and not torch.cuda.is_available():
            # As DataLoader(pin_memory=True) does without an accelerator: code written for a GPU node runs on a laptop.
            warnings.warn(
                "pin_memory=True, but this PyTorch cannot use CUDA (torch.cuda.is_available() is False): the batches "
                "are CPU tensors in ordinary memory",
                stacklevel=_caller_level(),
            )
            self.pin_memory = False

    def __repr__(self) -> str:
        where = f", device={str(self.device)!r}" if self.device is not None else ", pin_memory=True" if self.pin_memory else ""
        return f"<multitables.torch.TorchBatches of {self.batches!r}{where}>"

    def __iter__(self) -> Iterator[TensorBatchT]:
        if get_worker_info() is not None:
            raise RuntimeError(_NO_WORKERS)
        if _auto_batching(self, sys._getframe(1)):
            first = self.batches.sources[0] if isinstance(self.batches, MixedBatches) else self.batches
            n = first.batch_size
            raise RuntimeError(
                f"DataLoader(dataset) batches automatically (batch_size=1 unless given): it would stack these "
                f"batches, already of {n} rows each (get_batches' batch_size), into batches of batches, of shape "
                f"(batch_size, {n}, ...). Write DataLoader(dataset, batch_size=None), or iterate over the dataset itself"
            )
        sources = self.batches.sources if isinstance(self.batches, MixedBatches) else [self.batches]
        world = max(source.world_size for source in sources)
        if world > 1 and _dispatched(sys._getframe(1)):
            raise RuntimeError(
                f"Accelerate's prepare() made a DataLoaderDispatcher of these batches: process 0 iterates them and "
                f"splits each batch between the ranks, but they are rank {sources[0].rank}'s part of {world} "
                f"already (get_batches' rank and world_size, from torch.distributed), so the other ranks' rows would "
                f"never be read. Iterate the batches on every rank without preparing them (prepare the model and "
                f"the optimizer; device=accelerator.device gives the tensors there)"
            )
        # The batches' own iteration, each batch made a tensor in their loop before it counts as delivered: no
        # frame of ours between that count and the loop that gets it (NOTE [delivered batches]).
        if self.pin_memory or (self.device is not None and self.device.type != "cpu"):
            return cast("Iterator[TensorBatchT]", self._delivered())
        if isinstance(self.batches, MixedBatches):  # each batch as its source gives it
            return cast("Iterator[TensorBatchT]", self.batches.iter_as(_as_unnamed_tensors))
        return cast("Iterator[TensorBatchT]", self.batches.iter_into(convert=functools.partial(_as_tensors, paths=self.batches.paths)))

    def _delivered(self) -> Iterator[TensorBatch]:
        """Batches gathered into page-locked memory, and copied to the device (NOTE [batches on a device])."""
        from ._train.cuda import cuda_ops
        from ._train.device import Delivery

        if isinstance(self.batches, MixedBatches) or any(dtype.names for dtype, _ in self.batches.row_types):
            # A mix's batches, and a table's columns (fields=), are made before they come: copied to page-locked memory.
            made = Delivery(self.device, self.pin_memory, None, ())
            send = functools.partial(made.send, gathered=False)
            return self.batches.iter_as(send) if isinstance(self.batches, MixedBatches) else self.batches.iter_into(convert=send)
        device = self.device  # the lambda's, narrowed: the device's calls made later, at the first batch
        if device is not None and device.type == "cuda" and self.batches.shuffle:
            return self._gathered_on_device(lambda: cuda_ops(device))  # a generator: its end settles the copies
        delivery = Delivery(self.device, self.pin_memory, self.batches.row_types, self.batches.paths)
        return self.batches.iter_into(delivery.alloc, convert=functools.partial(delivery.send, gathered=True))

    def _gathered_on_device(self, ops: "Callable[[], Any]") -> Iterator[TensorBatch]:
        """Shuffled batches gathered on the device out of windows copied there (NOTE [windows on a device]); ``ops``
        makes the device's calls, once."""
        from ._train.device import DeviceStaging

        assert isinstance(self.batches, Batches)
        if self._staging is None:
            self._staging = DeviceStaging(ops(), self.batches.row_types)
        staging = self._staging
        try:  # yield from: no step of ours between a batch's count and the loop (NOTE [delivered batches])
            yield from self.batches.iter_into(staging.alloc, staging)
        finally:
            staging.settle()  # the next iteration may write the window buffers with any staging, a host one too

    def __len__(self) -> int:
        if isinstance(self.batches, MixedBatches):
            if self.batches.steps is None:
                raise TypeError("a mix of batches without steps= is endless: it has no length")
            return self.batches.steps
        # What one pass gives, as PyTorch counts a dataset's length: epochs=3 is three epochs' batches.
        if self.batches.epochs is None:
            raise TypeError("batches made with epochs=None are endless: they have no length")
        return len(self.batches) * self.batches.epochs

    def __reduce__(self) -> Any:
        # A worker started with spawn or forkserver gets the dataset pickled: refuse it here, clearly.
        raise RuntimeError(_NO_WORKERS.replace("(num_workers > 0)", "(num_workers > 0), nor be pickled"))

    @property
    def epoch(self) -> int:
        return self._epochs().epoch

    @property
    def set_epoch(self) -> "Callable[[int], None]":
        """As :meth:`Batches.set_epoch <multitables.batches.Batches.set_epoch>`. A mix has none: ``hasattr(dataset,
        "set_epoch")``, which training loops (Accelerate's, say) ask before they call it, is False."""
        return self._epochs().set_epoch

    def _epochs(self) -> "Batches[Any]":
        if isinstance(self.batches, MixedBatches):
            raise AttributeError("a mix of batches has no epochs of its own (each source keeps its own); it counts steps")
        return self.batches

    def state_dict(self) -> dict[str, Any]:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state)

    def check_state_dict(self, state: dict[str, Any]) -> None:
        self.batches.check_state_dict(state)

    def close(self) -> None:
        if self._staging is not None:  # first: it holds slots of the batches' queues, and page-locked them
            self._staging.close()
            self._staging = None
        self.batches.close()


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning raised in this module at the first frame outside it: the user's line,
    whether they made the adapter themselves or through :func:`get_batches`."""
    level, frame = 1, cast(Optional[FrameType], sys._getframe(1))
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        level, frame = level + 1, frame.f_back
    return level


def _check_device(device: torch.device) -> None:
    """Refuse, before any reader starts, a device this PyTorch cannot put tensors on (one it has no support for, an
    index past its devices) or one whose tensors hold no data (``meta``)."""
    if device.type == "meta":
        raise ValueError("device='meta' gives tensors without data; name a device the batches can be copied to")
    if device.type == "cuda":  # no tensor made: CUDA's context is made by the first batch, after the readers start
        if not torch.cuda.is_available():
            raise RuntimeError(f"device={str(device)!r} needs CUDA, which this PyTorch cannot use "
                               f"(torch.cuda.is_available() is False); leave it out for CPU tensors")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise RuntimeError(f"device={str(device)!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
        return
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as exc:  # "not compiled with XPU enabled" is an AssertionError
        raise RuntimeError(f"device={str(device)!r} cannot be used by this PyTorch: {exc}") from exc


def _check_tensor_rows(batches: "Batches[Any] | MixedBatches[Any]") -> None:
    """Refuse, when the adapter is made (before any reader starts), rows a tensor cannot hold (strings, a table's
    records without ``fields``): the ``TypeError`` naming the path that :func:`to_tensor` would raise at the first
    batch, once the first window was read. Each source's batch of no rows is made as a batch would be, and
    its arrays' dtypes tried as :func:`to_tensor` converts them (native byte order)."""
    for source in batches.sources if isinstance(batches, MixedBatches) else (batches,):
        empty = [np.empty((0,) + tuple(shape), dtype) for dtype, shape in source.row_types]
        batch = as_batch(empty, False, source.fields)
        if isinstance(batch, dict):  # fields=: one array per column of the table
            named = [(f"{source.paths[0]}[{name!r}]", a) for name, a in batch.items()]
        else:
            named = list(zip(source.paths, batch))
        for path, array in named:
            try:
                torch.as_tensor(array.astype(array.dtype.newbyteorder("=")))  # no rows: nothing copied
            except TypeError as exc:
                raise _not_held(array.dtype, path) from exc


def _as_unnamed_tensors(batch: Any) -> TensorBatch:
    """A mix's batch as tensors (its arrays named by position in errors)."""
    return _as_tensors(batch, ("",) * (1 if isinstance(batch, (np.ndarray, dict)) else len(batch)))


def _as_tensors(batch: Any, paths: Sequence[str]) -> TensorBatch:
    """One batch (an array, a tuple of arrays, or a dict of columns) as tensors; ``paths`` name its arrays in errors."""
    if isinstance(batch, dict):  # fields=: one array per column of the table
        return {name: to_tensor(a, f"{paths[0]}[{name!r}]" if paths[0] else name) for name, a in batch.items()}
    if isinstance(batch, np.ndarray):
        return to_tensor(batch, paths[0])
    return tuple(to_tensor(a, p) for a, p in zip(batch, paths))


# The keywords, and the tensors each call gives, as Batches.__init__'s overloads say (a type checker's view).
# A str is also a Sequence[str]: the first overload takes it, as Batches does.
# fmt: off
@overload
def get_batches(stream: Streamer, paths: str, batch_size: int, *,  # type: ignore[overload-overlap]
                device: str | torch.device | None = None, pin_memory: bool = False, shuffle: bool = True, seed: int = 0,
                drop_last: bool = False, n_procs: int | None = None, rank: int | None = None,
                world_size: int | None = None, block_size: int | None = None, window: int | None = None,
                read_ahead: int | None = None, field: str | None = None, fields: None = None, indices: Any = None,
                weights: Any = None, num_samples: int | None = None, epochs: int | None = 1,
                transform: Any = None) -> TorchBatches[torch.Tensor]: ...
@overload
def get_batches(stream: Streamer, paths: str, batch_size: int, *,
                device: str | torch.device | None = None, pin_memory: bool = False, shuffle: bool = True, seed: int = 0,
                drop_last: bool = False, n_procs: int | None = None, rank: int | None = None,
                world_size: int | None = None, block_size: int | None = None, window: int | None = None,
                read_ahead: int | None = None, field: None = None, fields: Sequence[str], indices: Any = None,
                weights: Any = None, num_samples: int | None = None, epochs: int | None = 1,
                transform: Any = None) -> TorchBatches[dict[str, torch.Tensor]]: ...
@overload
def get_batches(stream: Streamer, paths: Sequence[str], batch_size: int, *,
                device: str | torch.device | None = None, pin_memory: bool = False, shuffle: bool = True, seed: int = 0,
                drop_last: bool = False, n_procs: int | None = None, rank: int | None = None,
                world_size: int | None = None, block_size: int | None = None, window: int | None = None,
                read_ahead: int | None = None, field: None = None, fields: None = None, indices: Any = None,
                weights: Any = None, num_samples: int | None = None, epochs: int | None = 1,
                transform: Any = None) -> TorchBatches[tuple[torch.Tensor, ...]]: ...
@overload
def get_batches(stream: Streamer, paths: str, batch_size: int, *,
                device: str | torch.device | None = None, pin_memory: bool = False, shuffle: bool = True, seed: int = 0,
                drop_last: bool = False, n_procs: int | None = None, rank: int | None = None,
                world_size: int | None = None, block_size: int | None = None, window: int | None = None,
                read_ahead: int | None = None, field: None = None, fields: Sequence[str] | None = None,
                indices: Any = None, weights: Any = None, num_samples: int | None = None, epochs: int | None = 1,
                transform: Any = None) -> TorchBatches[torch.Tensor | dict[str, torch.Tensor]]: ...
# fmt: on


def get_batches(
    stream: "Streamer",
    paths: "str | Sequence[str]",
    batch_size: int,
    *,
    device: "str | torch.device | None" = None,
    pin_memory: bool = False,
    **kwargs: Any,
) -> "TorchBatches[Any]":
    """``TorchBatches(stream.get_batches(paths, batch_size, **kwargs), device, pin_memory)``.

    ``device``: where the tensors go, e.g. ``"cuda"``: each batch is gathered
    into page-locked memory and copied with ``non_blocking=True`` on a stream
    of its own while the previous batch trains (NOTE [batches on a device] in
    ``multitables._train.device``). ``pin_memory=True``: CPU tensors in
    page-locked memory, as ``DataLoader(pin_memory=True)`` gives (without
    CUDA: a warning, and ordinary CPU tensors). Other arguments as for
    :class:`~multitables.batches.Batches`; the tensors follow its arrays: a
    type checker sees ``TorchBatches[torch.Tensor]`` for one path,
    ``TorchBatches[tuple[torch.Tensor, ...]]`` for a sequence of paths and
    ``TorchBatches[dict[str, torch.Tensor]]`` with ``fields``. ``DataLoader``'s
    other keywords (``num_workers``, ``sampler``...) raise ``TypeError``
    saying what takes their place.
    """
    refuse_dataloader_keywords(kwargs)
    return TorchBatches(Batches(stream, paths, batch_size, **kwargs), device=device, pin_memory=pin_memory)
