"""Inspecting the node: bad input is refused with a clear error before any process starts."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import tables

import multitables
from multitables._io.node import inspect_node


def test_describes_a_pytables_carray(make_array) -> None:
    path = make_array(np.zeros((100, 3, 2), "f4"), chunkshape=(16, 3, 2))
    node = inspect_node(path, "/data")
    assert (node.n_rows, node.row_shape, node.dtype, node.chunk_rows) == (100, (3, 2), np.dtype("f4"), 16)
    assert node.row_nbytes == 24
    assert 1 in node.filter_ids  # deflate


def test_a_table_field_with_a_subarray_becomes_part_of_the_row_shape(table_file) -> None:
    path, _ = table_file
    node = inspect_node(path, "/table", "v")
    assert (node.row_shape, node.dtype) == ((3,), np.dtype("<f4"))
    assert node.field_read_dtype == np.dtype([("v", "<f4", (3,))])


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.h5"):
        inspect_node(tmp_path / "nope.h5", "/data")


def test_a_file_that_is_not_hdf5_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "text.h5"
    bad.write_text("hello")
    with pytest.raises(multitables.NotHDF5Error, match="not an HDF5 file"):
        inspect_node(bad, "/data")
    with pytest.raises(ValueError):  # also the builtin a user would catch
        inspect_node(bad, "/data")


def test_a_file_cut_short_is_named_with_how_much_it_holds(tmp_path: Path) -> None:
    """HDF5's words for a truncated file name no file; ours do, keep its type and HDF5's words as the cause."""
    whole = tmp_path / "whole.h5"
    with h5py.File(whole, "w") as f:
        f.create_dataset("data", data=np.arange(40_000, dtype="f4"), chunks=(1000,), compression="gzip")
    cut = tmp_path / "cut.h5"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(OSError, match=r"cut.h5' is cut short: it holds [\d,]+ bytes of the [\d,]+") as info:
        inspect_node(cut, "/data")
    assert isinstance(info.value.__cause__, OSError) and "truncated file" in str(info.value.__cause__)


def test_hdf5s_word_for_a_name_switched_while_it_opened_is_a_file_changed_error(tmp_path: Path, monkeypatch) -> None:
    """HDF5 finds the file it opened is not the one it looked at (a symlink switched meanwhile): "files' st_ino or
    st_dev fields changed!", no file named. A race to set up, so HDF5's error is made to come."""
    import h5py as h5

    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f["data"] = np.zeros(4)

    def lost_the_race(*args: object, **kwargs: object) -> None:
        raise OSError("Unable to synchronously open file (files' st_ino or st_dev fields changed!)")

    monkeypatch.setattr(h5.h5f, "open", lost_the_race)
    with pytest.raises(multitables.FileChangedError, match=r"x.h5' was replaced by another file while it was opened") as info:
        inspect_node(path, "/data")
    assert "st_ino" in str(info.value.__cause__)


def test_a_missing_path_is_a_key_error_naming_it(make_array) -> None:
    path = make_array(np.zeros(10))
    with pytest.raises(KeyError, match="/nothing"):
        inspect_node(path, "/nothing")


@pytest.mark.parametrize("what", ["group", "vlarray", "scalar", "strings"])
def test_non_array_nodes_are_refused(tmp_path: Path, what: str) -> None:
    path = tmp_path / "nodes.h5"
    with tables.open_file(path, "w") as f:
        f.create_group("/", "group")
        vl = f.create_vlarray("/", "vlarray", tables.Int32Atom())
        vl.append([1, 2])
        f.create_array("/", "scalar", 5)
    with h5py.File(path, "a") as f:
        f.create_dataset("strings", data=np.array(["a", "bc"], dtype=h5py.string_dtype()))
    with pytest.raises(multitables.NodeTypeError, match=what):
        inspect_node(path, "/" + what)


