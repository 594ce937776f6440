"""multitables: read HDF5 datasets as fast as the machine allows, with parallel reader processes.

Public API: :class:`Streamer` (``get_queue``, ``get_generator``,
``get_remainder``), :data:`QueueClosed` and the errors. Import from the top
of the package; the underscored modules are internal.
"""

from .errors import (
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

__version__ = "0.1.0"

__all__ = [
    "Streamer",
    "Batches",
    "Queue",
    "Guard",
    "QueueClosed",
    "MultitablesError",
    "NodeTypeError",
    "NotHDF5Error",
    "ReaderError",
    "ShmSpaceError",
    "StreamClosedError",
]
