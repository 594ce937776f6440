"""A signal handler's exception in a read of the user's own process (NOTE [a handler's exception] in ``_sys.signals``):
it reaches the user as it was raised, never wrapped as the read's failure nor swallowed by a fall-back; a real decode
failure is still wrapped, with its context.

Deterministic: the handler runs inside the decode step because that step sends the signal itself (Python runs the
handler before the next instruction of the sending frame)."""

from __future__ import annotations

import functools
import os
import signal
import threading
from typing import Any, Callable, Iterator

import pytest

from multitables._sys.signals import raised_by_handler


class Checkpoint(Exception):
    """What the user's handler raises: a scheduler's warning, turned into leaving the loop."""


def _raise(kind: type, signum: int, frame: Any) -> None:
    raise kind(f"signal {signum}")


@pytest.fixture
def handler() -> Iterator[Callable[[type], None]]:
    """``handler(kind)``: SIGUSR1's handler raises ``kind`` (Checkpoint at first); the old handler is put back."""
    old = signal.signal(signal.SIGUSR1, functools.partial(_raise, Checkpoint))
    yield lambda kind: signal.signal(signal.SIGUSR1, functools.partial(_raise, kind)) and None
    signal.signal(signal.SIGUSR1, old)


def signalling(fn: Callable[..., Any], times: int = 1) -> Callable[..., Any]:
    """``fn``, whose first ``times`` calls send SIGUSR1 to this process first: its handler runs in this call."""
    left = [times]

    def call(*args: Any, **kwargs: Any) -> Any:
        if left[0] > 0:
            left[0] -= 1
            os.kill(os.getpid(), signal.SIGUSR1)
        return fn(*args, **kwargs)

    return call


def _caught(fn: Callable[[], Any]) -> BaseException:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("nothing raised")


def test_a_handlers_exception_is_known_in_any_form_of_handler(handler: Callable[[type], None]) -> None:
    class Handler:
        def __call__(self, signum: int, frame: Any) -> None:
            raise Checkpoint

        def method(self, signum: int, frame: Any) -> None:
            self(signum, frame)  # raised a frame below the handler's

    for form in (Handler(), Handler().method, functools.partial(_raise, Checkpoint), lambda s, f: _raise(Checkpoint, s, f)):
        signal.signal(signal.SIGUSR1, form)
        assert raised_by_handler(_caught(signalling(lambda: None)))
    assert not raised_by_handler(_caught(lambda: _raise(Checkpoint, 0, None)))  # the same code, not run as a handler
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    exc = _caught(lambda: _raise(Checkpoint, 0, None))
    assert not raised_by_handler(exc)
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(raised_by_handler(exc)))  # handlers run in the main thread only
    thread.start()
    thread.join()
    assert seen == [False]
