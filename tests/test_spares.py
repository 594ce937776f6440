"""Spare bytes (NOTE [spare buffers]): memory made once in a process and taken again, never while a view of it lives."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from multitables._sys import spares

from _guards import hang_guard


@pytest.fixture(autouse=True)
def no_spares(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no spares, and leaves none to the next."""
    monkeypatch.setattr(spares, "_SPARES", [])


def addresses() -> list[int]:
    """Where each spare lies, oldest first."""
    return [address(spare) for spare in spares._SPARES]


def address(mapping: mmap.mmap) -> int:
    return np.frombuffer(mapping, np.uint8).ctypes.data


def test_bytes_gone_are_a_spare_taken_before_a_new_mapping() -> None:
    memory = spares.spare_bytes(240)
    assert memory.shape == (240,) and memory.dtype == np.uint8 and memory.flags.writeable
    assert memory.ctypes.data % mmap.PAGESIZE == 0  # a mapping of its own, aligned for any transport
    where = memory.ctypes.data
    del memory
    assert addresses() == [where]
    again = spares.spare_bytes(240)
    assert again.ctypes.data == where and addresses() == []  # taken: a spare goes to one caller


def test_bytes_are_no_spare_while_a_view_of_them_lives() -> None:
    memory = spares.spare_bytes(240)
    where = memory.ctypes.data
    row = memory[16:48].view("<f8")[1:]  # a view of a view, as a row of a block is
    del memory
    assert addresses() == []
    other = spares.spare_bytes(240)
    assert other.ctypes.data != where
    row[:] = 1.5
    del row  # the last view: now the bytes are a spare
    assert addresses() == [where]


@pytest.mark.parametrize("spare_bytes, fits", [(240, True), (480, True), (481, False), (239, False)])
def test_a_spare_fits_from_the_size_asked_to_twice_it(spare_bytes: int, fits: bool) -> None:
    spare = spares.new_mapping(spare_bytes)
    spares._keep(spare)
    taken = spares.spare_bytes(240)
    assert len(taken) == 240
    assert (taken.ctypes.data == address(spare)) is fits
    assert addresses() == ([] if fits else [address(spare)])


def test_the_smallest_spare_that_fits_is_taken() -> None:
    large, small, too_small = (spares.new_mapping(n) for n in (400, 300, 200))
    for spare in (large, small, too_small):
        spares._keep(spare)
    taken = spares.spare_bytes(240)
    assert taken.ctypes.data == address(small)
    assert addresses() == [address(large), address(too_small)]


def test_spares_past_the_limits_unmap_the_oldest(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = [spares.new_mapping(100) for _ in range(spares.MAX_SPARES + 1)]
    for spare in kept:
        spares._keep(spare)
    assert [id(spare) for spare in spares._SPARES] == [id(spare) for spare in kept[1:]]
    monkeypatch.setattr(spares, "_SPARES", [])
    monkeypatch.setattr(spares, "MAX_SPARE_BYTES", 250)
    for spare in kept[:3]:
        spares._keep(spare)
    assert [id(spare) for spare in spares._SPARES] == [id(spare) for spare in kept[1:3]]


def test_bytes_freed_while_the_lock_is_held_are_unmapped_not_waited_for() -> None:
    """The collector may free bytes inside a take on the same thread: giving them back must not wait."""
    memory = spares.spare_bytes(240)
    with hang_guard(10, "bytes freed with the lock held"), spares._LOCK:
        del memory
    assert addresses() == []


def test_no_bytes_asked_are_an_empty_array_and_no_spare() -> None:
    memory = spares.spare_bytes(0)
    assert memory.shape == (0,) and memory.dtype == np.uint8
    del memory
    assert addresses() == []


def test_a_forked_child_starts_with_no_spares_and_a_free_lock() -> None:
    spares._keep(spares.new_mapping(4096))
    with hang_guard(30, "a forked child taking spare bytes"):
        with spares._LOCK:  # held by this thread at the fork: the child must not inherit it held
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ok = spares._SPARES == [] and spares._LOCK.acquire(timeout=5)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(addresses()) == 1  # the parent keeps its own


def test_bytes_a_forked_child_writes_are_its_own_whoever_held_them() -> None:
    """A DataLoader's forked worker drops its copy of the parent's buffers (a Reader's decoded chunks) and decodes
    into them as its spares: its writes must not land in the parent's, or in another worker's, buffers."""
    held, dropped = spares.spare_bytes(4096), spares.spare_bytes(4096)
    held[:], dropped[:] = 1, 2
    with hang_guard(30, "a forked child writing spare bytes"):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            held[:] = 3
            del dropped  # the child's spare now, taken by its next buffer
            again = spares.spare_bytes(4096)
            again[:] = 4
            os._exit(0)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (held == 1).all() and (dropped == 2).all()  # the parent's bytes, as it wrote them
