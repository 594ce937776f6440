"""The benchmark's scaling section: its counters, its contenders reading every row once, and a run end to end.

No test asserts a timing: the figures come from a shared machine.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Callable, Iterator

import h5py
import numpy as np
import pytest

import multitables
from multitables._sys import cgroups
from multitables_bench import counters, scaling, scaling_report
from multitables_bench.counters import PAGE_SIZE, Snapshot, Usage
from multitables_bench.records import NODE, ROW_VALUES, Codec
from multitables_bench.scaling import ScalingFigure
from multitables_bench.scaling_passes import PHASES, PassSpec, _stored_chunks, run

REPO = Path(__file__).resolve().parents[1]
N_ROWS = 2048


@pytest.fixture
def numbered(make_array: Callable[..., Path]) -> Path:
    """A zlib file at /data of N_ROWS float32 rows of ROW_VALUES whose first value is the row's number."""
    data = np.zeros((N_ROWS, ROW_VALUES), np.float32)
    data[:, 0] = np.arange(N_ROWS)
    return make_array(data, complib="zlib", complevel=3)


def touch_fresh_pages(n: int) -> None:
    """Write one byte in each of ``n`` pages never touched before (no huge pages: one fault a page)."""
    m = mmap.mmap(-1, n * PAGE_SIZE)
    try:
        m.madvise(mmap.MADV_NOHUGEPAGE)
        for offset in range(0, n * PAGE_SIZE, PAGE_SIZE):
            m[offset] = 1
    finally:
        m.close()


# ---------------------------------------------------------------------------
# Counters
# ---------------------------------------------------------------------------


def test_a_process_is_read_from_proc_and_a_gone_one_is_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        usage = counters.proc_usage(child.pid)
        assert usage is not None and usage.minflt > 0 and usage.voluntary >= 0 and usage.involuntary >= 0
    finally:
        child.kill()
        child.wait()
    assert counters.proc_usage(child.pid) is None


