"""Shared fixtures: small HDF5 files, and a check that a test leaves no process, fd, thread or segment behind."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import psutil
import pytest

from multitables._shm.segment import SHM_PREFIX

#: Seconds a test's processes and segments get to disappear after it ends.
SETTLE_TIMEOUT = 5.0

# A shell starts a background job (``pytest ... &``) with SIGINT ignored, and programs inherit that through exec:
# the Ctrl-C tests' consumers would then never see their KeyboardInterrupt. Caught here, it is reset to the default
# in every program the tests start.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection made (PyTorch, PyTables, h5py, hypothesis: ~190,000 objects) out of the garbage
    collector's reach: every ``gc.collect()`` (each ``no_leaks`` test's, many tests' own) and every automatic full
    collection walked them all, ~0.1 s each; now they walk what the tests made."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def alone_on_its_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under pytest-xdist this process is one of the runner's workers: one parent, one command line, so NOTE [CPU
    siblings] counts the others as jobs sharing its CPUs and every default would be a share of the machine. The tests
    assert defaults for a process alone on its CPUs (the sibling tests make their siblings themselves, in processes
    of their own): the worker's own siblings are not counted here, in the worker and the pools it forks. Anything
    else is counted as the library counts it."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    from multitables._sys import siblings

    worker, count = os.getpid(), siblings._siblings

    def without_the_runners(pid: int, parent: "int | None", on: int) -> int:
        return 0 if pid == worker and siblings.PROC == "/proc" else count(pid, parent, on)

    monkeypatch.setattr(siblings, "_siblings", without_the_runners)


def own_segments() -> set[str]:
    """This process's segments in /dev/shm: the library's prefix and our pid (nothing else is looked at)."""
    mine = f"{SHM_PREFIX}{os.getpid()}_"
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(mine)}
    except FileNotFoundError:  # pragma: no cover
        return set()


def open_fds() -> set[tuple[int, str]]:
    """This process's open file descriptors, each with what it points to (a reused number is a new fd)."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            fds.add((int(name), os.readlink(f"/proc/self/fd/{name}")))
        except OSError:  # closed meanwhile (the listing's own fd, among others)
            pass
    return fds


@pytest.fixture
def fds_on() -> Callable[[Path], int]:
    """``fds_on(path)``: how many of this process's file descriptors are open on ``path``."""

    def count(path: Path) -> int:
        target = os.path.realpath(path)
        return sum(1 for _fd, where in open_fds() if where == target)

    return count


@pytest.fixture
def shm_mappings() -> Callable[[], list[str]]:
    """``shm_mappings()``: what this process maps of the library's segments (names removed from /dev/shm included)."""

    def mapped() -> list[str]:
        with open("/proc/self/maps") as f:
            return [line.split(None, 5)[5].strip() for line in f if f"/dev/shm/{SHM_PREFIX}" in line]

    return mapped


def _snapshot() -> dict[str, object]:
    me = psutil.Process()
    children = {c.pid for c in me.children(recursive=True) if _status(c) not in (psutil.STATUS_ZOMBIE, None)}
    # multiprocessing's resource tracker is started once and lives as long as this process.
    children = {pid for pid in children if "resource_tracker" not in " ".join(_cmdline(pid))}
    return {
        "segments": own_segments(),
        "fds": open_fds(),
        "children": children,
        "threads": {t.ident for t in threading.enumerate()},
    }


def _status(proc: psutil.Process) -> "str | None":
    """The process's status, or None once it is gone (it may end between listing and asking)."""
    try:
        return proc.status()
    except psutil.NoSuchProcess:
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


