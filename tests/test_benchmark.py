"""The benchmark script's logic: options, readers, summaries, the report's structure, and a --quick run end to end.

No test asserts a timing: the figures come from a shared machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from multitables._shm.segment import SHM_PREFIX
from multitables_bench import cache_modes, cli, files, machine, readers, records
from multitables_bench import passes as timing
from multitables_bench import plot as plotting
from multitables_bench import report as reporting
from multitables_bench.records import Codec, Context, Pass, Reader, Settings, Target

REPO = Path(__file__).resolve().parents[1]
CELL = re.compile(r"^[\d,]+ MB/s( \d+\.\d\dx)?\*?$")


# ---------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------


def test_defaults_follow_the_established_benchmark() -> None:
    s = cli.parse_args([])
    assert (s.size_gib, s.cycles, s.repeats) == (1.0, 1, 3)
    assert s.complibs == ("blosc",) and s.complevels == (0, 3, 9)
    assert s.engines == ("chunks", "h5py", "tables") and s.modes == ("direct", "generator")
    assert s.cache == "auto" and not s.direct_off and s.small_files
    assert s.max_procs == machine.usable_cpus()
    assert s.n_rows == (1 << 30) // 4096


def test_quick_is_small_and_explicit_options_win() -> None:
    s = cli.parse_args(["--quick"])
    assert s.quick and s.size_gib == cli.QUICK_SIZE_GIB and s.repeats == 1 and 1 <= s.max_procs <= 2
    assert s.n_rows * records.ROW_NBYTES > 16 << 20  # above the in-process threshold: readers start
    s = cli.parse_args(["--quick", "--repeats", "2", "--size", "0.5", "--max_procs", "3"])
    assert (s.repeats, s.size_gib, s.max_procs) == (2, 0.5, 3)


def test_every_established_option_parses() -> None:
    s = cli.parse_args(["--size", "2", "--cycles", "2", "--max_procs", "6", "--complib", "zlib", "--H5FD_DIRECT_OFF"])
    assert (s.size_gib, s.cycles, s.max_procs, s.complibs, s.direct_off) == (2.0, 2, 6, ("zlib",), True)


def test_complib_joins_complibs_without_repeats() -> None:
    s = cli.parse_args(["--complib", "zlib", "--complibs", "blosc:lz4", "zlib", "blosc:zstd"])
    assert s.complibs == ("zlib", "blosc:lz4", "blosc:zstd")


def test_new_options_parse() -> None:
    s = cli.parse_args(
        ["--complevels", "1", "5", "--engines", "tables", "--modes", "generator", "--cache", "warm", "--json", "r.json",
         "--markdown", "--html", "out.html", "--no-small-files"]
    )
    assert s.complevels == (1, 5) and s.engines == ("tables",) and s.modes == ("generator",) and s.cache == "warm"
    assert (s.json, s.markdown, s.html, s.small_files) == ("r.json", "-", "out.html", False)


@pytest.mark.parametrize(
    "argv",
    [
        ["--repeats", "0"],
        ["--cycles", "0"],
        ["--max_procs", "0"],
        ["--size", "0"],
        ["--complevels", "10"],
        ["--complibs", "nope"],
        ["--engines", "zarr"],
        ["--modes", "fast"],
        ["--cache", "cold"],
        ["--cache", "direct", "--H5FD_DIRECT_OFF"],
    ],
)
def test_bad_options_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_file_must_be_new_and_its_directory_exist(tmp_path: Path) -> None:
    existing = tmp_path / "data.h5"
    existing.write_bytes(b"precious")
    with pytest.raises(SystemExit):
        cli.parse_args(["--file", str(existing)])
    with pytest.raises(SystemExit):
        cli.parse_args(["--file", str(tmp_path / "missing" / "bench.h5")])
    assert cli.parse_args(["--file", str(tmp_path / "bench.h5")]).file == str(tmp_path / "bench.h5")


def test_plot_without_matplotlib_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "_available", lambda module: module != "matplotlib")
    with pytest.raises(SystemExit):
        cli.parse_args(["--plot", "p.png"])
    assert "pip install matplotlib" in capsys.readouterr().err


def test_sections_that_need_torch_say_so_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without torch, --sections training ended in ModuleNotFoundError after the other sections' work."""
    monkeypatch.setattr(cli, "_available", lambda module: module != "torch")
    with pytest.raises(SystemExit):
        cli.parse_args(["--sections", "random", "training"])
    assert "--sections training needs PyTorch" in capsys.readouterr().err
    assert cli.parse_args(["--sections", "random"]).sections == ("random",)


def test_a_complib_pytables_lacks_is_refused_not_written_as_zlib(capsys: pytest.CaptureFixture[str]) -> None:
    """PyTables writes zlib where it lacks the complib asked for (lzo in the stock wheels): the report called it lzo."""
    import tables

    missing = [lib for lib in tables.filters.all_complibs if tables.which_lib_version(lib.split(":")[0]) is None]
    if not missing:
        pytest.skip("this PyTables has every complib it knows")
    with pytest.raises(SystemExit):
        cli.parse_args(["--complibs", missing[0]])
    assert "not in this PyTables build" in capsys.readouterr().err


def test_options_of_the_main_section_alone_are_refused_with_other_sections(capsys: pytest.CaptureFixture[str]) -> None:
    """--markdown, --cache, --complibs ... were dropped without a word where main was not among the sections."""
    with pytest.raises(SystemExit):
        cli.parse_args(["--sections", "blocks", "--markdown", "x.md", "--cache", "evict", "--complibs", "blosc"])
    assert "--complibs, --cache, --markdown apply to the main section only" in capsys.readouterr().err
    assert cli.parse_args(["--sections", "blocks", "main", "--markdown", "x.md"]).markdown == "x.md"
    assert cli.parse_args(["--sections", "scaling", "--repeats", "2", "--max_procs", "1", "--quick"]).repeats == 2


def test_sections_file_needs_its_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--sections", "training", "--file", str(tmp_path / "bench" / "sec.h5")])
    assert "no such directory (make it first: mkdir -p" in capsys.readouterr().err


def test_data_defaults_to_noise_and_takes_a_list() -> None:
    assert cli.parse_args([]).data == ("noise",)
    assert cli.parse_args(["--data", "smooth"]).data == ("smooth",)
    assert cli.parse_args(["--data", "noise", "smooth", "noise"]).data == ("noise", "smooth")
    assert "--data" in cli.build_parser().format_help()


def test_unknown_data_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--data", "walk"])
    assert "invalid choice" in capsys.readouterr().err


