"""Unmapping off the caller's path (NOTE [release off the path]): a stream closed after its pass's last block has its
ring unmapped on a thread of its own, one stopped early or holding lent rows before its close returns, and no reader
is forked while an unmapping runs."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import multitables
from multitables._shm import ring
from multitables._sys import release
from multitables._sys.release import release_later, settle_releases

ROWS, WIDTH = 4096, 64


@pytest.fixture
def path(make_array: Callable[..., Path]) -> Path:
    return make_array(np.arange(ROWS * WIDTH, dtype=np.float32).reshape(ROWS, WIDTH), chunkshape=(64, WIDTH))


@pytest.fixture
def handed_off(monkeypatch: pytest.MonkeyPatch) -> "list[Callable[[], None]]":
    """The unmappings the ring hands to :func:`release_later` (they still run)."""
    seen: "list[Callable[[], None]]" = []

    def record(unmap: Callable[[], None]) -> None:
        seen.append(unmap)
        release_later(unmap)

    monkeypatch.setattr(ring, "release_later", record)
    return seen


def test_a_closed_streams_ring_is_unmapped_off_the_path_and_gone_once_settled(
    path: Path, handed_off: "list[Callable[[], None]]", shm_mappings: Callable[[], list[str]], no_leaks: None
) -> None:
    with multitables.Streamer(str(path)).get_queue("/data", n_procs=2, block_size=256) as queue:
        for guard in queue.iter():
            with guard as block:
                assert block.shape[1] == WIDTH
            del block
        assert shm_mappings()  # the ring, mapped while the stream lives
    assert len(handed_off) == 1  # the close gave its unmapping away
    settle_releases()
    assert shm_mappings() == []


def test_a_block_kept_past_its_queue_keeps_its_bytes_and_its_slot_alone(
    path: Path, handed_off: "list[Callable[[], None]]", shm_mappings: Callable[[], list[str]], no_leaks: None
) -> None:
    """NOTE [segment lifetime]: ``with guard as block`` leaves ``block`` bound after the loop; a use of it after the
    close breaks the guard's contract, but reads its last block rather than crash the process (the slot was
    unmapped under it). The ring's other pages go at the close, off the path, and the slot's with the block."""
    with multitables.Streamer(str(path)).get_queue("/data", n_procs=2, block_size=256, ordered=True) as queue:
        for guard in queue.iter():
            with guard as block:
                pass
    assert len(handed_off) == 1
    settle_releases()
    assert len(shm_mappings()) == 1  # the slot under block, nothing else
    np.testing.assert_array_equal(block, np.arange((ROWS - 256) * WIDTH, ROWS * WIDTH, dtype=np.float32).reshape(256, WIDTH))
    del block  # the last array on the slot: the closed queue does not hold its mapping
    assert shm_mappings() == []


def test_a_stream_stopped_early_is_unmapped_before_its_close_returns(
    path: Path, handed_off: "list[Callable[[], None]]", shm_mappings: Callable[[], list[str]], no_leaks: None
) -> None:
    with multitables.Streamer(str(path)).get_queue("/data", n_procs=2, block_size=256) as queue:
        with queue.get():
            pass
    assert handed_off == [] and shm_mappings() == []  # a break, an error, Ctrl-C: as the failure tests expect


def test_rows_the_generator_lent_keep_their_bytes_and_the_close_unmaps_at_once(
    path: Path, handed_off: "list[Callable[[], None]]", shm_mappings: Callable[[], list[str]]
) -> None:
    stream = multitables.Streamer(str(path))
    gen = stream.get_generator("/data", n_procs=2, block_size=256, ordered=True)  # else the first rows may be any block's
    kept = [next(gen) for _ in range(3)]  # rows of a lent slot
    gen.close()
    assert handed_off == []  # rows are lent: moved to private memory first, on the caller's path
    assert shm_mappings() == []
    np.testing.assert_array_equal(np.stack(kept), np.arange(3 * WIDTH, dtype=np.float32).reshape(3, WIDTH))


def test_no_reader_is_forked_while_an_unmapping_runs(path: Path, no_leaks: None) -> None:
    ended: "list[float]" = []
    release_later(lambda: (time.sleep(0.3), ended.append(time.monotonic())))
    with multitables.Streamer(str(path)).get_queue("/data", n_procs=2, block_size=256) as queue:
        started = time.monotonic()  # the readers are forked and attached when get_queue returns
        assert ended and ended[0] <= started  # get_queue waited for the unmapping before its fork
        for guard in queue.iter():
            with guard:
                pass


def test_the_pytables_probe_is_not_forked_while_an_unmapping_runs(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing.context

    from multitables._io.node import inspect_node
    from multitables._io.tables_engine import _first_row_problem_apart

    forked: "list[float]" = []
    start = multiprocessing.context.ForkProcess.start
    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", lambda p: (forked.append(time.monotonic()), start(p))[1])
    ended: "list[float]" = []
    release_later(lambda: (time.sleep(0.3), ended.append(time.monotonic())))
    assert _first_row_problem_apart(inspect_node(path, "/data"), {}) is None
    assert forked and ended and ended[0] <= forked[0]


def test_settle_waits_for_every_unmapping_and_a_child_inherits_none() -> None:
    gate = threading.Event()
    done: "list[int]" = []
    for i in range(3):
        release_later(lambda i=i: (gate.wait(5), done.append(i)))
    assert len(release._running) == 3
    pid = os.fork()
    if pid == 0:  # the child: none of those threads, so nothing to wait for
        os._exit(0 if not release._running else 1)
    assert os.waitpid(pid, 0)[1] == 0
    gate.set()
    settle_releases()
    assert sorted(done) == [0, 1, 2] and not release._running


def test_settle_returns_once_an_ended_releases_thread_is_gone_from_the_process() -> None:
    """Python 3.12 warns of a fork while the kernel counts more than one thread, and a thread's Python part ends before
    the kernel's thread does: settle waits for the latter (here, a thread that lingers 10 ms after saying it ended)."""
    ended, go = threading.Event(), threading.Event()
    tid: "list[int]" = []

    def lingering() -> None:
        tid.append(threading.get_native_id())
        with release._lock:
            release._ending.append(tid[0])  # as a release thread says when its unmapping is done
        ended.set()
        go.wait(5)

    threading.Thread(target=lingering).start()
    assert ended.wait(5)
    threading.Timer(0.01, go.set).start()
    settle_releases()
    assert tid and not os.path.exists(f"/proc/self/task/{tid[0]}")


def test_settle_in_another_thread_never_joins_an_unmapping_not_yet_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads that each open a stream: one's start settles while another hands off an unmapping whose thread is
    still starting (here, a start that takes 0.2 s); settle waits for it rather than join a thread not started."""
    real_start = threading.Thread.start
    starting = threading.Event()

    def slow_start(self: threading.Thread) -> None:
        if self.name == "multitables-release":
            starting.set()
            time.sleep(0.2)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    ran: "list[bool]" = []
    handing = threading.Thread(target=release_later, args=(lambda: ran.append(True),))
    handing.start()
    assert starting.wait(5)
    settle_releases()  # raised "cannot join thread before it is started" when the set held it before its start
    handing.join()
    assert ran == [True] and not release._running
