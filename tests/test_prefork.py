"""Just before a fork of a process that reads (a reader, the PyTables probe), the consumer leaves no lock of a reading
library held by a thread the child will not have (NOTE [forking among threads] in ``_sys.forks``)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from multitables._io import prefork


@pytest.fixture
def slow_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A reading library whose import takes 0.3 s, being imported by another thread when the test begins; ``done``
    is set on the module once its import ends."""
    name = "multitables_test_slow_library"
    (tmp_path / f"{name}.py").write_text("import time\ntime.sleep(0.3)\ndone = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(prefork, "READING_LIBRARIES", prefork.READING_LIBRARIES + (name,))
    importer = threading.Thread(target=__import__, args=(name,))
    importer.start()
    while name not in sys.modules:  # begun
        time.sleep(0.001)
    yield name
    importer.join()
    sys.modules.pop(name, None)


def test_before_fork_waits_for_a_reading_librarys_import_in_flight(slow_library: str) -> None:
    assert not hasattr(sys.modules[slow_library], "done")
    prefork.before_fork()
    assert sys.modules[slow_library].done


def test_the_pytables_probe_forks_only_once_the_import_has_ended(
    slow_library: str, make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import multiprocessing.context

    from multitables._io.node import inspect_node
    from multitables._io.tables_engine import _first_row_problem_apart

    path = make_array(np.arange(64, dtype="<f4").reshape(16, 4))
    imported_at_fork: "list[bool]" = []
    start = multiprocessing.context.ForkProcess.start

    def recorded(process: multiprocessing.context.ForkProcess) -> None:
        imported_at_fork.append(hasattr(sys.modules[slow_library], "done"))
        start(process)

    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", recorded)
    assert _first_row_problem_apart(inspect_node(path, "/data"), {}) is None
    assert imported_at_fork == [True]
