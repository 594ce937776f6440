"""multitables: read HDF5 datasets as fast as the machine allows, with parallel reader processes.

Public API: :class:`Streamer` (``get_queue``, ``get_generator``,
``get_remainder``, ``get_batches``), :data:`QueueClosed`, the random-access
:class:`Reader` and the errors. Import from the top
of the package; the underscored modules are internal.
"""

from .errors import (
    EmptyDatasetError,
    FileChangedError,
    MissingFilterError,
    MultitablesError,
    NodeTypeError,
    NotHDF5Error,
    QueueClosed,
    ReaderError,
    ShmSpaceError,
    StreamClosedError,
)
from .streamer import Guard, Queue, Streamer
from .batches import Batches
from .reader import DataProxy, Dataset, Future, Reader, Request, Stage, StagePool

__version__ = "0.1.0"

__all__ = [
    "Streamer",
    "Batches",
    "Reader",
    "Dataset",
    "Request",
    "Stage",
    "StagePool",
    "Future",
    "DataProxy",
    "Queue",
    "Guard",
    "QueueClosed",
    "MultitablesError",
    "EmptyDatasetError",
    "MissingFilterError",
    "FileChangedError",
    "NodeTypeError",
    "NotHDF5Error",
    "ReaderError",
    "ShmSpaceError",
    "StreamClosedError",
]
