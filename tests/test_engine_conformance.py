"""The engine conformance suite: what every engine must do, run on each engine in the registry.

As zarr's ``StoreTests``: one class of behaviour, and every engine of
``multitables._io.engines.REGISTRY`` runs it (the ``engine`` fixture), so a
new engine is tested by registering it. An engine delivers what h5py's
``dataset[()]`` gives, whatever the ranges, prefetches and row sets; it
releases its file when closed; and its ``problem`` is None exactly where its
opens read the node right. Choosing an engine (``auto``) is tested in
``test_engines``, each engine's own workings in its module's tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import h5py
import hdf5plugin
import numpy as np
import pytest
import tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multitables._io.engines import REGISTRY, Engine, open_source
from multitables._io.node import NodeInfo, inspect_node
from multitables._io.scattered import Stopped

EXAMPLES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(params=REGISTRY, ids=lambda engine: engine.name, scope="module")
def engine(request: pytest.FixtureRequest) -> Engine:
    """Each registered engine in turn."""
    return request.param


@dataclass(frozen=True)
class Case:
    """A node every engine reads, and what h5py gives for it."""

    path: Path
    node_path: str
    field: "str | None"
    expected: np.ndarray

    def node(self) -> NodeInfo:
        return inspect_node(self.path, self.node_path, self.field)

    def fancy(self, rows: "list[int]") -> np.ndarray:
        """h5py's fancy indexing of ``rows`` (sorted, unique)."""
        with h5py.File(self.path, "r") as f:
            ds = f[self.node_path]
            return (ds.fields(self.field) if self.field else ds)[rows]


def _write_cases(d: Path) -> "dict[str, Case]":
    rng = np.random.default_rng(7)
    cases: dict[str, Any] = {}
    with tables.open_file(d / "pt.h5", "w") as f:
        f.create_carray("/", "zlib", obj=rng.integers(-1000, 1000, (301, 5, 3)).astype("<i4"),
                        filters=tables.Filters(3, "zlib", shuffle=True), chunkshape=(32, 5, 3))
        f.create_array("/", "contiguous", rng.standard_normal((300, 4)))
        rows = np.zeros(700, [("a", "<i4"), ("b", "<f8"), ("v", "<f4", (3,)), ("s", "S5")])
        rows["a"], rows["b"], rows["v"] = np.arange(700), np.arange(700) / 3, np.arange(2100).reshape(700, 3)
        rows["s"] = [b"ab", b"ab\0cd", b"abcde", b"", b"\0\0x"] * 140  # null-terminated: h5py ends each at its first NUL
        f.create_table("/", "table", rows, filters=tables.Filters(5, "blosc"), chunkshape=(64,))
    cases |= {name: ("pt.h5", "/" + name, None) for name in ("zlib", "contiguous", "table")}
    cases["field"] = ("pt.h5", "/table", "v")
    with h5py.File(d / "h5.h5", "w") as f:
        # Chunks that cut the rows (N-d chunking).
        f.create_dataset("nd", data=rng.standard_normal((500, 6)).astype("<f4"), chunks=(64, 4), compression="gzip", shuffle=True)
        # Chunks never written read as the fill value.
        holes = f.create_dataset("holes", shape=(400, 3), dtype="<i2", chunks=(50, 3), fillvalue=-7, compression="gzip")
        holes[100:180] = 1
        # Fixed-length strings, some shorter than their 4 bytes.
        f.create_dataset("strings", data=np.array([b"ab", b"abcd", b"", b"x"] * 50, "S4"), chunks=(16,), compression="gzip")
    cases |= {name: ("h5.h5", "/" + name, None) for name in ("nd", "holes", "strings")}
    out = {}
    for name, (file, path, field) in cases.items():
        with h5py.File(d / file, "r") as f:
            expected = (f[path].fields(field) if field else f[path])[()]
        out[name] = Case(d / file, path, field, expected)
    return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> "dict[str, Case]":
    return _write_cases(tmp_path_factory.mktemp("conformance"))


CASES = ("zlib", "contiguous", "table", "field", "nd", "holes", "strings")


