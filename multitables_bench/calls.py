"""Timing the calls of one function in place, for the scripts that split a pass into its phases."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable


def time_calls(owner: Any, name: str, done: Callable[[float, float, tuple], None]) -> bool:
    """Replace ``owner.name`` by a wrapper that reports each call as ``done(start, end, args)`` (``perf_counter``
    seconds), raising or not; False, changing nothing, where ``owner`` has no such attribute (another layout of the
    package, under ``PYTHONPATH``)."""
    original = getattr(owner, name, None)
    if original is None:
        return False

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            done(t, time.perf_counter(), args)

    setattr(owner, name, wrapper)
    return True
