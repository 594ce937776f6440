"""Other projects' layouts: a group or column the user named by its writer's word is refused, saying where the rows are.

Each file is written here with h5py or PyTables in the layout the named writer
produces (attributes and members copied from its files), so the tests need
none of the writers installed.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
import tables

import multitables

ROWS = 40


def _pandas_table(path: Path) -> np.ndarray:
    """pandas 3.1.1 ``DataFrame({'a': int64, 'b': float64, 'd': float64}).to_hdf(path, key='df', format='table')``:
    group ``/df`` (``pandas_type``), a PyTables Table ``/df/table`` whose columns that are not data_columns are
    kept by dtype in ``values_block_N`` fields, their DataFrame names pickled (protocol 0) in ``values_block_N_kind``."""
    rows = np.zeros(ROWS, [("index", "<i8"), ("values_block_0", "<i8", (1,)), ("values_block_1", "<f8", (2,))])
    rows["index"] = np.arange(ROWS)
    rows["values_block_0"][:, 0] = np.arange(ROWS) * 10
    rows["values_block_1"] = np.arange(2 * ROWS, dtype="f8").reshape(ROWS, 2) / 4
    with tables.open_file(path, "w") as f:
        group = f.create_group("/", "df")
        group._v_attrs.pandas_type = b"frame_table"
        group._v_attrs.table_type = b"appendable_frame"
        table = f.create_table(group, "table", rows)
        table.attrs.values_block_0_kind = np.bytes_(pickle.dumps(["a"], protocol=0))
        table.attrs.values_block_1_kind = np.bytes_(pickle.dumps(["b", "d"], protocol=0))
    return rows


def _refusal(stream: multitables.Streamer, path: str, **kwargs: object) -> str:
    with pytest.raises(multitables.NodeTypeError) as info:
        stream.get_queue(path, n_procs=0, **kwargs)
    return str(info.value)


def test_a_pandas_table_key_is_refused_naming_its_table(tmp_path: Path) -> None:
    path = tmp_path / "pd.h5"
    _pandas_table(path)
    said = _refusal(multitables.Streamer(path), "/df")
    assert said.startswith(f"'/df' in {str(path)!r} is a Group; only array datasets")
    assert "pandas object written by to_hdf(format='table') ('frame_table'): its rows are the Table '/df/table'" in said


def test_a_pandas_column_by_its_dataframe_name_points_at_its_values_block(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "pd.h5"
    rows = _pandas_table(path)
    stream = multitables.Streamer(path)
    with pytest.raises(multitables.NoSuchFieldError, match=r"has no field 'd'; its fields are \['index', 'values_block_0', "
                       r"'values_block_1'\]\. pandas' to_hdf\(format='table'\) keeps .*'d' is values_block_1\[:, 1\]"):
        stream.get_queue("/df/table", field="d")
    with pytest.raises(multitables.NoSuchFieldError, match=r"no column 'a', 'zz'; .*: 'a' is values_block_0\[:, 0\] \("):
        stream.get_batches("/df/table", 8, fields=["a", "zz"])
    with multitables.Reader(path, n_procs=1) as reader:
        with pytest.raises(multitables.NoSuchFieldError, match=r"'b' is values_block_1\[:, 0\]"):
            reader.get_dataset("/df/table")["b"]
    got = np.concatenate(list(stream.get_batches("/df/table", 16, shuffle=False, field="values_block_1")))
    assert np.array_equal(got[:, 1], rows["values_block_1"][:, 1])  # where the hint says 'd' is


def test_a_column_that_is_nowhere_gets_no_pandas_hint(tmp_path: Path) -> None:
    path = tmp_path / "pd.h5"
    _pandas_table(path)
    with pytest.raises(multitables.NoSuchFieldError) as info:
        multitables.Streamer(path).get_queue("/df/table", field="zz")
    assert str(info.value.args[0]).endswith("its fields are ['index', 'values_block_0', 'values_block_1']")


class _Touch:
    """Unpickling this would create a file: the hint must never unpickle what a file holds."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_the_column_names_are_read_without_unpickling(tmp_path: Path) -> None:
    path, touched = tmp_path / "pd.h5", tmp_path / "touched"
    _pandas_table(path)
    with h5py.File(path, "a") as f:
        f["/df/table"].attrs["values_block_0_kind"] = np.bytes_(pickle.dumps(["a", _Touch(str(touched))], protocol=0))
    with pytest.raises(multitables.NoSuchFieldError, match=r"'a' is values_block_0\[:, 0\]"):
        multitables.Streamer(path).get_queue("/df/table", field="a")
    assert not touched.exists()


