"""multitables: read HDF5 datasets as fast as the machine allows, with parallel reader processes.

Public API: :class:`Streamer` (``get_queue``, ``get_generator``,
``get_remainder``, ``get_batches``), :data:`QueueClosed`, the random-access
:class:`Reader` and the errors. Import from the top
of the package; the underscored modules are internal.
"""

import sys

from .errors import (
    EmptyDatasetError,
    FileBusyError,
    FileChangedError,
    MissingFilterError,
    MultitablesError,
    NodeTypeError,
    NoSuchNodeError,
    NotHDF5Error,
    ObjectStorageError,
    QueueClosed,
    QueueClosedException,
    ReaderError,
    ReleasedResourceError,
    SharedMemoryError,
    ShmSpaceError,
    StreamClosedError,
    SubprocessException,
)
from .streamer import Guard, Queue, RowIterator, Streamer
from .batches import Batches, MixedBatches, mix_batches
from .reader import DataProxy, Dataset, Future, Reader, Request, RequestPool, Stage, StagePool
from ._access import compat2x as _compat2x

__version__ = "0.1.0"

# The established (2.x) module names: multitables.dataset, .dataset_ops, .request, .stage, .signals, .shared_mem,
# .resource_wrapper.
_compat2x.install(sys.modules[__name__])

__all__ = [
    "Streamer",
    "Batches",
    "MixedBatches",
    "mix_batches",
    "Reader",
    "Dataset",
    "Request",
    "Stage",
    "StagePool",
    "Future",
    "DataProxy",
    "RequestPool",
    "Queue",
    "Guard",
    "RowIterator",
    "QueueClosed",
    "MultitablesError",
    "EmptyDatasetError",
    "MissingFilterError",
    "FileChangedError",
    "FileBusyError",
    "NodeTypeError",
    "NoSuchNodeError",
    "NotHDF5Error",
    "ObjectStorageError",
    "ReaderError",
    "ShmSpaceError",
    "StreamClosedError",
    "ReleasedResourceError",
    "SharedMemoryError",
    "QueueClosedException",
    "SubprocessException",
]
