"""Subsets and weighted draws as pieces of file rows (``multitables._plan.subset``): pure, no files."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from multitables._plan.subset import EpochRows, piece_spans, subset_key, subset_rows, weighted_draw


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=80), st.data())
def test_a_span_and_its_selection_give_back_the_pieces_rows_repeats_included(values: list[int], data: st.DataObject) -> None:
    rows = np.sort(np.array(values, np.int64))  # a weighted draw: sorted, may repeat
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(rows) - 1), max_size=5)) if len(rows) > 1 else []))
    starts, stops = [0, *cuts], [*cuts, len(rows)]
    spans = piece_spans(rows, starts, stops)
    file_rows = np.arange(100)  # row i of the file holds i
    assert len(spans.selections) == len(starts)
    for a, b, s0, s1, selection in zip(starts, stops, spans.starts, spans.stops, spans.selections, strict=True):
        block = file_rows[s0:s1]
        got = block if selection is None else block[selection]
        np.testing.assert_array_equal(got, rows[a:b])
        # None exactly where the piece is its span, once each: read straight out of its slot
        assert (selection is None) == np.array_equal(rows[a:b], np.arange(s0, s1))
    k = data.draw(st.integers(0, len(starts)))
    later = spans.selections[k:]  # what a carry leaves of an epoch's pieces: the same selections
    assert len(later) == len(starts) - k
    for mine, theirs in zip(later, list(spans.selections)[k:], strict=True):
        assert (mine is None and theirs is None) or np.array_equal(mine, theirs)


def test_a_run_of_the_span_length_with_a_repeat_is_not_the_whole_span() -> None:
    spans = piece_spans(np.array([5, 5, 7]), [0], [3])
    assert (spans.starts.tolist(), spans.stops.tolist()) == ([5], [8])
    np.testing.assert_array_equal(spans.selections[0], [0, 0, 2])


def test_a_slice_a_mask_and_an_array_name_the_same_rows() -> None:
    mask = np.zeros(10, bool)
    mask[[1, 4, 7]] = True
    for indices in (slice(1, 10, 3), mask, [7, 1, 4], np.array([-3, -9, 4])):
        np.testing.assert_array_equal(subset_rows(indices, 10), [1, 4, 7])
    np.testing.assert_array_equal(subset_rows(slice(None, None, -3), 10), [0, 3, 6, 9])


def test_a_weighted_draw_depends_on_the_seed_and_epoch_only() -> None:
    w = np.linspace(0, 1, 50)
    a = weighted_draw(w, 30, seed=1, epoch=0)
    np.testing.assert_array_equal(a, weighted_draw(w, 30, seed=1, epoch=0))
    assert not np.array_equal(a, weighted_draw(w, 30, seed=1, epoch=1))
    assert not np.array_equal(a, weighted_draw(w, 30, seed=2, epoch=0))
    assert (np.diff(a) >= 0).all() and 0 not in a  # sorted; a weight of 0 is never drawn


@settings(max_examples=30, deadline=None)
@given(epochs=st.lists(st.integers(0, 5), min_size=1, max_size=12))
def test_an_epochs_draw_is_made_once_while_kept_and_is_that_epochs_draw_whenever_asked(epochs: list[int]) -> None:
    """Epochs asked for in any order: each answer is the epoch's own draw; asking again for one of the last two
    drawn draws nothing (the next epoch's, drawn when it is planned ahead, is not drawn again when it starts)."""
    w = np.arange(1, 41, dtype=np.float64)
    rows = EpochRows(None, w, 25, seed=3)
    drawn: list[int] = []
    with patch("multitables._plan.subset.weighted_draw", lambda *a: (drawn.append(a[3]), weighted_draw(*a))[1]):
        kept: list[int] = []
        for e in epochs:
            np.testing.assert_array_equal(rows.of(e), weighted_draw(w, 25, 3, e))
            assert drawn.count(e) == (0 if e in kept else 1)
            drawn.clear()
            if e not in kept:  # a draw is kept until two others were drawn after it
                kept = kept[-1:] + [e]
    assert rows.key() is not None and EpochRows(None, None, 40, 0).of(7) is None


def test_a_subsets_rows_are_the_same_every_epoch() -> None:
    subset = np.array([2, 3, 5, 8], np.int64)
    rows = EpochRows(subset, None, 4, seed=0)
    assert rows.of(0) is subset and rows.of(9) is subset and rows.key() == subset_key(subset)


def test_a_draw_made_elsewhere_is_taken_for_its_epoch_and_kept() -> None:
    w = np.arange(1, 41, dtype=np.float64)
    rows = EpochRows(None, w, 25, seed=3)
    made = rows.draw(2)  # as a thread would
    assert not rows.kept(2)
    with patch("multitables._plan.subset.weighted_draw", side_effect=AssertionError("drawn again")):
        assert rows.of(2, lambda: made) is made and rows.kept(2)
        assert rows.of(2) is made  # kept: neither drawn nor made again
    assert EpochRows(None, None, 40, 0).kept(5)  # nothing to draw
