"""What the consumer does just before it forks a process that reads: a reader, or the PyTables probe (NOTE
[forking among threads] in ``_sys.forks``)."""

from __future__ import annotations

from .._sys.forks import finish_imports
from .._sys.release import settle_releases
from .chunks.codecs.libraries import load_codec_functions

#: What readers import to read: h5py (and its filters), the chunk engine's codecs, PyTables, and the object client
#: (imported where a URL is read: NOTE [objects on demand] in ``_io.objects``; ``fileobj`` brings in the rest).
READING_LIBRARIES = ("h5py", "hdf5plugin", "imagecodecs", "blosc2", "tables", "multitables._io.objects.fileobj")


def before_fork() -> None:
    """In the consumer, just before it forks: wait for the unmappings in flight (NOTE [release off the path]), finish
    the reading libraries' imports that other threads have in flight, and load every codec function the chunk engine
    takes, so that the child finds no lock of theirs held by a thread it does not have."""
    settle_releases()
    finish_imports(READING_LIBRARIES)
    load_codec_functions()
