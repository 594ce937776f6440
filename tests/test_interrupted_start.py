"""A Ctrl-C that lands after a stream's or a Reader's readers started, before the object that owns them exists.

A notebook's kernel survives its interrupt and keeps the last error's traceback, with every frame of it: nothing
then collects a half-made queue or Reader, and readers left running lived, idle, as long as the kernel (a terminal's
Ctrl-C usually ends the program, and the readers with it). So the span that makes the owner closes what it started
when anything is raised in it. Each test raises the ``KeyboardInterrupt`` at one step of that span with a real
``SIGINT`` sent to this thread (Python runs the handler at the sending frame's next instruction, or when a span that
holds the signal ends), and keeps the traceback while it checks, as the kernel does.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import psutil
import pytest

import multitables
from multitables import Streamer
from multitables._procs.stream import StreamReaders
from multitables._shm import segment
from multitables._stream import queue as queue_module

from _guards import wait_until

GONE_WITHIN = 30.0  # a guard against a hang only


@pytest.fixture
def data() -> np.ndarray:
    return np.arange(20_000 * 16, dtype="<f4").reshape(20_000, 16)


@pytest.fixture
def h5file(make_array: Callable[..., Path], data: np.ndarray) -> Path:
    return make_array(data, complib="zlib", complevel=3, chunkshape=(500, 16))


def _interrupting(fn: Callable[..., Any], caller: "str | None" = None, after: bool = False) -> Callable[..., Any]:
    """``fn``, whose first call (from a function named ``caller``, if given) is interrupted as by a Ctrl-C: SIGINT to
    this thread before the call (``after``: once it returned, before its result reaches the caller)."""
    sent = []

    def call(*args: Any, **kwargs: Any) -> Any:
        first = not sent and (caller is None or sys._getframe(1).f_code.co_name == caller)
        if first and not after:
            sent.append(True)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        result = fn(*args, **kwargs)
        if first and after:
            sent.append(True)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        return result

    return call


def _readers() -> set[int]:
    """This process's children that are the library's readers (not the resource tracker)."""
    me = psutil.Process()
    return {c.pid for c in me.children() if c.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(c.cmdline())}


def _names() -> set[str]:
    """This process's names in /dev/shm."""
    return {n for n in os.listdir(segment.SHM_DIR) if n.startswith(f"{segment.SHM_PREFIX}{os.getpid()}_")}


def _interrupt_at(step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if step == "pipe":  # between os.pipe and the Connection objects that own its two fds
        monkeypatch.setattr(os, "pipe", _interrupting(os.pipe, caller="Pipe", after=True))
    elif step == "name":  # the unlink of the ring's (the inboxes') name, once every reader attached
        monkeypatch.setattr(segment, "_unlink", _interrupting(segment._unlink))
    elif step == "pids":  # the back end taking its readers' pids
        monkeypatch.setattr(StreamReaders, "pids", property(_interrupting(lambda self: self.pool.pids)))
    elif step == "finalizer":  # the owner's finalizer, made last
        for module in (queue_module, multitables.reader):
            monkeypatch.setattr(module, "weakref", SimpleNamespace(finalize=_interrupting(weakref.finalize)))
    else:
        raise AssertionError(step)


@pytest.mark.parametrize("step", ["pipe", "name", "pids", "finalizer"])
def test_a_ctrl_c_as_a_queue_is_made_stops_its_readers(
    h5file: Path, data: np.ndarray, step: str, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    before, names = _readers(), _names()
    stream = Streamer(str(h5file), start_method="fork")
    _interrupt_at(step, monkeypatch)
    with pytest.raises(KeyboardInterrupt) as caught:
        stream.get_queue("/data", n_procs=2)
    assert caught.traceback  # kept, as a notebook keeps its last error's, while the readers must go
    wait_until(lambda: _readers() <= before, GONE_WITHIN, "the readers started exit")
    assert _names() <= names
    monkeypatch.undo()
    blocks = []
    with stream.get_queue("/data", n_procs=2, ordered=True, remainder=True) as queue:  # the next cell's stream
        for guard in queue:
            with guard as block:
                blocks.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(blocks), data)
    del caught


@pytest.mark.parametrize("step", ["pipe", "name", "finalizer"])
def test_a_ctrl_c_as_a_reader_is_made_stops_its_readers(
    h5file: Path, data: np.ndarray, step: str, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    before, names = _readers(), _names()
    _interrupt_at(step, monkeypatch)
    with pytest.raises(KeyboardInterrupt) as caught:
        multitables.Reader(str(h5file), n_procs=2, start_method="fork")
    assert caught.traceback
    wait_until(lambda: _readers() <= before, GONE_WITHIN, "the readers started exit")
    assert _names() <= names
    monkeypatch.undo()
    with multitables.Reader(str(h5file), n_procs=2, start_method="fork") as reader:
        dataset = reader.get_dataset("/data")
        np.testing.assert_array_equal(reader.request(dataset[5:15], dataset.create_stage(10)).get(), data[5:15])
    del caught
