"""Variable-length rows (h5py vlen, PyTables VLArray) read through a transform (NOTE [variable-length rows] in ``_io.vlen``)."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import re
import weakref
from contextlib import closing
from pathlib import Path

import h5py
import numpy as np
import pytest
import tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables
from multitables import NodeTypeError, ReaderError
from multitables._io.h5py_engine import H5pySource
from multitables._io.node import open_node

N_ROWS = 300
_FILES = itertools.count()


def pad16(rows: np.ndarray) -> np.ndarray:
    """Each row's first 16 bytes, zero-padded, and its length: one row of 17 uint8 a row."""
    out = np.zeros((len(rows), 17), np.uint8)
    for i, row in enumerate(rows):
        data = np.frombuffer(row, np.uint8) if isinstance(row, bytes) else np.asarray(row).view(np.uint8)
        out[i, : min(16, len(data))] = data[:16]
        out[i, 16] = len(data) % 256
    return out


def pads_to_the_longest(rows: np.ndarray) -> np.ndarray:
    """Rows as wide as the block's longest: a shape that changes from block to block."""
    width = max(len(r) for r in rows)
    out = np.zeros((len(rows), width), np.uint8)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def random_rows(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    return [rng.integers(0, 256, rng.integers(0, 40), dtype=np.uint8) for _ in range(n)]


@pytest.fixture(scope="module")
def vlen_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """/v: vlen uint8 rows of 0-39 bytes (rows 0 and 1 of 3 and 5) in gzip chunks of 32; /i: the row numbers; /s and
    /b: vlen str and bytes; /vl: a PyTables VLArray of int32."""
    path = tmp_path_factory.mktemp("vlen") / "vlen.h5"
    rng = np.random.default_rng(7)
    rows = random_rows(rng, N_ROWS)
    rows[0], rows[1], rows[2] = (np.arange(n, dtype=np.uint8) for n in (3, 5, 39))
    with tables.open_file(path, "w") as f:
        vl = f.create_vlarray("/", "vl", tables.Int32Atom())
        for r in rows:
            vl.append(r.astype(np.int32) - 100)
    with h5py.File(path, "a") as f:
        v = f.create_dataset("v", (N_ROWS,), dtype=h5py.vlen_dtype(np.uint8), chunks=(32,), compression="gzip")
        for i, r in enumerate(rows):
            v[i] = r
        f.create_dataset("i", data=np.arange(N_ROWS), chunks=(32,))
        f.create_dataset("s", data=[f"é{'x' * (i % 23)}" for i in range(N_ROWS)], dtype=h5py.string_dtype(), chunks=(32,))
        f.create_dataset("b", data=[b"y" * (i % 19) for i in range(N_ROWS)], dtype=h5py.string_dtype("ascii"))
    return path


def expected(path: Path, name: str, function=pad16) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return function(f[name][()])


@pytest.mark.parametrize("n_procs", [0, 2], ids=["in-process", "readers"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_vlen_rows_through_a_transform_are_the_transform_of_h5pys_rows(vlen_file: Path, n_procs: int, shuffle: bool,
                                                                       no_leaks: None) -> None:
    want = expected(vlen_file, "v")
    b = multitables.Streamer(vlen_file).get_batches(["/v", "/i"], batch_size=25, shuffle=shuffle, seed=3,
                                                    n_procs=n_procs, block_size=64, transform={"/v": pad16})
    with closing(b):
        assert b.engines[0] == "h5py"
        assert b.row_types[0] == (np.dtype(np.uint8), (17,))
        seen = []
        for x, i in b:
            np.testing.assert_array_equal(x, want[i])  # every batch: the transform of h5py's rows, aligned
            seen.extend(i.tolist())
        assert (seen == list(range(N_ROWS))) != shuffle
        assert sorted(seen) == list(range(N_ROWS))


@pytest.mark.parametrize("name", ["s", "b", "vl"], ids=["vlen-str", "vlen-bytes", "VLArray"])
def test_vlen_strings_and_a_vlarray_reach_the_transform_as_h5py_gives_them(vlen_file: Path, name: str,
                                                                           no_leaks: None) -> None:
    want = expected(vlen_file, name)
    with closing(multitables.Streamer(vlen_file).get_batches("/" + name, batch_size=40, shuffle=False, n_procs=2,
                                                             block_size=64, transform=pad16)) as b:
        np.testing.assert_array_equal(np.concatenate(list(b)), want)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(0, 50), min_size=1, max_size=120), block=st.integers(1, 70),
       batch=st.integers(1, 30), chunk=st.integers(1, 40), seed=st.integers(0, 3))
def test_any_ragged_rows_in_any_blocks_are_read_whole(tmp_path: Path, lengths: list[int], block: int, batch: int,
                                                       chunk: int, seed: int) -> None:
    path = tmp_path / f"ragged{next(_FILES)}.h5"  # a name of its own: a file rewritten in place may look the same
    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        v = f.create_dataset("v", (len(lengths),), dtype=h5py.vlen_dtype(np.uint8), chunks=(min(chunk, len(lengths)),))
        for i, n in enumerate(lengths):
            v[i] = rng.integers(0, 256, n, dtype=np.uint8)
        f.create_dataset("i", data=np.arange(len(lengths)))
    want = expected(path, "v")
    with closing(multitables.Streamer(path).get_batches(["/v", "/i"], batch_size=batch, seed=seed, n_procs=0,
                                                        block_size=min(block, len(lengths)), transform={"/v": pad16})) as b:
        got = [(x, i) for x, i in b]
    assert sorted(np.concatenate([i for _, i in got]).tolist()) == list(range(len(lengths)))
    for x, i in got:
        np.testing.assert_array_equal(x, want[i])


def test_vlen_rows_without_a_transform_are_refused_before_any_process_starts(vlen_file: Path, no_leaks: None) -> None:
    stream = multitables.Streamer(vlen_file)
    children = set(multiprocessing.active_children())
    with pytest.raises(NodeTypeError, match=r"'/v' in .* holds variable-length rows.*give get_batches a transform="):
        stream.get_batches(["/i", "/v"], batch_size=10, n_procs=2)
    with pytest.raises(NodeTypeError, match=r"'/v' .*give get_batches a transform="):  # a transform for another path
        stream.get_batches(["/i", "/v"], batch_size=10, n_procs=2, transform={"/i": pad16})
    for read in (lambda: stream.get_queue("/v", n_procs=2), lambda: stream.get_generator("/v"),
                 lambda: stream.get_remainder("/v", 7), lambda: multitables.Reader(vlen_file).get_dataset("/vl")):
        with pytest.raises(NodeTypeError, match=r"variable-length rows.*streams \(get_queue, get_generator\) and the "
                                                r"Reader do not read them\. get_batches\(\.\.\., transform=\) does"):
            read()
    assert set(multiprocessing.active_children()) == children


def test_only_the_h5py_engine_reads_vlen_rows(vlen_file: Path, no_leaks: None) -> None:
    with pytest.raises(NodeTypeError, match=r"engine='tables' cannot read '/v'.*variable-length.*engine='h5py'"):
        multitables.Streamer(vlen_file, engine="tables").get_batches("/v", batch_size=10, transform=pad16)
    # The chunk engine, named, leaves what it cannot read to the next engine, as for any node (NOTE [variable-length rows]).
    with closing(multitables.Streamer(vlen_file, engine="chunks").get_batches("/v", batch_size=10, n_procs=0,
                                                                              transform=pad16)) as b:
        assert b.engines == ["h5py"]
        assert len(np.concatenate(list(b))) == N_ROWS


@pytest.mark.parametrize("n_procs", [0, 2], ids=["in-process", "readers"])
def test_a_transform_whose_rows_change_shape_fails_with_its_traceback(vlen_file: Path, n_procs: int,
                                                                      no_leaks: None) -> None:
    b = multitables.Streamer(vlen_file).get_batches("/v", batch_size=10, shuffle=False, n_procs=n_procs,
                                                    block_size=64, transform=pads_to_the_longest)
    with closing(b), pytest.raises(TypeError, match=r"transform .pads_to_the_longest. returned uint8 \(64, \d+\) for 64 rows; it gave uint8 rows of shape \(5,\)") as info:
        list(b)
    if n_procs:
        assert isinstance(info.value, ReaderError) and "in apply" in info.value.remote_traceback
        assert re.search(r"rows \d+:\d+ of '/v'", str(info.value))  # whichever reader's block failed first


def test_a_block_read_again_lets_the_last_blocks_rows_go(vlen_file: Path) -> None:
    """HDF5 writes each row's object over what the buffer held without releasing it: the read empties it first."""
    node, dataset = open_node(vlen_file, "/v")
    source = H5pySource(node, {}, dataset=dataset)
    try:
        out = np.empty(40, node.dtype)
        source.read_into(0, 40, out)
        first = [weakref.ref(row) for row in out]
        source.read_into(40, 80, out)
        gc.collect()
        assert not any(ref() is not None for ref in first)
        np.testing.assert_array_equal(pad16(out), expected(vlen_file, "v")[40:80])
    finally:
        source.close()


def test_vlen_blocks_are_planned_by_their_bytes_not_their_pointers(tmp_path: Path) -> None:
    """400 rows of 64 KiB, a chunk each: blocks of 4 MiB hold 64 of them; priced as 8-byte pointers, a block would
    take a quarter of the rows (100, 6.4 MiB)."""
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:
        v = f.create_dataset("v", (400,), dtype=h5py.vlen_dtype(np.uint8), chunks=(1,))
        for i in range(400):
            v[i] = np.full(64 << 10, i % 256, np.uint8)
    b = multitables.Streamer(path).get_batches("/v", batch_size=10, n_procs=0, transform=pad16)
    assert b.block_size == 64
    b.close()
