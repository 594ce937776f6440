"""Ctrl-C and the library's processes: the one place that decides what SIGINT (and SIGTERM, SIGHUP) do where.

The consumer decides what Ctrl-C (and a scheduler's SIGUSR1 or SIGUSR2) does;
readers ignore it, from their first instruction (:func:`sigint_held_for_children`, :func:`ignore_sigint`), and
the consumer holds it back, with the other signals that end a program,
while it creates a shared-memory segment, starts a reader or cleans up
after a dropped stream (:func:`signals_deferred`, NOTE [creation span] in
``_shm.segment``).

NOTE [a handler's exception]
    Python runs a signal handler in the main thread, between two
    instructions of whatever runs then: a read in the user's own process
    (``n_procs=0``, a stream too small for readers) may be inside a codec's
    call when the user's handler raises (a ``SIGALRM`` timeout, a
    checkpoint signal). That exception is the user's, not the read's: the
    places that turn a read's failure into one of ours (a codec's
    ``ChunkDecodeError``, a ``Reader<Name>`` in the consumer's form of a
    reader's failure, a node's ``NodeTypeError``, PyTables' refusal by a
    probe run here) or read again after one (the fall-backs of a block
    read, of HDF5's chunks) let it through unchanged, as they do a
    ``KeyboardInterrupt``; and the stream goes on from the block it
    interrupted, which a caller who caught it gets next (a block read here
    is used up once read; the queue's iterator and the generator outlive
    it, ``_stream.rows.walked``). It is known by its traceback, which holds the
    handler's frame: the code of a handler ``signal.getsignal`` names now
    (a handler that put another in its place before it raised is not seen,
    and its exception is wrapped as before). Reader processes ignore the
    signals the consumer acts on (:func:`ignore_sigint`) and keep their own
    form of a failure.
"""

from __future__ import annotations

import _signal
import functools
import itertools
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any, Iterator


#: Signals sent to every process of a job, which the consumer alone acts on: Ctrl-C (the terminal's whole foreground
#: group), and the warnings schedulers send every process of a job step before its end (SLURM's ``--signal=USR1@60``
#: without ``B:``, SGE's ``-notify``): a reader would die of one (their default action), or run the handler the
#: user's program installed, inherited through fork (saving a checkpoint, raising to leave the loop).
LEFT_TO_CONSUMER = (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


@contextmanager
def sigint_held_for_children() -> Iterator[None]:
    """Hold off :data:`LEFT_TO_CONSUMER` in this thread while it starts processes: see :func:`ignore_sigint`.

    A process inherits the signal mask through fork and exec, so a Ctrl-C
    that reaches a new process before its entry point runs (a spawned
    interpreter takes a while to import) stays pending in it until it is
    ignored there. In this thread it is delivered when the ``with`` ends.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(LEFT_TO_CONSUMER))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_sigint() -> None:
    """The first thing every reader does: ignore Ctrl-C (and the rest of :data:`LEFT_TO_CONSUMER`), then drop any
    that came while it started.

    Ctrl-C goes to the whole foreground process group, a scheduler's warning
    to every process of the job; the consumer decides what happens (it stops
    us), so our processes ignore them, from before their first instruction
    (:func:`sigint_held_for_children`).
    """
    for signum in LEFT_TO_CONSUMER:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(LEFT_TO_CONSUMER))


#: The signals the consumer holds over its critical spans: those that end a program (Ctrl-C, a terminal's hangup,
#: ``kill`` and ``docker stop``), whose Python handlers raise (``KeyboardInterrupt``, a handler's ``sys.exit``).
#: Any other signal whose handler is Python's is held too: it may raise (a scheduler's warning turned into leaving
#: the loop, a timeout's alarm), and a clean-up cut short by it is not always done again (a reader reaped by a
#: ``waitpid`` whose answer the exception dropped is never marked ended: its pipe stays open).
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _held() -> "dict[int, Any]":
    """The signals to hold, each with its handler now: those of :data:`HELD` Python handles and does not ignore, and
    every signal whose handler is Python code (read raw, as :func:`raised_by_handler` does: ~3 us for all)."""
    held = {}
    for signum, handler in enumerate(map(_signal.getsignal, range(1, signal.NSIG)), 1):
        if callable(handler) or signum in HELD and handler is not None and handler != signal.SIG_IGN:
            held[signum] = handler
    return held


@contextmanager
def signals_deferred(later: bool = False) -> Iterator[None]:
    """Hold a signal of :func:`_held` that comes during the ``with`` until its end (NOTE [creation span]).

    Python runs a signal's handler in the main thread only, between any two
    instructions; elsewhere there is nothing to hold. A signal ignored, or
    whose handler Python did not install (``getsignal`` says None), is left
    alone. Held, a handler cannot raise inside a hook Python calls where it
    prints an exception and drops it ("Exception ignored in"), such as the
    ``os.register_at_fork`` hooks around a reader's start: a Ctrl-C, or the
    ``SystemExit`` of a SIGTERM handler, was lost there. About 18 us a span
    (9 us for SIGINT alone).

    ``later``: for a clean-up that may itself run as a finalizer (a queue or
    a generator dropped), where an exception raised at the ``with``'s end
    would be dropped too, and cut the clean-up short (readers and names left
    until exit). The signal held is sent again from a thread of its own once
    the ``with`` ends, so that its handler runs in the main thread's own
    code, after the finalizer.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, FrameType | None]] = []
    old = _held()  # before any is replaced: a handler's exception while they are leaves them to the finally
    try:
        # All at once in C (map, and ``_signal``'s: ``signal.signal`` is Python, where a handler ran between two and
        # left the later ones replaced): no handler runs between two, so none is left replaced, nor one raises halfway.
        list(map(_signal.signal, old, itertools.repeat(lambda signum, frame: caught.append((signum, frame)))))
        yield
    finally:
        sent = later and bool(caught)
        if sent:  # started while they are held: a handler landing inside Thread.start left it half-made
            _send_later(caught)
        list(map(_signal.signal, old, old.values()))
        first = {signum: frame for signum, frame in reversed(caught)}  # each signal once, as the kernel has it
        if later:
            if first and not sent:
                _send_later(caught)  # one that came between the two (microseconds)
        elif first:
            for caught_signum, frame in first.items():
                handler = old[caught_signum]
                if callable(handler):
                    handler(caught_signum, frame)
                elif handler == signal.SIG_DFL:
                    os.kill(os.getpid(), caught_signum)


