"""Forks: the locks a forked child inherits held, and what a start from the fork server costs this process.

NOTE [forking among threads]
    A reader forked while another thread of the consumer held a lock would
    find it held for ever: the child has no such thread to release it.
    Python 3.12 warns of this at every fork from a process with threads.

    * The package's own module-level locks are made anew in every child
      (:func:`renew_lock_in_children`); a test holds every one of them while a
      process forks (``tests/test_reader_process.py``).
    * Other libraries' locks are another matter: h5py holds its own around a
      fork, but an import in flight holds Python's lock for that module, and
      imagecodecs loads each codec on first use under a lock of its own. A
      reader forked while another thread (a stream's consumer, say) loads a
      codec would wait on that lock for ever. So before it forks readers,
      the consumer waits for the reading libraries' imports in flight
      (:func:`finish_imports`) and loads every codec function the chunk
      engine takes (``_io.prefork.before_fork``): no reader loads one of
      those itself; each finds them loaded.

NOTE [fork server]
    Where multiprocessing's fork server starts readers (``forkserver``, Python
    3.14's default on Linux), what a start costs depends on that server, which
    only this process knows of. Its first start is a new interpreter importing
    the readers' modules (0.28-0.32 s here idle, 0.42 s beside two busy
    processes); from a server this library started, which preloads them, each
    later start is about a fork's (0.02-0.03 s); from a server started
    elsewhere, each reader imports them itself. So until a server of ours
    runs, the default reads in the consumer where readers would not pay for
    that first start, and adds up what such streams forgo (what readers from a
    ready server would have saved, less their start:
    ``_plan.readers.would_save_s``); the first start's price is lowered by
    that sum, so that once the streams have forgone it, the next one that
    readers would pay for starts the server, and every later one is cheap:
    rent, then buy, never more than twice the better of the two choices in
    hindsight. The price is ``_plan.costs.start_cost``.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from typing import Any, Iterable


def renew_lock_in_children(scope: "dict[str, Any]", name: str) -> None:
    """Make ``scope[name]`` (a module's ``globals()``, a lock it holds) a new lock in every child this process forks."""

    def renew() -> None:
        scope[name] = threading.Lock()

    os.register_at_fork(after_in_child=renew)


def start_method(asked: "str | None" = None) -> str:
    """The start method readers get: ``asked``, else multiprocessing's default, found without fixing it (as
    ``multiprocessing.get_start_method()`` does): a user's later ``set_start_method`` still works."""
    import multiprocessing

    return asked or multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def finish_imports(names: "Iterable[str]") -> None:
    """Wait until no thread is importing any module of ``names`` (one begun is in ``sys.modules``, and importing it
    again waits for the first to end), so that none is left half-imported in a child forked after this returns."""
    for name in names:
        if name in sys.modules:
            importlib.import_module(name)


#: Fork servers this library started, with the readers' modules preloaded, and what streams forwent meanwhile.
_READY_SERVERS: "set[int]" = set()
_forgone_s = [0.0]


def running_forkserver() -> "int | None":
    """The pid of multiprocessing's fork server where one was started in this process, else None (read where
    multiprocessing keeps it: it has no getter)."""
    from multiprocessing import forkserver

    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


def note_ready_server(pid: "int | None") -> None:
    """``pid``'s fork server was started by this library with the readers' modules preloaded."""
    if pid is not None:
        _READY_SERVERS.add(pid)


def server_ready() -> bool:
    """Whether the running fork server is one this library started with the readers' modules preloaded."""
    return running_forkserver() in _READY_SERVERS


def note_forgone(seconds: float) -> None:
    """A stream read in the consumer where readers from a ready server would have saved ``seconds``."""
    _forgone_s[0] += max(0.0, seconds)


def forgone_so_far() -> float:
    """Seconds this process's streams forwent while no ready fork server ran (:func:`note_forgone`)."""
    return _forgone_s[0]


def _forget_servers() -> None:
    _READY_SERVERS.clear()  # a forked child cannot ask its parent's server for processes
    _forgone_s[0] = 0.0


os.register_at_fork(after_in_child=_forget_servers)
