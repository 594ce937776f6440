"""NOTE [read plan]: one decision of readers, blocks and read-ahead, the same through every face."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import multitables
from multitables._io.fileset import inspect_files
from multitables._io.node import close_dataset
from multitables._plan import costs
from multitables._plan import readers as planner
from multitables._plan.readers import DatasetShape, Machine, plan_batches, plan_requests, plan_stream
from multitables._stream.options import StreamOptions

ENGINES = ["chunks", "h5py", "tables"]


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(60_000 * 8, dtype="<f4").reshape(60_000, 8), chunks=(500, 8), compression="gzip")
    return path


@pytest.fixture(params=["readers pay", "readers do not pay"])
def pays(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Make starting readers free (they always pay) or dear (they never do), and the machine three CPUs."""
    cost = 0.0 if request.param == "readers pay" else 1e9
    monkeypatch.setattr(costs, "START_COST_S", {"fork": cost, "forkserver": cost, "spawn": cost})
    monkeypatch.setattr(planner, "available_cpus", lambda: 3)
    return request.param == "readers pay"


@pytest.mark.parametrize("engine", ENGINES)
def test_every_face_chooses_the_same_readers_and_blocks(rows_file: Path, pays: bool, engine: str, no_leaks: None) -> None:
    stream = multitables.Streamer(rows_file, engine=engine)
    node = inspect_files(stream.filename, "/x")
    shape, machine = DatasetShape.of(node), Machine.here()
    expected = plan_stream(shape, engine, machine)
    assert expected.n_procs == (3 if pays else 0)
    with stream.get_queue("/x") as queue:
        assert (queue.engine, queue.n_procs, queue.block_size) == (engine, expected.n_procs, expected.block_size)
    batches = stream.get_batches("/x", 100)
    assert batches.n_procs == [expected.n_procs]
    # Training plans its blocks for one reader (the order must not depend on the machine): so does a stream of one.
    with stream.get_queue("/x", n_procs=1) as one:
        assert batches.block_size == one.block_size == plan_batches([shape], [engine], machine, n_rows=node.n_rows).block_size
    if engine != "tables":  # a Reader takes no engine name but auto's; the readers it starts do not depend on it
        with multitables.Reader(rows_file, engine=engine) as reader:
            assert reader.n_procs == plan_requests(None, machine) == 3


