"""The benchmark's training section (``multitables_bench.training`` and the writers in ``sections``).

Behaviour only: the shard and MDS copies hold the file's rows, every contender's pass delivers each row
once per epoch, a missing ``streaming`` package skips the MosaicML rows with a line that says how to
install it, and the report computes its ratios and verdicts. No test asserts a timing.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from multitables_bench import sections, training
from multitables_bench.cache import resident_fraction
from multitables_bench.training import Figure

pytest.importorskip("torch")

ROWS = 1000


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("training") / "train.h5")
    sections.write_training_file(path, ROWS)
    return path


@pytest.fixture(scope="module")
def shard_glob(train_file: str) -> str:
    directory = train_file + "-shards"
    sections.write_shards(train_file, directory)
    return sections.shard_paths(directory)


@pytest.fixture
def no_streaming(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import streaming`` raises ImportError, as where the package is not installed."""
    monkeypatch.setitem(sys.modules, "streaming", None)


def _labels(run: training.PassFn) -> np.ndarray:
    sink: list = []
    rows = run(sink)
    labels = np.concatenate(sink)
    assert rows == len(labels)
    return labels


def test_shards_hold_the_files_rows_in_order_with_its_chunks_and_filters(train_file: str, shard_glob: str) -> None:
    import tables

    names = sorted(glob.glob(shard_glob))
    assert [os.path.basename(n) for n in names] == [f"train-{k:03d}.h5" for k in range(training.SHARDS)]
    with tables.open_file(train_file) as src:
        xs, ys = [], []
        for name in names:
            with tables.open_file(name) as f:
                for node in ("X", "y"):
                    shard, whole = f.get_node("/", node), src.get_node("/", node)
                    assert shard.chunkshape == whole.chunkshape
                    assert shard.filters == whole.filters
                xs.append(f.root.X[:])
                ys.append(f.root.y[:])
        assert min(len(y) for y in ys) >= ROWS // training.SHARDS
        np.testing.assert_array_equal(np.concatenate(xs), src.root.X[:])
        np.testing.assert_array_equal(np.concatenate(ys), src.root.y[:])


@pytest.mark.parametrize("key", ["one", "shards", "a", "b"])
def test_each_contender_delivers_every_row_once_per_epoch(train_file: str, shard_glob: str, key: str) -> None:
    runs = {c.key: c for c in training.contenders(train_file, shard_glob, None, 2, None, None)}
    assert set(runs) == {"one", "shards", "a", "b"}
    labels = _labels(runs[key].run)
    np.testing.assert_array_equal(np.sort(labels), np.arange(ROWS))
    assert not np.array_equal(labels, np.arange(ROWS)), "the epoch should be shuffled"
    assert runs[key].run(None) == ROWS
    if key == "shards":
        assert runs[key].files() == sorted(glob.glob(shard_glob))


def test_per_row_reads_only_its_first_batches(train_file: str) -> None:
    assert _labels(training.per_row_pass(train_file, 0, max_batches=2)).size == 2 * training.BATCH


def test_the_mosaicml_rows_are_skipped_with_a_line_saying_how_to_install(no_streaming: None) -> None:
    module, why = training.import_streaming()
    assert module is None
    assert "not installed" in why and "pip install mosaicml-streaming" in why


def test_the_section_runs_without_streaming_and_reports_the_skip(
    tmp_path: Path, no_streaming: None
) -> None:
    log: list[str] = []
    text, figures = sections.run_sections(["training"], str(tmp_path), 600, 2, 1, log.append)
    assert {f.key for f in figures} == {"one", "shards", "a", "b"}
    assert {f.cache for f in figures} == {"warm", "cold"}
    assert all(f.rows == 600 for f in figures if f.key != "a")
    assert "MosaicML streaming: skipped: the package is not installed" in text
    assert any("skipped" in line for line in log)
    assert f"| multitables: {training.SHARDS} shard files / one file |" in text
    assert "MosaicML, first epoch |" not in text  # no ratio to a contender that did not run
    assert os.listdir(tmp_path) == []  # the file, its shards and its MDS copy are removed


def test_the_random_section_reads_batches_and_rows_one_at_a_time_beside_h5py(tmp_path: Path) -> None:
    log: list[str] = []
    text, figures = sections.run_sections(["random"], str(tmp_path), 600, 2, 1, log.append)
    by_section: "dict[str, list[str]]" = {}
    for f in figures:
        by_section.setdefault(f.section, []).append(f.label)
    assert list(by_section) == ["random", "rows in order", "rows at random"]
    for name in ("in order", "at random"):
        labels = by_section[f"rows {name}"]
        assert labels == [f"h5py ds[i], 1 process, {name}", f"multitables Reader, one row a request, n_procs=2, {name}"]
        assert f"| {labels[0]} |" in text and f"| {labels[1]} |" in text
    rows = {f.section: f.rows for f in figures if f.section != "random"}
    assert rows == {"rows in order": 600, "rows at random": sections.ONE_ROW_READS}  # in order: as many as there are
    assert "### Random access, one row a request" in text
    assert os.listdir(tmp_path) == []


