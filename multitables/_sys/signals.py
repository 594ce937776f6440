"""Ctrl-C and the library's processes: the one place that decides what SIGINT does where.

The consumer decides what Ctrl-C does; readers and readers ignore it, from
their first instruction (:func:`sigint_held_for_children`,
:func:`ignore_sigint`), and the consumer holds it back while it creates a
shared-memory segment (:func:`sigint_deferred`, NOTE [creation span] in
``_shm.segment``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def sigint_held_for_children() -> Iterator[None]:
    """Hold off SIGINT in this thread while it starts processes: see :func:`ignore_sigint`.

    A process inherits the signal mask through fork and exec, so a Ctrl-C
    that reaches a new process before its entry point runs (a spawned
    interpreter takes a while to import) stays pending in it until it is
    ignored there. In this thread it is delivered when the ``with`` ends.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_sigint() -> None:
    """The first thing every reader does: ignore Ctrl-C, then drop any that came while it started.

    Ctrl-C goes to the whole foreground process group; the consumer decides
    what happens (it stops us), so our processes ignore it, from before
    their first instruction (:func:`sigint_held_for_children`).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextmanager
def sigint_deferred(later: bool = False) -> Iterator[None]:
    """Hold a Ctrl-C that comes during the ``with`` until its end (NOTE [creation span]).

    Python raises ``KeyboardInterrupt`` in the main thread only, between any
    two instructions; elsewhere there is nothing to hold. Where Python's
    handler is not the one installed (``getsignal`` says None), nothing is
    changed.

    ``later``: for a clean-up that may run as a finalizer (a queue or a
    generator dropped), where Python prints an exception and drops it
    ("Exception ignored in"): a Ctrl-C raised there was lost, and cut the
    clean-up short (readers and names left until exit). The Ctrl-C held is
    sent again from a thread of its own once the ``with`` ends, so that Python
    raises it in the main thread's own code, after the finalizer.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    caught: list[object] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if caught and later:
            threading.Thread(target=_send_sigint, name="multitables-sigint", daemon=True).start()
        elif caught:
            if callable(old):
                old(signal.SIGINT, caught[0])
            elif old == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)


#: Seconds a Ctrl-C held over a clean-up waits to be sent again: the finalizer around it returns in microseconds.
REDELIVER_S = 0.01


def _send_sigint() -> None:
    time.sleep(REDELIVER_S)
    signal.raise_signal(signal.SIGINT)  # whatever handles SIGINT then: Python's raises it in the main thread