def test_default_readers_are_fewer_where_their_fewest_slots_do_not_fit_and_none_where_no_readers_do(
    rows_file: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """A small /dev/shm (8 MiB here and there; 100 KiB here, against 16 KiB chunks): the defaults' ring shrinks to
    one slot per reader and one, of a chunk each, and where even that takes more than half of what is free, the
    defaults start fewer readers, down to none, rather than refuse what the caller never asked for. Batches keep
    their blocks (an epoch's order is made of them) and fit their readers alone."""
    from multitables._shm import space

    monkeypatch.setattr(costs, "START_COST_S", {"fork": 0.0, "forkserver": 0.0, "spawn": 0.0})  # readers pay
    monkeypatch.setattr(planner, "available_cpus", lambda: 3)
    monkeypatch.setattr(space, "cgroup_free_bytes", lambda: None)
    monkeypatch.setattr(space, "shm_free_bytes", lambda: 100 << 10)
    data = np.arange(60_000 * 8, dtype="<f4").reshape(60_000, 8)
    stream = multitables.Streamer(rows_file)
    with stream.get_queue("/x", ordered=True) as queue:
        assert (queue.n_procs, queue.read_ahead, queue.block_size) == (2, 3, 500)  # 3 readers: 4 x 16 KiB > 50 KiB
        got = []
        for guard in queue:
            with guard as block:
                got.append(block.copy())
    np.testing.assert_array_equal(np.concatenate(got), data)
    batches = stream.get_batches("/x", 1000, shuffle=False)  # blocks of 15,000 rows: 469 KiB a slot
    assert batches.n_procs == [0]
    np.testing.assert_array_equal(np.concatenate(list(batches)), data)
    batches.close()
    monkeypatch.setattr(space, "shm_free_bytes", lambda: 2 << 20)  # room for one reader's two slots in half of it
    assert stream.get_batches("/x", 1000, shuffle=False).n_procs == [1]
    assert stream.get_batches("/x", 1000, shuffle=False, n_procs=3).n_procs == [3]  # asked: kept


def test_the_default_readers_of_a_stream_and_of_batches_follow_the_rate_measured_on_its_file(
    rows_file: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    monkeypatch.setattr(planner, "available_cpus", lambda: 3)
    stream = multitables.Streamer(rows_file, engine="chunks")
    shape = DatasetShape.of(inspect_files(stream.filename, "/x"))
    # Readers' cost set to what the table's rate says they save: the file lies where the rate is measured.
    cost = shape.nbytes / costs.table_rate(shape.filter_ids, "chunks") * (1 - 1 / 3)
    monkeypatch.setattr(costs, "START_COST_S", {"fork": cost, "forkserver": cost, "spawn": cost})
    asked: "list[str]" = []
    for rate, readers in ((1e3, 3), (1e15, 0)):  # this machine decodes it slowly, then fast

        def measured(self: StreamOptions, node: object, used: str, rate: float = rate) -> float:
            asked.append(used)
            return rate

        monkeypatch.setattr(StreamOptions, "measure_rate", measured)
        with stream.get_queue("/x") as queue:
            assert queue.n_procs == readers
        batches = stream.get_batches("/x", 100)
        assert batches.n_procs == [readers]
        batches.close()
    assert asked == ["chunks"] * 4
    with stream.get_queue("/x", n_procs=1) as queue:  # readers asked for: nothing to decide, nothing measured
        assert queue.n_procs == 1 and len(asked) == 4
    stream.get_batches("/x", 100, n_procs=1).close()
    assert len(asked) == 4


def test_no_rate_is_measured_where_a_chunk_is_large_beside_the_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """The sample is whole chunks, read twice before the pass: in three chunks, that is most of the pass."""
    path = tmp_path / "three_chunks.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(480_000, dtype="<f4").reshape(60_000, 8), chunks=(20_000, 8), compression="gzip")
    monkeypatch.setattr(planner, "available_cpus", lambda: 3)
    stream = multitables.Streamer(path, engine="chunks")
    node, dataset = stream.options.open_files("/x")
    close_dataset(dataset)
    assert stream.options.measure_rate(node, "chunks") is None
    shape = DatasetShape.of(node)
    cost = shape.nbytes / costs.table_rate(shape.filter_ids, "chunks") * (1 - 1 / 3)  # where a rate would decide
    monkeypatch.setattr(costs, "START_COST_S", {"fork": cost, "forkserver": cost, "spawn": cost})
    asked: "list[str]" = []
    monkeypatch.setattr(StreamOptions, "measure_rate", lambda self, node, used: asked.append(used))
    blocks = []
    with stream.get_queue("/x", ordered=True, remainder=True) as queue:
        for guard in queue.iter():
            with guard as block:
                blocks.append(block.copy())
    assert asked == [] and queue.n_procs == 0
    assert np.array_equal(np.concatenate(blocks), np.arange(480_000, dtype="<f4").reshape(60_000, 8))


@pytest.mark.parametrize("engine", ENGINES)
def test_the_rate_is_measured_by_the_chunk_engine_alone(rows_file: Path, engine: str, no_leaks: None) -> None:
    stream = multitables.Streamer(rows_file, engine=engine)
    node, dataset = stream.options.open_files("/x")
    close_dataset(dataset)
    rate = stream.options.measure_rate(node, engine)
    if engine == "chunks":
        assert rate is not None and 0 < rate < float("inf")
    else:  # HDF5's chunk cache would hand the second read its decoded chunks: the table's rate stands
        assert rate is None


@pytest.mark.parametrize("engine", ENGINES)
def test_every_face_caps_readers_alike(rows_file: Path, engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner, "available_cpus", lambda: 1)
    stream = multitables.Streamer(rows_file, engine=engine)
    with stream.get_queue("/x", n_procs=1000, block_size=20_000) as queue:  # 3 blocks
        assert queue.n_procs == 3
    with stream.get_queue("/x", n_procs=1000, block_size=1000) as queue:  # 60 blocks, one CPU
        assert queue.n_procs == planner.READERS_PER_CPU
    assert stream.get_batches("/x", 100, n_procs=1000, block_size=1000).n_procs == [planner.READERS_PER_CPU]
    assert stream.get_batches("/x", 100, n_procs=1000, block_size=20_000).n_procs == [3]
    assert plan_requests(1000, Machine.here()) == planner.READERS_PER_CPU
    worker = Machine(2, "fork", daemon=True)  # may start no reader: a Reader's default reads there, as a stream's
    assert plan_requests(None, worker) == 0 and plan_requests(0, Machine(2, "fork")) == 0
    assert plan_requests(2, worker) == 2  # asked for: refused where they would start (test_forks.py)


def test_n_procs_0_reads_in_this_process_in_every_mode(rows_file: Path, no_leaks: None) -> None:
    data = h5py.File(rows_file)["x"][()]
    stream = multitables.Streamer(rows_file)
    with stream.get_queue("/x", n_procs=0, ordered=True, remainder=True) as queue:
        assert queue.n_procs == 0 and queue.reader_pids == []
        got = [guard.block.copy() for guard in queue]
    np.testing.assert_array_equal(np.concatenate(got), data)
    np.testing.assert_array_equal(np.stack(list(stream.get_generator("/x", n_procs=0))), data)
    assert stream.get_batches("/x", 100, n_procs=0).n_procs == [0]


@pytest.mark.parametrize("shuffle", [True, False])
def test_one_slot_of_read_ahead_is_enough_for_batches(rows_file: Path, shuffle: bool, no_leaks: None) -> None:
    """read_ahead means the same in every face: at least 1."""
    reference = [x.copy() for x in multitables.Streamer(rows_file).get_batches("/x", 700, shuffle=shuffle, n_procs=0, seed=2)]
    batches = multitables.Streamer(rows_file).get_batches("/x", 700, shuffle=shuffle, n_procs=2, read_ahead=1, seed=2)
    got = list(batches)
    assert len(got) == len(reference)
    for mine, theirs in zip(got, reference):
        np.testing.assert_array_equal(mine, theirs)


def test_the_plan_travels_whole_to_the_readers(rows_file: Path) -> None:
    """The spec the consumer made is what the readers get: nothing unpacked and packed again on the way."""
    import pickle

    from multitables._procs.stream import StreamSettings, StreamSpec

    node = inspect_files(str(rows_file), "/x")
    spec = StreamSpec(node, "chunks", plan_stream(DatasetShape.of(node), "chunks", Machine(2, "fork"), n_procs=2))
    settings = pickle.loads(pickle.dumps(StreamSettings(spec, {}, "name", None)))
    assert settings.spec == spec and settings.spec.read.n_procs == 2


# -- NOTE [CPU siblings]: a pool's worker counts its share of the CPUs -------------------------------------------------


def test_a_pool_workers_defaults_count_its_share_of_the_cpus() -> None:
    """The defaults count ``cpus // workers``; a Reader's starts none on a share of one CPU; ``n_procs`` given is
    taken as asked, capped as before (at 4 per CPU of the machine's)."""
    zlib = DatasetShape(64_000_000, 4096, 256, (1,))
    for siblings, share in [(0, 16), (1, 8), (3, 4), (7, 2), (15, 1), (40, 1)]:
        worker = Machine(16, "fork", siblings=siblings)
        assert worker.share == share
        assert plan_requests(None, worker) == (share if share > 1 else 0)
        assert plan_stream(zlib, "h5py", worker).n_procs == (share if share > 1 else 0)
        assert plan_requests(3, worker) == 3 and plan_requests(1000, worker) == 64
        assert plan_stream(zlib, "h5py", worker, n_procs=5).n_procs == 5
    assert plan_requests(None, Machine(1, "fork")) == 1  # a main process on one CPU: as before


def _meet(folder: str, stage: str, workers: int) -> None:
    """Wait until ``workers`` processes reached ``stage`` (a file each: a Manager's barrier would be one more worker)."""
    import os
    import time

    Path(folder, f"{stage}-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while sum(name.startswith(stage) for name in os.listdir(folder)) < workers:
        assert time.monotonic() < deadline, f"not every worker reached {stage}"
        time.sleep(0.01)


def _defaults_in_a_worker(path: str, folder: str, workers: int) -> "tuple[int, int, int, int]":
    """In a pool's worker, once every worker runs a task: a Reader's default readers, a Reader's asked for, a stream's
    default readers, and the worker's siblings."""
    from multitables._sys.siblings import cpu_siblings

    _meet(folder, "started", workers)
    siblings = cpu_siblings()
    with multitables.Reader(path) as default, multitables.Reader(path, n_procs=1) as asked:
        n_default, n_asked = default.n_procs, asked.n_procs
    with multitables.Streamer(path).get_queue("/x") as queue:
        n_stream = queue.n_procs
    _meet(folder, "done", workers)  # no worker done (and gone) while another counts
    return n_default, n_asked, n_stream, siblings


def _in_a_pool(path: "Path | str", workers: int, method: str) -> "list[tuple[int, int, int, int]]":
    import multiprocessing
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context(method)
    with tempfile.TemporaryDirectory() as folder, ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(_defaults_in_a_worker, [str(path)] * workers, [folder] * workers, [workers] * workers))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_reader_in_a_pool_of_a_worker_per_cpu_reads_in_the_worker(rows_file: Path, method: str, no_leaks: None) -> None:
    """``ProcessPoolExecutor(max_workers=cpus)``: each worker's Reader started a reader per CPU, priced at nothing,
    as many readers per CPU as CPUs. Now it reads in the worker, and a stream's default too; asked for, it starts
    them. In the main process, a reader per CPU, as before. (The fork server, which outlives its pool, runs in a
    process of its own.)"""
    import subprocess
    import sys

    cpus = planner.available_cpus()
    with multitables.Reader(rows_file) as main:
        assert main.n_procs == planner.cap_readers(cpus, None, cpus)
    workers = 2  # the pool's process on at most 2 CPUs (its affinity, which its workers inherit): a worker per CPU
    script = f"import os, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from test_read_plan import _in_a_pool; " \
             f"os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2]); " \
             f"print(_in_a_pool({str(rows_file)!r}, {workers}, {method!r}))"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == repr([(0, 1, 0, workers - 1)] * workers)


def test_a_pools_workers_share_the_cpus(rows_file: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None) -> None:
    """Forked workers of a machine of 4 CPUs whose readers always pay: 2 workers start 2 readers each by default, a
    lone worker 4, as the main process."""
    monkeypatch.setattr(costs, "START_COST_S", {"fork": 0.0, "forkserver": 0.0, "spawn": 0.0})
    monkeypatch.setattr(planner, "available_cpus", lambda: 4)
    assert _in_a_pool(rows_file, 2, "fork") == [(2, 1, 2, 1)] * 2
    assert _in_a_pool(rows_file, 1, "fork") == [(4, 1, 4, 0)]
