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

NOTE [the consumer's garbage]
    A forked reader inherits the consumer's heap, with whatever garbage
    waited there for Python's cycle collector: a PyTorch model's, a CUDA
    tensor in a cycle. A reader's own collections would free it in the
    reader, and a CUDA tensor freed in a forked child aborts it (CUDA cannot
    run there: on a lent H200 a reader died of SIGABRT so, freeing a
    PyTorch tensor of a device staging the consumer had left to the
    collector), besides writing to pages it shared with the consumer. So the collector is
    paused in the consumer while it forks readers
    (:func:`collector_paused_for_readers`), and each reader first freezes the
    heap it inherited (``gc.freeze``: no collection looks at those objects
    again), then collects its own as the consumer did. Other forks of the
    consumer (the user's own) are left as they were.

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

NOTE [the main script again]
    Readers started by ``spawn`` or ``forkserver`` (Python 3.14's default on
    Linux) run the main script again, as a module of another name, before
    they read (from 3.13.8 and 3.14.1 the fork server runs it once, for all).
    A script that reads at its top level, outside ``if __name__ ==
    "__main__":``, would start readers there too, which multiprocessing
    refuses: the readers died, and the consumer saw only that (or, where the
    fork server runs it, a bare ``EOFError``). A function defined under that
    guard is not defined in them either. So the consumer reads the script
    (``ast``) before it starts a reader, and refuses either case, naming the
    line: a call from a top-level line in no ``if`` at all
    (:func:`unguarded_main_call`: any ``if`` may be a guard of the user's
    own), a transform defined under ``if __name__ == "__main__":``
    (:func:`under_main_guard`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gc
import importlib
import os
import sys
import threading
from types import FrameType
from typing import Any, Iterable, Iterator


def renew_lock_in_children(scope: "dict[str, Any]", name: str, make: Any = threading.Lock) -> None:
    """Make ``scope[name]`` (a module's ``globals()``, a lock it holds) a new lock (``make()``: a ``threading.Lock``,
    or an ``RLock``) in every child this process forks."""

    def renew() -> None:
        scope[name] = make()

    os.register_at_fork(after_in_child=renew)


_PARSE_LOCK = threading.Lock()
renew_lock_in_children(globals(), "_PARSE_LOCK")

#: While readers are forked (by any thread: ``_PAUSES`` at once): whether the collector was on in the consumer before
#: the first, for the child to turn on again after it froze its inherited heap (None: the forks now are not readers).
_COLLECTING: "bool | None" = None
_PAUSES = 0
_PAUSING = threading.Lock()
renew_lock_in_children(globals(), "_PAUSING")


@contextlib.contextmanager
def collector_paused_for_readers() -> Iterator[None]:
    """Around the forks of readers: no collection runs from before a fork until the child froze the heap it inherited
    (NOTE [the consumer's garbage]); the collector as it was in the consumer after the last thread's forks."""
    global _COLLECTING, _PAUSES
    with _PAUSING:
        if not _PAUSES:
            _COLLECTING = gc.isenabled()
            gc.disable()
        _PAUSES += 1
    try:
        yield
    finally:
        with _PAUSING:
            _PAUSES -= 1
            if not _PAUSES:
                if _COLLECTING:
                    gc.enable()
                _COLLECTING = None


def _freeze_inherited_heap() -> None:
    global _COLLECTING, _PAUSES
    if _COLLECTING is not None:  # a reader: the consumer's garbage is not this process's to collect
        gc.freeze()
        if _COLLECTING:
            gc.enable()
    _COLLECTING, _PAUSES = None, 0  # the pauses are the parent's threads'


os.register_at_fork(after_in_child=_freeze_inherited_heap)


def start_method(asked: "str | None" = None) -> str:
    """The start method readers get: ``asked``, else multiprocessing's default, found without fixing it (as
    ``multiprocessing.get_start_method()`` does): a user's later ``set_start_method`` still works."""
    import multiprocessing

    standard = multiprocessing.get_all_start_methods()
    default = multiprocessing.get_start_method(allow_none=True)
    # A pool's worker may run under a start method of the pool's own (joblib's loky sets 'loky' in its workers), whose
    # processes multiprocessing cannot close ("'Popen' object has no attribute 'close'") and whose semaphores its own
    # tracker counts as leaked: readers start by the platform's default there, as asking for one does.
    return asked or (default if default in standard else standard[0])


def _main_script() -> "tuple[Any, ast.Module] | None":
    """The ``__main__`` module and its parsed file, where it is a Python file that spawn and forkserver run again."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not path.endswith(".py"):
        return None
    tree = _parse(os.path.abspath(path))
    return None if tree is None else (main, tree)


def _parse(path: str) -> "ast.Module | None":
    # One thread at a time, once: CPython 3.11's ast counts its recursion in one place for every thread, and two
    # parses at once (a dask worker's threads, each making a Reader) failed with "AST constructor recursion depth
    # mismatch"; lru_cache alone lets both miss.
    with _PARSE_LOCK:
        return _parse_once(path)


@functools.lru_cache(maxsize=4)
def _parse_once(path: str) -> "ast.Module | None":
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def _top_statement(tree: "ast.Module", line: int) -> "ast.stmt | None":
    return next((s for s in tree.body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)


def unguarded_main_call() -> "tuple[str, int] | None":
    """The main script's file and line where its top level called into this library from a line in no ``if``, which
    a process started by spawn or forkserver runs again; else None (NOTE [the main script again])."""
    found = _main_script()
    if found is None:
        return None
    main, tree = found
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    top = _top_statement(tree, line)
    if top is None or any(isinstance(n, ast.If) and n.lineno <= line <= (n.end_lineno or 0) for n in ast.walk(top)):
        return None
    return main.__file__, line


def under_main_guard(function: Any) -> bool:
    """Whether ``function`` of the main script is defined under ``if __name__ == "__main__":``, which a process that
    runs the script again does not define (NOTE [the main script again])."""
    found = _main_script() if getattr(function, "__module__", None) == "__main__" else None
    code = getattr(function, "__code__", None)
    if found is None or code is None or os.path.abspath(code.co_filename) != os.path.abspath(found[0].__file__):
        return False
    top = _top_statement(found[1], code.co_firstlineno)
    if not (isinstance(top, ast.If) and isinstance(top.test, ast.Compare) and len(top.test.ops) == 1):
        return False
    test = top.test
    sides = {ast.dump(test.left), ast.dump(test.comparators[0])}
    guard = {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}
    is_guard = isinstance(test.ops[0], ast.Eq) and sides == guard
    return is_guard and top.body[0].lineno <= code.co_firstlineno <= (top.body[-1].end_lineno or 0)


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
