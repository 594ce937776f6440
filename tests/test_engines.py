"""Choosing and opening an engine: ``auto``'s walk, the chunk engine's fallback, caches, h5py's chunk cache.

What every engine must do, run on each, is ``test_engine_conformance``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import hdf5plugin
import numpy as np
import pytest
import tables

import multitables
from multitables._io.engines import open_source, readers_may_change, resolve_engine
from multitables._io.node import inspect_node


def test_auto_prefers_chunks_and_takes_tables_for_pytables_open_options(make_array) -> None:
    node = inspect_node(make_array(np.zeros(10)), "/data")
    assert resolve_engine("auto", node, {}) == "chunks"
    assert resolve_engine("chunks", node, {}) == "chunks"
    assert resolve_engine("h5py", node, {}) == "h5py"
    assert resolve_engine("auto", node, {"DRIVER": "H5FD_CORE"}) == "tables"
    with pytest.raises(ValueError, match="engine='fast'"):
        resolve_engine("fast", node, {})
    with pytest.raises(ValueError, match="takes no open options"):
        resolve_engine("chunks", node, {"DRIVER": "H5FD_CORE"})


@pytest.mark.parametrize("engine", ["auto", "tables"])
def test_a_node_pytables_cannot_open_given_its_open_options_is_refused_naming_what_reads_it(
    tmp_path: Path, no_leaks: None, engine: str
) -> None:
    # Given PyTables options, the node was opened by PyTables outside the check, so PyTables' own error
    # ("opens it as a SoftLink") came out as it was; and naming another engine gave it the options: h5py's
    # TypeError for DRIVER=. Without options it is a refusal (a NodeTypeError); with them, the same.
    path = tmp_path / "soft.h5"
    with h5py.File(path, "w") as f:
        f["data"] = np.arange(10.0)
        f["soft"] = h5py.SoftLink("/data")
    stream = multitables.Streamer(path, engine=engine, DRIVER="H5FD_CORE")
    with pytest.raises(multitables.NodeTypeError, match=r"'/soft'.*SoftLink.*reads it without the open options \['DRIVER'\]"):
        stream.get_queue("/soft")
    np.testing.assert_array_equal(np.array(list(stream.get_generator("/data"))), np.arange(10.0))


@pytest.mark.parametrize("front", ["stream", "reader"])
def test_an_h5py_open_option_given_to_pytables_says_where_open_options_go(make_array, front: str, no_leaks: None) -> None:
    """``driver='core'`` is h5py's name; with ``engine='auto'`` open options are PyTables' (the established API's), and
    PyTables' bare "Invalid or not supported driver: 'core'" named neither the file nor the way to h5py's."""
    path = make_array(np.arange(100, dtype="<f4"))
    with pytest.raises(ValueError, match=r"PyTables refuses the open options \['driver'\] given for '.*': Invalid or "
                                         r"not supported driver: 'core'.*engine='h5py'"):
        if front == "stream":
            multitables.Streamer(path, driver="core").get_queue("/data", n_procs=1)
        else:
            with multitables.Reader(path, n_procs=1, driver="core") as reader:
                reader.get_dataset("/data")
    stream = multitables.Streamer(path, engine="h5py", driver="core")
    np.testing.assert_array_equal(np.array(list(stream.get_generator("/data", n_procs=1))), np.arange(100, dtype="<f4"))


@pytest.mark.parametrize("front", ["stream", "reader"])
def test_open_options_pytables_would_ignore_are_warned_of_at_the_callers_line(make_array, front: str) -> None:
    """PyTables takes any keyword and ignores those it does not know: a typo, or h5py's ``rdcc_nbytes`` under
    ``engine='auto'``, changed nothing without a word. A warning names them (2.x ran such code: it still runs)."""
    path = make_array(np.arange(100, dtype="<f4"))
    make = (lambda **kw: multitables.Streamer(path, **kw)) if front == "stream" else (
        lambda **kw: multitables.Reader(path, n_procs=1, **kw))
    for engine in ("auto", "tables"):
        with pytest.warns(UserWarning, match=rf"open options \['node_cashe_slots', 'rdcc_nbytes'\] are none of "
                                             rf"PyTables'.*engine={engine!r}.*engine='h5py'") as caught:
            made = make(engine=engine, rdcc_nbytes=0, node_cashe_slots=8, driver="H5FD_SEC2")
        assert [w.filename for w in caught] == [__file__]
        if front == "stream":  # the options PyTables knows still apply, and the rows are read
            np.testing.assert_array_equal(np.array(list(made.get_generator("/data", n_procs=0))), np.arange(100, dtype="<f4"))
        else:
            made.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        quiet = [make(driver="H5FD_SEC2", NODE_CACHE_SLOTS=8, title="", filters=None),  # PyTables' own, any case
                 make(engine="h5py", rdcc_nbytes=0),  # h5py checks its own (the test below)
                 make(locking=False)]  # auto takes h5py for h5py's own locking= and swmr=
    with pytest.warns(UserWarning, match=r"open options \['locking'\] are none of PyTables'"):
        quiet.append(make(locking=False, driver="H5FD_SEC2"))  # with PyTables' options, PyTables
    for made in quiet:
        if front == "reader":
            made.close()


@pytest.mark.parametrize("n_procs", [0, 2])
def test_h5py_open_options_are_checked_up_front_and_used_in_every_process(make_array, monkeypatch, n_procs: int) -> None:
    import psutil

    data = np.arange(4000, dtype="<f4").reshape(1000, 4)
    path = make_array(data)
    before = psutil.Process().children()
    with pytest.raises(TypeError, match="'foo' is an invalid keyword"):  # h5py's own error, before any reader
        multitables.Streamer(path, engine="h5py", foo=1).get_queue("/data", n_procs=n_procs)
    assert psutil.Process().children() == before
    # In this process too the file is opened with them (an in-memory driver here), not the checks' open.
    opened = []
    real = h5py.File
    monkeypatch.setattr(h5py, "File", lambda *a, **kw: opened.append(kw.get("driver")) or real(*a, **kw))
    stream = multitables.Streamer(path, engine="h5py", driver="core", backing_store=False)
    got = []
    with stream.get_queue("/data", n_procs=n_procs, block_size=100, ordered=True) as queue:
        for guard in queue.iter():
            with guard as block:
                got.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(got), data)
    assert opened.count("core") == (2 if n_procs == 0 else 1)  # checked up front, then read here (n_procs=0)


def test_a_filter_the_chunk_engine_lacks_resolves_and_opens_as_h5py(tmp_path: Path) -> None:
    data = np.random.default_rng(2).standard_normal((500, 6)).astype("<f4")
    path = tmp_path / "zfp.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, chunks=(50, 6), **hdf5plugin.Zfp(reversible=True))
    node = inspect_node(path, "/data")
    assert resolve_engine("auto", node, {}) == "h5py"
    assert resolve_engine("chunks", node, {}) == "h5py"  # so the stream reports the engine that reads
    src = open_source("chunks", node, {})  # decided at open: never a failure midway
    try:
        assert src.engine == "h5py"
        out = np.empty((120, 6), "<f4")
        src.read_into(40, 160, out)
        np.testing.assert_array_equal(out, data[40:160])
    finally:
        src.close()


def test_cache_direct_is_the_chunk_engines_alone(make_array) -> None:
    node = inspect_node(make_array(np.zeros((100, 3))), "/data")
    for engine in ("h5py", "tables"):
        with pytest.raises(ValueError, match="needs the chunk engine"):
            open_source(engine, node, {}, cache="direct")
    with pytest.raises(ValueError, match="cache='warm'"):
        open_source("chunks", node, {}, cache="warm")


def test_the_chunk_cache_is_off_only_when_no_two_blocks_share_a_chunk() -> None:
    from multitables._io.h5py_engine import whole_chunks
    from multitables._plan.blocks import BlockPlan, RangePlan

    assert whole_chunks(BlockPlan(1000, 64), 1000, 32)
    assert whole_chunks(BlockPlan(1000, 64, remainder=True), 1000, 32)  # the last block ends at the end
    assert not whole_chunks(BlockPlan(1000, 48), 1000, 32)
    assert not whole_chunks(BlockPlan(1000, 64, cyclic=True), 1000, 32)  # wrapped blocks start anywhere
    assert whole_chunks(RangePlan((64, 0), (1000, 32)), 1000, 32)
    assert not whole_chunks(RangePlan((16, 32), (32, 48)), 1000, 32)
    assert whole_chunks(RangePlan((16,), (32,)), 1000, 32)  # one block: its chunks are read once anyway
    assert whole_chunks(BlockPlan(100, 100), 100, 1024)  # a dataset smaller than one chunk
    assert not whole_chunks(BlockPlan(100, 100, cyclic=True), 100, 1024)


@pytest.mark.parametrize("block_size", [64, 48, 1])
def test_h5py_reads_equal_with_and_without_the_chunk_cache(make_array, block_size: int) -> None:
    from multitables._plan.blocks import BlockPlan

    data = np.random.default_rng(3).standard_normal((1000, 7)).astype("<f4")
    node = inspect_node(make_array(data, complib="blosc", chunkshape=(32, 7)), "/data")
    plan = BlockPlan(1000, block_size, remainder=True)
    src = open_source("h5py", node, {}, plan)
    try:
        for k in range(plan.n_blocks):
            out = np.empty((plan.rows(k), 7), "<f4")
            src.read_into(plan.start(k), plan.start(k) + plan.rows(k), out)
            np.testing.assert_array_equal(out, data[plan.start(k) : plan.start(k) + plan.rows(k)])
    finally:
        src.close()


def test_h5py_reads_each_element_type_by_its_own_memory_type_one_after_another(tmp_path: Path) -> None:
    """Memory types are made once per process and kept per element type: each dataset is read with its own, the
    same size (int8, an enum of int8, bool) or kind (floats in either byte order) notwithstanding."""
    path = tmp_path / "types.h5"
    columns = {
        "i1": np.arange(-50, 50, dtype="i1"),
        "enum": np.arange(100, dtype="i1") % 3,
        "f4be": np.linspace(-1, 1, 100).astype(">f4"),
        "f4le": np.linspace(-1, 1, 100).astype("<f4"),
        "bool": np.arange(100) % 2 == 0,
    }
    with h5py.File(path, "w") as f:
        for name, values in columns.items():
            dtype = h5py.enum_dtype({"a": 0, "b": 1, "c": 2}, basetype="i1") if name == "enum" else values.dtype
            f.create_dataset(name, data=values, dtype=dtype, chunks=(10,), compression="gzip")
    for _ in range(2):
        for name, values in columns.items():
            with multitables.Streamer(str(path), engine="h5py").get_queue("/" + name, n_procs=0, remainder=True) as q:
                rows = np.concatenate([guard.block.copy() for guard in q.iter()])
            np.testing.assert_array_equal(rows, values)
            assert rows.dtype.kind == values.dtype.kind  # bools stay bools; floats come in this machine's order


@pytest.mark.parametrize("engine", ["chunks", "h5py"])
@pytest.mark.parametrize("reach", [True, False], ids=["within-reach", "too-large"])
def test_request_readers_keep_decoded_chunks_as_h5py_does_by_default(make_array, monkeypatch, engine: str, reach: bool) -> None:
    """A request reader's rows come in any order: each engine keeps h5py's default 8 MiB of decoded chunks (since
    h5py 3.16, HDF5 2.0; 1 MiB before, whatever the h5py installed), for datasets of at most 8 times that (here made
    small: a dataset of 28,000 bytes is beyond 8 times 1,000)."""
    from multitables._io import scattered
    from multitables._io.engines import open_rows

    data = np.arange(1000 * 7, dtype="<f4").reshape(1000, 7)
    node = inspect_node(make_array(data, complib="zlib", chunkshape=(32, 7)), "/data")
    default = (8191, scattered.ROWS_DECODED_BYTES, 0.75)
    with h5py.File(node.filename, "r") as f:
        h5pys = f["data"].id.get_access_plist().get_chunk_cache()
    assert h5pys == default or h5py.version.version_tuple < (3, 16)
    if not reach:
        monkeypatch.setattr(scattered, "ROWS_DECODED_BYTES", 1000)
    rows = open_rows(engine, node, {})
    try:
        source = rows._source
        if engine == "h5py":
            kept = source._dsid.get_access_plist().get_chunk_cache()
            assert kept == (default if reach else (521, 1 << 20, 1.0))  # else HDF5's own 1 MiB, as a stream's
        elif reach:
            assert source._decoded is not None and source._decoded.nbytes == default[1]
        else:
            assert source._decoded is None
        for r in (700, 5, 701, 6):
            out = np.empty((1, 7), "<f4")
            rows.read(np.array([r]), out, lambda: False)
            np.testing.assert_array_equal(out, data[r : r + 1])
    finally:
        rows.close()


@pytest.mark.parametrize("block_size, cache_bytes", [(64, 0), (48, 1 << 20)])
def test_h5py_takes_over_the_checks_dataset_with_the_chunk_cache_its_plan_needs(
    make_array, fds_on, block_size: int, cache_bytes: int
) -> None:
    """The in-process read reuses open_node's file; blocks that cut chunks still get a chunk cache; closing frees the file."""
    from multitables._io.node import open_node
    from multitables._plan.blocks import BlockPlan

    data = np.arange(1000 * 7, dtype="<f4").reshape(1000, 7)
    path = make_array(data, complib="blosc", chunkshape=(32, 7))
    node, dataset = open_node(path, "/data")
    plan = BlockPlan(1000, block_size, remainder=True)
    src = open_source("h5py", node, {}, plan, dataset)
    try:
        assert src._dsid.get_access_plist().get_chunk_cache()[1] == cache_bytes
        assert fds_on(path) == 1
        out = np.empty((block_size, 7), "<f4")
        src.read_into(block_size, 2 * block_size, out)
        np.testing.assert_array_equal(out, data[block_size : 2 * block_size])
    finally:
        src.close()
    assert fds_on(path) == 0


def test_cache_direct_with_auto_asks_the_chunk_engine_first(make_array) -> None:
    """``auto`` leaves blosc to h5py for speed; with O_DIRECT, which only the chunk engine has, it must not refuse."""
    from multitables._stream.options import StreamOptions

    path = make_array(np.arange(3000.0).reshape(1000, 3), complib="blosc")
    node = inspect_node(path, "/data")
    assert StreamOptions(str(path), "auto", "page", None, {}).resolve(node) == "h5py"
    assert StreamOptions(str(path), "auto", "direct", None, {}).resolve(node) == "chunks"


def test_auto_reads_a_set_with_each_files_choice_small_files_too(tmp_path) -> None:
    import h5py

    from multitables._io.fileset import inspect_files

    def shards(name: str, rows: int) -> "tuple[str, ...]":
        files = []
        for i in range(3):
            files.append(str(tmp_path / f"{name}-{i}.h5"))
            with h5py.File(files[-1], "w") as f:
                f.create_dataset("data", data=np.zeros((rows, 256), np.float32), chunks=(8, 256), compression="gzip")
        return tuple(files)

    small = inspect_files(shards("small", 8), "/data")
    large = inspect_files(shards("large", 4096), "/data")
    assert resolve_engine("auto", small, {}) == "chunks"
    assert resolve_engine("h5py", small, {}) == "h5py"
    assert resolve_engine("auto", large, {}) == "chunks"


def test_auto_reads_a_set_with_the_chunk_engine_where_one_file_would_take_h5py(tmp_path) -> None:
    # A set reopens its files every block of a shuffled epoch: the chunk engine does so in a stat and an open.
    from multitables._io.fileset import inspect_files

    files = []
    for i in range(3):
        files.append(str(tmp_path / f"b-{i}.h5"))
        with tables.open_file(files[-1], "w") as f:
            f.create_carray("/", "data", obj=np.zeros((100, 16), np.float32), filters=tables.Filters(3, "blosc"))
    assert resolve_engine("auto", inspect_node(files[0], "/data"), {}) == "h5py"
    assert resolve_engine("auto", inspect_files(tuple(files), "/data"), {}) == "chunks"
    assert resolve_engine("auto", inspect_files(tuple(files), "/data"), {"DRIVER": "H5FD_SEC2"}) == "tables"


def test_auto_reads_one_blosc_file_with_h5py_in_the_consumer_and_the_chunk_engine_in_readers(tmp_path) -> None:
    # Chunks of 128 KiB: smaller ones readers leave to h5py too (READER_CHUNK_BYTES, tests/test_tiles.py).
    path = str(tmp_path / "b.h5")
    data = np.arange(4000 * 16, dtype=np.float32).reshape(4000, 16)
    with tables.open_file(path, "w") as f:
        f.create_carray("/", "data", obj=data, filters=tables.Filters(3, "blosc"), chunkshape=(2048, 16))
    node = inspect_node(path, "/data")
    assert resolve_engine("auto", node, {}) == "h5py"
    assert resolve_engine("auto", node, {}, readers=True) == "chunks"
    assert resolve_engine("h5py", node, {}, readers=True) == "h5py"  # a named engine stays
    assert resolve_engine("auto", node, {"DRIVER": "H5FD_SEC2"}, readers=True) == "tables"
    # Asked again only where readers change the engines' order: each check of an object reads its index again.
    assert readers_may_change("auto", node, {}) and not readers_may_change("h5py", node, {})
    zlib = str(tmp_path / "z.h5")
    with tables.open_file(zlib, "w") as f:
        f.create_carray("/", "data", obj=data, filters=tables.Filters(3, "zlib"), chunkshape=(100, 16))
    assert not readers_may_change("auto", inspect_node(zlib, "/data"), {})
    stream = multitables.Streamer(path)
    for n_procs, engine in [(0, "h5py"), (2, "chunks")]:
        with stream.get_queue("/data", n_procs=n_procs, block_size=300, ordered=True) as q:
            assert q.engine == engine
            got = np.concatenate([g.__enter__().copy() for g in q.iter()])
        np.testing.assert_array_equal(got, data[:3900])
    batches = stream.get_batches("/data", 100, n_procs=2, shuffle=False)
    try:
        assert batches.engines == ["chunks"]
        np.testing.assert_array_equal(np.concatenate([b for b in batches]), data)
    finally:
        batches.close()


@pytest.mark.parametrize("n_procs", [0, 2])
def test_auto_reads_a_readers_requests_as_reader_processes_do_in_this_process_too(tmp_path, no_leaks, n_procs: int) -> None:
    """A Reader's requests on blosc: the chunk engine read them faster than h5py in reader processes and in this
    process (BENCHMARKS.md, engine choice for in-process reads), where a stream in the consumer takes h5py. A named
    engine stays; deflate takes the chunk engine, and so do chunks with no filter, whose rows it reads as stored (h5py
    read a random row's whole chunk), which a stream leaves to h5py. Rows exact for each."""
    rng = np.random.default_rng(n_procs)
    data = rng.standard_normal((4000, 16)).astype(np.float32)
    paths = {}
    for name, filters in [("blosc", tables.Filters(3, "blosc")), ("zlib", tables.Filters(3, "zlib")), ("plain", None)]:
        paths[name] = str(tmp_path / f"{name}.h5")
        with tables.open_file(paths[name], "w") as f:
            f.create_carray("/", "data", obj=data, filters=filters, chunkshape=(100, 16))
    cases = [("blosc", "auto", "chunks"), ("blosc", "h5py", "h5py"), ("blosc", "chunks", "chunks"),
             ("zlib", "auto", "chunks"), ("plain", "auto", "chunks")]
    for name, engine, expected in cases:
        with multitables.Reader(paths[name], engine=engine, n_procs=n_procs) as reader:
            ds = reader.get_dataset("/data")
            assert ds._engine == expected, (name, engine)
            stage = ds.create_stage(300)
            for rows in (np.sort(rng.choice(4000, 300, replace=False)), slice(1234, 1534), np.array([3999])):
                np.testing.assert_array_equal(reader.request(ds[rows], stage).get(), data[rows])
    with multitables.Streamer(paths["blosc"]).get_queue("/data", n_procs=0) as q:
        assert q.engine == "h5py"
    with multitables.Streamer(paths["plain"]).get_queue("/data", n_procs=2) as q:  # h5py streamed it faster
        assert q.engine == "h5py"


def test_auto_leaves_a_small_chunked_dataset_at_a_first_look_to_h5py_and_reads_it_next_with_the_chunk_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a first look, in the consumer, h5py reads it through the open that described it, where the chunk engine
    would learn its layout first (``FIRST_LOOK_BYTES``); the next stream finds the file described, and the chunk
    engine learns the layout once, to read no HDF5 after. Larger datasets, and readers, take the chunk engine."""
    from multitables._io import files
    from multitables._io.chunks import storage
    from multitables._io.chunks.engine import FIRST_LOOK_BYTES
    from multitables._io.fileset import forget_learned

    monkeypatch.setattr(files, "SETTLED_S", -1.0)  # files just written are remembered
    forget_learned()
    small_rows = FIRST_LOOK_BYTES // 64
    for name, rows, first in [("small", small_rows, "h5py"), ("large", small_rows + 1, "chunks")]:
        path = tmp_path / f"{name}.h5"
        data = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
        with h5py.File(path, "w") as f:
            f.create_dataset("data", data=data, chunks=(100, 16), compression="gzip")
        stream = multitables.Streamer(path)
        for expected in (first, "chunks", "chunks"):
            with stream.get_queue("/data", n_procs=0, ordered=True, remainder=True) as q:
                assert q.engine == expected, name
                np.testing.assert_array_equal(np.concatenate([g.__enter__().copy() for g in q.iter()]), data)
        assert storage.known_layout(multitables.Streamer(path).options.inspect("/data")) is not None
    forget_learned()
    with multitables.Streamer(tmp_path / "small.h5").get_queue("/data", n_procs=2) as q:
        assert q.engine == "chunks"
    forget_learned()



@pytest.mark.parametrize("chunks, expected", [((1, 6), "h5py"), ((64, 1), "h5py"), ((256, 1), "chunks")])
def test_auto_leaves_a_stream_of_small_chunks_to_h5py(
    tmp_path: Path, no_leaks: None, chunks: tuple[int, int], expected: str
) -> None:
    """Chunks of under 1 KiB (a table written row by row in one-row chunks, a column in 64-row ones) cost the chunk
    engine more around each chunk than HDF5 takes: ``auto`` leaves them to h5py, in the consumer and in readers
    (``SMALL_CHUNK_BYTES``); 1 KiB chunks stay the chunk engine's."""
    data = np.arange(4096 * 6, dtype=np.float32).reshape(4096, 6)
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, chunks=chunks, compression="gzip", shuffle=True)
    for n_procs in (0, 2):
        with multitables.Streamer(path).get_queue("/data", n_procs=n_procs, ordered=True, remainder=True) as q:
            assert q.engine == expected, n_procs
            np.testing.assert_array_equal(np.concatenate([g.__enter__().copy() for g in q.iter()]), data)
