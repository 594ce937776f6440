"""Waiting awake (NOTE [waiting awake]): a short look before sleeping, and only while answers came that soon."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from multitables._sys.awake import AWAKE, Eagerness, acquire, look


def test_a_look_sees_an_answer_that_comes_while_it_looks() -> None:
    answered = threading.Event()
    threading.Timer(0.001, answered.set).start()
    assert look(answered.is_set, seconds=10.0)
    assert answered.is_set()


def test_a_look_gives_up_after_its_seconds_and_asks_once_more_at_least() -> None:
    asked: "list[float]" = []
    began = time.perf_counter()
    assert not look(lambda: bool(asked.append(time.perf_counter())), seconds=0.002)
    assert asked[-1] - began >= 0.002 and len(asked) >= 2


def test_a_look_at_an_answer_already_there_asks_once() -> None:
    asked: "list[int]" = []
    assert look(lambda: bool(asked.append(1)) or True, seconds=0.0)
    assert asked == [1]


def test_a_side_looks_while_its_last_wait_was_short() -> None:
    awake = Eagerness()
    assert awake.eager  # the first wait looks: nothing is known yet
    awake.saw(AWAKE * 10)
    assert not awake.eager
    awake.saw(AWAKE / 2)
    assert awake.eager


class Tokens:
    """A semaphore's two ways to be asked, recorded: ``acquire(False)`` looks, ``acquire(timeout=...)`` sleeps.

    A token shows up at the ``arrives``-th look, or on a sleep if ``on_sleep``.
    """

    def __init__(self, arrives: "int | None", on_sleep: bool = True) -> None:
        self.arrives, self.on_sleep = arrives, on_sleep
        self.looks = self.sleeps = 0

    def acquire(self, block: bool = True, timeout: "float | None" = None) -> bool:
        if not block:
            self.looks += 1
            return self.arrives is not None and self.looks >= self.arrives
        self.sleeps += 1
        return self.on_sleep


def test_a_token_already_there_is_taken_with_one_look_and_teaches_nothing() -> None:
    awake = Eagerness()
    awake.eager = False
    tokens = Tokens(arrives=1)
    assert acquire(tokens, awake, timeout=1.0)
    assert (tokens.looks, tokens.sleeps) == (1, 0)
    assert not awake.eager  # a wait that never waited says nothing of how long waits are


def test_an_eager_side_takes_a_token_that_comes_while_it_looks_without_sleeping(monkeypatch) -> None:
    # A clock that moves a microsecond a reading: a process descheduled between two looks (a loaded machine) would
    # otherwise make the wait look long, which is another test's case.
    ticks = iter(range(10**6))
    monkeypatch.setattr("multitables._sys.awake.time", SimpleNamespace(perf_counter=lambda: next(ticks) * 1e-6))
    awake = Eagerness()
    tokens = Tokens(arrives=3)
    assert acquire(tokens, awake, timeout=1.0)
    assert tokens.looks == 3 and tokens.sleeps == 0
    assert awake.eager


def test_a_side_whose_waits_are_long_sleeps_at_once() -> None:
    awake = Eagerness()
    awake.eager = False
    tokens = Tokens(arrives=None)
    assert acquire(tokens, awake, timeout=1.0)  # the sleep's token
    assert (tokens.looks, tokens.sleeps) == (1, 1)


def test_a_look_that_finds_nothing_sleeps_then_and_the_side_stops_looking() -> None:
    awake = Eagerness()
    tokens = Tokens(arrives=None, on_sleep=False)
    assert not acquire(tokens, awake, timeout=0.0)
    assert tokens.looks >= 2 and tokens.sleeps == 1
    assert not awake.eager  # it waited AWAKE at least
