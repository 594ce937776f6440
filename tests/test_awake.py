"""Waiting awake (NOTE [waiting awake]): a short look before sleeping, and only while answers came that soon."""

from __future__ import annotations

import threading
import time

from multitables._sys.awake import AWAKE, Eagerness, look


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