@pytest.fixture
def blocks_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream reads the blocks its caller asks for, none several at a time (NOTE [read plan]): for tests of what a
    block read does (its slot, its buffer, its hints, a change of the file between two)."""
    from multitables._plan import readers

    monkeypatch.setattr(readers, "TOGETHER_BYTES", 1)


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Fail the test if it leaves segments, fds, child processes or threads behind (after a grace period)."""
    import multiprocessing.resource_tracker as rt

    rt.ensure_running()
    gc.collect()  # earlier tests' garbage closes its fds now, not in the middle of this test
    before = _snapshot()
    yield
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        after = _snapshot()
        diff = {
            "segments": after["segments"] - before["segments"],  # type: ignore[operator]
            # Only fds opened during the test count: one closed meanwhile (garbage of an
            # earlier test collected now) is no leak.
            "fds": after["fds"] - before["fds"],  # type: ignore[operator]
            "children": after["children"] - before["children"],  # type: ignore[operator]
            "threads": after["threads"] - before["threads"],  # type: ignore[operator]
        }
        if not any(diff.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not any(diff.values()), f"left behind: {diff}"


#: How the chunk engine finds its chunks: the B-tree read by us, HDF5's listing at open, HDF5 asked chunk by chunk.
CHUNK_INDEXES = ("btree", "listed", "lookup")


@contextlib.contextmanager
def chunk_index(kind: str) -> Iterator[int]:
    """Make the chunk engine find chunks as ``kind`` says (one of ``CHUNK_INDEXES``); gives the ``index_limit`` to pass."""
    from multitables._io.chunks import storage

    before = storage.READ_BTREE, storage.LIST_CHUNKS_UP_TO
    storage.READ_BTREE = kind == "btree"
    storage.LIST_CHUNKS_UP_TO = 0 if kind == "btree" else before[1]  # the tests' small datasets too
    storage.forget_layouts()
    try:
        yield 0 if kind == "lookup" else storage.INDEX_ALL_LIMIT
    finally:
        storage.READ_BTREE, storage.LIST_CHUNKS_UP_TO = before
        storage.forget_layouts()


@pytest.fixture
def make_array(tmp_path: Path) -> Callable[..., Path]:
    """``make_array(data, complib=..., complevel=..., chunkshape=..., kind=...)`` writes one PyTables array at /data."""
    import tables

    counter = iter(range(10**6))

    def make(
        data: np.ndarray,
        complib: "str | None" = "zlib",
        complevel: int = 3,
        chunkshape: "tuple[int, ...] | None" = None,
        kind: str = "carray",
        shuffle: bool = True,
        fletcher32: bool = False,
    ) -> Path:
        path = tmp_path / f"array{next(counter)}.h5"
        filters = tables.Filters(complevel=complevel, complib=complib, shuffle=shuffle, fletcher32=fletcher32) if complib else None
        with tables.open_file(path, "w") as f:
            if kind == "array":
                f.create_array("/", "data", data)
            elif kind == "earray":
                f.create_earray(
                    "/", "data", obj=data, filters=filters, chunkshape=chunkshape, expectedrows=max(len(data), 1)
                )
            else:
                f.create_carray("/", "data", obj=data, filters=filters, chunkshape=chunkshape)
        return path

    return make


@pytest.fixture
def table_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A PyTables Table at /table with an int, a float and a sub-array column; returns (path, rows)."""
    import tables

    dtype = np.dtype([("a", "<i4"), ("b", "<f8"), ("v", "<f4", (3,))])
    rows = np.zeros(1000, dtype)
    rows["a"] = np.arange(1000)
    rows["b"] = np.arange(1000) * 0.5
    rows["v"] = np.arange(3000).reshape(1000, 3)
    path = tmp_path / "table.h5"
    with tables.open_file(path, "w") as f:
        t = f.create_table("/", "table", rows, filters=tables.Filters(5, "blosc"), chunkshape=(64,))
        t.flush()
    return path, rows


# The object-storage tests' servers and files, all on 127.0.0.1 (tests/objfixtures.py).
from objfixtures import _proxy, _rangesrv, aws_env, moto_url, obj_files, proxy, rangesrv, s3  # noqa: E402,F401


@pytest.fixture(scope="session")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The disk model's compiled shim (``multitables_bench/diskmodel.py``), built once per session."""
    from multitables_bench import diskmodel

    return diskmodel.build_shim(tmp_path_factory.mktemp("shim"))
