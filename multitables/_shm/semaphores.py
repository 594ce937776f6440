"""The names of the semaphores shared with readers: unlinked once every reader has opened them.

NOTE [semaphore names]
    Under the spawn and forkserver start methods each multiprocessing
    semaphore or lock is a named POSIX semaphore (``/dev/shm/sem.mp-*``),
    which a reader opens by name when it unpickles its arguments at its
    start; CPython unlinks the name only in the creator's finalizer, or,
    once every process holding the resource tracker's pipe has exited, in
    the tracker (under fork it is unlinked at creation). A consumer killed
    (a pool's worker that the pool ended: loky, dask's nanny,
    ``Pool.terminate``) ran no finalizer, and its tracker is the pool's
    parent's, alive: a stream left 7 names, a Reader 70, until the pool
    itself ended, more at every restart.

    So, as for a segment (NOTE [segment lifetime] in ``segment``), the
    consumer unlinks the names as soon as every reader has passed the
    attach barrier (``_procs.pool.ReaderPool.wait_attached``): each
    process's handle stays valid, and nothing opens these semaphores by
    name afterwards (a pool starts its readers once; no object holding
    them pickles; a forked child inherits the handles). It does so by
    running the semaphore's own finalizer early, which also takes the
    name off the tracker's list and off the exit handlers (an unlink of
    its own would leave both to fail later). A start that fails keeps
    its names for the finalizers: a reader may still be opening them.

    A consumer killed before that, while its readers start, unlinks
    nothing: so each reader is handed the names as text too, and one that
    finds its consumer gone unlinks them (:func:`unlink_orphan_semaphore`)
    with its segments (NOTE [stuck orphans] in ``_procs.process``). Another
    reader may then not have opened them yet: a reader opens them in its
    own code (``_procs.process.Sealed``), not in the unpickling that its
    start method runs before any code of ours (whose failure printed a
    traceback), and one that finds a name gone fails with nobody left to
    hear it. Names made before the first reader started are left to the
    tracker: nobody else knows them.
"""

from __future__ import annotations

from typing import Any, Iterable

from .segment import untrack


def semaphore_names(semaphores: Iterable[Any]) -> tuple[str, ...]:
    """The names of ``semaphores`` (multiprocessing's) that have one: none under fork (unlinked at creation) or on
    Windows."""
    names = (getattr(getattr(sem, "_semlock", None), "name", None) for sem in semaphores)
    return tuple(name for name in names if name is not None)


def unlink_orphan_semaphore(name: str) -> None:
    """Unlink the semaphore ``name`` that a consumer made and died before it could unlink (a reader's last act: NOTE
    [semaphore names]), and take it off the resource tracker the reader shares with that consumer; a name gone
    already is no error (another reader unlinked it)."""
    from _multiprocessing import sem_unlink

    try:
        sem_unlink(name)
    except FileNotFoundError:
        return
    untrack(name, "semaphore")


def unlink_names(semaphores: Iterable[Any]) -> int:
    """Unlink the names of ``semaphores`` (multiprocessing's, made in this process) that still have one, and unregister
    them from the resource tracker; every process that opened one keeps using it (NOTE [semaphore names]). Returns
    how many were unlinked: none where a CPython keeps these finalizers otherwise than 3.8-3.13 do (the names then
    last as before)."""
    import multiprocessing.synchronize  # here: where sem_open is missing, importing it fails, and n_procs=0 needs none
    import multiprocessing.util

    names = set(semaphore_names(semaphores))
    if not names:  # fork (unlinked at creation) or Windows (no names)
        return 0
    cleanup = getattr(multiprocessing.synchronize.SemLock, "_cleanup", None)
    registry = getattr(multiprocessing.util, "_finalizer_registry", None)
    if cleanup is None or not isinstance(registry, dict):
        return 0
    done = 0
    for finalizer in list(registry.copy().values()):  # a copy: another thread may add or run finalizers meanwhile
        args = getattr(finalizer, "_args", None)
        if getattr(finalizer, "_callback", None) is cleanup and args and args[0] in names:
            try:
                finalizer()  # sem_unlink, then unregister; it leaves the registry (and runs once)
            except OSError:  # the name gone already (someone else's unlink): the tracker keeps it, as before
                continue
            done += 1
    return done