def _ranges(n_rows: int) -> "st.SearchStrategy[list[tuple[int, int]]]":
    bounds = st.tuples(st.integers(0, n_rows), st.integers(0, n_rows)).map(sorted).map(tuple)
    return st.lists(bounds, min_size=1, max_size=8)


def _read(source: Any, node: NodeInfo, start: int, stop: int) -> np.ndarray:
    out = np.empty((stop - start,) + node.row_shape, node.dtype)
    source.read_into(start, stop, out)
    return out


def _same(got: np.ndarray, expected: np.ndarray) -> bool:
    return got.dtype == expected.dtype and got.shape == expected.shape and got.tobytes() == expected.tobytes()


def _reads_right(engine: Engine, case: Case, reads: "list[tuple[int, int]]", hints: "Sequence[tuple[int, int]]" = ()) -> None:
    """Read each range of ``reads`` in turn from one source of ``case``'s node (after the hint paired with it, if any)
    and check the rows: what one read keeps for the next must not leak into it."""
    node = case.node()
    source = engine.open(node, {})
    try:
        for k, (start, stop) in enumerate(reads):
            hint = hints[k] if k < len(hints) else None
            if hint is not None:
                source.prefetch(*hint)
            assert _same(_read(source, node, start, stop), case.expected[start:stop]), f"rows {start}:{stop} after a hint of {hint}"
    finally:
        source.close()


FILTERS = [
    None,
    tables.Filters(3, "zlib", shuffle=True),
    tables.Filters(3, "blosc", shuffle=True),
    tables.Filters(5, "blosc:lz4"),
    tables.Filters(5, "blosc:lz4hc"),
    tables.Filters(5, "blosc:zstd", bitshuffle=True),
    tables.Filters(5, "blosc:zlib"),
    tables.Filters(5, "blosc:blosclz", fletcher32=True),
    tables.Filters(5, "blosc2:zstd"),
    tables.Filters(5, "blosc2:lz4"),
    tables.Filters(5, "bzip2", shuffle=True),
    tables.Filters(0, fletcher32=True),
]


def _write(path: Path, data: np.ndarray, filters: "tables.Filters | None", chunkshape: "tuple[int, ...] | None") -> None:
    with tables.open_file(path, "w") as f:
        if filters is None and chunkshape is None:
            f.create_array("/", "data", data)
        else:
            f.create_carray("/", "data", obj=data, filters=filters, chunkshape=chunkshape)


