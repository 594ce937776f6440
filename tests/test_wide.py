"""Wide rows: tables of many columns, read as a user with 2,000 of them does. What a column's name costs, how the
rows are copied (NOTE [structured copies] in ``multitables._sys.copies``) and how many strings are made as h5py
delivers them per block do not grow with the number of columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import multitables
from multitables._io import fields, strings
from multitables._io.setref import LEARNED
from multitables._io.strings import deliver_strings
from multitables._sys import copies
from multitables._sys.copies import copied, copy_rows
from multitables._train.copier import Copier


def _wide(n_columns: int) -> np.dtype:
    """Rows of ``n_columns`` columns of float32, int64, bool and 8-byte strings in turn, and a nested one."""
    kinds = ["<f4", "<i8", "?", "S8"]
    return np.dtype([(f"c{i:04d}", kinds[i % 4]) for i in range(n_columns)]
                    + [("nested", [("x", "<f8"), ("deep", [("s", "S4")])])])


class _Counted(str):
    """A column name that counts the comparisons made with it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        type(self).compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_a_column_is_found_by_its_name_not_by_a_search_of_every_name() -> None:
    # A batch of fields= takes each column by name; a search of the 2,000 names for each made it quadratic.
    rows = np.zeros(3, _wide(2000))
    rows["c1999"] = [b"a", b"b", b"c"]
    name = _Counted("c1999")
    _Counted.compared = 0
    assert fields.select_field(rows, name).tolist() == [b"a", b"b", b"c"]
    assert fields.field_of(rows.dtype, _Counted("nested/deep/s"))[1] == rows.dtype.fields["nested"][1] + 8
    assert _Counted.compared <= 4, _Counted.compared


def test_a_misspelt_column_among_many_is_named_with_the_nearest() -> None:
    dt = _wide(2000)
    with pytest.raises(KeyError) as raised:
        fields.field_of(dt, "c01999")
    message = str(raised.value)
    assert "'c1999'" in message and len(message) < 1000, message


