"""What a user names HDF5 files with: a name, a pattern, a list of them, a URL; what is no name, refused.

NOTE [naming files]
    Readers open the files by name, in processes of their own (started by
    fork, spawn or forkserver), so only names are taken: a str, bytes or
    ``os.PathLike``, a glob pattern, an ordered iterable of them, a
    ``file://`` URL (a local path), or an ``s3://`` or ``http(s)://`` URL.
    What users of h5py, PyTables or ``open()`` hand over in place of a name
    is refused before anything opens, with a ``TypeError`` that says what to
    pass instead: an open ``h5py.File``, ``Group`` or ``Dataset``, a PyTables
    file, node or column (their file's name and the node's path, which a
    reader can open), a file object (its name; one in memory, such as
    ``io.BytesIO``, has none), an unordered ``set`` (its files' rows would
    come in another order each run). Iterating these would read their
    lines, rows or keys as names. A name that cannot mean what it says is
    refused the same way: the empty name and ``~`` (expanded by neither
    ``open()`` nor h5py, so not here either) where no such file exists, a
    URL of a scheme nothing here reads (``gs://``, ``hf://``...), each
    naming the name as given.
"""

from __future__ import annotations

import errno
import glob
import io
import os
import re
from typing import Any
from urllib.parse import unquote

from .files import as_filename, from_root
from .objects.config import Store, make_store
from .objects.urls import SCHEMES, is_url

_GLOB_CHARS = frozenset("*?[")
#: A URL's scheme (RFC 3986): what ``gs://bucket/x.h5`` starts with.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
#: Iterables whose order is no order: their files' rows would come in another order in each run.
_UNORDERED = (set, frozenset)


def as_files(filename: Any, store: "Store | None" = None) -> "str | tuple[str, ...]":
    """The file, or the set of files in order, that ``filename`` names (NOTE [naming files]).

    ``filename``: a file (str, bytes or ``os.PathLike``), a glob pattern
    (``"train-*.h5"``: its matches in sorted order), or a list, tuple or
    other ordered iterable of files and patterns (each pattern expanded in place). One file in all
    gives that file's name (from the root: the working directory now is where a relative one lies, whatever
    ``os.chdir`` comes later); more give a tuple. A name that exists is never
    taken as a pattern. ``FileNotFoundError`` for a pattern nothing matches.
    A URL names an object; an ``s3://`` pattern lists the bucket, with
    ``store``'s settings (:func:`~multitables._io.objects.listing.expand`).
    ``TypeError`` for what is no name (an open h5py or PyTables object, a file object, a set), saying what to pass.
    """
    refuse_handle(filename)
    if not isinstance(filename, (str, bytes, os.PathLike)) and hasattr(filename, "__iter__"):
        items = list(filename)  # a list, a tuple, or Path.glob's generator
        if not items:
            raise ValueError("an empty list of files was given; name at least one HDF5 file")
        for item in items:
            refuse_handle(item)
        names = [name for item in items for name in _expand(as_filename(item), store)]
    else:
        names = _expand(as_filename(filename), store)
    names = [name if is_url(name) else from_root(name) for name in names]  # a later os.chdir changes nothing
    return names[0] if len(names) == 1 else tuple(names)


def _expand(name: str, store: "Store | None") -> "list[str]":
    if is_url(name):
        from .objects.listing import expand

        return expand(name, store or make_store(None))
    name = _local(name)
    if not _GLOB_CHARS.intersection(name) or os.path.lexists(name):
        return [name]
    matches = sorted(glob.glob(name))
    if not matches:
        raise FileNotFoundError(errno.ENOENT, "No HDF5 file matches the pattern", name)
    return matches


def _local(name: str) -> str:
    """The local path ``name`` (no object URL) stands for: a ``file://`` URL's path; ``FileNotFoundError`` or
    ``ValueError`` naming it as given where it cannot mean a file (NOTE [naming files])."""
    if not name:
        raise FileNotFoundError(errno.ENOENT, "No such HDF5 file: the name is empty", name)
    if "\0" in name:  # os.stat's words name no file: "embedded null byte"
        raise ValueError(f"{name!r} holds a NUL character, which no file's name can")
    scheme = _SCHEME.match(name)
    if scheme is not None and scheme[1].lower() == "file":
        rest = name[len(scheme[0]):]
        host, slash, path = rest.partition("/")
        if host.lower() not in ("", "localhost"):
            raise ValueError(f"{name!r} names a file on host {host!r}; a file:// URL names a file of this machine "
                             f"(file:///path/file.h5): mount it, or pass an s3:// or https:// URL")
        return unquote(slash + path)  # its %-escapes decoded (url2pathname on POSIX; urllib.request imports ssl)
    if (scheme is None and not name.startswith("~")) or os.path.lexists(name):  # a stat only for names in doubt
        return name
    if scheme is not None:
        raise ValueError(f"{name!r} is a URL of scheme {scheme[1]!r}, which multitables does not read: it reads local "
                         f"files (a path, or file:///path), and {', '.join(SCHEMES)} URLs")
    raise FileNotFoundError(errno.ENOENT, f"No such HDF5 file ('~' is expanded by neither open() nor h5py, nor "
                            f"here: pass os.path.expanduser(name), {os.path.expanduser(name)!r})", name)