def test_a_pandas_fixed_frame_is_refused_naming_its_blocks(tmp_path: Path) -> None:
    # pandas 3.1.1 ``df.to_hdf(path, key='df', format='fixed')``: a column block per dtype, its names in blockN_items.
    path = tmp_path / "fixed.h5"
    with h5py.File(path, "w") as f:
        group = f.create_group("df")
        group.attrs.update({"pandas_type": np.bytes_(b"frame"), "nblocks": np.int64(2)})
        group["block0_items"] = np.array([b"a"])
        group["block0_values"] = np.zeros((ROWS, 1), "i8")
        group["block1_items"] = np.array([b"b", b"c"])
        group["block1_values"] = np.zeros((ROWS, 2), "f8")
    said = _refusal(multitables.Streamer(path), "/df")
    assert said.endswith("written by to_hdf(format='fixed'), its columns in blocks of one dtype, a row per DataFrame "
                         "row: '/df/block0_values' holds ['a']; '/df/block1_values' holds ['b', 'c']")


def test_a_pandas_fixed_series_is_refused_naming_its_values(tmp_path: Path) -> None:
    path = tmp_path / "series.h5"
    with h5py.File(path, "w") as f:  # pandas 3.1.1 ``series.to_hdf(path, key='s', format='fixed')``
        f.create_group("s").attrs["pandas_type"] = np.bytes_(b"series")
        f["s/index"], f["s/values"] = np.arange(ROWS), np.zeros(ROWS)
    assert _refusal(multitables.Streamer(path), "/s").endswith("a pandas Series written by to_hdf(format='fixed'): its "
                                                               "values are '/s/values'")


def _anndata(path: Path) -> np.ndarray:
    """anndata 0.12.19 ``write_h5ad`` of an AnnData with a CSR ``X`` and a categorical obs column: groups whose
    ``encoding-type`` attribute says what they hold."""
    data = np.arange(1, 11, dtype="f4")
    with h5py.File(path, "w") as f:
        f.attrs["encoding-type"] = "anndata"
        x = f.create_group("X")
        x.attrs.update({"encoding-type": "csr_matrix", "encoding-version": "0.1.0", "shape": np.array([5, 7])})
        x["data"], x["indices"], x["indptr"] = data, np.arange(10) % 7, np.array([0, 2, 4, 6, 8, 10])
        cell = f.create_group("obs/cell")
        cell.attrs.update({"encoding-type": "categorical", "encoding-version": "0.2.0", "ordered": False})
        cell["codes"] = np.array([0, 1, 0, 1, 1], "i1")
        cell["categories"] = np.array(["a", "b"], dtype=h5py.string_dtype())
    return data


