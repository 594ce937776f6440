"""The PyTables engine's check of a node: PyTables tried for real in a forked probe, its answer kept for settled files."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tables

import multitables
from multitables._io import files, tables_engine


@pytest.fixture
def probes(monkeypatch) -> "list[str]":
    """The paths PyTables was tried on, one entry per probe forked."""
    tried: list[str] = []
    real = tables_engine._first_row_problem_apart

    def counted(node: Any, open_kwargs: "dict[str, Any]") -> "str | None":
        tried.append(node.path)
        return real(node, open_kwargs)

    monkeypatch.setattr(tables_engine, "_first_row_problem_apart", counted)
    return tried


def _rows(path: Any, **open_kwargs: Any) -> np.ndarray:
    blocks = []
    with multitables.Streamer(str(path), engine="tables", **open_kwargs).get_queue("/data", n_procs=0, remainder=True) as q:
        for guard in q.iter():
            with guard as block:
                blocks.append(block.copy())
    return np.concatenate(blocks)


def test_a_settled_files_answer_is_kept_per_open_options_and_a_rewrite_asks_again(make_array, monkeypatch, probes) -> None:
    monkeypatch.setattr(files, "SETTLED_S", -1.0)  # every file settled: its last change lies in the past
    data = np.arange(600, dtype="i4").reshape(200, 3)
    path = make_array(data)
    for _ in range(3):
        np.testing.assert_array_equal(_rows(path), data)
    assert probes == ["/data"]
    np.testing.assert_array_equal(_rows(path, driver="H5FD_SEC2"), data)  # other options: PyTables tried with them
    assert probes == ["/data"] * 2

    with tables.open_file(path, "a") as f:  # the same name, another file's bytes
        f.root.data[0] = [-1, -2, -3]
    data[0] = [-1, -2, -3]
    np.testing.assert_array_equal(_rows(path), data)
    assert probes == ["/data"] * 3


def test_a_file_just_written_is_tried_at_every_stream(make_array, probes) -> None:
    data = np.arange(60, dtype="f8").reshape(20, 3)
    path = make_array(data)
    for _ in range(2):
        np.testing.assert_array_equal(_rows(path), data)
    assert probes == ["/data"] * 2  # a write within the clock's tick could keep its identity
