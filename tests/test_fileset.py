"""Several files as one dataset (``_io.fileset``, NOTE [file sets]): every access mode reads the files' rows in turn.

A set is named by a list of files or a glob; its rows are the files' rows in
order, in every mode (queue, generator, batches, the torch adapter, random
access); a file that does not match the others is refused by name before
any process starts; a reader keeps a few files open however many there are;
each file's identity is checked where it is read. A node described is kept
while its files keep their identities, a set's or one file's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import psutil
import pytest
import tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables
from multitables._io.engines import open_source, resolve_engine
from multitables._io.fileset import MAX_OPEN, SetSource, inspect_files
from multitables._io.names import as_files

ROW = 16  # values per row

#: Codecs a shard may be written with: the set's files need not agree.
CODECS = {"zlib": tables.Filters(3, "zlib"), "blosc": tables.Filters(3, "blosc:lz4"), "none": None}


def rows_of(n: int, seed: int) -> np.ndarray:
    return (np.arange(n * ROW, dtype=np.float32).reshape(n, ROW) + seed * 1e6).astype(np.float32)


def write_shards(
    folder: Path, sizes: "list[int]", codecs: "list[str] | None" = None, chunk: int = 8, name: str = "shard"
) -> "tuple[list[Path], np.ndarray]":
    """One PyTables EArray ``/data`` per size (float32 rows of ``ROW``); returns the files and all their rows in order."""
    files, parts = [], []
    for i, n in enumerate(sizes):
        path = folder / f"{name}-{i:03d}.h5"
        rows = rows_of(n, i)
        codec = CODECS[(codecs or ["zlib"])[i % len(codecs or ["zlib"])]]
        with tables.open_file(path, "w") as f:
            arr = f.create_earray("/", "data", tables.Float32Atom(), (0, ROW), filters=codec, chunkshape=(chunk, ROW))
            if n:
                arr.append(rows)
        files.append(path)
        parts.append(rows)
    return files, np.concatenate(parts)


def blocks_of(queue: "multitables.Queue") -> np.ndarray:
    out = []
    with queue:
        for guard in queue.iter():
            with guard as block:
                out.append(block.copy())
    return np.concatenate(out)


# -- naming a set ----------------------------------------------------------------


def test_a_glob_names_its_matches_in_sorted_order(tmp_path: Path) -> None:
    files, _ = write_shards(tmp_path, [3, 4, 5])
    assert as_files(str(tmp_path / "shard-*.h5")) == tuple(map(str, files))
    assert as_files([files[2], str(tmp_path / "shard-00[01].h5")]) == (str(files[2]), str(files[0]), str(files[1]))
    assert as_files([files[1]]) == str(files[1])  # one file is that file
    assert as_files(sorted(tmp_path.glob("shard-*.h5"))) == tuple(map(str, files))
    assert sorted(as_files(tmp_path.glob("shard-*.h5"))) == list(map(str, files))  # any iterable, in its order
    assert multitables.Streamer(tmp_path / "shard-*.h5").filename == tuple(map(str, files))


def test_an_existing_name_is_never_a_pattern(tmp_path: Path) -> None:
    odd = tmp_path / "run[1].h5"
    write_shards(tmp_path, [2])[0][0].rename(odd)
    assert as_files(odd) == str(odd)


def test_a_pattern_nothing_matches_and_an_empty_list_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        multitables.Streamer(str(tmp_path / "train-*.h5"))
    assert info.value.filename == str(tmp_path / "train-*.h5")
    with pytest.raises(ValueError, match="empty list of files"):
        multitables.Streamer([])


# -- refused up front, by name ---------------------------------------------------


def _children() -> set[int]:
    return {c.pid for c in psutil.Process().children(recursive=True)}


def test_a_file_with_other_rows_is_refused_by_name(tmp_path: Path, no_leaks: None) -> None:
    files, _ = write_shards(tmp_path, [10, 10, 10])
    with h5py.File(files[1], "w") as f:  # rows of 8 values, not 16
        f["data"] = np.zeros((10, 8), np.float32)
    before = _children()
    with pytest.raises(ValueError, match=f"{files[1]}.*shape \\(8,\\).*{files[0]}.*shape \\(16,\\)"):
        multitables.Streamer(files).get_queue("/data", n_procs=2)
    with h5py.File(files[1], "w") as f:  # float64
        f["data"] = np.zeros((10, ROW), np.float64)
    with pytest.raises(ValueError, match=f"{files[1]}.*float64"):
        multitables.Streamer(files).get_batches("/data", 4)
    with pytest.raises(ValueError, match=str(files[1])):
        multitables.Reader(files, n_procs=1).get_dataset("/data")
    assert _children() == before


def lengths(rows: np.ndarray) -> np.ndarray:
    """A variable-length row's length: a transform that reads any base type."""
    return np.array([len(r) for r in rows], np.int64)


def test_a_file_whose_variable_length_rows_have_another_base_type_is_refused_by_name(
    tmp_path: Path, no_leaks: None
) -> None:
    """Object dtypes compare equal whatever their base type: vlen uint8 rows and vlen str rows passed the check,
    and a transform got arrays from one file and bytes from the other. Same base types still make a set."""
    files = [tmp_path / f"v{i}.h5" for i in range(3)]
    for name, dtype in zip(files, [h5py.vlen_dtype(np.uint8), h5py.string_dtype(), h5py.vlen_dtype(np.uint8)]):
        with h5py.File(name, "w") as f:
            v = f.create_dataset("v", (4,), dtype=dtype)
            for i in range(4):
                v[i] = "x" * i if dtype.metadata["vlen"] is str else np.arange(i, dtype=np.uint8)
    before = _children()
    with pytest.raises(ValueError, match=f"{files[1]}.*object \\(vlen str\\), .{files[0]}.*object \\(vlen uint8\\)"):
        multitables.Streamer(files[:2]).get_batches("/v", 2, n_procs=1, transform=lengths)
    assert _children() == before
    with multitables.Streamer([files[0], files[2]]).get_batches("/v", 2, shuffle=False, n_procs=0, transform=lengths) as b:
        assert np.concatenate(list(b)).tolist() == [0, 1, 2, 3] * 2