def test_each_data_kind_gets_its_own_file(tmp_path: Path) -> None:
    assert records.data_path("bench/x.h5", "noise", ("noise",)) == "bench/x.h5"  # as before --data
    assert records.data_path("bench/x.h5", "smooth", ("smooth",)) == "bench/x-smooth.h5"
    assert [records.data_path("x.h5", d, ("noise", "smooth")) for d in ("noise", "smooth")] == ["x-noise.h5", "x-smooth.h5"]
    (tmp_path / "x-smooth.h5").write_bytes(b"precious")
    with pytest.raises(SystemExit):
        cli.parse_args(["--file", str(tmp_path / "x.h5"), "--data", "noise", "smooth"])
    assert cli.parse_args(["--file", str(tmp_path / "x.h5"), "--data", "noise"]).file == str(tmp_path / "x.h5")


def test_codecs_write_complevel_zero_once() -> None:
    s = cli.parse_args(["--complibs", "zlib", "blosc", "--complevels", "3", "0", "9"])
    assert s.codecs == (Codec("none", 0), Codec("zlib", 3), Codec("zlib", 9), Codec("blosc", 3), Codec("blosc", 9))
    assert s.small_codec == Codec("zlib", 3)
    assert cli.parse_args(["--complevels", "0"]).small_codec == Codec("none", 0)


# ---------------------------------------------------------------------------
# The page cache, as the benchmark uses it
# ---------------------------------------------------------------------------


def _settings(**kw: Any) -> Settings:
    return cli.parse_args([]) if not kw else Settings(**{**cli.parse_args([]).__dict__, **kw})


