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
    figures = gpu.gpu_section(path, 2, lambda m: None, device="cpu")
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
    table = gpu.gpu_markdown(figures, 2, 2)
    assert table.count("\n| ") == 2 + len(figures)  # the header, its separator and a row each


def test_without_cuda_the_section_says_it_was_skipped(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the section runs")
    assert "Skipped: torch.cuda.is_available() is False" in gpu.run_gpu(str(tmp_path), 2, 2, lambda m: None)
