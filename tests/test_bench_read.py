"""``multitables-benchmark --read FILE:DATASET ...``: the main section's passes on a user's own datasets.

The user's files are never written; what cannot be measured is refused before the first pass, naming the file and
the dataset. No test asserts a timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import tables

from multitables_bench import cli, userdata
from multitables_bench.records import READ_DATA, USER_ENGINES, Codec

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    """A user's file: /zlib (shuffle + deflate 3, chunked), /raw (contiguous), a PyTables table, a scalar, a vlen."""
    path = tmp_path / "data" / "user.h5"
    path.parent.mkdir()
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        walk = np.cumsum(rng.integers(-8, 9, (2000, 128)), axis=1).astype(np.float32)
        f.create_dataset("zlib", data=walk, chunks=(100, 128), compression="gzip", compression_opts=3, shuffle=True)
        f.create_dataset("raw", data=rng.standard_normal((1000, 32)).astype(np.float32))
        f["scalar"] = 1.0
        f.create_dataset("ragged", (4,), dtype=h5py.vlen_dtype(np.int32))
    with tables.open_file(str(path), "a") as t:
        table = t.create_table("/", "table", {"a": tables.Int32Col(), "b": tables.Float64Col(shape=(3,))})
        table.append([(i, (i, i, i)) for i in range(3000)])
    return path


def _fingerprint(path: Path) -> tuple[str, int, int, int]:
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns, st.st_ctime_ns


def test_read_measures_each_dataset_as_the_main_section_and_leaves_the_files_as_they_were(
    user_file: Path, tmp_path: Path
) -> None:
    other = tmp_path / "data" / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(5000, dtype=np.int64)
    before = {p: _fingerprint(p) for p in (user_file, other)}
    scratch = tmp_path / "scratch"  # the benchmark's own temporary files go here, and must go
    scratch.mkdir()
    out = {k: tmp_path / f"report.{k}" for k in ("json", "md", "html")}
    specs = ["data/user.h5:/zlib", "data/user.h5:raw", "data/user.h5:/table", "data/other.h5:/x"]
    argv = [sys.executable, str(REPO / "multitables_benchmark.py"), "--read", *specs, "--engines", "h5py",
            "--repeats", "1", "--max_procs", "1", "--cache", "evict",
            "--json", str(out["json"]), "--markdown", str(out["md"]), "--html", str(out["html"])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "TQDM_DISABLE": "1", "TMPDIR": str(scratch)}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    assert {p: _fingerprint(p) for p in (user_file, other)} == before  # not a byte, not a time changed
    assert list(scratch.iterdir()) == []
    doc = json.loads(out["json"].read_text())
    keys = ["data/user.h5:/zlib", "data/user.h5:/raw", "data/user.h5:/table", "data/other.h5:/x"]
    assert [d["key"] for d in doc["datasets"]] == keys
    zlib, raw, table, x = doc["datasets"]
    assert (zlib["shape"], zlib["dtype"], zlib["filters"], zlib["chunks"]) == ([2000, 128], "float32", "shuffle+deflate(3)",
                                                                               [100, 128])
    assert zlib["data_nbytes"] == 2000 * 128 * 4 and zlib["stored_nbytes"] < zlib["data_nbytes"] / 2
    assert (raw["filters"], raw["chunks"], raw["stored_nbytes"]) == ("none", None, 1000 * 32 * 4)
    assert table["shape"] == [3000] and "('b', '<f8', (3,))" in table["dtype"]
    assert (x["shape"], x["dtype"]) == ([5000], "int64")

    found = {(p["target"], p["reader"]["kind"], p["reader"]["engine"], p["reader"]["mode"], p["reader"]["n_procs"])
             for p in doc["passes"]}
    for key in keys:
        expected = {(key, "single", e, "", None) for e in USER_ENGINES}
        expected |= {(key, "multitables", "h5py", m, n) for m in ("direct", "generator") for n in (1, None)}
        if key in ("data/user.h5:/zlib", "data/other.h5:/x"):  # the first dataset of each file reads its file
            expected.add((key, "odirect", "", "", None))
        assert {f for f in found if f[0] == key} == expected, key
    assert len(doc["passes"]) == len(found)  # one repeat, one cycle
    assert {p["data"] for p in doc["passes"]} == {READ_DATA} and doc["settings"]["read"] == specs
    rows = {(p["target"], p["reader"]["kind"]): p for p in doc["passes"]}
    assert rows[("data/user.h5:/zlib", "single")]["nbytes"] == zlib["data_nbytes"]
    assert rows[("data/user.h5:/zlib", "single")]["file_nbytes"] == zlib["stored_nbytes"]
    assert rows[("data/user.h5:/zlib", "odirect")]["nbytes"] == user_file.stat().st_size

    for key in keys:
        assert key in proc.stdout
    assert "shuffle+deflate(3)" in proc.stdout and "decompression overhead" not in proc.stdout
    assert out["md"].read_text().count("\n### ") == out["html"].read_text().count("<table>") == 1 + 1 + 2 + 1

    again = tmp_path / "again.md"  # the report renders again from its JSON, datasets and all
    cli.main(["--report-from", str(out["json"]), "--markdown", str(again)])
    assert again.read_text() == out["md"].read_text()


