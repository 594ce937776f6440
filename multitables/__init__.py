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
    NoSuchFieldError,
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
del sys  # not a name of the package


def _bind_annotation_names() -> None:
    """Bind, in the modules below the public faces, the names their annotations take from the faces.

    NOTE [annotations from above]
        A module may annotate with a class of a module that imports it:
        ``_train.mix`` with ``batches.Batches``, ``batches`` with
        ``streamer.Streamer``, ``_access`` with ``reader.Reader`` and
        ``reader.Dataset``. It imports that class under ``TYPE_CHECKING``
        only, as an import at run time would close an import cycle (and go
        up the layers). ``typing.get_type_hints``, which pydantic,
        typeguard, beartype, Sphinx's ``autodoc_typehints`` and IDEs call,
        evaluates annotations in the module's globals, so the package binds
        those names there once every module is loaded. A module that adds
        such an import adds its name here;
        ``tests/test_references.py`` resolves every public annotation.
    """
    from . import batches
    from ._access import futures, request, stages
    from ._train import mix

    for module, names in (
        (batches, {"Streamer": Streamer}),
        (mix, {"Batches": Batches}),
        (request, {"Dataset": Dataset}),
        (stages, {"Reader": Reader}),
        (futures, {"Reader": Reader}),
    ):
        for name, value in names.items():
            setattr(module, name, value)


_bind_annotation_names()

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
    "NoSuchFieldError",
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
