"""A seam for ``test_reader_process``: reader 0 of a stream exits with code 0 before it maps its ring, once every other
reader mapped it, as a reader whose imported code calls ``os._exit(0)`` does (or one that found its consumer gone).

Forked readers inherit what :func:`install` patched in the test's process. Spawned ones import this module when they
unpickle the transform :func:`keep`, before their loop runs, and install it then where :data:`ENV` says
``<readers>:<folder>``.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any, Callable

ENV = "MULTITABLES_TEST_LEAVE_EARLY"
#: How long reader 0 waits for the others to map the ring before it leaves anyway.
WAIT = 20.0


def keep(rows: Any) -> Any:
    """The transform that brings this module into a spawned reader."""
    return rows


def _reader_index() -> "int | None":
    name = multiprocessing.current_process().name
    prefix = "multitables-reader-"
    return int(name[len(prefix):]) if name.startswith(prefix) else None


def install(setattr: Callable[[Any, str, Any], None], n_readers: int, marks: Path) -> None:
    """Patch the stream's ``Ring`` with ``setattr``: reader 0 leaves at its attach; every other reader leaves a file in
    ``marks`` once it told the consumer it mapped the ring."""
    from multitables._procs import stream

    attach, map_own_slots = stream.Ring.attach, stream.Ring.map_own_slots

    def leave_first(*args: Any, **kwargs: Any) -> Any:
        if _reader_index() == 0:
            deadline = time.monotonic() + WAIT
            while len(list(marks.iterdir())) < n_readers - 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.2)  # the consumer has counted the others by now
            os._exit(0)
        return attach(*args, **kwargs)

    def mark(self: Any) -> None:  # called just after the reader released its attach semaphore
        (marks / str(_reader_index())).touch()
        map_own_slots(self)

    setattr(stream.Ring, "attach", leave_first)
    setattr(stream.Ring, "map_own_slots", mark)


if os.environ.get(ENV) and _reader_index() is not None:
    _n, _, _folder = os.environ[ENV].partition(":")
    install(setattr, int(_n), Path(_folder))