#: Seconds a signal held over a clean-up waits at most for the main thread to leave it (NOTE [a signal sent again]).
REDELIVER_S = 2.0


def _send_later(caught: "list[tuple[int, FrameType | None]]") -> None:
    """Send the signals ``caught`` (read once the main thread has left the clean-up, so those caught meanwhile too)
    again from a thread of its own (NOTE [a signal sent again])."""
    inside: "list[tuple[int, object]]" = []
    frame: "FrameType | None" = sys._getframe(2)  # the clean-up's: from the ``with``'s frame out to the first not ours
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _CLEAN_UP_MODULES:
        inside.append((id(frame), frame.f_code))
        frame = frame.f_back
    thread = threading.Thread(target=_send_again, args=(caught, inside, threading.main_thread().ident),
                              name="multitables-signal", daemon=True)
    thread.start()


#: The modules whose frames a clean-up run as a finalizer spans: ours, the ``with``'s and a ``weakref.finalize``'s.
_CLEAN_UP_MODULES = frozenset({"multitables", "contextlib", "weakref"})


def _send_again(caught: "list[tuple[int, FrameType | None]]", inside: "list[tuple[int, object]]", main: "int | None"
                ) -> None:
    """Send the signals ``caught`` again once the main thread has left the frames ``inside``.

    NOTE [a signal sent again]
        A signal held over a clean-up that may run as a finalizer is sent again once the main thread has left it:
        its handler, run in the main thread, then raises in the user's own code, not in the finalizer, where Python
        would print the exception and drop it. A fixed delay did not do (10 ms: a loaded machine's finalizer ran
        longer, and the handler raised inside it). Its thread looks at the main thread's frames every millisecond
        (by identity and code: the frames are not kept alive) for at most :data:`REDELIVER_S`, then sends anyway.
    """
    deadline = time.monotonic() + REDELIVER_S
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(main) if main is not None else None
        if frame is None or not inside:
            break
        on_stack = set()
        while frame is not None:
            on_stack.add((id(frame), frame.f_code))
            frame = frame.f_back
        del frame
        if on_stack.isdisjoint(inside):
            break
        time.sleep(0.001)
    for signum in {signum: None for signum, _ in caught}:  # each once, in the order they came
        signal.raise_signal(signum)  # whatever handles it then: a Python handler runs in the main thread


def raised_by_handler(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a Python signal handler this process has (NOTE [a handler's exception]).

    Asked on the error path only: about 5 us, none for an error raised in the catching frame itself (a library's,
    in C), which no handler's frame lies under (HDF5's error for each chunk not written, in the h5py engine's
    fall-back).
    """
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None else None  # the frames below the one that catches (ours, not a handler)
    if tb is None or threading.current_thread() is not threading.main_thread():  # Python runs handlers there only
        return False
    # The C function's answers as they are (SIG_DFL and SIG_IGN as numbers): ``signal.getsignal`` makes an enum of
    # each, 140 us for every signal.
    handlers = [h for h in map(_signal.getsignal, range(1, signal.NSIG)) if callable(h)]
    codes = {code for code in map(_code_of, handlers) if code is not None}
    while tb is not None and codes:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def _code_of(handler: object) -> "CodeType | None":
    """The code a Python handler runs (a function's, a method's, a ``functools.partial``'s or a callable object's ``__call__``);
    None for a handler in C (Python's own for SIGINT)."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    code = getattr(handler, "__code__", None)  # a function, or a method (which lends its function's)
    if code is None and not isinstance(handler, type):
        code = getattr(getattr(type(handler), "__call__", None), "__code__", None)
    return code if isinstance(code, CodeType) else None
