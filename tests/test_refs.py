"""Whether a buffer is referenced beyond its container (``multitables._sys.refs``), whatever the interpreter counts."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from multitables._sys import refs


def test_an_item_only_its_container_holds_is_not_held_elsewhere() -> None:
    buffers = [np.zeros(8), None]
    assert not refs.held_elsewhere(buffers, 0)
    assert not refs.held_elsewhere((object(), np.zeros(3)), 1)


def test_a_name_or_a_view_of_it_holds_it() -> None:
    buffers = [np.zeros((4, 2)), np.zeros(3)]
    row = buffers[0][2]  # a row kept by the caller: a view holding its base
    assert refs.held_elsewhere(buffers, 0) and not refs.held_elsewhere(buffers, 1)
    del row
    assert not refs.held_elsewhere(buffers, 0)
    name = buffers[1]
    assert refs.held_elsewhere(buffers, 1)
    del name
    assert not refs.held_elsewhere(buffers, 1)


def test_an_interpreter_that_counts_fewer_references_moves_the_baseline_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """As from Python 3.14, which may borrow a local passed to a call (gh-130704): every count is lower, and a
    baseline fixed for another version (3, the container, the name, the argument) would take a held buffer for free."""
    real, shift = sys.getrefcount, [0]
    monkeypatch.setattr(sys, "getrefcount", lambda obj: real(obj) - shift[0])
    probe = [np.zeros(3)]
    view = probe[0][1:]
    # Counted down so that a held buffer counts 3 (2 on 3.11-3.13: this wrapper's own reference, and one borrowed;
    # 3.10 holds one more).
    shift[0] = refs.item_refs(probe, 0) - 3
    del view, probe
    importlib.reload(refs)  # the baseline is measured again, as an import under that interpreter would
    try:
        buffers = [np.zeros(3)]
        row = buffers[0][1:]
        assert refs.item_refs(buffers, 0) <= 3  # what a fixed baseline of 3 would call free
        assert refs.held_elsewhere(buffers, 0)
        del row
        assert not refs.held_elsewhere(buffers, 0)
    finally:
        monkeypatch.undo()
        importlib.reload(refs)
