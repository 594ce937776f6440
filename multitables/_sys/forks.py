"""Locks in a forked child: a lock another thread of the parent held at the fork stays held there for ever.

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