def test_cache_modes_resolve(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import multitables_bench.cache as pc

    assert cache_modes.resolve_cache(_settings(cache="warm"), str(tmp_path))[0] == "warm"
    assert cache_modes.resolve_cache(_settings(cache="evict"), str(tmp_path))[0] == "evict"
    assert cache_modes.resolve_cache(_settings(direct_off=True), str(tmp_path))[0] == "evict"

    monkeypatch.setattr(pc, "direct_driver_available", lambda engine, directory=None: False)
    mode, note = cache_modes.resolve_cache(_settings(), str(tmp_path))
    assert mode == "evict" and "no usable direct driver" in note
    # Asked for, "direct" works with the stock wheels: the chunk engine reads with O_DIRECT, the rest evict.
    mode, note = cache_modes.resolve_cache(_settings(cache="direct"), str(tmp_path))
    assert mode == cache_modes.DIRECT_CHUNKS and "O_DIRECT" in note and "no usable direct driver" in note
    assert cache_modes.open_kwargs_for(cache_modes.DIRECT_CHUNKS, "chunks") == {"cache": "direct"}
    assert cache_modes.open_kwargs_for(cache_modes.DIRECT_CHUNKS, "h5py") == {}
    assert cache_modes.open_kwargs_for(cache_modes.DIRECT_CHUNKS, "auto") == {}

    monkeypatch.setattr(pc, "direct_driver_available", lambda engine, directory=None: True)
    assert cache_modes.resolve_cache(_settings(), str(tmp_path))[0] == "direct"
    assert cache_modes.open_kwargs_for("direct", "h5py") == {"driver": "direct"}
    assert cache_modes.open_kwargs_for("direct", "tables") == {"driver": "H5FD_DIRECT"}
    assert cache_modes.open_kwargs_for("direct", "chunks") == {"cache": "direct"}
    assert cache_modes.open_kwargs_for("evict", "tables") == {}
    assert cache_modes.open_kwargs_for("evict", "chunks") == {}


@pytest.mark.parametrize("reporting", [True, False])
def test_cold_passes_settle_memory_under_free_page_reporting(
    monkeypatch: pytest.MonkeyPatch, small_target: Target, tmp_path: Path, reporting: bool
) -> None:
    import multitables_bench.cache as pc

    settled: list[int] = []
    monkeypatch.setattr(cache_modes, "_settles_memory", lambda: reporting)
    monkeypatch.setattr(pc, "settle_free_memory", settled.append)
    cache_modes.prepare_cache(small_target.path, "evict")
    cache_modes.prepare_cache(small_target.path, cache_modes.DIRECT_CHUNKS)
    cache_modes.prepare_cache(small_target.path, "warm")  # warm passes read from memory: nothing to settle
    size = os.path.getsize(small_target.path)
    assert settled == ([size + cache_modes.SETTLE_EXTRA] * 2 if reporting else [])
    note = cache_modes.resolve_cache(_settings(cache="evict"), str(tmp_path))[1]
    assert ("free page reporting" in note) == reporting
    assert "free page reporting" not in cache_modes.resolve_cache(_settings(cache="warm"), str(tmp_path))[1]


@pytest.mark.parametrize("kind", ["single", "multitables"])
def test_direct_chunk_passes_leave_the_page_cache_cold(tmp_path: Path, kind: str) -> None:
    from multitables_bench.cache import resident_fraction

    path = tmp_path / "z.h5"
    files.write_file(str(path), 2000, Codec("zlib", 3), chunk_rows=64)  # 8 MB: HDF5's metadata, read cached, is ~1%
    target = Target("main", str(path), Codec("zlib", 3), 2000, 64)
    if cache_modes.prepare_cache(str(path), "evict") > 0.05:
        pytest.skip("this filesystem keeps the file cached (tmpfs?)")
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    if kind == "single":
        rows = readers.read_single(target, Reader("single", "chunks"), cache_modes.DIRECT_CHUNKS, 64, lambda n: None)
    else:
        rows = readers.read_multitables(target, Reader("multitables", "chunks", "direct", 2), cache_modes.DIRECT_CHUNKS, lambda n: None)
    assert rows == 2000
    assert resident_fraction(str(path)) < 0.05  # read with O_DIRECT; the page-cache path leaves ~100% (below)
    readers.read_single(target, Reader("single", "chunks"), "evict", 64, lambda n: None)
    assert resident_fraction(str(path)) > 0.5


def test_prepare_cache_warm_reads_the_file_in(tmp_path: Path) -> None:
    path = tmp_path / "f.h5"
    files.write_file(str(path), 300, Codec("zlib", 1))
    assert cache_modes.prepare_cache(str(path), "warm") == pytest.approx(1.0)
    assert 0.0 <= cache_modes.prepare_cache(str(path), "evict") <= 1.0


@pytest.mark.parametrize(
    ("cache", "resident", "warm"),
    [("evict", 0.0, False), ("evict", 0.02, True), ("direct", 0.011, True), ("evict", 0.009, False), ("warm", 1.0, False)],
)
def test_a_cold_pass_starting_cached_is_marked(cache: str, resident: float, warm: bool) -> None:
    p = Pass("main", Codec("none", 0), Reader("odirect"), 0, 0, cache, resident, 1.0, 10**6)
    assert p.warm_start is warm
    assert p.mb_per_s == pytest.approx(1.0)


# ---------------------------------------------------------------------------
# Files and readers
# ---------------------------------------------------------------------------


@pytest.fixture
def small_target(tmp_path: Path) -> Target:
    path = tmp_path / "t.h5"
    files.write_file(str(path), 1000, Codec("blosc", 3), chunk_rows=64)
    return Target("main", str(path), Codec("blosc", 3), 1000, 64)


def test_written_file_is_random_normal_float32_rows(small_target: Target) -> None:
    import tables

    with tables.open_file(small_target.path) as f:
        node = f.get_node(records.NODE)
        assert node.shape == (1000, 1024) and node.dtype == np.float32 and node.chunkshape == (64, 1024)
        assert node.filters.complib == "blosc" and node.filters.complevel == 3
        data = node.read()
    assert abs(float(data.mean())) < 0.01 and abs(float(data.std()) - 1) < 0.01


def test_noise_rows_are_the_established_ones() -> None:
    expected = np.random.default_rng(5).standard_normal((3, records.ROW_VALUES), dtype=np.float32)
    assert np.array_equal(files.make_rows(np.random.default_rng(5), 3), expected)


def test_smooth_rows_are_a_seeded_walk_in_whole_steps() -> None:
    a = files.make_rows(np.random.default_rng(1), 50, "smooth")
    assert a.shape == (50, records.ROW_VALUES) and a.dtype == np.float32
    assert np.array_equal(a, files.make_rows(np.random.default_rng(1), 50, "smooth"))  # deterministic
    assert not np.array_equal(a, files.make_rows(np.random.default_rng(2), 50, "smooth"))
    steps = np.diff(a, axis=1, prepend=0)
    assert np.array_equal(steps, np.round(steps)) and np.abs(steps).max() == files.SMOOTH_STEP
    assert set(np.unique(steps)) == set(range(-files.SMOOTH_STEP, files.SMOOTH_STEP + 1))
    with pytest.raises(ValueError):
        files.make_rows(np.random.default_rng(1), 1, "walk")


def _stored(path: Path) -> tuple[np.ndarray, float]:
    """The data of a written file and its compression ratio (data bytes / file bytes)."""
    import tables

    with tables.open_file(str(path)) as f:
        data = f.get_node(records.NODE).read()
    return data, data.nbytes / os.path.getsize(path)


def test_smooth_file_is_deterministic_and_compresses_several_times(tmp_path: Path) -> None:
    """Written block by block (WRITE_ROWS), the same seed gives the same rows; zlib 3 packs them ~4x, noise ~1.1x."""
    n = files.WRITE_ROWS + 500  # two appends
    for name in ("a", "b"):
        files.write_file(str(tmp_path / f"{name}.h5"), n, Codec("zlib", 3), data="smooth")
    files.write_file(str(tmp_path / "noise.h5"), n, Codec("zlib", 3))
    a, ratio = _stored(tmp_path / "a.h5")
    b, _ = _stored(tmp_path / "b.h5")
    assert a.shape == (n, records.ROW_VALUES) and np.array_equal(a, b)
    rng = np.random.default_rng(0)
    first, second = files.make_rows(rng, files.WRITE_ROWS, "smooth"), files.make_rows(rng, 500, "smooth")
    assert np.array_equal(a, np.concatenate([first, second]))
    assert ratio > 3.5
    assert _stored(tmp_path / "noise.h5")[1] < 1.3


@pytest.mark.parametrize("engine", records.ENGINES)
def test_single_process_reader_reads_every_row_in_blocks(small_target: Target, engine: str) -> None:
    steps: list[int] = []
    rows = readers.read_single(small_target, Reader("single", engine), "evict", 96, steps.append)
    assert rows == 1000 and sum(steps) == 1000 and max(steps) == 96 and steps[-1] == 1000 % 96
    assert readers.engine_can_read(small_target, engine) is None


@pytest.mark.parametrize("mode", records.MODES)
@pytest.mark.parametrize("n_procs", [1, None])
def test_multitables_reader_reads_every_row(small_target: Target, mode: str, n_procs: "int | None", no_leaks: None) -> None:
    steps: list[int] = []
    used: list[int] = []
    rows = readers.read_multitables(small_target, Reader("multitables", "h5py", mode, n_procs), "evict", steps.append, used)
    assert rows == 1000 and sum(steps) == 1000
    assert used == [0 if n_procs is None else n_procs]  # 4 MB: read in-process by default


def test_probe_reports_what_multitables_picks(small_target: Target, no_leaks: None) -> None:
    used, block = readers.probe_multitables(small_target, "auto", None, "evict")
    assert used == 0  # 4 MB: read in-process by default
    assert block == 1000  # in-process: one block of the whole file
    assert readers.probe_multitables(small_target, "h5py", 2, "evict")[0] == 2


def test_unreadable_file_is_explained(tmp_path: Path) -> None:
    path = tmp_path / "not.h5"
    path.write_bytes(b"not HDF5 at all")
    target = Target("main", str(path), Codec("none", 0), 1)
    assert readers.engine_can_read(target, "h5py") and readers.engine_can_read(target, "tables")


def test_an_engine_that_cannot_decode_is_skipped_with_a_note(
    small_target: Target, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    monkeypatch.setattr(timing, "engine_can_read", lambda path, engine: "no filter" if engine == "h5py" else None)
    notes: list[str] = []
    jobs = timing.main_jobs(small_target, _settings(max_procs=1, engines=("h5py", "tables")), "evict", notes)
    assert {j.reader.engine for j in jobs if j.reader.kind != "odirect"} == {"tables"}
    assert len(notes) == 1 and "h5py cannot decode" in notes[0]
    # The O_DIRECT read, one single-process reader, n_procs 1 and default in both modes:
    assert [j.reader.kind for j in jobs].count("multitables") == 4 and len(jobs) == 6


def test_small_files_get_more_repeats_than_a_quick_run_gives_them() -> None:
    assert timing.small_repeats(cli.parse_args([])) == timing.SMALL_MIN_REPEATS == 41
    assert timing.small_repeats(cli.parse_args(["--quick"])) == timing.QUICK_SMALL_REPEATS == 15
    assert timing.small_repeats(cli.parse_args(["--repeats", "50"])) == 50


def test_run_jobs_interleaves_repeats_and_records_residency(small_target: Target) -> None:
    jobs = [timing.Job(small_target, Reader("odirect")), timing.Job(small_target, Reader("single", "h5py"), block_size=128)]
    lines: list[str] = []
    passes = timing.run_jobs(jobs, "evict", repeats=2, cycles=2, log=lines.append)
    assert [(p.repeat, p.reader.kind, p.cycle) for p in passes] == [
        (r, k, c) for r in range(2) for k in ("odirect", "single") for c in range(2)
    ]
    assert all(0.0 <= p.resident <= 1.0 and p.seconds > 0 for p in passes)
    assert passes[-1].nbytes == 1000 * records.ROW_NBYTES and passes[0].nbytes == os.path.getsize(small_target.path)
    assert len(lines) == len(passes) and all("cached]" in line and "MB/s" in line for line in lines)


@given(st.integers(1, 9))
def test_pair_order_puts_each_job_after_each_job_once(n: int) -> None:
    cycle = timing.pair_order(n)
    assert len(cycle) == n * n
    after = Counter(zip(cycle, cycle[1:] + cycle[:1]))  # the cycle wraps: its last pass precedes its first
    assert after == Counter({(a, b): 1 for a in range(n) for b in range(n)})


@given(st.integers(1, 6), st.integers(1, 30))
def test_pass_order_gives_each_job_its_repeats_and_each_predecessor_alike(n: int, repeats: int) -> None:
    order = timing.pass_order(n, repeats)
    assert Counter(order) == Counter({j: repeats for j in range(n)})
    if repeats % n == 0:  # whole cycles: every ordered pair as often, but the one that wraps, once less
        after = Counter(zip(order, order[1:]))
        cycles = repeats // n
        assert after == Counter({(a, b): cycles - ((a, b) == (order[-1], order[0])) for a in range(n) for b in range(n)}) - Counter()


def test_run_jobs_in_pairs_numbers_each_jobs_repeats_in_turn(small_target: Target) -> None:
    jobs = [timing.Job(small_target, Reader("single", "h5py"), block_size=128), timing.Job(small_target, Reader("odirect"))]
    passes = timing.run_jobs(jobs, "evict", repeats=4, cycles=1, log=lambda _line: None, pairs=True)
    kinds = [p.reader.kind for p in passes]
    assert kinds == [("single", "odirect")[j] for j in timing.pass_order(2, 4)]
    for kind in ("single", "odirect"):
        assert [p.repeat for p in passes if p.reader.kind == kind] == [0, 1, 2, 3]


def test_a_pass_starts_with_the_garbage_of_the_pass_before_collected(
    small_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc
    import weakref

    class Cycle:
        pass

    def leave_garbage() -> "weakref.ref[Cycle]":
        cycle = Cycle()
        cycle.me = cycle  # type: ignore[attr-defined]  # only the cycle collector frees it
        return weakref.ref(cycle)

    alive_when_timed: list[bool] = []
    real = timing.read_single

    def read_single(*args: Any) -> int:
        alive_when_timed.append(garbage() is not None)
        return real(*args)

    monkeypatch.setattr(timing, "read_single", read_single)
    gc.disable()  # so that only the pass can collect it
    try:
        garbage = leave_garbage()
        assert garbage() is not None
        timing.time_pass(timing.Job(small_target, Reader("single", "h5py"), block_size=128), "evict", 0, 0, lambda line: None)
    finally:
        gc.enable()
    assert alive_when_timed == [False]


# ---------------------------------------------------------------------------
# Summaries and the report
# ---------------------------------------------------------------------------

LEVELS = (0, 3)
ENGINES = ("h5py", "tables")
MODES = ("direct", "generator")
MAX_PROCS = 2


#: Compression ratio of the synthetic files, by (data, complevel).
RATIOS = {("noise", 0): 1.0, ("noise", 3): 1.25, ("smooth", 0): 1.0, ("smooth", 3): 4.0}


def _pass(
    target: str, codec: Codec, reader: Reader, rate: float, repeat: int = 0, cycle: int = 0, resident: float = 0.0,
    data: str = "noise",
) -> Pass:
    n_procs_used = None
    if reader.kind == "multitables":
        n_procs_used = reader.n_procs if reader.n_procs is not None else (2 if target == "main" else 0)
    nbytes = int(rate * records.MB)
    file_nbytes = nbytes if reader.kind == "odirect" else int(nbytes / RATIOS[data, codec.complevel])
    return Pass(target, codec, reader, repeat, cycle, "evict", resident, 1.0, nbytes, n_procs_used, 64, data, file_nbytes)


def synthetic_passes(data: str = "noise", small: bool = True) -> list[Pass]:
    """Every pass a full run with two complevels, both engines and modes, max_procs 2 and the small files would make."""
    passes = []
    for level in LEVELS:
        codec = records.make_codec("blosc", level)
        passes.append(_pass("main", codec, Reader("odirect"), 900.0, data=data))
        passes += [_pass("main", codec, Reader("single", e), 400.0 if e == "h5py" else 200.0, data=data) for e in ENGINES]
        for e in ENGINES:
            for m in MODES:
                for n in (1, 2, None):
                    warm = 0.5 if (level, e, m, n) == (3, "tables", "generator", 2) else 0.0
                    rate = 100.0 * (n or 2) * (0.9 if (data, e, n) == ("smooth", "h5py", 2) else 1.0)
                    passes.append(_pass("main", codec, Reader("multitables", e, m, n), rate, resident=warm, data=data))
    if not small:
        return passes
    for small in records.SMALL_FILES:
        codec = Codec("blosc", 3)
        passes += [_pass(small.key, codec, Reader("single", e), 100.0) for e in ENGINES]
        rate = 50.0 if small.key == "sub-chunk" else 95.0
        passes += [_pass(small.key, codec, Reader("multitables", "auto", m, None), rate) for m in MODES]
    return passes


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    s = _settings(complibs=("blosc",), complevels=LEVELS, max_procs=MAX_PROCS, repeats=1, engines=ENGINES)
    return Context(s, "evict", "evict: pages dropped", machine.machine_info(str(tmp_path)), {"numpy": np.__version__}, ("a note",))


def test_summary_is_the_median_over_repeats_of_rates_over_cycles() -> None:
    codec, reader = Codec("zlib", 3), Reader("single", "h5py")
    passes = [
        Pass("main", codec, reader, repeat, cycle, "evict", 0.0, seconds, 100 * 10**6)
        for repeat, times in enumerate([(1.0, 1.0), (0.5, 0.5), (2.0, 2.0)])
        for cycle, seconds in enumerate(times)
    ]
    (result,) = reporting.summarize(passes)
    assert result.rates == pytest.approx((100.0, 200.0, 50.0))
    assert result.mb_per_s == pytest.approx(100.0)
    assert not result.warm_start
    marked = reporting.summarize(passes[:-1] + [Pass("main", codec, reader, 2, 1, "evict", 0.3, 2.0, 100 * 10**6)])
    assert marked[0].warm_start


def test_scaling_table_is_complevel_by_n_procs_with_ratios_and_default() -> None:
    results = reporting.summarize(synthetic_passes())
    t = reporting.scaling_table(results, "blosc", LEVELS, "h5py", "direct", MAX_PROCS)
    assert t.header == ("complevel / n_procs", "1", "2", "default (what it used)", "efficiency 2 / (2 x 1)")
    assert [row[0] for row in t.rows] == ["0", "3"]
    assert all(CELL.match(c) for row in t.rows for c in row[1:-2])
    assert t.rows[0][1:] == ("100 MB/s 0.25x", "200 MB/s 0.50x", "200 MB/s 0.50x (2 procs)", "1.00")
    assert t.notes == ()


def test_parallel_efficiency_is_n_readers_over_n_times_one() -> None:
    results = reporting.summarize(synthetic_passes("smooth", small=False))
    codec = Codec("blosc", 3)
    assert reporting.efficiency(results, codec, "h5py", "direct", 2) == pytest.approx(0.9)  # 180 / (2 x 100)
    assert reporting.efficiency(results, codec, "tables", "direct", 2) == pytest.approx(1.0)
    assert reporting.efficiency(results, codec, "tables", "direct", 3) is None  # not measured
    t = reporting.scaling_table(results, "blosc", LEVELS, "h5py", "direct", MAX_PROCS)
    assert t.rows[1][-1] == "0.90"
    one = reporting.scaling_table(results, "blosc", LEVELS, "h5py", "direct", 1)
    assert one.header == ("complevel / n_procs", "1", "default (what it used)")  # no efficiency with one reader


def test_summary_has_the_rate_of_file_bytes_and_the_compression_ratio() -> None:
    results = reporting.summarize(synthetic_passes("smooth", small=False))
    codec = Codec("blosc", 3)
    h5py = reporting.find_result(results, "main", codec, Reader("single", "h5py"))
    disk = reporting.find_result(results, "main", codec, Reader("odirect"))
    assert h5py is not None and disk is not None and h5py.data == "smooth"
    assert h5py.file_ratio == pytest.approx(4.0) and h5py.file_mb_per_s == pytest.approx(100.0)  # 400 MB/s of data / 4
    assert disk.file_ratio is None and disk.file_mb_per_s == pytest.approx(900.0)  # O_DIRECT reads file bytes
    assert reporting.compression(results, "main", codec) == pytest.approx(4.0)
    # A report from before file_nbytes was recorded: the file's size is what its O_DIRECT pass read.
    old = [replace(p, file_nbytes=None) for p in synthetic_passes("smooth", small=False)]
    found = reporting.summarize(old)
    h5py = reporting.find_result(found, "main", codec, Reader("single", "h5py"))
    assert h5py is not None and h5py.file_ratio == pytest.approx(400 / 900) and h5py.file_mb_per_s == pytest.approx(900.0)
    assert all(r.file_mb_per_s == r.mb_per_s for r in found if r.reader.kind == "odirect")  # it reads file bytes
    without_disk = [p for p in old if p.reader.kind != "odirect"]
    assert all(r.file_mb_per_s is None and r.file_ratio is None for r in reporting.summarize(without_disk))


def test_file_table_has_every_reader_in_file_bytes() -> None:
    results = reporting.summarize(synthetic_passes("smooth", small=False))
    t = reporting.file_table(results, "blosc", LEVELS, ENGINES, MODES, MAX_PROCS)
    assert t.header == ("reader / complevel", "0", "3")
    assert t.rows[0] == ("compression (data / file bytes)", "1.00x", "4.00x")
    rows = {row[0]: row[1:] for row in t.rows}
    assert rows["O_DIRECT read"] == ("900 MB/s", "900 MB/s")
    assert rows["h5py read_direct, 1 process"] == ("400 MB/s", "100 MB/s")
    assert rows["multitables h5py direct n_procs=2"] == ("180 MB/s", "45 MB/s")
    assert len(t.rows) == 1 + 1 + len(ENGINES) + len(ENGINES) * len(MODES) * (MAX_PROCS + 1)
    assert t.rows[-2][2].endswith("*") and t.notes == (reporting.WARM_NOTE,)  # tables generator n_procs=2, level 3
    assert {c for row in reporting.file_table([], "zlib", LEVELS, ENGINES, MODES, 1).rows for c in row[1:]} == {"n/a"}


def test_a_default_cell_says_where_most_passes_read() -> None:
    codec, reader = Codec("blosc", 3), Reader("multitables", "auto", "direct", None)
    used = [0, 2, 0]  # as recorded pass by pass
    passes = [Pass("main", codec, reader, r, 0, "evict", 0.0, 1.0, 100 * records.MB, n, 64) for r, n in enumerate(used)]
    (result,) = reporting.summarize(passes)
    assert result.n_procs_used == 0
    assert reporting.default_cell(result, None) == "100 MB/s (in-process)"


def test_warm_start_is_marked_in_its_cell_and_noted() -> None:
    results = reporting.summarize(synthetic_passes())
    t = reporting.scaling_table(results, "blosc", LEVELS, "tables", "generator", MAX_PROCS)
    assert t.rows[1][2].endswith("*") and not t.rows[0][2].endswith("*")
    assert t.notes == (reporting.WARM_NOTE,)


def test_baseline_table_has_the_disk_and_each_engine() -> None:
    results = reporting.summarize(synthetic_passes())
    t = reporting.baseline_table(results, "blosc", LEVELS, ENGINES)
    assert t.header[1].startswith("compression") and t.header[2].startswith("O_DIRECT") and len(t.header) == 3 + len(ENGINES)
    assert t.rows[0][1:] == ("1.00x", "900 MB/s", "400 MB/s 1.00x", "200 MB/s 0.50x")
    assert t.rows[1][1] == "1.25x"


def test_missing_measurements_read_n_a() -> None:
    t = reporting.scaling_table([], "zlib", LEVELS, "h5py", "direct", MAX_PROCS)
    assert {c for row in t.rows for c in row[1:]} == {"n/a"}


def test_small_files_table_checks_the_target() -> None:
    results = reporting.summarize(synthetic_passes())
    t = reporting.small_table(results, MODES)
    assert len(t.rows) == len(records.SMALL_FILES)
    assert [row[-1] for row in t.rows] == ["yes", "yes", "NO"]
    assert "in-process" in t.rows[0][3] and "0.95x" in t.rows[0][3]


def test_text_report_aligns_every_table(ctx: Context) -> None:
    results = reporting.summarize(synthetic_passes())
    tables = reporting.report_tables(results, ctx)
    assert len(tables) == 1 + len(ENGINES) * len(MODES) + 1 + 1  # baseline, scaling tables, file bytes, small files
    assert {t.section for t in tables} == {""}  # noise only: no sections, as before --data
    text = reporting.render_text(tables, ctx)
    for key in ("machine", "file", "data", "cache", "method", "versions", "note"):
        assert re.search(rf"^\s*{key}: ", text, re.M)
    assert "decompression overhead only" in text
    for t in tables:
        block = text.split(t.title + "\n", 1)[1].split("\n\n", 1)[0].splitlines()
        table_lines = [block[0]] + block[2 : 2 + len(t.rows)]
        bars = {tuple(m.start() for m in re.finditer(r" \| ", line)) for line in table_lines}
        assert len(bars) == 1, t.title  # the column separators line up
        assert set(block[1]) <= {"-", "+"}


def test_markdown_tables_are_well_formed(ctx: Context) -> None:
    results = reporting.summarize(synthetic_passes())
    tables = reporting.report_tables(results, ctx)
    md = reporting.render_markdown(tables, ctx)
    assert md.count("\n### ") == len(tables)
    for t in tables:
        section = md.split("### " + reporting._md_escape(t.title), 1)[1].split("\n###", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith("|")]
        assert len(rows) == 2 + len(t.rows)
        widths = {len(re.findall(r"(?<!\\)\|", line)) for line in rows}
        assert widths == {len(t.header) + 1}
        assert set(rows[1]) <= set("|-:")
    assert "\\*" in md  # the warm-start mark survives Markdown


@pytest.fixture
def both_ctx(ctx: Context) -> Context:
    machine = {**ctx.machine, "file": {**ctx.machine["file"], "path": "bench/x.h5"}}
    return replace(ctx, settings=replace(ctx.settings, data=("noise", "smooth")), machine=machine)


def both_passes() -> list[Pass]:
    return synthetic_passes("noise", small=False) + synthetic_passes("smooth")


def test_report_has_a_section_per_data_kind(both_ctx: Context) -> None:
    results = reporting.summarize(both_passes())
    tables = reporting.report_tables(results, both_ctx)
    per_kind = 1 + len(ENGINES) * len(MODES) + 1
    assert len(tables) == 2 * per_kind + 1
    sections = [t.section for t in tables]
    assert sections[0].startswith("data: noise") and sections[per_kind].startswith("data: smooth")
    assert len(set(sections[:per_kind])) == len(set(sections[per_kind:-1])) == 1
    assert sections[-1] == "small files (data: noise)"
    # Each section reports its own data: compression and efficiency differ.
    assert tables[0].rows[1][1] == "1.25x" and tables[per_kind].rows[1][1] == "4.00x"
    smooth_h5py = tables[per_kind + 1]  # after the baseline: h5py direct
    assert "engine h5py" in smooth_h5py.title and "direct" in smooth_h5py.title and smooth_h5py.rows[1][-1] == "0.90"
    assert tables[1].rows[1][-1] == "1.00"
    text = reporting.render_text(tables, both_ctx)
    assert text.count("\ndata: noise") == 1 and text.count("\ndata: smooth") == 1
    assert "random walk" in text and "bench/x-noise.h5, bench/x-smooth.h5 (one per data kind)" in text
    md = reporting.render_markdown(tables, both_ctx)
    assert md.count("\n### ") == len(tables) and md.count("\n## data: ") == 2 and md.count("\n## small files") == 1
    parser = _Cells()
    parser.feed(reporting.render_html(tables, both_ctx).replace("<!DOCTYPE html>", "").replace('<meta charset="utf-8">', ""))
    assert parser.stack == [] and len(parser.tables) == len(tables)


def test_a_report_without_data_or_file_sizes_still_loads(ctx: Context, tmp_path: Path) -> None:
    """JSON written before --data: every pass is noise; file sizes come from the O_DIRECT passes."""
    passes = synthetic_passes(small=False)
    doc = json.loads(json.dumps(reporting.report_json(passes, reporting.summarize(passes), ctx)))
    del doc["settings"]["data"]
    for p in doc["passes"]:
        del p["data"], p["file_nbytes"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    reloaded, rctx = reporting.load_report(str(path))
    assert rctx.settings.data == ("noise",) and {p.data for p in reloaded} == {"noise"}
    tables = reporting.report_tables(reporting.summarize(reloaded), rctx)
    assert tables[0].rows[0][1] == "0.44x" and tables[-1].rows[1][1:] == ("900 MB/s", "900 MB/s")  # 400 MB/s / 900


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[int]] = []
        self.stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.stack.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append(0)
        elif tag in ("td", "th"):
            self.tables[-1][-1] += 1

    def handle_endtag(self, tag: str) -> None:
        assert self.stack.pop() == tag


def test_html_is_one_page_of_balanced_tables(ctx: Context) -> None:
    results = reporting.summarize(synthetic_passes())
    tables = reporting.report_tables(results, ctx)
    page = reporting.render_html(tables, ctx)
    assert page.startswith("<!DOCTYPE html>")
    parser = _Cells()
    parser.feed(page.replace("<!DOCTYPE html>", "").replace('<meta charset="utf-8">', ""))
    assert parser.stack == []
    assert [len(rows) for rows in parser.tables] == [1 + len(t.rows) for t in tables]
    assert all(set(rows) == {len(t.header)} for rows, t in zip(parser.tables, tables))


def test_json_has_every_raw_time_and_reloads(ctx: Context, tmp_path: Path) -> None:
    passes = synthetic_passes()
    results = reporting.summarize(passes)
    doc = json.loads(json.dumps(reporting.report_json(passes, results, ctx)))
    assert doc["benchmark"] == "multitables" and doc["cache"] == "evict"
    assert len(doc["passes"]) == len(passes) and len(doc["results"]) == len(results)
    first = doc["passes"][0]
    assert {"seconds", "nbytes", "resident", "warm_start", "mb_per_s", "codec", "reader", "repeat", "cycle"} <= set(first)
    assert sum(p["warm_start"] for p in doc["passes"]) == 1
    assert {"cpu_model", "cpus", "memory_bytes", "file"} <= set(doc["machine"])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    reloaded, rctx = reporting.load_report(str(path))
    assert reloaded == passes and rctx.settings == ctx.settings and rctx.notes == ctx.notes


def test_report_from_json_measures_nothing(ctx: Context, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    passes = synthetic_passes()
    saved = tmp_path / "r.json"
    saved.write_text(json.dumps(reporting.report_json(passes, reporting.summarize(passes), ctx)))
    md = tmp_path / "r.md"
    cli.main(["--report-from", str(saved), "--markdown", str(md)])
    out = capsys.readouterr().out
    assert "Small files" in out and md.read_text().count("\n### ") == len(reporting.report_tables(reporting.summarize(passes), ctx))


def test_report_from_keeps_the_runs_time_and_refuses_what_is_not_a_report(
    ctx: Context, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report rendered again was dated when it was rendered; a file of other JSON (or none) was a traceback."""
    passes = synthetic_passes()
    saved, again = tmp_path / "r.json", tmp_path / "again.json"
    doc = reporting.report_json(passes, reporting.summarize(passes), ctx)
    saved.write_text(json.dumps({**doc, "created": "2020-01-02T03:04:05+0000"}))
    cli.main(["--report-from", str(saved), "--json", str(again)])
    assert json.loads(again.read_text())["created"] == "2020-01-02T03:04:05+0000"
    for text in ("not json", json.dumps({"some": "other"})):
        saved.write_text(text)
        with pytest.raises(SystemExit, match="is not a report that --json wrote"):
            cli.main(["--report-from", str(saved)])


def test_machine_names_the_device_and_filesystem(tmp_path: Path) -> None:
    m = machine.machine_info(str(tmp_path))
    assert m["cpus"] >= 1 and m["usable_cpus"] >= 1 and m["cpu_model"]
    assert m["file"]["fstype"] and m["file"]["mount"]
    if "disk" in m["file"]:
        assert m["file"]["rotational"] in (True, False, None)


def test_plot_writes_a_png(ctx: Context, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.png"
    plotting.plot(reporting.summarize(synthetic_passes()), ctx, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_draws_an_in_process_default_at_0_and_its_legend_outside_the_panels(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    in_process = [replace(p, n_procs_used=0) if p.reader.n_procs is None else p for p in synthetic_passes(small=False)]
    plotting.plot(reporting.summarize(in_process), ctx, str(tmp_path / "p.png"))
    (fig,) = drawn
    for ax in fig.axes:
        assert ax.get_legend() is None
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0 (in-process)", "1", "2"]
        stars = [c for c in ax.collections if c.get_sizes()[0] == 120]  # the warm starts' crosses are 80
        assert len(stars) == len(ENGINES) * len(MODES)
        assert {float(c.get_offsets()[0][0]) for c in stars} == {0.0}
    assert len(fig.legends) == 1


def test_interrupted_run_reports_what_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def measure_then_stop(*args: Any) -> None:
        passes: list[Pass] = args[-1]
        passes.append(_pass("main", Codec("none", 0), Reader("odirect"), 500.0))
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "measure", measure_then_stop)
    report = tmp_path / "r.json"
    with pytest.raises(SystemExit) as ended:  # partial figures are written, and the exit says they are partial
        cli.main(["--quick", "--file", str(tmp_path / "bench.h5"), "--json", str(report)])
    assert ended.value.code == 130
    doc = json.loads(report.read_text())
    assert len(doc["passes"]) == 1 and any("interrupted" in n for n in doc["notes"])
    assert "500 MB/s" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


# ---------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------


def own_segments() -> set[str]:
    """This library's entries in /dev/shm whose creating process is gone (nothing else there is looked at): the
    benchmark's processes have all ended, and a live creator's segment is another program's (a run beside this one)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    names = {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIX)}
    return {n for n in names if not psutil.pid_exists(int(n[len(SHM_PREFIX):].partition("_")[0]))}


def test_quick_run_end_to_end(tmp_path: Path) -> None:
    """``--quick`` writes its files, measures every reader, reports in every format and leaves nothing behind."""
    before = own_segments()
    out = {k: tmp_path / f"report.{k}" for k in ("json", "md", "html")}
    argv = [sys.executable, str(REPO / "multitables_benchmark.py"), "--quick", "--file", str(tmp_path / "bench.h5"),
            "--json", str(out["json"]), "--markdown", str(out["md"]), "--html", str(out["html"])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "TQDM_DISABLE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    doc = json.loads(out["json"].read_text())
    s = cli.parse_args(["--quick"])
    kinds = {(p["target"], p["reader"]["kind"]) for p in doc["passes"]}
    assert {("main", "odirect"), ("main", "single"), ("main", "multitables")} <= kinds
    assert {k.key for k in records.SMALL_FILES} <= {t for t, _ in kinds}
    assert {p["repeat"] for p in doc["passes"] if p["target"] == "sub-chunk"} == set(range(timing.small_repeats(s)))
    main = [p for p in doc["passes"] if p["target"] == "main"]
    per_codec = 1 + len(s.engines) + len(s.engines) * len(s.modes) * (s.max_procs + 1)
    assert len(main) == per_codec * len(s.codecs) * s.repeats * s.cycles
    assert doc["cache"] in ("direct", "evict")
    assert all(0.0 <= p["resident"] <= 1.0 for p in doc["passes"])
    assert sum(1 for line in proc.stderr.splitlines() if "cached] repeat" in line) == len(doc["passes"])

    assert "decompression overhead only" in proc.stdout and "Small files" in proc.stdout
    assert out["md"].read_text().count("\n### ") == out["html"].read_text().count("<table>")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in out.values())  # files removed
    assert own_segments() <= before


def test_quick_run_of_both_data_kinds(tmp_path: Path) -> None:
    """``--data noise smooth`` writes a file of each, reports a section of each, and removes both."""
    out = {k: tmp_path / f"report.{k}" for k in ("json", "md")}
    argv = [sys.executable, str(REPO / "multitables_benchmark.py"), "--quick", "--file", str(tmp_path / "bench.h5"),
            "--data", "noise", "smooth", "--complibs", "zlib", "--complevels", "3", "--engines", "chunks",
            "--modes", "direct", "--max_procs", "1", "--no-small-files", "--json", str(out["json"]), "--markdown", str(out["md"])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "TQDM_DISABLE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out["json"].read_text())
    ratios = {p["data"]: p["nbytes"] / p["file_nbytes"] for p in doc["passes"] if p["reader"]["kind"] != "odirect"}
    assert set(ratios) == {"noise", "smooth"} and ratios["smooth"] > 3.5 and ratios["noise"] < 1.3
    md = out["md"].read_text()
    assert md.count("\n## data: ") == 2 and "bench-noise.h5, " in md and "bench-smooth.h5 (one per data kind)" in md
    assert all(r["file_mb_per_s"] for r in doc["results"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in out.values())  # files removed


def test_the_chunk_engine_is_measured_but_never_the_baseline() -> None:
    assert records.single_engines(("chunks",)) == ["chunks", "h5py", "tables"]
    assert records.single_engines(("h5py",)) == ["h5py", "tables"]
    codec = records.make_codec("zlib", 3)
    passes = [_pass("main", codec, Reader("single", e), r) for e, r in (("chunks", 900.0), ("h5py", 400.0), ("tables", 150.0))]
    best = reporting.best_single(reporting.summarize(passes), "main", codec)
    assert best is not None and best.reader.engine == "h5py"


# ---------------------------------------------------------------------------
# benchmarks/profile_readers.py: the summary of a py-spy profile
# ---------------------------------------------------------------------------


def _profile_readers() -> Any:
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_readers.py"
    spec = importlib.util.spec_from_file_location("profile_readers", script)
    assert spec is not None and spec.loader is not None
    prof = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prof)
    return prof


def test_reader_profile_summary_sorts_reader_samples_by_activity(tmp_path: Path) -> None:
    prof = _profile_readers()
    reader = "process 2:\"python\";reader_main (multitables/_procs/process.py:120);stream_loop (multitables/_procs/stream.py:75)"
    raw = tmp_path / "raw.txt"
    raw.write_text(
        f"{reader};ChunkSource._read_rows (multitables/_io/chunks/source.py:330);Deflate.decode (multitables/_io/chunks/codecs/deflate.py:30) 6\n"
        f"{reader};ChunkSource._read_rows (multitables/_io/chunks/source.py:312);PreadFile.read_into (multitables/_io/chunks/pread.py:80) 3\n"
        f"{reader};Ring.claim (multitables/_shm/ring.py:190) 1\n"
        "process 1:\"python\";<module> (x.py:1);Ring.take (multitables/_shm/ring.py:225) 50\n"  # the consumer: not counted
    )
    table = prof.summarize(str(raw)).splitlines()
    assert table[2:] == [
        "| decode: inflate (deflate) | 6 | 60% |",
        "| wait for the disk: pread | 3 | 30% |",
        "| ring: wait for a free slot, publish | 1 | 10% |",
    ]
    (tmp_path / "none.txt").write_text("process 1:\"python\";<module> (x.py:1) 5\n")
    with pytest.raises(SystemExit, match="no samples"):
        prof.summarize(str(tmp_path / "none.txt"))


def test_read_pattern_times_each_way_of_reading_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = _profile_readers()
    monkeypatch.setattr(prof, "PATTERN_BLOCK", 4096)
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(5 * 4096 + 100))  # 6 blocks, the last one short
    table = prof.read_pattern(str(path), passes=2).splitlines()
    assert [row.split(" | ")[0] for row in table[2:]] == [
        "| 1 process, in order",
        "| 2 processes, alternate blocks",
        "| 2 processes, alternate blocks, next block hinted",
    ]
    assert all(len(row.split(" | ")[2].split(", ")) == 2 for row in table[2:])  # one rate per pass


def test_every_block_is_read_by_exactly_one_of_the_pattern_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = _profile_readers()
    monkeypatch.setattr(prof, "PATTERN_BLOCK", 4096)
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(5 * 4096 + 100))
    offsets: list[int] = []
    real = os.preadv
    monkeypatch.setattr(prof.os, "preadv", lambda fd, bufs, offset: (offsets.append(offset), real(fd, bufs, offset))[1])
    for first in range(2):
        prof._read_every(str(path), first, 2, hint=True)
    assert sorted(offsets) == [k * 4096 for k in range(6)]


def test_small_times_h5py_and_default_multitables_on_a_generated_file(tmp_path: Path) -> None:
    prof = _profile_readers()
    table = prof.small(rows=10, chunk=16, passes=2, cache="warm", workdir=str(tmp_path)).splitlines()
    assert table[0].startswith("| 10 rows in 16-row chunks, blosc 3, warm, 2 passes |")
    assert [row.split(" | ")[0] for row in table[2:]] == [
        "| h5py read_direct, 1 process",
        "| multitables direct, default n_procs",
        "| multitables generator, default n_procs",
    ]
    assert table[2].endswith("| 1.00x |")  # h5py is the baseline
    assert list(tmp_path.iterdir()) == []  # the file is removed


def test_placement_compares_h5py_with_the_default_readers_and_the_consumer(small_target: Target) -> None:
    from multitables._plan import readers as planner  # the planner decides whether readers pay
    from multitables._plan.readers import available_cpus

    prof = _profile_readers()
    pays = planner.parallel_pays
    table = prof.placement(small_target.path, passes=2, cache="warm").splitlines()
    cpus = available_cpus()
    rows = [row.split(" | ") for row in table[2:]]
    assert [row[0] for row in rows] == [
        "| h5py read_direct, 1 process",
        "| multitables direct, default n_procs",
        f"| multitables direct, {cpus} readers",
        "| multitables direct, read in the consumer",
        "| multitables generator, default n_procs",
        f"| multitables generator, {cpus} readers",
        "| multitables generator, read in the consumer",
    ]
    assert table[2].startswith("| h5py read_direct, 1 process |") and "| 1.00x |" in table[2]
    # Readers used in each of the two passes: a small file is read in the consumer by default.
    assert [row[3].rstrip(" |") for row in rows[1:]] == ["0 0", f"{cpus} {cpus}", "0 0"] * 2
    assert planner.parallel_pays is pays  # put back


def test_max_procs_beyond_what_multitables_starts_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Columns past the readers' cap were headed with the n_procs asked for, though fewer readers ran."""
    from multitables._plan.readers import READERS_PER_CPU

    with pytest.raises(SystemExit):
        cli.parse_args(["--max_procs", str(READERS_PER_CPU * cli.usable_cpus() + 1)])
    assert "readers multitables starts on this machine" in capsys.readouterr().err
    assert cli.parse_args(["--max_procs", str(READERS_PER_CPU * cli.usable_cpus())]).max_procs > 0


def test_the_help_is_plain_text() -> None:
    """``--help`` is read in a terminal: no reST markup from the module's docstring."""
    text = cli.build_parser().format_help()
    assert "--complibs x --complevels" in text
    assert "``" not in text and ":ref:" not in text
