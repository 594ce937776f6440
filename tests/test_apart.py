"""Checks run in a forked child (``_io.apart``): one child for many items, a death told as the item's it died on."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multitables._io.apart import Died, each_apart


@pytest.fixture
def forked(monkeypatch) -> "list[int]":
    """One entry per child forked."""
    import multiprocessing.context

    started: list[int] = []
    start = multiprocessing.context.ForkProcess.start
    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", lambda p: (started.append(1), start(p))[1])
    return started


def _die() -> None:
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # no faulthandler dump
    os.kill(os.getpid(), signal.SIGSEGV)


def test_many_items_are_checked_in_one_child(forked, no_leaks) -> None:
    assert each_apart(lambda i: (i * i, os.getpid()), list(range(50)), 10.0)[7][0] == 49
    assert len({pid for _, pid in each_apart(lambda i: (i, os.getpid()), list(range(50)), 10.0)}) == 1
    assert len(forked) == 2


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 8), data=st.data())
def test_the_items_a_child_dies_on_are_told_and_the_others_answered(n: int, data: Any) -> None:
    fatal = data.draw(st.sets(st.integers(0, n - 1)))

    def check(i: int) -> int:
        if i in fatal:
            _die()
        return i * 10

    assert each_apart(check, list(range(n)), 10.0) == [Died("signal SIGSEGV") if i in fatal else i * 10 for i in range(n)]


def test_a_death_caused_by_the_items_before_is_no_verdict(forked, no_leaks) -> None:
    checked: list[int] = []  # in the child: what it checked before

    def check(i: int) -> int:
        if i == 3 and checked:  # dies only after others: their doing, not item 3's
            _die()
        checked.append(i)
        return i

    assert each_apart(check, list(range(6)), 10.0) == list(range(6))
    assert len(forked) == 2  # item 3 first in the second child


def test_an_exit_and_a_hang_are_told(forked, no_leaks) -> None:
    def check(i: int) -> int:
        if i == 1:
            os._exit(3)
        if i == 2:
            time.sleep(30)
        return i

    assert each_apart(check, [0, 1, 2, 3], 0.5) == [0, Died("exit code 3"), Died(None), 3]
