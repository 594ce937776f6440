"""PyTorch adapter: :class:`Batches <multitables.batches.Batches>` as tensors, for training loops and ``DataLoader``.

Needs PyTorch (``pip install 'multitables[torch]'``); ``import multitables``
alone never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Sequence, Union

import numpy as np

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("multitables.torch needs PyTorch: pip install 'multitables[torch]'") from exc

from .batches import Batches

if TYPE_CHECKING:
    from .streamer import Streamer

__all__ = ["TorchBatches", "get_batches", "to_tensor"]

#: A batch as tensors: one per dataset, or a single one when one path was given.
TensorBatch = Union[torch.Tensor, tuple[torch.Tensor, ...]]


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
        where = f" of {path!r}" if path else ""
        raise TypeError(
            f"rows{where} have dtype {array.dtype}, which PyTorch cannot hold in a tensor; "
            f"stream numeric datasets (or a numeric column of a table) to get tensors"
        ) from exc


class TorchBatches(IterableDataset):  # type: ignore[type-arg]
    """The batches of a :class:`~multitables.batches.Batches` as tensors.

    Iterate over it directly in a training loop, or give it to
    ``torch.utils.data.DataLoader(dataset, batch_size=None)`` (batching is
    done here; ``num_workers`` must stay 0: the reading already runs in
    parallel processes). Each tensor is made with ``torch.from_numpy`` on the
    fresh array of the batch, so it costs no copy and is yours.

    :meth:`set_epoch`, :meth:`state_dict` and :meth:`load_state_dict` are
    those of the wrapped batches (``set_epoch`` as on
    ``DistributedSampler``).
    """

    def __init__(self, batches: Batches) -> None:
        if not isinstance(batches, Batches):
            raise TypeError(f"TorchBatches wraps multitables Batches, not {type(batches).__name__}")
        self.batches = batches
        self._single = batches._single

    def __iter__(self) -> Iterator[TensorBatch]:
        if get_worker_info() is not None:
            raise RuntimeError(
                "TorchBatches runs inside a DataLoader worker: use DataLoader(..., batch_size=None, "
                "num_workers=0); multitables already reads with its own processes (n_procs), and a copy "
                "in each worker would deliver every row once per worker"
            )
        paths = self.batches.paths
        for batch in self.batches:
            if self._single:
                yield to_tensor(batch, paths[0])  # type: ignore[arg-type]
            else:
                yield tuple(to_tensor(a, p) for a, p in zip(batch, paths))

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def epoch(self) -> int:
        return self.batches.epoch

    def set_epoch(self, epoch: int) -> None:
        """As :meth:`Batches.set_epoch <multitables.batches.Batches.set_epoch>`."""
        self.batches.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches.load_state_dict(state)

    def close(self) -> None:
        self.batches.close()


def get_batches(stream: "Streamer", paths: "str | Sequence[str]", batch_size: int, **kwargs: Any) -> TorchBatches:
    """``TorchBatches(stream.get_batches(paths, batch_size, **kwargs))``; arguments as for :class:`~multitables.batches.Batches`."""
    return TorchBatches(Batches(stream, paths, batch_size, **kwargs))
