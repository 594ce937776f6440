"""Mixing sources in proportions (``multitables.mix_batches``; ``_api.mix``)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

import multitables
from multitables._api.mix import SCHEDULE_STEPS, schedule


def write(path: Path, n_rows: int, tag: int) -> Path:
    """/y is tag * 10_000 + i: a batch says which source and rows it came from."""
    with h5py.File(path, "w") as f:
        f.create_dataset("/y", data=(tag * 10_000 + np.arange(n_rows)).astype("<i8"), chunks=(64,))
    return path


@pytest.fixture
def sources(tmp_path: Path):
    a = multitables.Streamer(write(tmp_path / "a.h5", 700, 1))
    b = multitables.Streamer(write(tmp_path / "b.h5", 300, 2))

    def make(seed: int = 0, n_procs: int = 0, **kw):
        return multitables.mix_batches(
            [a.get_batches("/y", batch_size=50, seed=1, n_procs=n_procs), b.get_batches("/y", batch_size=50, seed=2, n_procs=n_procs)],
            [0.7, 0.3], seed=seed, **kw,
        )

    return make


def origin(batch: np.ndarray) -> int:
    tags = set((batch // 10_000).tolist())
    assert len(tags) == 1  # a batch comes from one source
    return tags.pop()


@pytest.mark.parametrize("n_procs", [0, 2], ids=["in-process", "readers"])
def test_each_batch_comes_from_the_scheduled_source_and_each_source_goes_on_through_its_epochs(sources, n_procs: int) -> None:
    mix = sources(seed=5, n_procs=n_procs, steps=200)
    got = [origin(batch) - 1 for batch in mix]
    assert got == schedule(np.array([0.7, 0.3]), 5, 0, 200).tolist()
    assert mix.step == 200
    rows_a = np.concatenate([batch for batch in sources(seed=5, steps=200) if origin(batch) == 1]) - 10_000
    per_epoch = 700
    for e in range(len(rows_a) // per_epoch):  # source a: every row once per epoch of its own
        assert sorted(rows_a[e * per_epoch : (e + 1) * per_epoch].tolist()) == list(range(700))


def test_the_schedule_keeps_the_proportions_and_depends_on_the_seed_and_step_only(sources) -> None:
    p = np.array([0.7, 0.3])
    s = schedule(p, 3, 0, 20_000)
    assert abs(s.mean() - 0.3) < 0.02  # 3 sd of 20,000 draws is 0.01
    np.testing.assert_array_equal(s[5000:6000], schedule(p, 3, 5000, 1000))  # any window of steps alone
    assert not np.array_equal(s[:1000], schedule(p, 4, 0, 1000))
    assert SCHEDULE_STEPS < 20_000  # the test crossed schedule blocks


def test_a_mix_resumes_with_the_next_step_of_every_source(sources) -> None:
    whole = [batch.copy() for batch in sources(seed=2, steps=60)]
    first = sources(seed=2)
    for step, _batch in enumerate(first, start=1):
        if step == 25:
            break
    state = json.loads(json.dumps(first.state_dict()))
    again = sources(seed=2, steps=60)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == 35
    for got, want in zip(rest, whole[25:]):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="another mix"):
        sources(seed=3).load_state_dict(state)


@pytest.mark.parametrize(
    "proportions, match",
    [([1.0], "one proportion per source"), ([0.5, -0.5], "not negative"), ([0, 0], "not all 0"), ([1, float("nan")], "finite")],
)
def test_bad_proportions_are_refused(sources, proportions, match: str) -> None:
    mix_sources = sources()._sources
    with pytest.raises(ValueError, match=match):
        multitables.mix_batches(mix_sources, proportions)


def test_one_source_is_not_a_mix(sources) -> None:
    with pytest.raises(ValueError, match="at least two sources"):
        multitables.mix_batches(sources()._sources[:1], [1.0])


def test_the_mixing_snippet_of_the_training_docs_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import textwrap

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.rst").read_text()
    section = text[text.index("\nMixing sources\n") :]
    snippet = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section).group(1)  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    for name, tag in (("train.h5", 1), ("books.h5", 2)):
        with h5py.File(name, "w") as f:
            f.create_dataset("/X", data=np.zeros((500, 2)))
            f.create_dataset("/y", data=(tag * 10_000 + np.arange(500)).astype("<i8"))
    scope: dict = {}
    exec(textwrap.dedent(snippet), scope)
    assert scope["checkpoint"]["step"] == 100 and scope["mix"].step == 100
    assert scope["y"].shape == (256,)
