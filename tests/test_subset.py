"""Subsets and weighted draws as pieces of file rows (``multitables._plan.subset``): pure, no files."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from multitables._plan.subset import piece_spans, subset_rows, weighted_draw


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=80), st.data())
def test_a_span_and_its_selection_give_back_the_pieces_rows_repeats_included(values: list[int], data: st.DataObject) -> None:
    rows = np.sort(np.array(values, np.int64))  # a weighted draw: sorted, may repeat
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(rows) - 1), max_size=5)) if len(rows) > 1 else []))
    starts, stops = [0, *cuts], [*cuts, len(rows)]
    spans = piece_spans(rows, starts, stops)
    file_rows = np.arange(100)  # row i of the file holds i
    for a, b, s0, s1, selection in zip(starts, stops, spans.starts, spans.stops, spans.selections):
        block = file_rows[s0:s1]
        got = block if selection is None else block[selection]
        np.testing.assert_array_equal(got, rows[a:b])


def test_a_run_of_the_span_length_with_a_repeat_is_not_the_whole_span() -> None:
    spans = piece_spans(np.array([5, 5, 7]), [0], [3])
    assert (spans.starts, spans.stops) == ((5,), (8,))
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