def test_an_empty_dataset_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.h5"
    with tables.open_file(path, "w") as f:
        f.create_earray("/", "data", tables.Float32Atom(), (0, 4))
    with pytest.raises(ValueError, match="empty"):
        inspect_node(path, "/data")


def test_unknown_fields_are_key_errors_listing_the_fields(table_file, make_array) -> None:
    path, _ = table_file
    with pytest.raises(KeyError, match=r"no field 'zzz'.*\['a', 'b', 'v'\]"):
        inspect_node(path, "/table", "zzz")
    with pytest.raises(KeyError, match="not a table"):
        inspect_node(make_array(np.zeros(10)), "/data", "a")


def test_closing_the_dataset_of_open_node_closes_its_file(make_array, fds_on) -> None:
    from multitables._io.node import close_dataset, open_node

    path = make_array(np.arange(10.0))
    node, dataset = open_node(path, "/data")
    assert node.n_rows == 10 and fds_on(path) == 1
    close_dataset(dataset)
    assert fds_on(path) == 0


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_is_refused_before_anything_opens_it(tmp_path: Path, kind: str) -> None:
    # Opening a FIFO for reading waits for a writer: an open before the check would hang here.
    from _guards import hang_guard

    if kind == "fifo":
        path = tmp_path / "pipe.h5"
        os.mkfifo(path)
        what = "FIFO"
    else:
        path = Path(os.devnull)
        what = "character device"
    with hang_guard(30, f"a {kind} given as the file"):
        for call in (
            lambda: inspect_node(path, "/data"),
            lambda: multitables.Streamer(path).get_queue("/data"),
            lambda: list(multitables.Streamer(path).get_generator("/data")),
            lambda: multitables.Reader(path, n_procs=1),
        ):
            with pytest.raises(multitables.NotHDF5Error, match=f"is a {what}.*not a regular file"):
                call()


@pytest.mark.parametrize("spelling", ["str", "bytes", "pathlike", "undecodable"])
def test_file_names_are_taken_as_open_and_h5py_take_them(tmp_path: Path, spelling: str) -> None:
    data = np.arange(3000, dtype="<i8").reshape(1000, 3)
    raw = os.fsencode(tmp_path) + (b"/caf\xe9.h5" if spelling == "undecodable" else b"/data.h5")
    with h5py.File(raw, "w") as f:  # h5py takes bytes, so does the kernel
        f.create_dataset("data", data=data, chunks=(100, 3), compression="gzip")
    name = {"str": os.fsdecode(raw), "bytes": raw, "pathlike": Path(os.fsdecode(raw)), "undecodable": raw}[spelling]
    node = inspect_node(name, "/data")
    assert (node.n_rows,) + node.row_shape == data.shape
    for engine in ("auto", "h5py", "chunks"):
        stream = multitables.Streamer(name, engine=engine)
        np.testing.assert_array_equal(np.stack(list(stream.get_generator("/data", n_procs=1))), data)
        got = []
        with stream.get_queue("/data", n_procs=2, block_size=100, ordered=True) as queue:
            for guard in queue:
                with guard as block:
                    got.append(block.copy())
        np.testing.assert_array_equal(np.concatenate(got), data)
    with multitables.Reader(name, n_procs=1) as reader:
        ds = reader.get_dataset("/data")
        np.testing.assert_array_equal(reader.request(ds[::7], ds.create_stage(200)).get(), data[::7])
    if spelling == "undecodable":
        # PyTables takes only names that decode: the engine says so, and which engine reads the file.
        with pytest.raises(multitables.NodeTypeError, match="engine='tables' cannot read.*reads it"):
            multitables.Streamer(name, engine="tables").get_queue("/data")


def test_an_empty_path_is_named_as_such(make_array) -> None:
    path = make_array(np.zeros(3))
    with pytest.raises(ValueError, match="path is empty"):  # not "the file may be damaged"
        inspect_node(path, "")
    with pytest.raises(ValueError, match="path is empty"):
        multitables.Streamer(path).get_queue("")
