"""Work started on a thread of its own, for a result wanted later: a window's order, the next epoch's draw, the data
of an awaited future."""

from __future__ import annotations

import queue
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


class DaemonThreads:
    """Daemon threads named ``name`` that run the calls :meth:`submit` hands them, one each, reused.

    A call waits for an idle thread's, or starts one: as many run at once as
    are submitted (the caller bounds them). A thread idle for ``idle`` s ends;
    :meth:`shutdown` ends the idle ones at once, the busy ones after their
    call. Daemon threads, unlike ``ThreadPoolExecutor``'s, never hold the
    interpreter's exit.
    """

    def __init__(self, name: str, idle: float = 10.0) -> None:
        self._name = name
        self._idle_s = idle
        self._calls: "queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a call
        self._threads = 0
        self._shut = False

    def submit(self, fn: "Callable[[], T]") -> "Future[T]":
        """``fn()`` on one of the threads; its result or error by the future's. RuntimeError once shut down."""
        future: "Future[T]" = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError(f"the {self._name} threads are shut down")
            if self._idle:
                self._idle -= 1
            else:
                self._threads += 1
                threading.Thread(target=self._run, name=f"{self._name}-{self._threads}", daemon=True).start()
            self._calls.put((future, fn))
        return future

    def shutdown(self) -> None:
        """End the idle threads now, the others once their call returns; no more calls are taken (idempotent)."""
        with self._lock:
            self._shut = True
            for _ in range(self._threads):
                self._calls.put(None)

    def _run(self) -> None:
        while True:
            try:
                got = self._calls.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if not self._idle:  # a call was handed to this thread just now: take it
                        continue
                    self._idle -= 1
                    self._threads -= 1
                    return
            if got is None:
                return
            future, fn = got
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - raised by result(), where the result is wanted
                    future.set_exception(exc)
                del future, fn, got  # nothing of the call kept while idle
            with self._lock:
                self._idle += 1
