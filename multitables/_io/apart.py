"""Checks that may crash the process, run in a forked child (the PyTables engine's probe): a crash is an answer.

:func:`each_apart` runs a check on many items in one child, so that the
fork (0.2 s beside a large parent) is paid once per call, not per item, and
still tells which item the child died on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from .._sys.forks import collector_paused_for_readers
from .prefork import before_fork

T = TypeVar("T")


@dataclass(frozen=True)
class Died:
    """A child's end before it answered on an item: ``how`` (``exit code 1``, ``signal SIGSEGV``), None where it
    hung past the timeout."""

    how: "str | None"


def each_apart(check: Callable[[T], Any], items: Sequence[T], timeout: float) -> "list[Any]":
    """``check(item)`` of each of ``items`` (a picklable answer each), run in one forked child where there is fork and
    this process may start one, else here; a :class:`Died` for an item the child died or hung (``timeout`` seconds
    for each answer) on.

    A child that dies on an item answers no further: the items after it are
    checked in another child. One that died on an item after others is no
    verdict on that item (what the check did to the child before may be the
    cause): it is checked again first in the next child, and a :class:`Died`
    only where a child dies on it first.
    """
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.current_process().daemon:
        return [check(item) for item in items]  # not Linux, or a daemonic process, which may start none
    ctx = multiprocessing.get_context("fork")
    answers: "list[Any]" = []
    while len(answers) < len(items):
        answers += _run(check, items[len(answers):], timeout, ctx)
    return answers


def _child(conn: Any, check: Callable[[Any], Any], items: Sequence[Any]) -> None:
    from .._sys.signals import ignore_sigint

    ignore_sigint()
    for item in items:  # each answer as it is known: the first item without one is the one it died on
        conn.send(check(item))
    conn.close()


def _run(check: Callable[[T], Any], items: Sequence[T], timeout: float, ctx: Any) -> "list[Any]":
    """The answers of one forked child on the first of ``items`` (one at least), up to one it died or hung on."""
    import signal

    before_fork()  # as a reader's fork
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, check, items), name="multitables-probe", daemon=True)
    answers: "list[Any]" = []
    try:
        with collector_paused_for_readers():  # NOTE [the consumer's garbage]
            proc.start()
        send.close()
        answered = True
        while answered and len(answers) < len(items):
            answered = recv.poll(timeout)
            try:
                if answered:
                    answers.append(recv.recv())
            except EOFError:
                break  # it died before answering
        if len(answers) == len(items):
            return answers
        proc.join(timeout if answered else 0)
        if proc.exitcode is None:
            return answers + [Died(None)]
        if answers:
            return answers  # the item it died on is checked again, first in the next child
        if proc.exitcode < 0:
            return [Died(f"signal {signal.Signals(-proc.exitcode).name}")]
        return [Died(f"exit code {proc.exitcode}")]
    finally:
        send.close()
        recv.close()
        if proc.is_alive():
            proc.kill()
        if proc.pid is not None:
            proc.join()
            proc.close()
