"""Storage layouts and element types of users' files: every face reads h5py's rows, or refuses before any reader starts.

Each case is a tiny file written with h5py: virtual datasets (sources in the file, in other files, missing, strided),
external raw files, compact storage, element types (float16, complex, bool, big-endian, enums, strings, compounds
with array members), edge shapes and HDF5's filters (lzf, scaleoffset, nbit, shuffle with fletcher32, chunks whose
optional filters were skipped). Read by every engine through the queue (with the remainder), the generator, a
Reader's requests and training batches, in this process; a few through reader processes too.
Then what failed mid-stream before NOTE [data outside the file]: a piece kept outside the file that no engine reads.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

import h5py
import numpy as np
import pytest

import multitables
from _guards import hang_guard
from _readall import live_children
from multitables._io.outside import places

ENGINES = ("auto", "chunks", "h5py", "tables")
N = 23
BASE = np.arange(N * 4, dtype="<i4").reshape(N, 4)
RNG = np.random.default_rng(7)
FLOATS = RNG.standard_normal((N, 8)).astype("<f4")


@pytest.fixture(autouse=True)
def _guard(request: pytest.FixtureRequest) -> Iterator[None]:
    with hang_guard(60.0, request.node.name):
        yield


# -- the files -------------------------------------------------------------------


def _vds_same_file(f: h5py.File) -> None:
    f.create_dataset("a", data=BASE[:12], chunks=(4, 4), compression="gzip")
    f.create_dataset("b", data=BASE[12:] + 1000)  # contiguous
    layout = h5py.VirtualLayout(shape=BASE.shape, dtype="<i4")
    layout[:12] = h5py.VirtualSource(f["a"])
    layout[12:] = h5py.VirtualSource(f["b"])
    f.create_virtual_dataset("data", layout, fillvalue=-1)


def _sources(f: h5py.File) -> "list[str]":
    """Three source files beside ``f`` (relative names), each chunked and compressed otherwise."""
    names = []
    for i, options in enumerate([dict(chunks=(3, 4), compression="gzip"), dict(chunks=(5, 2), shuffle=True), {}]):
        name = f"source{i}.h5"
        with h5py.File(Path(f.filename).parent / name, "w") as src:
            src.create_dataset("x", data=BASE[:7] * (i + 2), **options)
        names.append(name)
    return names


def _vds_other_files(f: h5py.File, missing: bool = False) -> None:
    names = _sources(f)
    if missing:
        names[1] = "no_such_file.h5"  # HDF5 gives the fill value there
    layout = h5py.VirtualLayout(shape=(21, 4), dtype="<i4")
    for i, name in enumerate(names):
        layout[i * 7:(i + 1) * 7] = h5py.VirtualSource(name, "x", shape=(7, 4))
    f.create_virtual_dataset("data", layout, fillvalue=-5)


def _vds_strided(f: h5py.File) -> None:
    f.create_dataset("a", data=BASE[:11], chunks=(4, 4))
    f.create_dataset("b", data=BASE[11:22] + 500, chunks=(7, 4), compression="gzip")
    layout = h5py.VirtualLayout(shape=(22, 4), dtype="<i4")
    layout[0::2] = h5py.VirtualSource(f["a"])
    layout[1::2] = h5py.VirtualSource(f["b"])
    f.create_virtual_dataset("data", layout)


def _external(f: h5py.File) -> None:
    """Raw rows in two files beside ``f``, split mid-row, the second at an offset (names relative to the working
    directory, as HDF5 resolves them: the test runs there)."""
    data = FLOATS.astype("<f8")
    raw, cut = data.tobytes(), 5 * 64 + 8
    Path("raw_a.bin").write_bytes(raw[:cut])
    Path("raw_b.bin").write_bytes(b"\xab" * 100 + raw[cut:])
    f.create_dataset("data", shape=data.shape, dtype=data.dtype,
                     external=[("raw_a.bin", 0, cut), ("raw_b.bin", 100, len(raw) - cut)])


def _compact(f: h5py.File) -> None:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    dsid = h5py.h5d.create(f.id, b"data", h5py.h5t.STD_I16LE, h5py.h5s.create_simple((N, 3)), dcpl=dcpl)
    dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.arange(N * 3, dtype="<i2").reshape(N, 3))


def _typed(data: np.ndarray, chunked: bool) -> Callable[[h5py.File], None]:
    def write(f: h5py.File) -> None:
        options = dict(chunks=(5,) + data.shape[1:], compression="gzip", shuffle=True) if chunked else {}
        f.create_dataset("data", data=data, **options)
    return write


def _enum(f: h5py.File) -> None:
    kind = h5py.enum_dtype({"A": 0, "B": 300}, basetype=">i2")
    f.create_dataset("data", data=np.array([0, 300, 300] * 7 + [0, 0], ">i2"), dtype=kind, chunks=(5,), compression="gzip")


COMPOUND = np.dtype([("id", "<i4"), ("vec", "<f4", (3,)), ("m", ">i2", (2, 2))])


def _compound() -> np.ndarray:
    rows = np.zeros(N, COMPOUND)
    rows["id"], rows["vec"], rows["m"] = np.arange(N), RNG.standard_normal((N, 3)), np.arange(N * 4).reshape(N, 2, 2)
    return rows


def _rank6(f: h5py.File) -> None:
    f.create_dataset("data", data=np.arange(5 * 72, dtype="<i2").reshape(5, 2, 3, 2, 2, 3), chunks=(2, 1, 2, 2, 1, 3),
                     compression="gzip")


def _unwritten(f: h5py.File) -> None:
    ds = f.create_dataset("data", shape=(N, 6), chunks=(4, 3), dtype="<i4", fillvalue=-99, compression="gzip")
    ds[5:9, :3] = 1
    ds[17:21, 2:5] = 2


def _shrunk(f: h5py.File) -> None:
    ds = f.create_dataset("data", data=BASE, chunks=(5, 3), maxshape=(None, None), fillvalue=3)
    ds.resize((8, 3))  # chunks past the extent go, the kept ones' rows past it are filled
    ds.resize((17, 4))


def _nbit(f: h5py.File) -> None:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((6, 8))
    dcpl.set_filter(h5py.h5z.FILTER_NBIT)
    dsid = h5py.h5d.create(f.id, b"data", h5py.h5t.STD_I32LE, h5py.h5s.create_simple((N, 8)), dcpl=dcpl)
    dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, RNG.integers(-500, 500, (N, 8)).astype("<i4"))


def _skipped_filters(f: h5py.File) -> None:
    """Chunks written as stored with a filter mask: some through shuffle and deflate, some through deflate alone,
    some through neither (what HDF5 does with an optional filter that did not help)."""
    ds = f.create_dataset("data", shape=(N, 8), chunks=(6, 8), dtype="<f4", compression="gzip", shuffle=True)
    for k in range(0, N, 6):
        chunk = np.zeros((6, 8), "<f4")
        chunk[:len(FLOATS[k:k + 6])] = FLOATS[k:k + 6]
        raw, mask = chunk.tobytes(), (k // 6) % 3
        shuffled = np.frombuffer(raw, np.uint8).reshape(-1, 4).T.tobytes()
        stored = {0: zlib.compress(shuffled), 1: zlib.compress(raw), 2: raw}[mask]
        ds.id.write_direct_chunk((k, 0), stored, filter_mask={0: 0, 1: 0b01, 2: 0b11}[mask])


def _options(**options: Any) -> Callable[[h5py.File], None]:
    def write(f: h5py.File) -> None:
        data = options.pop("data", FLOATS)
        f.create_dataset("data", data=data, **options)
    return write


CASES: "dict[str, Callable[[h5py.File], None]]" = {
    "vds-same-file": _vds_same_file,
    "vds-other-files": _vds_other_files,
    "vds-missing-source": lambda f: _vds_other_files(f, missing=True),
    "vds-strided": _vds_strided,
    "external-split-offset": _external,
    "compact": _compact,
    "float16-chunked": _typed(FLOATS.astype("<f2"), True),
    "complex64-contiguous": _typed((FLOATS[:, :3] + 1j * FLOATS[:, 3:6]).astype("<c8"), False),
    "complex128-chunked": _typed((FLOATS[:, :3] - 1j * FLOATS[:, 3:6]).astype("<c16"), True),
    "bool-chunked": _typed(FLOATS > 0, True),
    "big-endian-int-1d-chunked": _typed(np.arange(N, dtype=">i4") * 1001, True),
    "big-endian-float-contiguous": _typed(FLOATS.astype(">f8"), False),
    "big-endian-enum": _enum,
    "bytes-chunked": _typed(np.array([b"ab" * (i % 4) for i in range(N)], "S7"), True),
    "compound-array-members": _typed(_compound(), True),
    "rank-6": _rank6,
    "chunk-larger-than-dataset": _options(data=BASE, chunks=(64, 8), maxshape=(None, None), compression="gzip"),
    "unwritten-chunks-fill-value": _unwritten,
    "resized-smaller": _shrunk,
    "lzf-incompressible": _options(data=RNG.integers(0, 256, (N, 64), dtype=np.uint8), chunks=(4, 64), compression="lzf"),
    "scaleoffset-float": _options(chunks=(6, 8), scaleoffset=3),
    "scaleoffset-int": _options(data=BASE, chunks=(6, 4), scaleoffset=0),
    "nbit": _nbit,
    "shuffle-fletcher32": _options(chunks=(6, 8), shuffle=True, fletcher32=True),
    "skipped-filters": _skipped_filters,
}
#: Cases also read by reader processes, which find the other files as this process does (the others read in this
#: process only: a reader decodes with the same source, ~0.5 s a case of four faces).
WITH_READERS = ("vds-missing-source", "external-split-offset")


def _write(tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # external raw files are found from the working directory
    path = tmp_path / "case.h5"
    with h5py.File(path, "w") as f:
        CASES[case](f)
    return path


# -- the faces ---------------------------------------------------------------------


def _queue(path: Path, engine: str, n_procs: int) -> np.ndarray:
    stream, blocks = multitables.Streamer(path, engine=engine), []
    with stream.get_queue("/data", n_procs=n_procs, ordered=True) as queue:
        for guard in queue.iter():
            with guard as block:
                blocks.append(block.copy())
        size = queue.block_size
    blocks.append(stream.get_remainder("/data", size))
    return np.concatenate(blocks, dtype=blocks[0].dtype)


def _generator(path: Path, engine: str, n_procs: int) -> np.ndarray:
    rows = list(multitables.Streamer(path, engine=engine).get_generator("/data", n_procs=n_procs, ordered=True))
    if isinstance(rows[0], np.void):
        return np.array(rows, dtype=rows[0].dtype)
    if isinstance(rows[0], np.ndarray):
        assert len({row.dtype for row in rows}) == 1
        return np.stack(rows, dtype=rows[0].dtype)
    return np.array(rows, dtype=object)  # numpy scalars (native, a string's as long as its value): compared by value


def _requests(path: Path, engine: str, n_procs: int) -> np.ndarray:
    with multitables.Reader(path, n_procs=n_procs, engine=engine) as reader:
        ds = reader.get_dataset("/data")
        n = len(ds)
        with ds.create_stage(n) as stage:
            picked = np.asarray(reader.request(ds[np.array([n - 1, 0])], stage).get()).copy()
            whole = np.asarray(reader.request(ds[:], stage).get()).copy()
    _same(picked, whole[[n - 1, 0]])
    return whole


def _batches(path: Path, engine: str, n_procs: int) -> np.ndarray:
    with multitables.Streamer(path, engine=engine).get_batches("/data", 5, shuffle=False, n_procs=n_procs) as batches:
        parts = [np.asarray(b).copy() for b in batches]
    return np.concatenate(parts, dtype=parts[0].dtype)  # numpy's own choice would make it native-endian


FACES = {"queue": _queue, "generator": _generator, "requests": _requests, "batches": _batches}


def _same(got: np.ndarray, ref: np.ndarray) -> None:
    if got.dtype == object:  # a 1-d generator's numpy scalars
        assert all(value == ref.dtype.type(value) for value in got)
        got = np.array(list(got), ref.dtype)
    assert got.dtype == ref.dtype
    assert got.shape == ref.shape
    assert np.array_equal(got, ref, equal_nan=ref.dtype.kind in "fc") if ref.dtype.names is None else got.tobytes() == ref.tobytes()


def _h5py_rows(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f["data"][()]


@pytest.mark.parametrize("case", CASES)
def test_every_face_and_engine_reads_h5py_rows_or_refuses_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   case: str, no_leaks: None) -> None:
    path = _write(tmp_path, case, monkeypatch)
    ref = _h5py_rows(path)
    wrong = []
    for engine in ENGINES:
        for face, read in FACES.items():
            for n_procs in (0, 2) if case in WITH_READERS else (0,):
                try:
                    _same(read(path, engine, n_procs), ref)
                except multitables.NodeTypeError as exc:  # a refusal: before reading, naming the dataset
                    if "'/data'" not in str(exc) or engine != "tables":
                        wrong.append(f"{engine}/{face}/{n_procs}: refused: {exc}")
                except Exception as exc:  # noqa: BLE001 - each is reported
                    wrong.append(f"{engine}/{face}/{n_procs}: {type(exc).__name__}: {exc}")
    assert not wrong, "\n".join(wrong)


# -- pieces outside the file that an engine cannot read (NOTE [data outside the file]) --------------------


def _external_file_missing(f: h5py.File) -> str:
    Path("rows_a.bin").write_bytes(BASE[:5].tobytes())
    f.create_dataset("data", shape=BASE.shape, dtype=BASE.dtype,
                     external=[("rows_a.bin", 0, 80), ("rows_b.bin", 0, BASE.nbytes - 80)])  # rows_b.bin never written
    return "external file 'rows_b.bin'"


def _odd_source(path: Path) -> None:
    """A source ``x`` of 12 rows compressed with a filter no HDF5 here has (chunks written as stored)."""
    with h5py.File(path, "w") as src:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((6, 4))
        dcpl.set_filter(40123, h5py.h5z.FLAG_OPTIONAL)
        dsid = h5py.h5d.create(src.id, b"x", h5py.h5t.STD_I32LE, h5py.h5s.create_simple((12, 4)), dcpl=dcpl)
        for k in (0, 6):
            dsid.write_direct_chunk((k, 0), BASE[k:k + 6].tobytes(), filter_mask=0)


def _source_filter_nothing_decodes(f: h5py.File) -> str:
    """A virtual dataset whose second source is compressed with a filter no HDF5 here has."""
    _odd_source(Path(f.filename).parent / "odd.h5")
    f.create_dataset("plain", data=BASE[:12])
    layout = h5py.VirtualLayout(shape=(24, 4), dtype="<i4")
    layout[:12] = h5py.VirtualSource(f["plain"])
    layout[12:] = h5py.VirtualSource("odd.h5", "x", shape=(12, 4))
    f.create_virtual_dataset("data", layout)
    return "virtual source 'x' in 'odd.h5'"


UNREADABLE = {"external-file-missing": _external_file_missing, "source-filter-nothing-decodes": _source_filter_nothing_decodes}


def _start(path: Path, engine: str, face: str) -> Any:
    """Make ``face`` read ``/data`` of ``path`` with ``engine`` and a reader process (requests: in this process), as far
    as its first rows."""
    stream = multitables.Streamer(path, engine=engine)
    if face == "queue":
        with stream.get_queue("/data", n_procs=1) as queue:
            return queue.get()
    if face == "generator":
        return next(stream.get_generator("/data", n_procs=1))
    if face == "batches":
        with stream.get_batches("/data", 4, n_procs=1) as batches:
            return next(iter(batches))
    with multitables.Reader(path, n_procs=0, engine=engine) as reader:
        ds = reader.get_dataset("/data")
        with ds.create_stage(len(ds)) as stage:
            return reader.request(ds[:], stage).get()


@pytest.mark.parametrize("face", ["queue", "generator", "batches", "requests"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", UNREADABLE)
def test_a_piece_outside_the_file_no_engine_reads_is_refused_before_any_reader_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, engine: str, face: str, no_leaks: None,
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "case.h5"
    with h5py.File(path, "w") as f:
        piece = UNREADABLE[case](f)
    before = live_children()
    # A filter nothing decodes is the error that says so (filter, source file and dataset), not HDF5's plugin words.
    refusal = multitables.MissingFilterError if case == "source-filter-nothing-decodes" else multitables.NodeTypeError
    with pytest.raises(refusal) as refused:
        _start(path, engine, face)
    assert live_children() == before
    assert "'/data'" in str(refused.value) and str(path) in str(refused.value)
    assert piece in str(refused.value)  # by every engine: PyTables' words name no piece
    if refusal is multitables.MissingFilterError:
        assert refused.value.filter_ids == (40123,) and "(id 40123)" in str(refused.value)


def test_the_tables_engine_refuses_a_virtual_source_pytables_cannot_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None,
) -> None:
    """The PyTables wheel has no lzf: a source compressed with it failed PyTables mid-stream, its first rows read."""
    monkeypatch.chdir(tmp_path)
    rows = np.repeat(BASE[:12, :1], 64, axis=1)  # chunks lzf shrinks: stored through it
    with h5py.File(tmp_path / "lzf.h5", "w") as src:
        src.create_dataset("x", data=rows, chunks=(6, 64), compression="lzf")
        assert {src["x"].id.get_chunk_info(i).filter_mask for i in range(2)} == {0}
    path = tmp_path / "case.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("plain", data=rows)
        layout = h5py.VirtualLayout(shape=(24, 64), dtype="<i4")
        layout[:12] = h5py.VirtualSource(f["plain"])
        layout[12:] = h5py.VirtualSource("lzf.h5", "x", shape=(12, 64))
        f.create_virtual_dataset("data", layout)
    before = live_children()
    with pytest.raises(multitables.NodeTypeError, match="lzf.*engine='h5py' \\(or 'auto'\\) reads it"):
        list(multitables.Streamer(path, engine="tables").get_generator("/data", n_procs=1))
    assert live_children() == before
    _same(_generator(path, "auto", 1), _h5py_rows(path))


def test_sources_stored_alike_are_read_once_and_an_odd_one_among_them_is_refused_naming_it(
    tmp_path: Path, no_leaks: None,
) -> None:
    """A virtual dataset over thousands of files read one element of each, 0.6 ms a source (NOTE [data outside the
    file]): of sources alike, one is read; one stored otherwise among them, even rewritten since, is still found."""
    layout = h5py.VirtualLayout(shape=(12 * 12, 4), dtype="<i4")
    for i in range(12):
        with h5py.File(tmp_path / f"src{i:02d}.h5", "w") as src:
            src.create_dataset("x", data=BASE[:12] + i, chunks=(6, 4), compression="gzip")
        layout[i * 12:(i + 1) * 12] = h5py.VirtualSource(f"src{i:02d}.h5", "x", shape=(12, 4))
    path = tmp_path / "case.h5"
    with h5py.File(path, "w") as f:
        f.create_virtual_dataset("data", layout)
        assert places(f["data"]) == [((0, 0), "virtual source 'x' in 'src00.h5'")]
    _same(_queue(path, "auto", 1), _h5py_rows(path))
    (tmp_path / "src08.h5").unlink()
    _odd_source(tmp_path / "src08.h5")  # a new version of a file the check has seen
    with pytest.raises(multitables.MissingFilterError, match="id 40123.*virtual source 'x' in 'src08.h5'"):
        multitables.Streamer(path).get_queue("/data", n_procs=1)


def test_a_null_dataspace_is_refused_as_empty_not_as_a_scalar(tmp_path: Path) -> None:
    path = tmp_path / "null.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=h5py.Empty("<f4"))
    with pytest.raises(multitables.NodeTypeError, match=r"'/data' .* is empty: its dataspace is null \(h5py.Empty\)"):
        multitables.Streamer(path).get_queue("/data", n_procs=0)