@pytest.mark.parametrize("how", ["copy_rows", "copied", "Copier"])
def test_structured_rows_are_copied_as_bytes(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = np.zeros(50, _wide(300))
    rows["c0001"] = np.arange(50)
    rows["nested"]["deep"]["s"] = b"ab"
    calls: "list[np.dtype]" = []
    real = np.copyto

    def counted(out: np.ndarray, src: Any, **kwargs: Any) -> None:
        calls.append(out.dtype)
        real(out, src, **kwargs)

    monkeypatch.setattr(copies.np, "copyto", counted)
    out = np.empty_like(rows)
    if how == "copy_rows":
        copy_rows(out, rows)
    elif how == "copied":
        out = copied(rows[::2])
        rows = rows[::2]
    else:
        Copier(1).copy(out, rows)
    assert out.tobytes() == rows.tobytes() and out.dtype == rows.dtype
    assert [dt.names for dt in calls] == [None]  # one copy, of bytes (numpy copies a structured dtype field by field)


def test_rows_of_another_dtype_are_still_cast() -> None:
    rows = np.array([(1, 2.5)], [("a", "<i4"), ("b", "<f8")])
    out = np.zeros(1, [("a", "<i8"), ("b", "<f4")])
    copy_rows(out, rows)
    assert out.tolist() == [(1, 2.5)]


_PADS = st.lists(st.tuples(st.sampled_from([1, 3, 8]), st.integers(1, 2), st.sampled_from(["nullterm", "spacepad"])),
                 min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(places=_PADS, seed=st.integers(0, 2**32 - 1), n_rows=st.integers(1, 20))
def test_strings_of_many_columns_are_made_as_one_at_a_time_makes_them(places: Any, seed: int, n_rows: int) -> None:
    offset, pads = 0, []
    for size, count, pad in places:
        pads.append((offset + 1, size, count, pad))  # a byte between: the places are not side by side
        offset += 1 + size * count
    rng = np.random.default_rng(seed)
    # Bytes of NULs, spaces and letters, so strings hold junk after a NUL and runs of spaces at their ends.
    stored = rng.choice(np.array([0, 0, 32, 32, 65, 66], np.uint8), size=(n_rows, offset + 2))
    one = stored.copy()
    for pad_ in pads:  # one place at a time
        deliver_strings(one.view(f"V{offset + 2}").reshape(-1), (pad_,))
    many = stored.copy()
    deliver_strings(many.view(f"V{offset + 2}").reshape(-1), tuple(pads))
    assert many.tobytes() == one.tobytes()


def test_strings_of_many_columns_are_made_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # 500 string columns: a loop over them cost 3/4 of the chunk engine's read of each block.
    dt = _wide(2000)
    rows = np.zeros(10, dt)
    rows["c0003"] = b"ab"
    raw = rows.view(np.uint8).reshape(10, -1)
    at = dt.fields["c0003"][1]
    raw[:, at + 3] = 90  # a byte after the NUL that ends b"ab": HDF5 delivers b"ab"
    pads = tuple((dt.fields[n][1], 8, 1, "nullterm") for n in dt.names if dt.fields[n][0] == np.dtype("S8"))
    searched = []
    real = strings._after_nul
    monkeypatch.setattr(strings, "_after_nul", lambda *a: searched.append(1) or real(*a))
    deliver_strings(rows, pads)
    assert rows["c0003"].tolist() == [b"ab"] * 10 and raw[:, at + 3].tolist() == [0] * 10
    assert len(searched) <= 1, len(searched)


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_reader_reads_tables_too_wide_for_a_stage_header(tmp_path: Path, n_procs: int, no_leaks: None) -> None:
    # A table's dtype travelled in each stage's header (7 KiB): a Reader refused any of about 130 columns or more,
    # blaming the file name. More such tables than the readers keep (LEARNED): each request hands its node again.
    path = tmp_path / "wide.h5"
    dt = _wide(400)
    tables = []
    with h5py.File(path, "w") as f:
        for k in range(LEARNED + 2):
            rows = np.zeros(40, dt)
            rows["c0001"] = np.arange(40) + 1000 * k
            rows["c0399"] = [b"k%d_%d" % (k, i) for i in range(40)]
            rows["nested"]["deep"]["s"] = b"n%d" % k
            f.create_dataset(f"t{k}", data=rows, chunks=(8,), compression="gzip")
            tables.append(rows)
    reader = multitables.Reader(filename=str(path), n_procs=n_procs)
    try:
        datasets = [reader.get_dataset(f"/t{k}") for k in range(LEARNED + 2)]  # the first ones dropped by the readers
        stage = datasets[0].create_stage(40)
        for k in (0, LEARNED + 1, 1, 0):
            got = reader.request(datasets[k][3:30], stage).get()
            assert got.tobytes() == tables[k][3:30].tobytes()
            column = reader.request(datasets[k].col("c0399")[np.array([7, 2, 39])], stage).get()
            assert column.tolist() == [tables[k]["c0399"][i] for i in (7, 2, 39)]
            nested = reader.request(datasets[k]["nested/deep/s"][::13], stage).get()
            assert nested.tolist() == [b"n%d" % k] * 4
    finally:
        reader.close(wait=True)


def test_the_generator_copies_wide_rows_as_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None) -> None:
    path = tmp_path / "wide.h5"
    rows = np.zeros(300, _wide(300))
    rows["c0001"] = np.arange(300)
    rows["c0299"] = [b"r%d" % i for i in range(300)]
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=rows, chunks=(16,))
    copied_as: "list[np.dtype]" = []
    real = np.copyto

    def counted(out: np.ndarray, src: Any, **kwargs: Any) -> None:
        copied_as.append(out.dtype)
        real(out, src, **kwargs)

    monkeypatch.setattr(np, "copyto", counted)
    got = [row.copy() for row in multitables.Streamer(str(path)).get_generator("/t", n_procs=1, read_ahead=2, block_size=32)]
    assert np.array(got).tobytes() == rows.tobytes()
    wide = [dt for dt in copied_as if dt.names]
    assert copied_as and not wide, (len(copied_as), len(wide))  # the last blocks at least are copied (not lent)


def test_a_reader_copies_wide_rows_out_as_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "wide.h5"
    rows = np.zeros(64, _wide(100))
    rows["c0001"] = np.arange(64)
    with h5py.File(path, "w") as f:
        f.create_dataset("t", data=rows)
    reader = multitables.Reader(filename=str(path), n_procs=0)
    try:
        dataset = reader.get_dataset("/t")
        stage = dataset.create_stage(64)
        future = reader.request(dataset[5:60], stage)
        made: "list[np.dtype]" = []
        real = np.copyto
        monkeypatch.setattr(np, "copyto", lambda out, src, **kw: (made.append(out.dtype), real(out, src, **kw)))
        got = future.get()
    finally:
        reader.close(wait=True)
    assert got.tobytes() == rows[5:60].tobytes() and got.dtype == rows.dtype
    assert made and not [dt for dt in made if dt.names], made  # one copy, as bytes (not .copy(): field by field)

