"""Inspecting the node: bad input is refused with a clear error before any process starts."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import tables

import multitables
from multitables._node import inspect_node


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
    from multitables._node import close_dataset, open_node

    path = make_array(np.arange(10.0))
    node, dataset = open_node(path, "/data")
    assert node.n_rows == 10 and fds_on(path) == 1
    close_dataset(dataset)
    assert fds_on(path) == 0
