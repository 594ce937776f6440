"""The next epoch's weighted draw made on a thread (``multitables._train.draws``): the epoch's own, errors where
the rows are asked for, no thread left behind."""

from __future__ import annotations

import threading
from unittest.mock import patch

import numpy as np
import pytest
from _forked import in_a_fork

from multitables._plan.subset import EpochRows, weighted_draw
from multitables._train.draws import DrawsAhead


def test_a_draw_made_ahead_on_its_thread_is_the_epochs_and_its_error_is_raised_where_the_rows_are_asked_for() -> None:
    w = np.arange(1, 41, dtype=np.float64)
    rows = DrawsAhead(EpochRows(None, w, 25, seed=3))
    go = threading.Event()

    def slow(*args: object) -> np.ndarray:
        go.wait(10)
        return weighted_draw(*args)  # type: ignore[arg-type]

    with patch("multitables._plan.subset.weighted_draw", slow):
        rows.draw_ahead(4)
        assert not rows.ready(4) and rows.ready(5)  # nothing of epoch 5 is in progress
        go.set()
        np.testing.assert_array_equal(rows.of(4), weighted_draw(w, 25, 3, 4))
        assert rows.ready(4)
    with patch("multitables._plan.subset.weighted_draw", side_effect=MemoryError("no room for the draw")):
        rows.draw_ahead(6)
        with pytest.raises(MemoryError, match="no room for the draw"):
            rows.of(6)
    late = threading.Event()

    def slower_for_7(*args: object) -> np.ndarray:
        (late if args[3] == 7 else go).wait(10)
        return weighted_draw(*args)  # type: ignore[arg-type]

    with patch("multitables._plan.subset.weighted_draw", slower_for_7):
        rows.draw_ahead(7)
        rows.draw_ahead(8)  # set_epoch went elsewhere: 7's draw is left untaken, and ends last
        assert not rows.ready(7)
        threading.Timer(0.2, late.set).start()
        rows.close()  # waits for both: no thread left
    assert not [t for t in threading.enumerate() if t.name == "multitables-draw"]
    assert DrawsAhead(EpochRows(None, None, 40, 0)).ready(1)  # nothing to draw: always ready


def test_a_fork_draws_an_epoch_itself_where_the_parents_draw_of_it_was_in_progress() -> None:
    # The draw's thread is the parent's: the fork has none, and its copy of the draw would never end there.
    import os

    class Rows:  # a draw that, in the parent, waits until told to go on
        def __init__(self) -> None:
            self.parent, self.go = os.getpid(), threading.Event()

        def kept(self, epoch: int) -> bool:
            return False

        def draw(self, epoch: int) -> np.ndarray:
            if os.getpid() == self.parent:
                self.go.wait()
            return np.array([epoch, os.getpid()])

        def of(self, epoch: int, drawn: object = None) -> np.ndarray:
            return drawn() if drawn is not None else self.draw(epoch)  # type: ignore[operator]

    rows = Rows()
    ahead = DrawsAhead(rows)  # type: ignore[arg-type]
    ahead.draw_ahead(1)

    def asked() -> object:
        got = [ahead.ready(1), ahead.of(1).tolist(), os.getpid()]
        ahead.close()
        return got

    ready, (epoch, drawn_in), child = in_a_fork(asked, seconds=20)["result"]  # type: ignore[index]
    assert ready and (epoch, drawn_in) == (1, child)
    assert not ahead.ready(1)  # the parent's draw still waits
    rows.go.set()
    assert ahead.of(1).tolist() == [1, os.getpid()]
    ahead.close()
