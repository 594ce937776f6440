"""Files open for writing, in this process or by another program: found, and said as :class:`FileBusyError`.

NOTE [files written here]
    HDF5 shares one open of a file among every open of it in a process (it
    knows the file by device and inode, whatever the name). A file that this
    process holds open for writing (an ``h5py.File`` in mode ``"r+"``, ``"a"``,
    ``"w"`` or ``"x"``, a PyTables file in ``"a"`` or ``"w"``) is therefore not
    read as the disk holds it: the describing open sees that handle's unwritten
    changes and writes them when it closes (so the file changes under the stream
    that described it), and a reader forked from here inherits the handle, writes
    its metadata into the file from another process at its own open and close
    (HDF5 allows one writer), and keeps its descriptor, with HDF5's exclusive
    lock, after the caller closes it. So such a file is refused, with what to
    do, where the file is described (:func:`check_intent`: one call on the open
    that describes it) and again before readers are forked (:func:`refuse_written_here`:
    a handle may be opened between the two). A SWMR writer (``swmr_mode =
    True``) is HDF5's own way to read a file while it is written: allowed (its
    readers neither write nor lock). A handle on another file is left alone:
    a reader never opens it, and ends with ``os._exit``, which flushes nothing.

    A read-only handle held here is shared the same way, with what HDF5 learnt
    of the file when it was opened: where the file ends, its cached metadata.
    A file that another program grew since (HDF5's lock off, as on many
    cluster file systems, or taken by no writer) is then read through that
    stale view, by the describing open and by every reader forked from here:
    HDF5's "addr overflow", or a shape and rows of the file as it was. Where
    the handle's idea of the file's end is short of the file's size now
    (:func:`refuse_stale`), the file is refused with
    :class:`FileChangedError`, saying to close the handle. A SWMR reader
    (``swmr=True``) refreshes its view: left alone.

    Another program's write shows as HDF5's "unable to lock file" (its lock) or
    "file is already open for write" (the mark a writer leaves in the
    superblock, there also after a writer died): :func:`busy_error` says each as
    a :class:`FileBusyError` with the ways out.

NOTE [swmr extent]
    A dataset that an SWMR writer appends to (read with ``swmr=True``) keeps,
    in a process, the extent HDF5 gave its first open while any open of it
    lasts: a second open sees no row flushed since. ``refresh()``
    (``H5Drefresh``) brings it to the extent flushed last, but only where it
    is the dataset's one open in the process: with two, HDF5 reads wrong rows
    through the refreshed one and fails the other's reads ("can't insert
    duplicate key"). So :func:`refresh_swmr`, where a dataset has fewer rows
    than planned with (a Reader's readers, asked for rows of a new
    ``get_dataset``) or where it is described, first closes the library's
    other opens of it in this process (a stream, batches or a Reader reading
    here, ``n_procs=0``, or those a forked reader inherited: each a
    :class:`HeldOpen`), refreshes it, and opens them again, each through its
    own file and with its own access list: the opens share the refreshed
    extent, and each still reads only the rows it planned with. Their reads
    and that swap hold one lock, so a read on another thread never meets a
    closed open, and the swap holds h5py's own lock too, so no thread opens
    the dataset between the count of its opens and the refresh (which then
    failed reads with "can't insert duplicate key"). An open that another
    thread holds while it describes the dataset is not a held one: a look
    made meanwhile has the rows that open saw, never other rows. A Reader's
    readers also close their open of a dataset before
    opening it for a dataset of more rows (``_procs.serve``). An open the
    library does not hold (an h5py handle of the caller's) is left alone: the
    dataset is then not refreshed, described with the rows that handle saw,
    and refused where it is still short of the rows planned with, saying so.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from collections.abc import Iterable
from typing import Any

from .._sys.forks import renew_lock_in_children
from ..errors import FileBusyError, FileChangedError
from .objects.urls import is_url

_HERE = ("HDF5 shares that open with every other open of the file in this process, reader processes forked from here "
         "included: what is read would be the handle's unwritten state, and readers would write it into the file. "
         "Close it, or open it with mode 'r', before reading the file with multitables (a SWMR writer, "
         "swmr_mode = True, may stay open)")
_LOCKED = ("is locked: a program has it open for writing (HDF5's file lock). Close it there; a file written with "
           "SWMR is read with swmr=True (Streamer(filename, swmr=True)); HDF5_USE_FILE_LOCKING=FALSE in the "
           "environment (or locking=False, engine='h5py') reads it anyway, which is safe only if nothing writes it "
           "meanwhile")
_MARKED = ("is marked as open for writing (HDF5's consistency flags in its superblock): a SWMR writer has it open "
           "(read it with swmr=True), or its writer did not close it (`h5clear -s` clears the mark once no program "
           "writes the file)")

_NOT_SWMR = ("is open for writing without SWMR (HDF5's consistency flags in its superblock): swmr=True reads a file "
             "that a writer holds only in SWMR mode (swmr_mode = True); read it once that writer has closed it")


def _identities(filenames: Iterable[str]) -> "set[tuple[int, int]]":
    """``(st_dev, st_ino)`` of each local file named (URLs and names that are not there now are skipped)."""
    found = set()
    for name in filenames:
        if is_url(name):
            continue
        try:
            st = os.stat(name)
        except OSError:
            continue
        found.add((st.st_dev, st.st_ino))
    return found


def _h5py_writers(wanted: "set[tuple[int, int]]") -> "str | None":
    h5py = sys.modules.get("h5py")
    if h5py is None:
        return None
    h5f = h5py.h5f
    for fid in h5f.get_obj_ids(types=h5f.OBJ_FILE):
        try:
            intent = fid.get_intent()
            if not intent & h5f.ACC_RDWR or intent & h5f.ACC_SWMR_WRITE:
                continue
            st = os.fstat(fid.get_vfd_handle())
        except (OSError, ValueError, RuntimeError):  # a driver with no descriptor (core, family): not a local file
            continue
        if (st.st_dev, st.st_ino) in wanted:
            return "an h5py.File open for writing: mode 'r+', 'a', 'w' or 'x'"
    return None


def _tables_writers(filenames: Iterable[str], wanted: "set[tuple[int, int]] | None" = None) -> "str | None":
    # PyTables' registry of the files it has open: its own (private) name, looked up with care; its handles are
    # another copy of HDF5's, which h5py's list does not show. Files are looked at only if a handle writes.
    registry = getattr(getattr(sys.modules.get("tables"), "file", None), "_open_files", None)
    for handle in list(getattr(registry, "handlers", ())):
        mode = getattr(handle, "mode", "r")
        if mode == "r" or not getattr(handle, "isopen", False):
            continue
        wanted = _identities(filenames) if wanted is None else wanted
        if _identities([getattr(handle, "filename", "")]) & wanted:
            return f"a PyTables file in mode {mode!r}"
    return None


def written_here(filenames: Iterable[str]) -> "str | None":
    """The handle of this process that holds one of ``filenames`` open for writing, in words (None: none does)."""
    filenames = list(filenames)
    wanted = _identities(filenames)
    if not wanted:
        return None
    return _h5py_writers(wanted) or _tables_writers(filenames, wanted)


def _here_error(filename: str, holder: str) -> FileBusyError:
    return FileBusyError(f"{filename!r} is open for writing in this process ({holder}): {_HERE}")


def refuse_written_here(filenames: Iterable[str]) -> None:
    """Raise :class:`FileBusyError` if this process holds one of ``filenames`` open for writing (before a fork)."""
    names = list(filenames)
    holder = written_here(names)
    if holder is not None:
        raise _here_error(", ".join(names) if len(names) < 4 else f"{names[0]!r} (one of {len(names)} files)", holder)


def check_intent(fid: Any, filename: str) -> None:
    """Raise :class:`FileBusyError` if this process holds ``filename`` open for writing, ``fid`` being this library's
    read-only open of it: h5py's handle shows in ``fid``'s intent (the shared file's), PyTables' (another copy of
    HDF5) in its registry. A library call and a look at a set: this runs at every description."""
    import h5py

    intent = fid.get_intent()
    holder = None
    if intent & h5py.h5f.ACC_RDWR and not intent & h5py.h5f.ACC_SWMR_WRITE:
        holder = written_here([filename]) or "an h5py.File open for writing"
    else:
        holder = _tables_writers([filename])
    if holder is not None:
        raise _here_error(filename, holder)
    if not intent & (h5py.h5f.ACC_RDWR | h5py.h5f.ACC_SWMR_READ):
        refuse_stale(fid, filename)


def refuse_stale(fid: Any, filename: str) -> None:
    """Raise :class:`FileChangedError` if ``fid``, a read-only open of ``filename``, was opened before the file grew:
    a handle of this process that HDF5 shares with every later open of the file (NOTE [files written here])."""
    try:
        seen = fid.get_filesize()  # where HDF5 took the file to end at its open (its end of file or address space)
        now = os.fstat(fid.get_vfd_handle()).st_size
    except (OSError, ValueError, RuntimeError):  # a driver with no descriptor (core, family): not a local file
        return
    if seen < now:
        raise FileChangedError(
            f"{filename!r} grew from {seen:,} to {now:,} bytes since this process opened it with h5py (a handle "
            f"still open here, such as an h5py.File in mode 'r'): HDF5 shares that open, with the file as it was "
            f"then, with every open of the file in this process, reader processes forked from here included, so "
            f"rows would be read from a stale view of it. Close that handle (or reopen it) before reading the file "
            f"with multitables; a file written while it is read is opened with swmr=True"
        )


def raise_if_busy(exc: BaseException, filename: str) -> None:
    """Raise :func:`busy_error`'s error from ``exc`` where it has one (as ``node.raise_if_switched`` does its own)."""
    busy = busy_error(exc, filename)
    if busy is not None:
        raise busy from exc


def busy_error(exc: BaseException, filename: str) -> "FileBusyError | None":
    """``exc`` (HDF5's or PyTables' error opening ``filename``) as a :class:`FileBusyError` where it says the file is
    open for writing (locked, or marked so); None otherwise. The caller raises it from ``exc``."""
    words = str(exc)
    if "already opened, but not in read-only mode" in words:  # PyTables' own registry: this process writes it
        return _here_error(filename, written_here([filename]) or "a PyTables file not in mode 'r'")
    if "unable to lock file" in words:
        holder = written_here([filename])
        if holder is not None:
            return _here_error(filename, holder)
        return FileBusyError(f"{filename!r} {_LOCKED}: {exc}")
    if "file is already open for write" in words:
        return FileBusyError(f"{filename!r} {_MARKED}: {exc}")
    if "not already open for SWMR writing" in words:  # swmr=True, and the mark of a writer without SWMR
        return FileBusyError(f"{filename!r} {_NOT_SWMR}: {exc}")
    return None


#: Held around each read through a :class:`HeldOpen` and around :func:`refresh_swmr`, which may swap its open.
_SWMR_LOCK = threading.RLock()
renew_lock_in_children(globals(), "_SWMR_LOCK", threading.RLock)
#: The holders of the library's opens of datasets read with ``swmr=True`` in this process (each its ``dataset_id``).
#: A set, not holder -> open: a holder dropped unclosed leaves by the set's callback, where a signal's handler may
#: run and its exception is dropped; cut short, it left the entry, whose open kept the file open in this process.
_HELD: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _locked(name: str) -> Any:
    """:class:`HeldOpen`'s method ``name``: the source's own, under the lock."""

    def method(self: Any, *args: Any) -> Any:
        with _SWMR_LOCK:
            return getattr(super(HeldOpen, self), name)(*args)

    method.__name__ = method.__qualname__ = name
    return method


class HeldOpen:
    """A mixin for a rows source whose dataset is of a file read with ``swmr=True``: its reads hold the lock
    :func:`refresh_swmr` takes to close its open and open it again (NOTE [swmr extent]). The source has
    ``dataset_id`` (its open, an h5py ``DatasetID``) and ``use_dataset(dsid)`` (read through ``dsid`` from now on)."""

    dataset_id: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with _SWMR_LOCK:
            super().__init__(*args, **kwargs)
            _HELD.add(self)

    read_into = _locked("read_into")
    read_runs = _locked("read_runs")
    read_strided = _locked("read_strided")
    prefetch = _locked("prefetch")

    def close(self) -> None:
        with _SWMR_LOCK:
            _HELD.discard(self)
            super().close()  # type: ignore[misc]  # a mixin's: the close of the source it is mixed into


def refresh_swmr(dsid: Any, n_rows: "int | None", where: str) -> None:
    """Bring ``dsid``, of a file read with ``swmr=True``, to the extent flushed last where it has fewer than
    ``n_rows`` rows (None: whatever it has), the library's other opens of it here closed meanwhile and opened again
    (NOTE [swmr extent]); ``OSError`` naming ``where`` if it still has fewer (an open that is not the library's)."""
    import h5py

    if n_rows is not None and dsid.get_space().shape[:1] >= (n_rows,):
        return
    try:  # the lock every h5py call holds: no open of it elsewhere meanwhile (h5py's own, private: kept if it moves)
        from h5py._objects import phil
    except ImportError:  # pragma: no cover - an h5py without it: the race of another thread's open stays
        phil = contextlib.nullcontext()

    with _SWMR_LOCK, phil:
        fid = h5py.h5i.get_file_id(dsid)
        try:
            if not fid.get_intent() & h5py.h5f.ACC_SWMR_READ:
                return
            addr = h5py.h5o.get_info(dsid).addr
            opens = {d.id for d in h5py.h5f.get_obj_ids(fid, types=h5py.h5f.OBJ_DATASET)
                     if h5py.h5o.get_info(d).addr == addr}  # ids: h5py's == says "the same object"
            _refresh_alone(dsid, opens)
        finally:
            fid.close()
    shape = dsid.get_space().shape
    if n_rows is not None and shape[:1] < (n_rows,):
        raise OSError(f"{where} has {shape[0]} rows in this process, not the {n_rows} planned with: another open of "
                      f"it here (an h5py handle) keeps the rows HDF5 saw when it was first opened, and HDF5 refreshes "
                      f"a dataset only where it is open once; close that handle")


def _refresh_alone(dsid: Any, opens: "set[int]") -> None:
    """``dsid.refresh()`` where the opens ``opens`` (ids) other than it are all :class:`HeldOpen`'s, closed meanwhile
    and each opened again through its own file (its ``h5py.File`` closes only what was opened through it)."""
    import h5py

    held = [(holder, holder.dataset_id) for holder in list(_HELD)]
    held = [(holder, other) for holder, other in held if other.valid and other.id in opens and other.id != dsid.id]
    if len(opens) - len(held) != 1:  # another open, not the library's: HDF5 would read wrong rows
        return
    closed = []
    try:
        for holder, other in held:
            closed.append((holder, h5py.h5i.get_file_id(other), h5py.h5i.get_name(other), other.get_access_plist()))
            other.close()
        dsid.refresh()
    finally:
        for holder, ofid, name, dapl in closed:
            try:
                holder.use_dataset(h5py.h5d.open(ofid, name, dapl))
            finally:
                ofid.close()