def test_the_blocks_section_reads_every_row_in_the_blocks_asked_for_beside_h5py(tmp_path: Path) -> None:
    log: list[str] = []
    text, figures = sections.run_sections(["blocks"], str(tmp_path), 600, 2, 1, log.append)
    by_section: "dict[str, list[str]]" = {}
    for f in figures:
        by_section.setdefault(f.section, []).append(f.label)
        assert f.rows == 600  # every row once, the short last block included
    assert list(by_section) == ["blocks of /y", "rows of /y", "blocks of /X", "rows of /X"]
    for name, labels in by_section.items():
        assert labels == (["h5py ds[i:i + 256], 1 process", "multitables get_queue(block_size=256)"]
                          if name.startswith("blocks") else
                          ["h5py each row of ds[i:i + 256], 1 process", "multitables get_generator(block_size=256)"])
        assert all(f"| {label} |" in text for label in labels)
    assert "### Blocks of 256 rows asked for" in text
    assert os.listdir(tmp_path) == []


def test_warm_reads_the_files_in_and_cold_drops_every_one(train_file: str, shard_glob: str) -> None:
    names = sorted(glob.glob(shard_glob))
    assert training.set_cache(names, "warm") > 0.99
    cached = training.set_cache(names, "cold")
    if cached > 0.01:
        pytest.skip(f"the page cache cannot be emptied here (tmpfs?): {cached:.0%} still cached")
    assert all(resident_fraction(n) <= 0.01 for n in names)


def _figure(key: str, cache: str, rate: float, warm_start: bool = False) -> Figure:
    return Figure("training", f"reader {key}", rate, (1.0,), 100, cache, key, rate / 1000, warm_start)


def test_the_report_has_both_caches_the_ratios_and_their_verdicts() -> None:
    rates = {"one": (100.0, 100.0), "shards": (95.0, 80.0), "a": (5.0, 5.0), "b": (50.0, 90.0),
             "mosaic": (120.0, 50.0), "mosaic-later": (50.0, 200.0)}
    figures = [_figure(k, c, r[i], warm_start=(k == "b" and c == "cold")) for k, r in rates.items()
               for i, c in enumerate(training.CACHES)]
    text = sections.training_markdown(figures, ["a note"])
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["reader b"].endswith("| 50 | 0 | 90* | 0* |")
    assert "| 0.95x | 0.80x | >= 0.9x | met warm only |" in text
    assert "| 0.83x | 2.00x | >= 1x | met cold only |" in text  # one / mosaic
    assert "| 2.00x | 0.50x | >= 1x | met warm only |" in text  # one / mosaic later
    assert "| 20.00x | 20.00x | >= 10x | met |" in text
    assert "| 2.00x | 1.11x | >= 1.3x | met warm only |" in text
    assert "more than 1% of its files" in text and text.endswith("a note")


def test_mosaicml_pass_delivers_every_row_once_and_prepares_its_shards(train_file: str, tmp_path: Path) -> None:
    streaming, why = training.import_streaming()
    if streaming is None:
        pytest.skip(f"MosaicML streaming: {why}")
    mds = str(tmp_path / "mds")
    sections.write_mds(train_file, mds, streaming)
    gz = training.mds_files(mds, decompressed=False)
    assert len(gz) > 1 and all(os.path.exists(n) for n in gz)
    for decompressed in (False, True):
        training.mosaic_prepare(streaming, mds, decompressed)()
        assert len(training.mds_files(mds, decompressed=True)) == (len(gz) if decompressed else 1)
        labels = _labels(training.mosaic_pass(streaming, mds, 2))
        np.testing.assert_array_equal(np.sort(labels), np.arange(ROWS))
        assert not np.array_equal(labels, np.arange(ROWS))


def test_section_mib_sizes_the_sections_file_and_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    from multitables_bench import cli

    assert cli.parse_section_mib(["--sections", "training"]) is None
    assert cli.parse_section_mib(["--sections", "training", "--section-mib", "1024"]) == 1024
    with pytest.raises(SystemExit):
        cli.parse_section_mib(["--sections", "training", "--section-mib", "0"])
    assert "--section-mib must be at least 1" in capsys.readouterr().err
