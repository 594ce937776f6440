"""Ctrl-C and the library's processes: the one place that decides what SIGINT (and SIGTERM, SIGHUP) do where.

The consumer decides what Ctrl-C (and a scheduler's SIGUSR1 or SIGUSR2) does;
readers ignore it, from their first instruction (:func:`sigint_held_for_children`, :func:`ignore_sigint`), and
the consumer holds it back, with the other signals that end a program,
while it creates a shared-memory segment, starts a reader or cleans up
after a dropped stream (:func:`signals_deferred`, NOTE [creation span] in
``_shm.segment``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator


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
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def signals_deferred(later: bool = False) -> Iterator[None]:
    """Hold a signal of :data:`HELD` that comes during the ``with`` until its end (NOTE [creation span]).

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
    caught: list[tuple[int, object]] = []
    old = {}
    for signum in HELD:
        handler = signal.getsignal(signum)
        if handler is not None and handler != signal.SIG_IGN:
            old[signum] = signal.signal(signum, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
        first = {signum: frame for signum, frame in reversed(caught)}  # each signal once, as the kernel has it
        if first and later:
            threading.Thread(target=_send_again, args=(list(first),), name="multitables-signal", daemon=True).start()
        elif first:
            for signum, frame in first.items():
                if callable(old[signum]):
                    old[signum](signum, frame)
                elif old[signum] == signal.SIG_DFL:
                    os.kill(os.getpid(), signum)


#: Seconds a signal held over a clean-up waits to be sent again: the finalizer around it returns in microseconds.
REDELIVER_S = 0.01


def _send_again(signums: "list[int]") -> None:
    time.sleep(REDELIVER_S)
    for signum in signums:
        signal.raise_signal(signum)  # whatever handles it then: a Python handler runs in the main thread
