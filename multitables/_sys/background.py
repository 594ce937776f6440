"""Work started on a thread of its own, for a result wanted later: a window's order, the next epoch's draw."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def on_thread(name: str, fn: "Callable[..., T]", *args: Any, inline: bool = False) -> "Future[T]":
    """``fn(*args)`` on a daemon thread named ``name`` (or, ``inline``, at once in the caller's): its result, or its
    error with the thread's traceback, by the future's ``result()``. The thread ends with the work; whoever keeps
    the future waits for it before giving up what ``fn`` uses."""
    future: "Future[T]" = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - raised by result(), where the result is wanted
            future.set_exception(exc)

    if inline:
        run()
    else:
        threading.Thread(target=run, name=name, daemon=True).start()
    return future