def test_a_file_without_the_node_is_a_key_error_naming_it(tmp_path: Path, no_leaks: None) -> None:
    files, _ = write_shards(tmp_path, [10, 10])
    with h5py.File(files[1], "w") as f:
        f["other"] = np.zeros((10, ROW), np.float32)
    with pytest.raises(KeyError, match=str(files[1])):
        multitables.Streamer(files).get_generator("/data")


def test_a_file_that_is_not_hdf5_is_refused_by_name(tmp_path: Path, no_leaks: None) -> None:
    files, _ = write_shards(tmp_path, [10])
    junk = tmp_path / "notes.h5"
    junk.write_text("not HDF5")
    with pytest.raises(multitables.NotHDF5Error, match=str(junk)):
        multitables.Streamer([files[0], junk]).get_queue("/data")
    with pytest.raises(multitables.NotHDF5Error, match=str(junk)):
        multitables.Reader([files[0], junk], n_procs=1)


def test_empty_files_take_no_part_but_a_set_without_rows_is_refused(tmp_path: Path, no_leaks: None) -> None:
    files, data = write_shards(tmp_path, [0, 5, 0, 7, 0])
    node = inspect_files(tuple(map(str, files)), "/data")
    assert [p.node.filename for p in node.parts] == [str(files[1]), str(files[3])]
    assert [p.offset for p in node.parts] == [0, 5]
    assert np.array_equal(np.stack(list(multitables.Streamer(files).get_generator("/data"))), data)
    empties, _ = write_shards(tmp_path, [0, 0], name="empty")
    with pytest.raises(multitables.EmptyDatasetError, match="2 files"):
        multitables.Streamer(empties).get_queue("/data")


def test_queries_are_refused_on_a_set(tmp_path: Path, table_file: "tuple[Path, np.ndarray]", no_leaks: None) -> None:
    path, _ = table_file
    with multitables.Reader([path, path], n_procs=1) as reader:
        ds = reader.get_dataset("/table")
        with pytest.raises(ValueError, match="runs on one file"):
            ds.where("a > 3")


# -- every mode reads the files' rows in turn ------------------------------------