class TestEveryEngine:
    """What every registered engine must do (the module docstring says why one class)."""

    @pytest.mark.parametrize("filters", FILTERS, ids=lambda f: "contiguous" if f is None else f"{f.complib}{f.complevel}{'+f32' if f.fletcher32 else ''}")
    def test_reads_equal_pytables(self, tmp_path: Path, engine: Engine, filters: "tables.Filters | None") -> None:
        data = np.random.default_rng(1).integers(-1000, 1000, (301, 5, 3)).astype("<i4")
        path = tmp_path / "d.h5"
        _write(path, data, filters, None if filters is None else (32, 5, 3))
        node = inspect_node(path, "/data")
        src = open_source(engine.name, node, {})
        try:
            for start, stop in [(0, 301), (5, 37), (31, 33), (300, 301)]:
                out = np.empty((stop - start,) + node.row_shape, node.dtype)
                src.read_into(start, stop, out)
                np.testing.assert_array_equal(out, data[start:stop])
        finally:
            src.close()

    @pytest.mark.parametrize("field", [None, "a", "b", "v"])
    def test_tables_and_fields(self, table_file: "tuple[Path, np.ndarray]", engine: Engine, field: "str | None") -> None:
        path, rows = table_file
        node = inspect_node(path, "/table", field)
        src = open_source(engine.name, node, {})
        try:
            out = np.empty((100,) + node.row_shape, node.dtype)
            src.read_into(450, 550, out)
        finally:
            src.close()
        expected = rows[450:550] if field is None else rows[field][450:550]
        np.testing.assert_array_equal(out, expected)

    def test_h5py_written_files(self, tmp_path: Path, engine: Engine) -> None:
        data = np.arange(4000, dtype="<f8").reshape(1000, 4)
        path = tmp_path / "h5py.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("zstd", data=data, chunks=(100, 4), **hdf5plugin.Zstd())
            f.create_dataset("gzip", data=data, chunks=(64, 2), compression="gzip", shuffle=True)
            f.create_dataset("plain", data=data)
        # PyTables' own HDF5 library has no zstd filter (hdf5plugin registers with h5py's):
        # that is why ``auto`` checks the node's filters before it picks an engine.
        names = ("gzip", "plain") if engine.name == "tables" else ("zstd", "gzip", "plain")
        for name in names:
            node = inspect_node(path, "/" + name)
            src = open_source(engine.name, node, {})
            out = np.empty((300, 4), "<f8")
            try:
                src.read_into(650, 950, out)
            finally:
                src.close()
            np.testing.assert_array_equal(out, data[650:950])

    @pytest.mark.parametrize("name", CASES)
    @EXAMPLES
    @given(data=st.data())
    def test_read_into_gives_the_rows_of_any_range(self, engine: Engine, cases: "dict[str, Case]", name: str, data: st.DataObject) -> None:
        node = cases[name].node()
        _reads_right(engine, cases[name], data.draw(_ranges(node.n_rows)))

    @pytest.mark.parametrize("name", ["zlib", "nd", "holes"])
    @EXAMPLES
    @given(data=st.data())
    def test_prefetch_never_changes_rows(self, engine: Engine, cases: "dict[str, Case]", name: str, data: st.DataObject) -> None:
        node = cases[name].node()
        # Hints of other rows, of the rows read next, or of none (a == b), before each read.
        _reads_right(engine, cases[name], data.draw(_ranges(node.n_rows)), data.draw(_ranges(node.n_rows)))

    @pytest.mark.parametrize("name", CASES)
    @EXAMPLES
    @given(data=st.data())
    def test_random_access_rows_equal_h5py_fancy_indexing(self, engine: Engine, cases: "dict[str, Case]", name: str,
                                                          data: st.DataObject) -> None:
        case = cases[name]
        node = case.node()
        rows = sorted(data.draw(st.sets(st.integers(0, node.n_rows - 1), min_size=1, max_size=80)))
        reader = engine.open_rows(node, {})
        try:
            out = np.empty((len(rows),) + node.row_shape, node.dtype)
            reader.read(np.array(rows, np.int64), out, lambda: False)
        finally:
            reader.close()
        assert _same(out, case.fancy(rows)), f"rows {rows}"

    @pytest.mark.parametrize("name", CASES)
    @EXAMPLES
    @given(data=st.data())
    def test_random_access_rows_given_as_a_range_equal_h5py_slicing(self, engine: Engine, cases: "dict[str, Case]", name: str,
                                                                   data: st.DataObject) -> None:
        """A slice's plan reaches the readers as a range (``StageMap.rows_of``), consecutive rows or not."""
        case = cases[name]
        node = case.node()
        start = data.draw(st.integers(0, node.n_rows - 1))
        rows = range(start, data.draw(st.integers(start + 1, node.n_rows)), data.draw(st.sampled_from([1, 1, 2, 7, 31, 32, 33, 300])))
        reader = engine.open_rows(node, {})
        try:
            out = np.empty((len(rows),) + node.row_shape, node.dtype)
            reader.read(rows, out, lambda: False)
        finally:
            reader.close()
        assert _same(out, case.fancy(list(rows))), f"rows {rows}"

    @pytest.mark.parametrize("rows", [range(0, 300), range(0, 300, 3)])
    def test_a_random_access_read_of_a_range_stops_when_asked(self, engine: Engine, cases: "dict[str, Case]", rows: range) -> None:
        node = cases["zlib"].node()
        reader = engine.open_rows(node, {})
        try:
            with pytest.raises(Stopped):
                reader.read(rows, np.empty((len(rows),) + node.row_shape, node.dtype), lambda: True)
        finally:
            reader.close()

    def test_a_random_access_read_stops_when_asked(self, engine: Engine, cases: "dict[str, Case]") -> None:
        node = cases["zlib"].node()
        rows = np.arange(0, node.n_rows, 3, dtype=np.int64)  # one run per row: many reads
        reader = engine.open_rows(node, {})
        try:
            with pytest.raises(Stopped):
                reader.read(rows, np.empty((len(rows),) + node.row_shape, node.dtype), lambda: True)
        finally:
            reader.close()

    @pytest.mark.parametrize("name", ["zlib", "contiguous", "holes"])
    def test_close_releases_the_file(self, engine: Engine, cases: "dict[str, Case]", fds_on: Callable[[Path], int], name: str) -> None:
        case = cases[name]
        node = case.node()
        assert fds_on(case.path) == 0
        source = engine.open(node, {})
        source.prefetch(0, node.n_rows)
        _read(source, node, 0, node.n_rows)
        source.close()
        assert fds_on(case.path) == 0
        reader = engine.open_rows(node, {})
        reader.read(np.arange(node.n_rows, dtype=np.int64), np.empty((node.n_rows,) + node.row_shape, node.dtype), lambda: False)
        reader.close()
        assert fds_on(case.path) == 0

    def test_problem_is_none_exactly_where_its_opens_read_the_node(self, engine: Engine, cases: "dict[str, Case]",
                                                                  refused: "dict[str, Case]") -> None:
        for name, case in {**cases, **refused}.items():
            node = case.node()
            why = engine.problem(node, {})
            failure = _what_fails(engine, node, case.expected)
            if (engine.name, name) in CONSERVATIVE:
                assert why is not None and failure is None, f"{name}: {CONSERVATIVE[engine.name, name]}"
                continue
            assert (why is None) == (failure is None), f"{engine.name} on {name}: problem {why!r}, its opens: {failure}"