def test_fresh_pages_touched_in_the_window_are_counted_in_the_consumer(
    numbered: Path, no_leaks: None, blocks_as_asked: None
) -> None:
    pages = 1000
    lap = 2 * 2 + 2  # the read-ahead, and the ring's slots
    touched: list[int] = []
    slots: list[int] = []  # the slot (its address) of each block

    def opens(i: int) -> bool:  # the window's first block: every slot seen before it, or no new one for a lap
        if i < lap:
            return False
        last_new = max(k for k, s in enumerate(slots) if s not in slots[:k])
        return len(set(slots)) == lap or i - last_new > lap

    def on_block(i: int, block: np.ndarray) -> None:
        if not touched and opens(i):
            touch_fresh_pages(pages)
            touched.append(i)
        slots.append(block.__array_interface__["data"][0])

    with multitables.Streamer(str(numbered)).get_queue(NODE, n_procs=2, block_size=8, remainder=True) as queue:
        n_blocks = -(-N_ROWS // queue.block_size)
        rows, nbytes, counted = counters.drain_counted(queue, n_blocks, on_block=on_block)
    assert rows == N_ROWS and nbytes == N_ROWS * ROW_VALUES * 4
    assert counted is not None
    assert len(touched) == 1 and touched[0] >= lap  # readers with slots of their own may first use one late
    assert counted.window_blocks == n_blocks - 2 * lap - touched[0]
    assert counted.window_bytes == counted.window_blocks * 8 * ROW_VALUES * 4
    assert counted.consumer.minflt >= pages
    assert (counted.readers_counted, counted.readers_total) == (2, 2)
    for usage in (counted.consumer, counted.readers):
        assert min(usage.minflt, usage.voluntary, usage.involuntary) >= 0
    per_gib = counted.per_gib()
    assert set(per_gib) == set(scaling_report.COUNTERS) and all(v >= 0 for v in per_gib.values())
    assert per_gib["consumer_minflt_per_gib"] >= pages / (counted.window_bytes / counters.GiB)


class _SlotBlocks:
    """A readers' queue as drain_counted sees it: blocks out of ``slots`` buffers, in the order given; no reader pids."""

    def __init__(self, order: "list[int]", slots: int) -> None:
        self.n_procs, self.read_ahead, self.reader_pids = 2, slots, []
        self._buffers = [np.zeros((4, ROW_VALUES), np.float32) for _ in range(slots)]
        self._order = order

    def iter(self) -> "Iterator[contextlib.nullcontext[np.ndarray]]":
        return (contextlib.nullcontext(self._buffers[s]) for s in self._order)


def test_the_window_opens_once_every_slot_was_taken_or_no_new_one_for_a_lap() -> None:
    # Six slots, the last first taken as block 9: the lap ends there, not at block 6.
    order = [0, 1, 2, 3, 4, 0, 1, 2, 3, 5] + [k % 6 for k in range(30)]
    rows, _, counted = counters.drain_counted(_SlotBlocks(order, 6), len(order))
    assert rows == 4 * len(order) and counted is not None
    assert counted.window_blocks == (len(order) - 12) - 10  # blocks 10 to 27
    # One slot never taken: the lap ends a lap after the last new one (block 4), at block 11.
    order = [k % 5 for k in range(40)]
    assert counters.drain_counted(_SlotBlocks(order, 6), len(order))[2].window_blocks == (40 - 12) - 11
    # Two slots by turns (NOTE [warm slots]): a lap after block 1, at block 8; a slot first taken later is counted.
    order = [k % 2 for k in range(20)] + [2] + [k % 2 for k in range(19)]
    assert counters.drain_counted(_SlotBlocks(order, 6), len(order))[2].window_blocks == (40 - 12) - 8
    # A new slot in every lap: no window before the last blocks.
    order = [k // 5 for k in range(30)]
    assert counters.drain_counted(_SlotBlocks(order, 6), len(order))[2] is None
    # Every slot taken within the lap: it opens at block 6.
    order = [k % 6 for k in range(40)]
    assert counters.drain_counted(_SlotBlocks(order, 6), len(order))[2].window_blocks == (40 - 12) - 6


def test_reading_the_readers_counters_is_left_out_of_the_consumers_window(monkeypatch: pytest.MonkeyPatch) -> None:
    pages = 1000

    def costly_read(pid: int) -> Usage:  # as /proc's first read in a forked process: pages copied as written
        touch_fresh_pages(pages)
        return Usage()

    monkeypatch.setattr(counters, "proc_usage", costly_read)
    queue = _SlotBlocks([k % 6 for k in range(40)], 6)
    queue.reader_pids = [os.getpid()]
    counted = counters.drain_counted(queue, 40)[2]
    assert counted is not None and counted.readers_counted == 1
    assert counted.consumer.minflt < pages  # neither snapshot's reading of the readers


def test_no_window_without_enough_blocks_and_no_readers_in_process(numbered: Path, no_leaks: None) -> None:
    with multitables.Streamer(str(numbered)).get_queue(NODE, n_procs=2, block_size=256, remainder=True) as queue:
        rows, _, counted = counters.drain_counted(queue, 8)  # 8 blocks, a lap of 6
    assert rows == N_ROWS and counted is None
    with multitables.Streamer(str(numbered)).get_queue(NODE, n_procs=0, block_size=16, remainder=True) as queue:
        _, _, counted = counters.drain_counted(queue, N_ROWS // 16)
    assert counted is not None and counted.readers_total == 0 and counted.readers == Usage()


def test_a_reader_gone_before_the_last_snapshot_is_left_out_of_both() -> None:
    before = Snapshot(Usage(10, 1, 1), {1: Usage(5, 5, 5), 2: Usage(7, 7, 7), 3: None})
    after = Snapshot(Usage(30, 2, 4), {1: Usage(105, 6, 8), 2: None, 3: Usage(1, 1, 1)})
    counted = counters.window(before, after, counters.GiB, 4)
    assert counted.consumer == Usage(20, 1, 3) and counted.readers == Usage(100, 1, 3)
    assert (counted.readers_counted, counted.readers_total) == (1, 3)
    assert counted.per_gib()["reader_switches_per_gib"] == 4.0
    assert counters.pages_per_gib() * PAGE_SIZE == counters.GiB


# ---------------------------------------------------------------------------
# Contenders: every row once
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "n"), [("h5py", 1), ("processes", 1), ("processes", 3), ("multitables", 2),
                                         ("multitables", None), ("dataloader", 2)])
def test_each_contender_reads_every_row_exactly_once(numbered: Path, kind: str, n: "int | None", no_leaks: None) -> None:
    if kind == "dataloader":
        pytest.importorskip("torch")
    result = run(PassSpec(kind, str(numbered), n, block_rows=96, n_rows=N_ROWS, record=True))
    assert result.first_values is not None
    assert sorted(result.first_values) == list(range(N_ROWS))  # each row once, none missing
    assert result.rows == N_ROWS and result.nbytes == N_ROWS * ROW_VALUES * 4 and result.seconds > 0
    if kind in ("h5py", "processes", "dataloader"):
        assert result.first_values == list(range(N_ROWS))  # in order: the shares are contiguous, in turn
    if kind == "multitables":  # where its seconds went: every phase, in order, adding up to the pass
        assert result.phases is not None and list(result.phases) == list(PHASES)
        assert all(v >= 0 for v in result.phases.values())
        assert sum(result.phases.values()) == pytest.approx(result.seconds)
    else:
        assert result.phases is None


def test_the_pass_server_answers_each_pass_and_reports_a_failure_with_its_traceback(numbered: Path, tmp_path: Path) -> None:
    servers = scaling.PassServers()
    try:
        assert servers.run(PassSpec("h5py", str(numbered), 1, 96, N_ROWS)).rows == N_ROWS
        with pytest.raises(RuntimeError, match="(?s)h5py n=1 on .*missing.h5 failed.*FileNotFoundError"):
            servers.run(PassSpec("h5py", str(tmp_path / "missing.h5"), 1, 96, N_ROWS))
        assert servers.run(PassSpec("multitables", str(numbered), 2, 96, N_ROWS)).rows == N_ROWS  # still serving
    finally:
        servers.close()


def test_a_pythonpath_naming_another_multitables_is_the_one_the_pass_servers_import(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An A/B of the section names the other package on PYTHONPATH; the passes must not import this checkout's."""
    other = tmp_path / "other" / "multitables"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "other"))
    code = "import multitables, multitables_bench; print(multitables.__file__); print(multitables_bench.__file__)"
    printed = subprocess.run([sys.executable, "-c", code], env=scaling.pass_env(), cwd=tmp_path, capture_output=True,
                             text=True, check=True).stdout.split()
    assert printed[0] == str(other / "__init__.py")
    assert Path(printed[1]).parent.parent == REPO  # the benchmark's own code: this checkout's


