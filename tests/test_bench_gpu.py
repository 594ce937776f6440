"""The GPU training section: its loops run (on the CPU here: the same code with device="cpu") and report every contender."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from multitables_bench import gpu  # noqa: E402


def test_the_section_measures_every_contender(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "BATCH", 64)
    path = str(tmp_path / "gpu.h5")
    gpu.write_file(path, 2)
    figures, step_s = gpu.gpu_section(path, 2, lambda m: None, device="cpu")
    assert step_s > 0  # as long as the CPU-only batches take
    labels = [f.label for f in figures]
    assert [label.split(",")[0] for label in labels[:4]] == ["multitables"] * 4
    assert labels[2].endswith("no step") and not labels[3].endswith("no step")  # device=: delivery alone, then with the step
    assert labels[4].startswith("DataLoader(num_workers=2") and labels[4].endswith("no step")
    assert labels[5].startswith("DataLoader(num_workers=2") and not labels[5].endswith("no step")
    assert all(f.samples_per_s > 0 for f in figures)
    assert [f.waited is None for f in figures] == [True, False, True, False, True, False]  # a step ran, or none
    assert all(0 <= f.waited <= 1 for f in figures if f.waited is not None)
    # An epoch's first batch against one in mid-epoch, where a step ran (epochs of 8 batches of 64 rows: both kinds)
    assert [f.epoch_start is None for f in figures] == [f.waited is None for f in figures]
    assert all(f.epoch_start >= 0 and f.mid_epoch >= 0 for f in figures if f.waited is not None)
    assert figures[4].window_start is None and figures[5].window_start is None  # DataLoader: no windows
    table = gpu.gpu_markdown(figures, 2, 2, step_s)
    assert table.count("\n| ") == 2 + len(figures)  # the header, its separator and a row each
    assert f"a step of {step_s * 1e3:.2f} ms, as long as the CPU-only batches take to come" in table
    assert all(line.count("|") == 10 for line in table.splitlines() if line.startswith("|"))
    assert all(f.gpu_idle is None and f.gpu_epoch_start is None for f in figures)  # no GPU: no GPU clock


def test_a_given_step_is_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "BATCH", 64)
    path = str(tmp_path / "gpu.h5")
    gpu.write_file(path, 2)
    figures, step_s = gpu.gpu_section(path, 2, lambda m: None, device="cpu", step_s=0.0005)
    assert step_s == 0.0005 and len(figures) == 6
    assert "a step of 0.50 ms, given" in gpu.gpu_markdown(figures, 2, 2, step_s, step_given=True)


def test_a_windows_first_batch_is_the_one_that_holds_its_first_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "BATCH", 64)
    assert gpu.window_firsts(8, 128) == {0, 2, 4, 6}
    assert gpu.window_firsts(8, 100) == {0, 1, 3, 4, 6, 7}  # rows 0, 100, 200, 300, 400 and 500
    assert gpu.window_firsts(8, 512) == {0}
    # Two epochs of 4 batches, windows starting at batches 0 and 2: the epochs' firsts, the rest, the windows' firsts
    waits = [9.0, 1.0, 5.0, 1.0, 7.0, 1.0, 3.0, 1.0]
    assert gpu._boundary(waits, 4, {0, 2}) == (8.0, 1.0, 4.0)
    assert gpu._boundary(waits, 4, {0}) == (8.0, 1.0, None)


def test_without_cuda_the_section_says_it_was_skipped(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the section runs")
    assert "Skipped: torch.cuda.is_available() is False" in gpu.run_gpu(str(tmp_path), 2, 2, lambda m: None)


def test_the_gpu_clock_gives_the_gap_before_each_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Events before and after each step: a step's gap runs from the previous step's end (the first: from when
    the loop began) to its own start."""
    import torch

    clock = iter([0.0, 5.0, 7.0, 7.5, 9.0, 12.0, 20.0])  # ms: loop begins; then each step's start and end

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing

        def record(self) -> None:
            self.at = next(clock)

        def elapsed_time(self, later: "Event") -> float:
            return later.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    gaps = gpu._GpuGaps()
    for _ in range(3):
        gaps.mark()
        gaps.mark()
    assert gaps.gaps() == [0.005, 0.0005, 0.003]