def test_an_anndata_sparse_x_is_refused_as_a_sparse_matrix_naming_its_parts(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "a.h5ad"
    data = _anndata(path)
    stream = multitables.Streamer(path)
    with multitables.Reader(path, n_procs=1) as reader:
        refusals = (lambda: stream.get_queue("/X"), lambda: stream.get_batches(["/X"], 4), lambda: reader.get_dataset("/X"))
        for refuse in refusals:
            with pytest.raises(multitables.NodeTypeError) as info:
                refuse()
            assert str(info.value).endswith(
                "Group; only array datasets (Array, CArray, EArray) and Tables can be streamed. It holds a sparse matrix "
                "(anndata's 'csr_matrix' encoding, shape (5, 7)) as the datasets '/X/data', '/X/indices', '/X/indptr': "
                "multitables streams the rows of a dense dataset, not a sparse matrix; read it with anndata or "
                "scipy.sparse, or stream those datasets as flat arrays")
    assert np.array_equal(np.concatenate(list(stream.get_batches("/X/data", 4, shuffle=False))), data)


def test_an_anndata_categorical_is_refused_naming_its_codes(tmp_path: Path) -> None:
    path = tmp_path / "a.h5ad"
    _anndata(path)
    said = _refusal(multitables.Streamer(path), "/obs/cell")
    assert said.endswith("It holds a categorical column (anndata's 'categorical' encoding): stream its codes "
                         "'/obs/cell/codes'; its categories are '/obs/cell/categories'")
    assert _refusal(multitables.Streamer(path), "/").endswith(
        "It holds anndata's 'anndata' encoding: '/X' (a group), '/obs' (a group)")


def test_any_other_group_is_refused_naming_its_first_members(tmp_path: Path) -> None:
    # Keras 3.15.1 ``model.save_weights('k.weights.h5')`` keeps a layer's weights as ``/layers/<name>/vars/0, 1``.
    path = tmp_path / "k.weights.h5"
    with h5py.File(path, "w", track_order=True) as f:
        f["layers/dense/vars/0"], f["layers/dense/vars/1"] = np.zeros((16, 32), "f4"), np.zeros(32, "f4")
        many = f.create_group("many", track_order=True)
        for i in range(10):
            many[f"d{i}"] = np.zeros(3)
        many["link"] = h5py.SoftLink("/many/d0")
        f.create_group("empty")
    stream = multitables.Streamer(path)
    assert _refusal(stream, "/layers/dense").endswith("It holds '/layers/dense/vars' (a group)")
    assert _refusal(stream, "/layers/dense/vars").endswith(
        "It holds '/layers/dense/vars/0' (a dataset), '/layers/dense/vars/1' (a dataset)")
    assert _refusal(stream, "/many").endswith("It holds " + ", ".join(f"'/many/d{i}' (a dataset)" for i in range(8))
                                              + ", ... (11 in all)")
    assert _refusal(stream, "/empty").endswith("is a Group; only array datasets (Array, CArray, EArray) and Tables "
                                               "can be streamed. It is empty")


def _matlab(path: Path) -> dict[str, np.ndarray]:
    """A v7.3 .mat file as MATLAB (and hdf5storage 0.2, which copies its layout) writes one: a 512-byte userblock,
    a ``MATLAB_class`` attribute on every variable, matrices transposed (N x D in MATLAB is a D x N dataset), an
    empty matrix as its dimensions in uint64 with ``MATLAB_empty``, a cell array as object references into
    ``/#refs#``, a sparse matrix as a group of ``data``, ``ir`` and ``jc`` (compressed sparse columns)."""
    rng = np.random.default_rng(0)
    values = {"X": rng.standard_normal((8, 300)), "L": (rng.random((2, 300)) > 0.5).astype("u1")}
    with h5py.File(path, "w", userblock_size=512) as f:
        for name, kind in (("X", "double"), ("L", "logical")):
            f.create_dataset(name, data=values[name], chunks=(1, 128), compression="gzip").attrs["MATLAB_class"] = \
                np.bytes_(kind)
        empty = f.create_dataset("E", data=np.array([0, 5], "u8"))
        empty.attrs.update({"MATLAB_class": np.bytes_("double"), "MATLAB_empty": np.uint8(1)})
        f["#refs#/b"] = np.arange(3.0).reshape(1, 3)
        cell = f.create_dataset("C", shape=(1, 1), dtype=h5py.ref_dtype)
        cell[0, 0] = f["#refs#/b"].ref
        cell.attrs["MATLAB_class"] = np.bytes_("cell")
        sparse = f.create_group("S")
        sparse.attrs.update({"MATLAB_class": np.bytes_("double"), "MATLAB_sparse": np.uint64(100)})
        sparse["data"], sparse["ir"], sparse["jc"] = np.ones(3), np.arange(3, dtype="u8"), np.array([0, 1, 2, 3], "u8")
    return values


def test_a_matlab_file_reads_its_matrices_as_stored_and_refuses_what_is_not_a_matrix(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "m.mat"
    values = _matlab(path)
    stream = multitables.Streamer(path)
    for name in ("X", "L"):  # as h5py delivers them: MATLAB's columns are the rows
        assert np.array_equal(np.concatenate(list(stream.get_batches(f"/{name}", 4, shuffle=False))), values[name])
    with multitables.Reader(path, n_procs=0) as reader:
        refusals = {
            "/E": "'/E' in {} holds MATLAB's empty array (attribute MATLAB_empty): its values [0, 5] are the "
                  "dimensions of an empty matrix, not data, so it has no rows to read",
            "/C": "'/C' in {} has dtype object, which is variable-length, opaque or references; only fixed-size "
                  "numeric, string and compound rows can be streamed. It holds HDF5 object references (a MATLAB cell "
                  "array, whose elements are datasets in '/#refs#'): read the datasets they point to with h5py",
            "/S": "'/S' in {} is a Group; only array datasets (Array, CArray, EArray) and Tables can be streamed. It "
                  "holds a MATLAB sparse matrix (100 rows) as compressed sparse columns, the datasets '/S/data' (the "
                  "nonzeros), '/S/ir' (their rows) and '/S/jc' (where each column starts): multitables streams the "
                  "rows of a dense dataset, not a sparse matrix; read it with scipy.sparse.csc_matrix, or stream those "
                  "datasets as flat arrays",
        }
        for node, said in refusals.items():
            for refuse in (lambda: stream.get_queue(node), lambda: stream.get_generator(node),
                           lambda: stream.get_batches(node, 4), lambda: reader.get_dataset(node)):
                with pytest.raises(multitables.NodeTypeError) as info:
                    refuse()
                assert str(info.value) == said.format(repr(str(path)))


@pytest.mark.parametrize("dtype, shape", [("u8", (2,)), ("u4", (2,)), ("u8", (3, 1))])
def test_a_small_unsigned_dataset_named_like_matlabs_empty_marker_but_without_its_attribute_reads(
        tmp_path: Path, dtype: str, shape: "tuple[int, ...]") -> None:
    path = tmp_path / "m.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("E", data=np.arange(np.prod(shape), dtype=dtype).reshape(shape)).attrs["MATLAB_class"] = \
            np.bytes_("double")
    assert np.array_equal(np.stack(list(multitables.Streamer(path).get_generator("/E", n_procs=0))),
                          np.arange(np.prod(shape), dtype=dtype).reshape(shape))


#: netCDF-C's name for a dimension scale that stands for a dimension with no variable (``nc4hdf.c``), then ``%10d``.
NETCDF_DIMENSION = "This is a netCDF dimension but not a netCDF variable."


def _netcdf(path: Path) -> dict[str, np.ndarray]:
    """A netCDF-4 file as netCDF-C 4.10 (netCDF4-python 1.7) writes one: coordinate variables ``lat`` and ``lev``
    (dimension scales named for themselves; ``lev`` big-endian float32, as netCDF's ``endian='big'``), a dimension with
    no variable (``nv``) and an unlimited one (``time``) as placeholders (dimension scales of big-endian float32 named
    ``'This is a netCDF dimension but not a netCDF variable.%10d'``, never written: an unlimited one keeps 0 rows
    while its variables grow), ``temp(time, lat)`` chunked a time step a chunk with zlib + shuffle and a
    ``_FillValue``, steps 3 and 4 never written (unallocated chunks), ``bounds(lat, nv)``, a packed int16 with
    ``scale_factor``/``add_offset``, and the DIMENSION_LIST / REFERENCE_LIST attributes h5py's ``dims`` API writes as
    netCDF-C does. Returns what h5py reads of each variable."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w", libver="earliest") as f:
        f.attrs["_NCProperties"] = np.bytes_("version=2,netcdf=4.10.1,hdf5=2.2.0")
        lat = f.create_dataset("lat", data=np.arange(5, dtype="f4") * 10)
        lat.make_scale("lat")
        f.create_dataset("lev", data=np.array([1000, 850, 500], ">f4")).make_scale("lev")
        placeholders = {"nv": f.create_dataset("nv", shape=(2,), dtype=">f4"),
                        "time": f.create_dataset("time", shape=(0,), maxshape=(None,), chunks=(1024,), dtype=">f4")}
        for name, scale in placeholders.items():
            scale.make_scale(f"{NETCDF_DIMENSION}{len(scale):10d}")
        var = f.create_dataset("temp", shape=(6, 5), maxshape=(None, 5), chunks=(1, 5), dtype="f4", fillvalue=-999.0,
                               compression="gzip", compression_opts=9, shuffle=True)
        for step in (0, 1, 2, 5):
            var[step] = rng.normal(280, 5, 5).astype("f4")
        bounds = f.create_dataset("bounds", data=np.stack([np.arange(5) * 10 - 5, np.arange(5) * 10 + 5], 1).astype("f4"))
        packed = f.create_dataset("packed", data=rng.integers(-3000, 3000, (6, 5), dtype="i2"), chunks=(1, 5))
        packed.attrs.update({"scale_factor": np.float64(0.01), "add_offset": np.float64(273.15)})
        for variable, dims in ((var, ("time", "lat")), (bounds, ("lat", "nv")), (packed, ("time", "lat"))):
            for axis, dim in enumerate(dims):
                variable.dims[axis].attach_scale(f[dim])
        f.create_group("forecast").create_dataset("step", shape=(0,), maxshape=(None,), dtype=">f4").make_scale(
            f"{NETCDF_DIMENSION}{0:10d}")
        return {name: f[name][()] for name in ("lat", "lev", "temp", "bounds", "packed")}


def test_a_netcdf_file_reads_its_variables_raw_and_refuses_its_dimension_placeholders(tmp_path: Path, no_leaks: None) -> None:
    path = tmp_path / "t.nc"
    values = _netcdf(path)
    assert values["temp"][3, 0] == -999.0  # the unallocated steps read as the fill value
    stream = multitables.Streamer(path)
    for name, want in values.items():  # coordinate variables too; packed values as stored, scale_factor not applied
        for engine in ("h5py", "chunks"):
            got = np.stack(list(multitables.Streamer(path, engine=engine).get_generator(f"/{name}", n_procs=0)))
            assert got.dtype.newbyteorder("=") == want.dtype.newbyteorder("=") and np.array_equal(got, want), (name, engine)
    with multitables.Reader(path, n_procs=0) as reader:
        for node, users in (("/nv", "('/bounds')"), ("/time", "('/packed', '/temp')"), ("/forecast/step", "")):
            said = (f"{node!r} in {str(path)!r} is netCDF-4's placeholder for a dimension with no coordinate variable "
                    f"(a dimension scale named 'This is a netCDF dimension but not a netCDF variable.'): it holds no "
                    f"data, so it has no rows to read" + (f"; stream the variables defined on it {users}" if users else ""))
            for refuse in (lambda: stream.get_queue(node), lambda: stream.get_generator(node),
                           lambda: stream.get_batches(node, 4), lambda: reader.get_dataset(node)):
                with pytest.raises(multitables.NodeTypeError) as info:
                    refuse()
                assert str(info.value) == said
    assert _refusal(stream, "/forecast").endswith("It holds '/forecast/step' (a netCDF dimension, no data)")
