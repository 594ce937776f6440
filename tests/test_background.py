"""Work on a thread of its own (``multitables._sys.background``): its result, or its error with the thread's frames."""

from __future__ import annotations

import threading
import traceback

import pytest

from multitables._sys.background import on_thread


def test_the_result_comes_from_the_named_thread_or_at_once_from_the_callers() -> None:
    assert on_thread("multitables-test", lambda a, b: (a + b, threading.current_thread().name), 2, 3).result(5) == (
        5, "multitables-test")
    assert on_thread("multitables-test", threading.current_thread, inline=True).result() is threading.current_thread()


@pytest.mark.parametrize("inline", [False, True])
def test_an_error_is_raised_by_result_with_the_frames_it_rose_through(inline: bool) -> None:
    def no_room() -> None:
        raise MemoryError("no room")

    future = on_thread("multitables-test", no_room, inline=inline)
    with pytest.raises(MemoryError, match="no room") as info:
        future.result(5)
    assert "no_room" in "".join(traceback.format_tb(info.value.__traceback__))