#: (engine, node) where ``problem`` refuses what the engine's opens would read right, with the reason.
CONSERVATIVE = {
    ("h5py", "quad"): "h5py's low-level read converts PyTables' quad floats, but its dataset[()] has no numpy type for "
                      "them: refused, as h5py would refuse it",
}


def _what_fails(engine: Engine, node: NodeInfo, expected: np.ndarray) -> "str | None":
    """Why reading all of ``node`` with ``engine``'s opens (a source, and rows for random access) does not give ``expected``; None if it does."""
    rows = np.arange(node.n_rows, dtype=np.int64)
    for how in ("open", "open_rows"):
        try:
            opened = getattr(engine, how)(node, {})
        except Exception as exc:
            return f"{how}: {type(exc).__name__}: {exc}"
        try:
            out = np.empty((node.n_rows,) + node.row_shape, node.dtype)
            if how == "open":
                opened.read_into(0, node.n_rows, out)
            else:
                opened.read(rows, out, lambda: False)
        except Exception as exc:
            return f"{how}, reading: {type(exc).__name__}: {exc}"
        finally:
            opened.close()
        if not _same(out, expected):
            return f"{how}: other rows"
    return None


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> "dict[str, Case]":
    """Nodes some engine does not read: a filter only h5py's plugins decode, references PyTables cannot load,
    types h5py has no numpy type for (read as PyTables reads them)."""
    d = tmp_path_factory.mktemp("refused")
    data = np.random.default_rng(8).standard_normal((500, 6)).astype("<f4")
    with h5py.File(d / "plugins.h5", "w") as f:
        f.create_dataset("zfp", data=data, chunks=(50, 6), **hdf5plugin.Zfp(reversible=True))
        f.create_dataset("lz4", data=data, chunks=(50, 6), **hdf5plugin.LZ4())
        x = f.create_dataset("scale", data=np.arange(10.0))
        x.make_scale("x")
        f.create_dataset("y", data=np.arange(20.0).reshape(10, 2)).dims[0].attach_scale(x)
    found = {name: Case(d / "plugins.h5", "/" + name, None, data if name != "scale" else np.arange(10.0))
             for name in ("zfp", "lz4", "scale")}
    shipped = Path(tables.__file__).parent / "tests"
    for name, file, path in [("quad", "float.h5", "/quadprecision"), ("time32", "times-nested-be.h5", "/earr32")]:
        if (shipped / file).exists():  # PyTables' own test files, where its wheel ships them
            with tables.open_file(shipped / file) as f:
                found[name] = Case(shipped / file, path, None, np.asarray(f.get_node(path)[:]))
    return found