@pytest.mark.parametrize("option", [["--size", "1"], ["--complib", "zlib"], ["--complibs", "zlib"], ["--complevels", "3"],
                                    ["--data", "smooth"], ["--file", "bench.h5"], ["--plot", "a.png"]])
def test_options_of_the_generated_files_are_refused_with_read(
    option: list[str], user_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--read", f"{user_file}:/zlib", *option])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{option[0]} cannot go with --read, which measures your datasets as they are" in err


def test_read_is_refused_with_other_sections_and_report_from(user_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--read", f"{user_file}:/zlib", "--sections", "main", "random"])
    assert "--read measures the main section's readers on your datasets: leave out --sections" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_args(["--read", f"{user_file}:/zlib", "--report-from", str(user_file)])
    assert "--report-from measures nothing and --read measures your datasets: give one of them" in capsys.readouterr().err


def _refused(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """The error ``main`` exits with, having measured nothing."""
    measured: list[Any] = []
    monkeypatch.setattr(cli, "measure_read", lambda *a: measured.append(a))
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2 and measured == []
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_bad_datasets_are_named_before_any_pass(
    user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = f"{user_file}:/zlib"
    assert _refused(["--read", good, f"{tmp_path}/missing.h5:/x"], monkeypatch, capsys) == (
        f"multitables-benchmark: error: --read {tmp_path}/missing.h5:/x: [Errno 2] No such HDF5 file: "
        f"'{tmp_path}/missing.h5'")
    assert _refused(["--read", good, f"{user_file}:/nope"], monkeypatch, capsys) == (
        f"multitables-benchmark: error: --read {user_file}:/nope: no node '/nope' in '{user_file}' "
        "(its datasets: /ragged, /raw, /scalar, /table, /zlib)")
    assert _refused(["--read", f"{user_file}:/scalar", good], monkeypatch, capsys) == (
        f"multitables-benchmark: error: --read {user_file}:/scalar: '/scalar' in '{user_file}' is a scalar; only "
        "datasets with rows can be streamed")
    ragged = _refused(["--read", f"{user_file}:/ragged"], monkeypatch, capsys)
    assert ragged.startswith(f"multitables-benchmark: error: --read {user_file}:/ragged: '/ragged' in '{user_file}' "
                             "holds variable-length rows")
    assert _refused(["--read", str(user_file)], monkeypatch, capsys) == (
        f"multitables-benchmark: error: --read {user_file}: give FILE:DATASET, a dataset path inside the file after a "
        f"colon, such as {user_file}:/images")


def test_a_dataset_no_engine_decodes_is_refused_before_any_pass(
    user_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(userdata, "engine_can_read", lambda target, engine: f"{engine} lacks filter 32001")
    assert _refused(["--read", f"{user_file}:/zlib"], monkeypatch, capsys) == (
        f"multitables-benchmark: error: --read {user_file}:/zlib: no engine decodes /zlib in {user_file} here "
        "(chunks: chunks lacks filter 32001; h5py: h5py lacks filter 32001; tables: tables lacks filter 32001)")


def test_a_spec_splits_at_the_last_colon_and_the_path_starts_at_the_root() -> None:
    assert userdata.parse_spec("runs:2024/data.h5:images") == ("runs:2024/data.h5", "/images")
    assert userdata.parse_spec("data.h5:/a/b") == ("data.h5", "/a/b")
    with pytest.raises(ValueError, match="give FILE:DATASET"):
        userdata.parse_spec(":/images")


def test_a_dataset_is_described_as_hdf5_stores_it(user_file: Path) -> None:
    dataset, target = userdata.describe(f"{user_file}:zlib")
    assert (dataset.key, dataset.path, dataset.shape, dataset.dtype) == (f"{user_file}:/zlib", "/zlib", (2000, 128),
                                                                          "float32")
    assert (dataset.filters, dataset.chunks) == ("shuffle+deflate(3)", (100, 128))
    assert target.codec == Codec("shuffle+deflate(3)", 0) and target.codec.label == "shuffle+deflate(3)"
    assert (target.node, target.n_rows, target.row_shape, target.data_nbytes) == ("/zlib", 2000, (128,), 2000 * 128 * 4)
    assert target.stored_nbytes == dataset.stored_nbytes < target.data_nbytes