def test_inflate_decodes_the_files_own_stored_chunks_in_each_process(numbered: Path, no_leaks: None) -> None:
    chunks, chunk_nbytes = _stored_chunks(str(numbered), 1 << 20)
    with h5py.File(numbered) as f:
        chunk_rows = f[NODE].chunks[0]
        assert chunk_nbytes == chunk_rows * ROW_VALUES * 4 and len(chunks) == -(-(1 << 20) // chunk_nbytes)
        unshuffled = np.frombuffer(zlib.decompress(chunks[-1]), np.uint8).reshape(4, -1).T.copy().view("<f4")
        last = (len(chunks) - 1) * chunk_rows
        assert np.array_equal(unshuffled.reshape(chunk_rows, ROW_VALUES), f[NODE][last : last + chunk_rows])
    result = run(PassSpec("inflate", str(numbered), n=2, memcpy_mib=2))
    assert result.n_used == 2 and result.seconds > 0
    assert result.nbytes >= 2 * (2 << 20) and result.nbytes % (2 * chunk_nbytes) == 0  # whole chunks, both processes


def test_memcpy_counts_every_byte_copied(no_leaks: None) -> None:
    result = run(PassSpec("memcpy", n=2, memcpy_mib=2))
    assert result.nbytes == 2 * 8 * (2 << 20) and result.seconds > 0 and result.n_used == 2


# ---------------------------------------------------------------------------
# Sizes, files, machine
# ---------------------------------------------------------------------------


def test_processes_double_up_to_the_cpus() -> None:
    assert scaling.procs_list(1) == [1]
    assert scaling.procs_list(2) == [1, 2]
    assert scaling.procs_list(12) == [1, 2, 4, 8, 12]
    assert scaling.procs_list(16) == [1, 2, 4, 8, 16]


def test_threads_per_core_is_known_here() -> None:
    threads = scaling.threads_per_core()
    assert threads is not None and threads >= 1


def test_a_file_is_reused_when_it_holds_the_same_and_refused_otherwise(tmp_path: Path) -> None:
    paths = scaling.file_paths(str(tmp_path / "bench.h5"))
    assert sorted(os.path.basename(p) for p in paths.values()) == ["bench-scaling-blosc-3.h5", "bench-scaling-zlib-3.h5"]
    path, log = paths[Codec("zlib", 3)], []
    scaling.ensure_file(path, Codec("zlib", 3), 512, log.append)
    written = os.path.getmtime(path)
    scaling.ensure_file(path, Codec("zlib", 3), 512, log.append)
    assert os.path.getmtime(path) == written and log == [f"scaling: reusing {path}"]
    with pytest.raises(SystemExit, match="remove it"):
        scaling.ensure_file(path, Codec("zlib", 3), 1024, log.append)
    assert scaling.block_rows(path) % 1 == 0 and scaling.block_rows(path) >= 1


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _fig(kind: str, n: "int | None", rate: float, codec: str = "zlib-3", **kw: object) -> ScalingFigure:
    return ScalingFigure(codec, kind, n, rate, (rate,), **kw)  # type: ignore[arg-type]


def test_rows_have_ratios_to_h5py_efficiency_and_counters_against_the_target() -> None:
    limit = counters.FAULT_TARGET * counters.pages_per_gib()
    low = dict.fromkeys(scaling_report.COUNTERS, 1.0)
    figures = [_fig("h5py", 1, 100.0, block_rows=1024), _fig("multitables", 1, 200.0, n_used=1, engine="chunks", counters=low),
               _fig("multitables", 4, 600.0, n_used=4, engine="chunks", counters={**low, "reader_minflt_per_gib": limit + 1}),
               _fig("multitables", None, 700.0, n_used=4, engine="chunks"), _fig("processes", 1, 90.0),
               _fig("processes", 4, 180.0)]
    rows = scaling_report.codec_rows(figures, "zlib-3")
    assert all(len(r) == len(scaling_report.HEADER) for r in rows)
    assert [r[3] for r in rows] == ["1.00x", "2.00x", "6.00x", "7.00x", "0.90x", "1.80x"]
    assert [r[4] for r in rows] == ["n/a", "1.00", "0.75", "0.88", "1.00", "0.50"]
    assert [r[-1] for r in rows] == ["", "met", "missed", "n/a (too few blocks)", "", ""]
    targets = {t[0]: t for t in scaling_report.target_rows(figures, 4)}
    assert targets["zlib 3, n_procs=4: efficiency"][1:] == ("0.75", ">= 0.8", "missed")
    assert not any(t.startswith("the machine") for t in targets)  # no inflate pass measured: nothing said of the cores
    cores = [_fig("inflate", 1, 500.0), _fig("inflate", 4, 1800.0)]
    assert [r[4] for r in scaling_report.codec_rows(figures + cores, "zlib-3")][-2:] == ["1.00", "0.90"]
    targets = {t[0]: t for t in scaling_report.target_rows(figures + cores, 4)}
    assert targets["the machine: zlib 3 chunks inflated in memory by 4 processes at once: efficiency"][1] == "0.90"


# ---------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------


def _md_rows(text: str, heading: str) -> list[list[str]]:
    """The rows (header first, no rule) of the first Markdown table under ``heading``."""
    lines = text.split(heading, 1)[1].strip().splitlines()
    table = lines[:next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]
    return [[c.strip() for c in line.strip("|").split("|")] for k, line in enumerate(table) if k != 1]


def test_the_section_runs_end_to_end_on_a_tiny_file(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    argv = [sys.executable, str(REPO / "multitables_benchmark.py"), "--sections", "scaling", "--quick", "--section-mib", "4",
            "--max_procs", "2", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "TQDM_DISABLE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch = scaling.torch_available()
    for codec in ("zlib-3", "blosc-3"):
        rows = _md_rows(proc.stdout, f"#### {codec} + shuffle")
        assert tuple(rows[0]) == scaling_report.HEADER
        labels = [r[0] for r in rows[1:]]
        assert labels[0].startswith("h5py, one process")
        assert [lbl.split(",")[1].strip() for lbl in labels if lbl.startswith("multitables")][:2] == ["n_procs=1", "n_procs=2"]
        assert sum(lbl.startswith("multitables direct, default") for lbl in labels) == 1
        assert sum("plain h5py process" in lbl for lbl in labels) == 2
        assert sum(lbl.startswith("DataLoader") for lbl in labels) == (2 if torch else 0)
        assert sum("inflated in memory" in lbl for lbl in labels) == (2 if codec == "zlib-3" else 0)
        assert all(len(r) == len(rows[0]) for r in rows)
    facts = dict(_md_rows(proc.stdout, "#### The machine")[1:])  # type: ignore[arg-type]
    assert any(k.startswith("memory copy, 2 processes") for k in facts) and "threads per core" in facts
    quota = next(v for k, v in facts.items() if k.startswith("CPU quota"))
    assert quota == ("none" if cgroups.cpu_quota() is None else f"{cgroups.cpu_quota():g} CPUs")
    doc = json.loads((tmp_path / "report.json.scaling.json").read_text())
    assert doc["section"] == "scaling" and doc["pages_per_gib"] == counters.pages_per_gib()
    per_codec = 1 + 3 + 2 + (2 if torch else 0)
    assert len(doc["passes"]) == 2 * per_codec + 2 + 2  # one repeat: every contender of both files, two inflates, two memcpys
    targets = dict((r[0], r[1:]) for r in _md_rows(proc.stdout, "#### Issue 29's targets, as far as this run measures them")[1:])
    assert targets["the machine: zlib 3 chunks inflated in memory by 2 processes at once: efficiency"][1:] == \
        ["(the cores alone, for the row above)", "n/a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json.scaling.json"]  # its files removed
