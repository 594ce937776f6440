"""``python -m multitables``: what it prints and what it leaves behind (behaviour only, no timings)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from multitables.__main__ import main, why


def check_report(out: str) -> None:
    """Both readers, their ratios to h5py, the reader processes and the engine, and where the figures come from."""
    assert "h5py read_direct, 1 process" in out
    out = " ".join(out.split())  # the closing lines are wrapped
    assert "multitables get_queue" in out and "multitables get_generator" in out
    assert re.search(r"multitables get_queue, \S+ [\d,]+ [\d,]+ \d+\.\d\dx", out), out
    assert re.search(r"multitables read the file (\d+\.\d\dx as fast as|at \d+\.\d\dx)", out), out
    assert re.search(r"with \d+ reader process(es)? \(.*\) and its '(chunks|h5py|tables)' engine", out), out
    assert "page cache warm" in out and "this machine" in out
    assert "Why:" in out


def test_temporary_file_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    main(["--rows", "2048"])
    out = capsys.readouterr().out
    check_report(out)
    assert "2,048 rows of 1024 float32" in out and "zlib level 3" in out and "smooth data" in out
    assert "'chunks' engine" in out  # auto reads deflate with the chunk engine
    assert list(tmp_path.iterdir()) == []


def test_given_file_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "demo.h5"
    main(["--rows", "2048", "--file", str(path), "--n-procs", "2", "--complib", "blosc", "--data", "noise"])
    out = capsys.readouterr().out
    check_report(out)
    out = " ".join(out.split())
    assert "blosc level 3" in out and "noise data" in out
    assert "with 2 reader processes (n_procs=2 asked)" in out
    assert "get_queue, n_procs=2" in out and "get_queue, n_procs=1" in out
    assert path.is_file() and f"The file is kept: {path}" in out


def test_as_a_module(tmp_path: Path) -> None:
    """The command the README gives, run from outside the checkout."""
    run = subprocess.run(
        [sys.executable, "-m", "multitables", "--rows", "1024", "--n-procs", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr
    check_report(run.stdout)
    assert "with 1 reader process (n_procs=1 asked)" in " ".join(run.stdout.split())
    assert run.stdout.count("get_queue, n_procs=1") == 1  # no second one-reader line when one reader is asked
    assert list(tmp_path.iterdir()) == []


def test_no_thread_of_the_demo_runs_when_its_readers_fork(tmp_path: Path) -> None:
    """Python 3.12 warns at a fork among threads: the progress bar's monitor thread is not left running."""
    script = (
        "import os, runpy, sys, threading\n"
        "seen = []\n"
        "os.register_at_fork(before=lambda: seen.extend(type(t).__name__ for t in threading.enumerate()))\n"
        f"sys.argv = ['multitables', '--rows', '4096', '--n-procs', '2', '--file', {str(tmp_path / 'd.h5')!r}]\n"
        "runpy.run_module('multitables', run_name='__main__')\n"
        "print('forks:', len(seen) > 0, sorted(set(seen)))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "forks: True ['_MainThread']"


def test_why_reports_a_slower_ratio_as_measured() -> None:
    lines = " ".join(why({"procs": 2, "engine": "h5py"}, {"h5py": 1.0, "direct": 0.8, "one": 0.5}, 2, None))
    assert "at 0.80x plain h5py's rate: slower here" in lines
    assert "(the default on 2 CPUs)" in lines and "one reader process alone: 0.50x" in lines
    lines = " ".join(why({"procs": 0, "engine": "chunks"}, {"h5py": 1.0, "direct": 2.5, "one": 1.0}, 2, None))
    assert "2.50x as fast as plain h5py" in lines and "too small for reader processes to pay" in lines
    # One reader measured faster than the default's two: the two are not credited with the speed.
    lines = " ".join(why({"procs": 2, "engine": "chunks"}, {"h5py": 1.0, "direct": 3.3, "one": 3.6}, 2, None))
    assert "one reader process alone read it at 3.60x" in lines and "more readers added nothing" in lines
    assert "decode on 2 cores at once" not in lines


@pytest.mark.parametrize(
    "args, complaint",
    [(["--rows", "0"], "--rows must be at least 1"), (["--rows", "-5"], "--rows must be at least 1"),
     (["--complib", "bogus"], "invalid choice: 'bogus'"), (["--complevel", "12"], "invalid choice: 12"),
     (["--n-procs", "-1"], "--n-procs must be 0 or more")],
)
def test_bad_arguments_are_usage_errors(args: list, complaint: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(args)
    assert ended.value.code == 2 and complaint in capsys.readouterr().err


def test_the_file_is_described_as_written_and_n_procs_0_as_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--rows", "256", "--complevel", "0", "--n-procs", "0", "--file", str(tmp_path / "plain.h5")])
    out = " ".join(capsys.readouterr().out.split())
    assert "uncompressed, chunks of" in out and "zlib level 0" not in out  # PyTables stores level 0 unfiltered
    assert "in this process, as asked" in out and "too small" not in out
    assert "(4,096 B a row, 1.0 MiB)" in out


def test_a_tiny_file_is_described_in_its_own_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--rows", "1", "--n-procs", "0", "--file", str(tmp_path / "one.h5")])
    out = " ".join(capsys.readouterr().out.split())
    assert "file: 1 row of 1024 float32 (4,096 B a row, 4.0 KiB)" in out
    assert re.search(r"\d\.\d KiB on disk", out), out


def test_a_file_the_demo_did_not_write_is_never_written_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--file`` named the user's own file: it was written over without a word."""
    import h5py
    import numpy as np

    mine = tmp_path / "mine.h5"
    with h5py.File(mine, "w") as f:
        f["precious"] = np.arange(10)
    for target, complaint in [(mine, "exists and this demo did not write it"), (tmp_path, "is a folder"),
                              (tmp_path / "no" / "x.h5", "there is no folder")]:
        with pytest.raises(SystemExit) as ended:
            main(["--rows", "256", "--file", str(target)])
        assert ended.value.code == 2 and complaint in capsys.readouterr().err
    with h5py.File(mine, "r") as f:
        assert list(f) == ["precious"]
    demo = tmp_path / "demo.h5"
    main(["--rows", "256", "--n-procs", "0", "--file", str(demo)])
    main(["--rows", "512", "--n-procs", "0", "--file", str(demo)])  # its own example: written again
    assert "512 rows of 1024 float32" in capsys.readouterr().out