sizes_st = st.lists(st.integers(0, 40), min_size=2, max_size=6).filter(lambda s: sum(s) > 0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=sizes_st,
    codecs=st.lists(st.sampled_from(sorted(CODECS)), min_size=1, max_size=3),
    chunk=st.sampled_from([1, 3, 8]),
    block=st.integers(1, 50),
    engine=st.sampled_from(["auto", "h5py", "chunks"]),
)
def test_in_process_modes_read_the_rows_in_file_order(
    tmp_path_factory: pytest.TempPathFactory, sizes: "list[int]", codecs: "list[str]", chunk: int, block: int, engine: str
) -> None:
    files, data = write_shards(tmp_path_factory.mktemp("set"), sizes, codecs, chunk)
    stream = multitables.Streamer(files, engine=engine)
    block = min(block, len(data))
    got = blocks_of(stream.get_queue("/data", n_procs=1, block_size=block, ordered=True, remainder=True))
    assert np.array_equal(got, data)
    assert np.array_equal(np.stack(list(stream.get_generator("/data", block_size=block))), data)
    assert np.array_equal(stream.get_remainder("/data", block), data[len(data) // block * block :])
    # The source alone: reads that start and end anywhere, across any number of files.
    node = inspect_files(stream.filename, "/data")
    source = open_source(resolve_engine(engine, node, {}), node, {})
    try:
        n = len(data)
        for a, b in [(0, n), (n // 3, min(n, n // 3 + block)), (n - 1, n)]:
            out = np.empty((b - a, ROW), np.float32)
            source.read_into(a, b, out)
            assert np.array_equal(out, data[a:b])
    finally:
        source.close()


@pytest.mark.parametrize("n_procs", [1, 2])
def test_readers_deliver_every_block_across_files(tmp_path: Path, no_leaks: None, n_procs: int) -> None:
    files, data = write_shards(tmp_path, [37, 0, 64, 5, 100, 1], ["zlib", "blosc", "none"])
    stream = multitables.Streamer(files)
    got = blocks_of(stream.get_queue("/data", n_procs=n_procs, block_size=9, ordered=True, remainder=True))
    assert np.array_equal(got, data)
    unordered = blocks_of(stream.get_queue("/data", n_procs=n_procs, block_size=9, remainder=True))
    assert sorted(map(bytes, unordered)) == sorted(map(bytes, data))
    rows = list(stream.get_generator("/data", n_procs=n_procs, block_size=16, ordered=True))
    assert np.array_equal(np.stack(rows), data)


def test_cyclic_wraps_from_the_last_file_to_the_first(tmp_path: Path, no_leaks: None) -> None:
    files, data = write_shards(tmp_path, [10, 15])
    queue = multitables.Streamer(files).get_queue("/data", n_procs=2, block_size=10, cyclic=True, ordered=True)
    with queue:
        got = []
        for _ in range(5):
            with queue.get() as block:
                got.append(block.copy())
    assert np.array_equal(np.concatenate(got), np.concatenate([data, data])[:50])


def test_shuffled_ranks_share_every_row_of_every_file_once(tmp_path: Path, no_leaks: None) -> None:
    files, data = write_shards(tmp_path, [30, 45, 0, 61, 20])
    seen = []
    for rank in range(2):
        batches = multitables.Streamer(files).get_batches(
            "/data", 8, shuffle=True, seed=3, rank=rank, world_size=2, drop_last=False, block_size=8, n_procs=2
        )
        seen += [row.tobytes() for batch in batches for row in batch]
    assert sorted(seen) == sorted(row.tobytes() for row in data)


def test_batches_resume_on_a_set(tmp_path: Path, no_leaks: None) -> None:
    files, _ = write_shards(tmp_path, [33, 50, 17])

    def batches() -> Any:
        return multitables.Streamer(files).get_batches("/data", 10, shuffle=True, seed=5, block_size=8, n_procs=1)

    whole = [b.copy() for b in batches()]
    first = batches()
    it = iter(first)
    head = [next(it).copy() for _ in range(4)]
    state = first.state_dict()
    first.close()
    rest = batches()
    rest.load_state_dict(state)
    tail = [b.copy() for b in rest]
    assert all(np.array_equal(a, b) for a, b in zip(head + tail, whole)) and len(head + tail) == len(whole)


def test_table_columns_of_a_set(tmp_path: Path, table_file: "tuple[Path, np.ndarray]", no_leaks: None) -> None:
    path, rows = table_file
    twice = np.concatenate([rows, rows])
    batches = multitables.Streamer([path, path]).get_batches("/table", 100, fields=["a", "v"], shuffle=False, n_procs=2)
    got = list(batches)
    assert np.array_equal(np.concatenate([b["a"] for b in got]), twice["a"])
    assert np.array_equal(np.concatenate([b["v"] for b in got]), twice["v"])


def test_the_torch_adapter_reads_a_set(tmp_path: Path, no_leaks: None) -> None:
    torch = pytest.importorskip("torch")
    import multitables.torch as mtt

    files, data = write_shards(tmp_path, [20, 12])
    batches = mtt.get_batches(multitables.Streamer(files), "/data", 8, shuffle=False, n_procs=1)
    got = torch.cat(list(torch.utils.data.DataLoader(batches, batch_size=None)))
    batches.close()
    assert np.array_equal(got.numpy(), data)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=sizes_st, keys=st.lists(st.integers(0, 10**6), min_size=1, max_size=20), step=st.integers(1, 7))
def test_random_access_across_files(tmp_path_factory: pytest.TempPathFactory, sizes: "list[int]", keys: "list[int]", step: int) -> None:
    files, data = write_shards(tmp_path_factory.mktemp("set"), sizes, ["zlib", "none"])
    n = len(data)
    coords = np.array([k % n for k in keys])
    with multitables.Reader(files, n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        assert len(ds) == n
        with ds.create_stage(n) as stage:
            assert np.array_equal(reader.request(ds[:], stage).get(), data)
            assert np.array_equal(reader.request(ds[coords], stage).get(), data[coords])
            assert np.array_equal(reader.request(ds[n // 4 :: step], stage).get(), data[n // 4 :: step])


# -- bounded open files ----------------------------------------------------------


def test_a_source_keeps_at_most_max_open_files_open(tmp_path: Path, no_leaks: None, fds_on: Callable[[Path], int]) -> None:
    files, data = write_shards(tmp_path, [5] * 20, ["zlib", "none"])
    node = inspect_files(tuple(map(str, files)), "/data")
    opened: list[str] = []

    def open_part(part: Any) -> Any:
        opened.append(part.filename)
        return open_source("h5py", part, {})

    source = SetSource(node, "h5py", open_part)
    try:
        out = np.empty((1, ROW), np.float32)
        for row in range(len(data)):
            source.read_into(row, row + 1, out)
            assert np.array_equal(out[0], data[row])
            assert source.open_files <= MAX_OPEN
            assert sum(fds_on(f) for f in files) <= MAX_OPEN
        assert opened == list(map(str, files))  # read in order: each file opened once
    finally:
        source.close()
    assert sum(fds_on(f) for f in files) == 0


@pytest.mark.parametrize("engine", ["chunks", "h5py", "tables"])
def test_a_file_open_in_a_set_costs_one_descriptor_hints_included(
    tmp_path: Path, no_leaks: None, fds_on: Callable[[Path], int], engine: str
) -> None:
    """docs/training.rst: a reader keeps at most four files open, one descriptor each, also while it hints ahead."""
    files, data = write_shards(tmp_path, [40] * 8, ["zlib"])
    node = inspect_files(tuple(map(str, files)), "/data")
    source = open_source(engine, node, {})
    try:
        out = np.empty((8, ROW), np.float32)
        for row in range(0, len(data), 8):
            source.prefetch(row + 8, min(row + 24, len(data)))
            source.read_into(row, row + 8, out)
            assert np.array_equal(out, data[row : row + 8])
            assert sum(fds_on(f) for f in files) <= MAX_OPEN
    finally:
        source.close()
    assert sum(fds_on(f) for f in files) == 0


@pytest.mark.parametrize("engine", ["chunks", "h5py", "tables"])
def test_a_hint_over_many_whole_files_opens_none_and_their_read_opens_each_once(
    tmp_path: Path, no_leaks: None, engine: str
) -> None:
    """A block over more small files than stay open was hinted by opening each file through HDF5, closed again before
    the read, which opened each once more. A file the hint covers whole is hinted by name (its pages reach the cache),
    and only the files it covers in part are opened for it."""
    from multitables_bench.cache import evict, resident_fraction

    files, data = write_shards(tmp_path, [6] * 12, ["zlib"], chunk=3)
    node = inspect_files(tuple(map(str, files)), "/data")
    opened: list[str] = []

    def open_part(part: Any) -> Any:
        opened.append(part.filename)
        return open_source(engine, part, {})

    source = SetSource(node, engine, open_part)
    try:
        for f in files:
            evict(f)
        source.prefetch(0, len(data))
        assert opened == []
        assert all(resident_fraction(f) == 1.0 for f in files)
        out = np.empty((len(data), ROW), np.float32)
        source.read_into(0, len(data), out)
        assert np.array_equal(out, data)
        assert opened == list(map(str, files))
        source.prefetch(3, 9)  # two files in part: each opened, its source hinting just those rows
        assert opened[len(files):] == [str(files[0]), str(files[1])], opened
    finally:
        source.close()


def test_a_set_of_thousands_of_files_streams_under_a_low_open_file_limit(tmp_path: Path) -> None:
    """3,000 files of a set streamed by readers under ``ulimit -n 256``: each reader keeps a few open, hints
    included (a hint by name holds a descriptor only while it is made)."""
    import h5py

    for i in range(3000):
        with h5py.File(tmp_path / f"s{i:04d}.h5", "w") as f:
            f.create_dataset("data", data=np.full(10, i, "<i4"), chunks=(5,), compression="gzip")
    script = (
        "import resource, sys, numpy as np, multitables\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "for n_procs in (0, 2):\n"
        "    got = np.array(list(multitables.Streamer(sys.argv[1]).get_generator('/data', n_procs=n_procs, ordered=True)))\n"
        "    assert np.array_equal(got, np.repeat(np.arange(3000), 10)), n_procs\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "s*.h5")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_readers_of_many_files_hold_few_open(tmp_path: Path, no_leaks: None) -> None:
    files, data = write_shards(tmp_path, [10] * 60)
    names = set(map(str, files))
    queue = multitables.Streamer(tmp_path / "shard-*.h5").get_queue("/data", n_procs=2, block_size=10, ordered=True)
    most = 0
    got = []
    with queue:
        for guard in queue.iter():
            with guard as block:
                got.append(block.copy())
            for pid in queue.reader_pids:
                try:
                    held = {f.path for f in psutil.Process(pid).open_files()} & names
                except psutil.NoSuchProcess:  # done with its share of the blocks
                    continue
                most = max(most, len(held))
    assert np.array_equal(np.concatenate(got), data)
    # MAX_OPEN held, and one more for the length of a hint's call: a file hinted whole is opened by name, advised and
    # closed (``files.will_need_file``), one at a time.
    assert 1 <= most <= MAX_OPEN + 1


# -- each file's identity, where it is read --------------------------------------


@pytest.mark.parametrize("n_procs", [None, 2])
@pytest.mark.parametrize("changed", [0, 3], ids=["a file being read", "a file not yet opened"])
def test_a_file_changed_mid_stream_stops_the_stream_naming_it(
    tmp_path: Path, no_leaks: None, n_procs: "int | None", changed: int, blocks_as_asked: None
) -> None:
    files, _ = write_shards(tmp_path, [80, 40, 40, 40])
    queue = multitables.Streamer(files).get_queue("/data", n_procs=n_procs, block_size=10, ordered=True, read_ahead=2)
    with pytest.raises(multitables.FileChangedError, match=str(files[changed])):
        with queue:
            for i, guard in enumerate(queue.iter()):
                with guard:
                    pass
                if i == 0:
                    st_ = os.stat(files[changed])
                    os.utime(files[changed], ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))


@pytest.mark.parametrize("n_procs", [0, 2])
@pytest.mark.parametrize("change", ["cut short", "deleted"])
def test_a_file_that_cannot_be_opened_since_it_changed_is_a_change_naming_it_and_the_rows(
    tmp_path: Path, no_leaks: None, n_procs: int, change: str, blocks_as_asked: None
) -> None:
    """A file cut short or deleted after the set was inspected fails its open (HDF5's error names no file): that
    is the change of NOTE [file identity] too, whether the open is a read's or a hint's of the blocks ahead."""
    files, _ = write_shards(tmp_path, [80, 40, 40, 40])
    queue = multitables.Streamer(files).get_queue("/data", n_procs=n_procs, block_size=10, ordered=True, read_ahead=2)
    with pytest.raises(multitables.FileChangedError, match=str(files[3])) as raised:
        with queue:
            for i, guard in enumerate(queue.iter()):
                with guard:
                    pass
                if i == 0 and change == "deleted":
                    files[3].unlink()
                elif i == 0:
                    os.truncate(files[3], files[3].stat().st_size // 2)
    assert raised.value.rows is not None and raised.value.rows[0] >= 160  # a read of the changed file's rows


def test_a_damaged_file_is_named_in_the_readers_error(tmp_path: Path, no_leaks: None) -> None:
    files, _ = write_shards(tmp_path, [64, 64, 64], chunk=64)
    with h5py.File(files[1], "r") as f:
        offset = f["data"].id.get_chunk_info(0).byte_offset
    with open(files[1], "r+b") as f:
        f.seek(offset + 4)
        f.write(b"\xff" * 32)
    stream = multitables.Streamer(files, engine="chunks")
    with pytest.raises(multitables.ReaderError, match=str(files[1])):
        blocks_of(stream.get_queue("/data", n_procs=2, block_size=64))


# -- the docs --------------------------------------------------------------------


def test_the_sharded_snippet_of_the_training_docs_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import textwrap

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.rst").read_text()
    section = text[text.index("Many files as one dataset") :]
    snippet = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section).group(1)  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shards").mkdir()
    sizes = [50, 0, 70, 30]
    for i, n in enumerate(sizes):
        with h5py.File(tmp_path / "shards" / f"train-{i:03d}.h5", "w") as f:
            rows = np.arange(sum(sizes[:i]), sum(sizes[: i + 1]))
            f["X"] = np.stack([rows, -rows], axis=1).astype(np.float32)
            f["y"] = rows
    seen: list[int] = []

    def model(x: np.ndarray, y: np.ndarray) -> float:
        assert np.array_equal(x[:, 0], y) and len(y) <= 256
        seen.extend(y.tolist())
        return 0.0

    exec(textwrap.dedent(snippet), {"model": model, "print": lambda *a: None})
    assert sorted(seen) == list(range(sum(sizes))) and seen != sorted(seen)


def test_random_access_over_many_files(tmp_path: Path, no_leaks: None) -> None:
    """A set's description outgrows a stage header; the readers are handed it apart (NOTE [set descriptions])."""
    files, data = write_shards(tmp_path, [3] * 150, ["zlib", "none"])
    coords = np.array([449, 0, 3, 200, 2])
    with multitables.Reader(tmp_path / "shard-*.h5", n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        with ds.create_stage(len(data)) as stage:
            assert np.array_equal(reader.request(ds[:], stage).get(), data)
            assert np.array_equal(reader.request(ds[coords], stage).get(), data[coords])


def test_a_file_changed_before_the_readers_look_fails_the_request(tmp_path: Path, no_leaks: None) -> None:
    files, _ = write_shards(tmp_path, [10, 10])
    with multitables.Reader(files, n_procs=1) as reader:
        ds = reader.get_dataset("/data")
        st_ = os.stat(files[1])
        os.utime(files[1], ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
        with ds.create_stage(20) as stage:
            with pytest.raises(multitables.FileChangedError):
                reader.request(ds[:], stage).get()


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_readers_first_request_opens_only_the_files_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None, n_procs: int
) -> None:
    """The readers are handed the set's node that ``get_dataset`` described (NOTE [set descriptions] in
    ``_io.setref``): a request opens the files its rows lie in, not every file of the set to find the node again."""
    files, data = write_shards(tmp_path, [10] * 12)
    names, log = [str(f) for f in files], tmp_path / "opens.log"
    real = h5py.h5f.open

    def logged(name: Any, *a: Any, **k: Any) -> Any:  # in the readers too: forked with it
        with open(log, "a") as f:
            f.write(os.fsdecode(name) + "\n")
        return real(name, *a, **k)

    monkeypatch.setattr(h5py.h5f, "open", logged)
    with multitables.Reader(names, n_procs=n_procs, engine="h5py", start_method="fork") as reader:
        ds = reader.get_dataset("/data")
        log.unlink()  # the consumer's look at the set
        with ds.create_stage(10) as stage:
            assert np.array_equal(reader.request(ds[3:7], stage).get(), data[3:7])
            assert np.array_equal(reader.request(ds[[25, 21, 29]], stage).get(), data[[25, 21, 29]])
    assert set(log.read_text().split()) == {names[0], names[2]}


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_file_replaced_after_get_dataset_fails_each_read_of_it_naming_it(
    tmp_path: Path, no_leaks: None, n_procs: int
) -> None:
    """The node handed to the readers holds each file's identity at ``get_dataset``, checked where the file is read:
    the other files' rows are read, and each read of the replaced one fails, naming it."""
    files, data = write_shards(tmp_path, [10, 10, 10])
    (other,), _ = write_shards(tmp_path, [30], name="other")
    with multitables.Reader(files, n_procs=n_procs) as reader:
        ds = reader.get_dataset("/data")
        os.replace(other, files[1])
        with ds.create_stage(10) as stage:
            for _ in range(2):
                assert np.array_equal(reader.request(ds[0:10], stage).get(), data[0:10])
                with pytest.raises(multitables.FileChangedError, match=str(files[1])):
                    reader.request(ds[15:18], stage).get()
                assert np.array_equal(reader.request(ds[22:30], stage).get(), data[22:30])


@pytest.mark.parametrize("n_procs", [0, 2])
def test_the_nodes_handed_to_the_readers_of_two_datasets_of_one_set_stay_apart(
    tmp_path: Path, no_leaks: None, n_procs: int
) -> None:
    """Two nodes of the same files (each with its files' identities and rows: the same fingerprint) are two nodes."""
    names = [str(tmp_path / f"two-{i}.h5") for i in range(3)]
    for i, name in enumerate(names):
        with h5py.File(name, "w") as f:
            f["a"], f["b"] = np.arange(10) + 100 * i, -np.arange(10) - 100 * i
    a_rows = np.concatenate([np.arange(10) + 100 * i for i in range(3)])
    with multitables.Reader(names, n_procs=n_procs) as reader:
        a, b = reader.get_dataset("/a"), reader.get_dataset("/b")
        with a.create_stage(30) as stage:
            assert np.array_equal(reader.request(a[8:23], stage).get(), a_rows[8:23])
            assert np.array_equal(reader.request(b[8:23], stage).get(), -a_rows[8:23])
            assert np.array_equal(reader.request(reader.get_dataset("/a")[::7], stage).get(), a_rows[::7])


def test_a_reader_killed_taking_a_sets_node_fails_get_dataset_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """The segment that hands the readers a set's node (NOTE [set descriptions] in ``_io.setref``) goes with the
    ``get_dataset`` that made it, whatever its readers did."""
    import signal

    from multitables._io import setref

    files, _ = write_shards(tmp_path, [10, 10])
    consumer, real = os.getpid(), setref.Learned.add

    def killed(self: Any, *a: Any) -> None:  # in a reader, forked with it, as it takes the node
        if os.getpid() != consumer:
            os.kill(os.getpid(), signal.SIGKILL)
        real(self, *a)

    monkeypatch.setattr(setref.Learned, "add", killed)
    with multitables.Reader(files, n_procs=2, start_method="fork") as reader:
        with pytest.raises(multitables.ReaderError, match="-9|SIGKILL"):
            reader.get_dataset("/data")


@pytest.mark.parametrize("n_procs", [0, 1])
@pytest.mark.parametrize("change", ["replaced", "deleted"])
@pytest.mark.parametrize("which", [1, 2], ids=["a file read before", "a file not yet opened"])
def test_a_file_of_a_readers_set_changed_fails_its_requests_in_the_readers_words(
    tmp_path: Path, no_leaks: None, n_procs: int, change: str, which: int
) -> None:
    """A file of a Reader's set found changed was said in a stream's words ("while it was being streamed ... the
    stream stops"); as for a Reader of one file, it is the Reader's requests that fail."""
    files, _ = write_shards(tmp_path, [10, 10, 10])
    (other,), _ = write_shards(tmp_path, [10], name="other")
    with multitables.Reader(files, n_procs=n_procs) as reader:
        ds = reader.get_dataset("/data")
        with ds.create_stage(30) as stage:
            reader.request(ds[:20], stage).get()  # the first two files opened
            if change == "replaced":
                os.replace(other, files[which])
                how = "replaced by another file"
            else:
                files[which].unlink()
                how = "deleted or renamed"
            with pytest.raises(multitables.FileChangedError, match=re.escape(
                    f"{str(files[which])!r} was {how} since the Reader was made; rows read from it now could hold "
                    f"other data, so its requests fail")):
                reader.request(ds[:], stage).get()


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> "list[str]":
    """The files ``_io.fileset`` describes (opens with HDF5), in order, from now on."""
    import multitables._io.fileset as fileset

    seen: list[str] = []
    real = fileset.open_node
    monkeypatch.setattr(fileset, "open_node", lambda name, *a, **k: (seen.append(name), real(name, *a, **k))[1])
    return seen


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files just written count as settled (NOTE [file identity]: what is learned of a file is kept only then)."""
    from multitables._io import files

    monkeypatch.setattr(files, "SETTLED_S", -1.0)


def test_each_file_of_a_set_is_opened_once_before_any_reader_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """The engine's check of a file (the chunk engine's, which learns its layout) runs while the inspection has the file
    open, files just written included; a file it cannot read still makes h5py the set's engine."""
    files, rows = write_shards(tmp_path, [30, 0, 20])
    compact, more = tmp_path / "shard-003.h5", rows_of(10, 3)  # a layout the chunk engine does not read
    with h5py.File(compact, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        dsid = h5py.h5d.create(f.id, b"data", h5py.h5t.IEEE_F32LE, h5py.h5s.create_simple(more.shape), dcpl=dcpl)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, more)
    names = [*map(str, files), str(compact)]
    opens: "dict[str, int]" = {}
    real = h5py.h5f.open
    monkeypatch.setattr(h5py.h5f, "open", lambda name, *a, **k: (
        opens.__setitem__(os.fsdecode(name), opens.get(os.fsdecode(name), 0) + 1), real(name, *a, **k))[1])
    queue = multitables.Streamer(names).get_queue("/data", n_procs=1, remainder=True)
    counted, engine, got = dict(opens), queue.engine, blocks_of(queue)  # the opens before its reader started
    assert counted == dict.fromkeys(names, 1) and engine == "h5py"
    assert np.array_equal(got, np.concatenate([rows, more]))
    opens.clear()
    batches = multitables.Streamer(names).get_batches("/data", 10, n_procs=1)
    counted, engines = dict(opens), batches.engines
    batches.close()
    assert counted == dict.fromkeys(names, 1) and engines == ["h5py"]
    opens.clear()
    with multitables.Reader(names, n_procs=1) as reader:
        ds = reader.get_dataset("/data")
        assert opens == dict.fromkeys(names, 1)
        assert np.array_equal(reader.request(ds[25:55], ds.create_stage(30)).get(), np.concatenate([rows, more])[25:55])


def test_a_set_is_inspected_again_only_when_a_file_changed(tmp_path: Path, opened: "list[str]", settled: None) -> None:
    files, _ = write_shards(tmp_path, [10, 10, 10])
    names = tuple(map(str, files))
    first = inspect_files(names, "/data")
    assert inspect_files(names, "/data") is first and opened == list(names)  # every epoch asks; nothing changed
    with h5py.File(files[1], "w") as f:
        f["data"] = np.zeros((10, 8), np.float32)
    with pytest.raises(ValueError, match=str(files[1])):
        inspect_files(names, "/data")


def test_a_settled_files_node_is_described_once_while_the_file_keeps_its_identity(
    tmp_path: Path, opened: "list[str]", settled: None
) -> None:
    """A loop over small files, epoch after epoch: each stream of a file seen before opens no HDF5 file to plan."""
    (path,), rows = write_shards(tmp_path, [20])
    for n_procs, engine in [(0, "auto"), (0, "auto"), (1, "auto"), (0, "h5py"), (0, "chunks")]:
        streamer = multitables.Streamer(str(path), engine=engine)
        assert np.array_equal(blocks_of(streamer.get_queue("/data", n_procs=n_procs, block_size=5)), rows)
    assert np.array_equal(np.stack(list(multitables.Streamer(str(path)).get_generator("/data"))), rows)
    with multitables.Reader(str(path)) as reader:
        ds = reader.get_dataset("/data")
        assert np.array_equal(reader.request(ds[3:9], ds.create_stage(6)).get(), rows[3:9])
    assert opened == [str(path)]
    os.utime(path)  # its identity changes (the times): described again, once
    assert np.array_equal(blocks_of(multitables.Streamer(str(path)).get_queue("/data", n_procs=0)), rows)
    assert np.array_equal(blocks_of(multitables.Streamer(str(path)).get_queue("/data", n_procs=0)), rows)
    assert opened == [str(path)] * 2
    (path,), longer = write_shards(tmp_path, [30])  # rewritten in place, more rows: what is read is the new file
    assert np.array_equal(blocks_of(multitables.Streamer(str(path)).get_queue("/data", n_procs=0, remainder=True)), longer)
    assert opened == [str(path)] * 3


def test_a_file_just_written_is_described_at_every_open(tmp_path: Path, opened: "list[str]") -> None:
    """Its identity cannot show a write in the same tick of the clock: nothing learned of it is kept."""
    (path,), rows = write_shards(tmp_path, [20])
    for _ in range(2):
        assert np.array_equal(blocks_of(multitables.Streamer(str(path)).get_queue("/data", n_procs=0)), rows)
    assert opened == [str(path)] * 2


def test_a_node_linked_from_another_file_is_described_at_every_open(tmp_path: Path, opened: "list[str]", settled: None) -> None:
    """The identity taken is the linking file's; the rows lie in the other, which may change alone."""
    (target,), rows = write_shards(tmp_path, [20])
    link = tmp_path / "link.h5"
    with h5py.File(link, "w") as f:
        f["data"] = h5py.ExternalLink(target.name, "/data")
    for _ in range(2):
        assert np.array_equal(blocks_of(multitables.Streamer(str(link)).get_queue("/data", n_procs=0)), rows)
    assert opened == [str(link)] * 2


def _growing(path: Path, values: np.ndarray) -> Path:
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=values, chunks=(10,), maxshape=(None,))
    return path


def _grow(path: Path, more: np.ndarray) -> np.ndarray:
    with h5py.File(path, "a") as f:
        ds = f["data"]
        ds.resize((len(ds) + len(more),))
        ds[-len(more) :] = more
        return ds[()]


def _virtual_over(folder: Path, source: Path) -> Path:
    """A virtual dataset /data whose rows are all of ``source``'s /data (1-D), however many it comes to have."""
    unlimited = h5py.h5s.UNLIMITED
    spaces = []
    for _ in range(2):
        space = h5py.h5s.create_simple((1,), (unlimited,))
        space.select_hyperslab((0,), (unlimited,), block=(1,))
        spaces.append(space)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_virtual(spaces[0], os.fsencode(source.name), b"data", spaces[1])
    path = folder / "virtual.h5"
    with h5py.File(path, "w", libver="latest") as f:
        h5py.h5d.create(f.id, b"data", h5py.h5t.NATIVE_INT64, spaces[0], dcpl=dcpl)
    return path


def test_a_node_whose_rows_lie_in_other_files_is_described_at_every_open(
    tmp_path: Path, opened: "list[str]", settled: None
) -> None:
    """A virtual dataset takes its rows from other files, and a set's file may link into one: their identities are
    not taken, so a description of such a node is not kept. The rows read are those of the files as they are now."""
    source = _growing(tmp_path / "source.h5", np.arange(20))
    virtual = _virtual_over(tmp_path, source)
    for _ in range(2):
        assert np.array_equal(np.array(list(multitables.Streamer(str(virtual)).get_generator("/data"))), np.arange(20))
    assert opened == [str(virtual)] * 2
    grown = _grow(source, np.arange(100, 105))
    assert np.array_equal(np.array(list(multitables.Streamer(str(virtual)).get_generator("/data"))), grown)
    other = _growing(tmp_path / "other.h5", np.arange(-10, 0))
    link = tmp_path / "link.h5"
    with h5py.File(link, "w") as f:
        f["data"] = h5py.ExternalLink(source.name, "/data")
    names = [str(other), str(link)]
    for more in (None, np.arange(200, 203)):
        now = grown if more is None else _grow(source, more)
        got = blocks_of(multitables.Streamer(names).get_queue("/data", n_procs=0, remainder=True))
        assert np.array_equal(got, np.concatenate([np.arange(-10, 0), now]))


@pytest.mark.parametrize("n_procs", [0, 1])
def test_a_file_replaced_after_its_description_is_not_read_as_described(tmp_path: Path, n_procs: int) -> None:
    """The stream checks the file against the identity it was described under, not one taken later: a file replaced
    in between (here, once the node is known) is an error, not the old node's rows of the new file."""
    import multitables._io.fileset as fileset

    (path,), rows = write_shards(tmp_path, [20])
    (newer,), _ = write_shards(tmp_path, [30], name="newer")
    real = fileset.open_node

    def replaced_after(name: str, *a: Any, **k: Any) -> Any:
        described = real(name, *a, **k)
        os.replace(newer, path)  # a writer's atomic replace, just after the description
        return described

    fileset.open_node = replaced_after
    try:
        with pytest.raises(multitables.FileChangedError):
            blocks_of(multitables.Streamer(str(path)).get_queue("/data", n_procs=n_procs))
    finally:
        fileset.open_node = real


# -- a name that comes to mean another file (a symlink switched: ``ln -sfn v2.h5 current.h5``) ---------------------


def _versions(folder: Path, shuffled: bool = False) -> "tuple[Path, np.ndarray, np.ndarray]":
    """``current.h5``, a symlink to ``v1.h5`` (3,000 rows) beside ``v2.h5`` (2,000 rows, other values); with
    ``shuffled``, both 200,000 rows in chunks of 1,000 with the shuffle filter (a filter: a stream hints its reads), v2's
    chunks written last to first (the same shape, other places)."""
    n, chunk = (200_000, 1000) if shuffled else (3000, 100)
    v1_rows = np.arange(n * 4, dtype="f8").reshape(n, 4)
    v2_rows = -v1_rows if shuffled else v1_rows[:2000] + 1e6
    for name, rows in (("v1.h5", v1_rows), ("v2.h5", v2_rows)):
        with h5py.File(folder / name, "w") as f:
            ds = f.create_dataset("data", shape=rows.shape, dtype=rows.dtype, chunks=(chunk, 4), shuffle=shuffled)
            starts = range(0, len(rows), chunk)
            for k in reversed(starts) if name == "v2.h5" else starts:
                ds[k : k + chunk] = rows[k : k + chunk]
    (folder / "current.h5").symlink_to(folder / "v1.h5")
    return folder / "current.h5", v1_rows, v2_rows


def _switch(link: Path, to: str) -> None:
    (link.parent / "next.h5").symlink_to(link.parent / to)
    os.replace(link.parent / "next.h5", link)


def _rows(path: Path, engine: str, n_procs: int = 0) -> np.ndarray:
    return blocks_of(multitables.Streamer(str(path), engine=engine).get_queue("/data", n_procs=n_procs, remainder=True,
                                                                                    ordered=True))


def test_a_description_is_kept_under_the_file_described_not_the_one_its_name_meant_a_moment_before(
    tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name is looked at (a stat), then HDF5 opens it: switched in between, the description is v2's, and it
    was kept under v1's identity, so that every later stream of v1 read 2,000 of its 3,000 rows, without a word."""
    import multitables._io.fileset as fileset

    link, v1_rows, v2_rows = _versions(tmp_path)
    real = fileset.open_node

    def switched_first(name: str, *a: Any, **k: Any) -> Any:
        _switch(link, "v2.h5")  # lost the race with a deploy: the name means v2 when HDF5 opens it
        return real(name, *a, **k)

    monkeypatch.setattr(fileset, "open_node", switched_first)
    assert np.array_equal(_rows(link, "h5py"), v2_rows)  # v2 described, v2 read: one file, whichever
    monkeypatch.setattr(fileset, "open_node", real)
    _switch(link, "v1.h5")
    for engine in ("h5py", "chunks", "tables", "auto"):
        assert np.array_equal(_rows(link, engine), v1_rows), engine


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_chunk_layout_is_kept_under_the_file_it_was_read_from(tmp_path: Path, settled: None, n_procs: int) -> None:
    """A stream made while the name meant v1 learned v1's layout for its hints; the name switched to v2 before its
    first block. The layout was kept under the identity the name had then, v2's, and every later stream of v2 read
    v1's chunk places: every row wrong, no error."""
    link, _, v2_rows = _versions(tmp_path, shuffled=True)
    queue = multitables.Streamer(str(link), engine="h5py").get_queue("/data", n_procs=0, block_size=40_000)
    _switch(link, "v2.h5")
    with pytest.raises(multitables.FileChangedError):
        blocks_of(queue)
    assert np.array_equal(_rows(link, "chunks", n_procs), v2_rows)


def test_an_open_of_another_file_than_the_one_described_is_refused(tmp_path: Path) -> None:
    """Each engine checks the file it opened (its descriptor) against the description's identity: a name switched
    between a stream's look at it and an engine's open reads nothing of the other file."""
    from multitables._io.chunks.source import ChunkSource
    from multitables._io.fileset import inspect_files
    from multitables._io.node import reopen_dataset
    from multitables._io.tables_engine import TablesSource

    link, _, _ = _versions(tmp_path, shuffled=True)
    node = inspect_files(str(link), "/data")
    _switch(link, "v2.h5")
    for opens in (lambda: reopen_dataset(node), lambda: ChunkSource(node), lambda: TablesSource(node, {})):
        with pytest.raises(multitables.FileChangedError, match="after it was described"):
            opens()
    _switch(link, "v1.h5")
    ChunkSource(node).close()


def test_a_readers_dataset_of_a_file_changed_since_the_reader_was_made_is_refused(tmp_path: Path, no_leaks: None) -> None:
    """Its readers check every request against the file the Reader was made on: a dataset described from the file
    that replaced it had the new shape, and none of its requests could be read."""
    (path,), rows = write_shards(tmp_path, [20])
    (newer,), _ = write_shards(tmp_path, [30], name="newer")
    with multitables.Reader(str(path), n_procs=1) as reader:
        assert reader.get_dataset("/data").shape == rows.shape
        os.replace(newer, path)
        with pytest.raises(multitables.FileChangedError, match="since the Reader was made"):
            reader.get_dataset("/data")


def test_a_sum_that_fails_leaves_the_file_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 fds_on: Callable[[Path], int]) -> None:
    """Batches' inspection sums the file it holds open (NOTE [data sums]): an error there closed nothing, and the
    file stayed open as long as the error was held."""
    from multitables._io import fileset

    path = tmp_path / "one.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=rows_of(10, 0))

    def fails(node: Any, dataset: Any) -> Any:
        raise OSError("Can't synchronously read data")

    monkeypatch.setattr(fileset, "with_sum", fails)
    with pytest.raises(OSError, match="synchronously") as raised:
        inspect_files(str(path), "/data", summed=True)
    assert raised.value is not None and fds_on(path) == 0  # the error still held