def _kind(obj: Any) -> str:
    """``obj``'s type as its user knows it: ``h5py.Dataset``, ``tables.Table``, ``io.BytesIO``."""
    module = type(obj).__module__.partition(".")[0].lstrip("_")
    return f"{module}.{type(obj).__name__}" if module != "builtins" else type(obj).__name__


def refuse_handle(obj: Any) -> None:
    """Raise ``TypeError`` saying what to pass where ``obj`` is handed over in place of a file's name: an open h5py
    or PyTables object, a file object, an unordered set (NOTE [naming files])."""
    if isinstance(obj, (str, bytes, os.PathLike)):
        return
    kind = _kind(obj)
    if isinstance(obj, _UNORDERED):
        raise TypeError(f"a {kind} of files has no order, so their rows would come in another order in each run: "
                        f"pass a list, such as sorted(files)")
    if isinstance(obj, (bytearray, memoryview)):
        raise TypeError(f"filename must be a str, bytes or os.PathLike, not {kind}: pass bytes(name)")
    words: "str | None" = None
    if kind.startswith("h5py."):
        words = _h5py_words(obj)
    elif kind.startswith("tables."):
        words = _tables_words(obj)
    if words is None and (isinstance(obj, io.IOBase) or callable(getattr(obj, "read", None))):
        words = _file_object_words(obj)
    if words is not None:
        raise TypeError(f"an open {kind} is not taken: readers open the file by its name, in processes of their own. "
                        f"{words}")


def _pass(filename: str, how: str, path: "str | None" = None, field: "str | None" = None) -> str:
    """What to pass instead: the file's name (``how``: the attributes that give it), and the node's path (and
    column) where ``path`` names one."""
    if path is None:
        return f"Pass its file's name, {filename!r} ({how}), and a dataset's path in it"
    field_words = "" if field is None else f", field={field!r}"
    return (f"Pass its file's name and its path, {filename!r} and {path!r}{field_words} ({how}), "
            f"as in Streamer({filename!r}).get_queue({path!r}{field_words})")


def _h5py_words(obj: Any) -> str:
    try:
        handle, path = obj.file, obj.name
        filename, driver = handle.filename, handle.driver
    except (AttributeError, ValueError, RuntimeError):  # closed: its file and path are no longer known
        return "Pass the name of the file it was opened from, and the dataset's path in it"
    if driver == "core" and not os.path.exists(filename):
        return ("It is held in memory only (driver='core', backing_store=False), where no reader can open it: write "
                "it to a file (backing_store=True, or h5py.File(name, 'w')) and pass that file's name")
    if hasattr(obj, "shape"):  # a Dataset
        return _pass(filename, "dataset.file.filename, dataset.name", path)
    return _pass(filename, "file.filename")


def _tables_words(obj: Any) -> "str | None":
    column = None
    if hasattr(obj, "table") and hasattr(obj, "pathname"):  # a tables.Column: its table's, and its own name
        obj, column = obj.table, obj.pathname
    handle = getattr(obj, "_v_file", obj)
    filename = getattr(handle, "filename", None)
    if not isinstance(filename, str):
        return None
    if hasattr(obj, "shape"):  # a Leaf: a Table, an Array
        return _pass(filename, "node._v_file.filename, node._v_pathname", obj._v_pathname, column)
    return _pass(filename, "file.filename")


def _file_object_words(obj: Any) -> str:
    name = getattr(obj, "name", None)
    if isinstance(name, (str, bytes)) and os.path.isfile(name):
        return f"Pass its name, {os.fsdecode(name)!r} (file.name)"
    return "A file in memory has no name for a reader to open: write its bytes to a file and pass that file's name"
