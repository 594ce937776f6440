"""Mixing sources in proportions (``multitables.mix_batches``; ``_train.mix``)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import psutil
import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables
from multitables._train.mix import SCHEDULE_STEPS, row_counts, schedule


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
    once = sources()._sources[0]
    with pytest.raises(ValueError, match="sources 0 and 1 are the same Batches"):  # two schedules, one position
        multitables.mix_batches([once, once], [0.5, 0.5])


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


def test_the_per_row_snippet_of_the_training_docs_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import textwrap

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.rst").read_text()
    section = text[text.index('With ``per="row"``') :]
    snippet = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section).group(1)  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    for name, tag in (("train.h5", 1), ("books.h5", 2)):
        with h5py.File(name, "w") as f:
            f.create_dataset("/X", data=np.zeros((500, 2)))
            f.create_dataset("/y", data=(tag * 10_000 + np.arange(500)).astype("<i8"))
    scope: dict = {}
    exec(textwrap.dedent(snippet), scope)
    tags = (scope["y"] // 10_000).tolist()
    assert len(tags) == 256 and tags.count(1) + tags.count(2) == 256 and 150 < tags.count(1) < 250
    assert scope["checkpoint"]["step"] == 1 and scope["checkpoint"]["per"] == "row"


# -- per="row": rows of every source in each batch ------------------------------


@pytest.fixture
def row_sources(tmp_path: Path):
    a = multitables.Streamer(write(tmp_path / "a.h5", 700, 1))
    b = multitables.Streamer(write(tmp_path / "b.h5", 300, 2))
    c = multitables.Streamer(write(tmp_path / "c.h5", 130, 3))

    def make(seed: int = 0, n_procs: int = 0, batch_size: int = 50, **kw):
        batches = [s.get_batches("/y", batch_size=batch_size, seed=i, n_procs=n_procs) for i, s in enumerate((a, b, c))]
        return multitables.mix_batches(batches, [0.5, 0.3, 0.2], seed=seed, per="row", **kw), batches

    return make


def test_per_row_each_batch_holds_each_sources_next_rows_in_the_drawn_counts(row_sources) -> None:
    mix, _ = row_sources(seed=4, steps=40)
    _, alone = row_sources(seed=4)  # the same sources, read on their own
    streams = [iter(np.concatenate([batch for _, batch in zip(range(60), _endless(s))])) for s in alone]
    p = np.array([0.5, 0.3, 0.2])
    for step, batch in enumerate(mix):
        assert len(batch) == 50
        counts = row_counts(p, 50, 4, step)
        tags = (batch // 10_000).tolist()
        assert [tags.count(i + 1) for i in range(3)] == counts.tolist()
        for i, n in enumerate(counts.tolist()):  # the source's next n rows, in some order
            want = sorted(next(streams[i]).item() for _ in range(n))
            assert sorted(batch[batch // 10_000 == i + 1].tolist()) == want
    assert mix.step == 40


def test_per_row_batches_kept_uncopied_keep_their_rows(row_sources) -> None:
    """A batch is the caller's (an asynchronous consumer may read it later): later steps write into no earlier one."""
    kept = list(row_sources(seed=4, steps=40)[0])
    copies = [batch.copy() for batch in row_sources(seed=4, steps=40)[0]]
    assert all(np.array_equal(k, c) for k, c in zip(kept, copies)) and len(kept) == 40
    assert not any(np.shares_memory(a, c) for i, a in enumerate(kept) for c in kept[i + 1 :])


def _endless(batches):
    while True:
        yield from batches


def test_per_row_counts_keep_the_proportions_and_do_not_depend_on_the_readers(row_sources) -> None:
    counts = np.array([row_counts(np.array([0.5, 0.3, 0.2]), 50, 1, step) for step in range(3000)])
    assert np.allclose(counts.sum(axis=0) / counts.sum(), [0.5, 0.3, 0.2], atol=0.01)
    here = [batch.copy() for batch in row_sources(seed=1, steps=30)[0]]
    readers = [batch.copy() for batch in row_sources(seed=1, steps=30, n_procs=2)[0]]
    assert all(np.array_equal(x, y) for x, y in zip(here, readers))
    assert not all(np.array_equal(x, y) for x, y in zip(here, row_sources(seed=2, steps=30)[0]))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stop=st.integers(0, 45), batch_size=st.sampled_from([7, 50, 128]), close=st.booleans())
def test_per_row_resumes_mid_batch_of_a_source(row_sources, stop: int, batch_size: int, close: bool) -> None:
    whole = [batch.copy() for batch in row_sources(seed=6, batch_size=batch_size, steps=45)[0]]
    first, _ = row_sources(seed=6, batch_size=batch_size, steps=45)
    it = iter(first)
    head = [next(it).copy() for _ in range(stop)]
    if close:
        first.close()  # the held source batches are read again on the next pass
        head += [batch.copy() for _, batch in zip(range(3), first)]
    state = json.loads(json.dumps(first.state_dict()))
    again, _ = row_sources(seed=6, batch_size=batch_size, steps=45)
    again.load_state_dict(state)
    rest = [batch.copy() for batch in again]
    assert len(head) + len(rest) == 45
    for got, want in zip(head + rest, whole):
        np.testing.assert_array_equal(got, want)
    first.close()


def test_per_row_refuses_sources_that_cannot_share_a_batch(tmp_path: Path, row_sources) -> None:
    a = multitables.Streamer(write(tmp_path / "a.h5", 700, 1))
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["/y"] = np.arange(300, dtype="<f8")
    f = multitables.Streamer(tmp_path / "f.h5")
    with pytest.raises(ValueError, match="batch sizes differ: \\[50, 60\\]"):
        multitables.mix_batches([a.get_batches("/y", 50), f.get_batches("/y", 60)], [1, 1], per="row")
    before = psutil.Process().children()
    with pytest.raises(TypeError, match="int64.*float64|float64.*int64"):  # when the mix is made, no reader started
        multitables.mix_batches([a.get_batches("/y", 50, n_procs=1), f.get_batches("/y", 50, n_procs=1)], [1, 1], per="row")
    assert psutil.Process().children() == before
    with pytest.raises(ValueError, match="per='rows' is not one of"):
        multitables.mix_batches([a.get_batches("/y", 50), f.get_batches("/y", 50)], [1, 1], per="rows")
    by_batch = row_sources()[0].state_dict()
    with pytest.raises(ValueError, match="another mix"):
        multitables.mix_batches(row_sources()[1], [0.5, 0.3, 0.2]).load_state_dict(by_batch)


@pytest.mark.parametrize("per", ["batch", "row"])
@pytest.mark.parametrize("refused", ["another seed", "a batch beyond its epoch"])
def test_a_refused_load_leaves_every_source_and_the_mix_where_they_were(tmp_path: Path, refused: str, per: str) -> None:
    """Source 1 refuses its part of the state after source 0's was found good: neither source, nor the mix, moves."""
    a = multitables.Streamer(write(tmp_path / "a.h5", 700, 1))
    b = multitables.Streamer(write(tmp_path / "b.h5", 300, 2))

    def make(seed_b: int) -> "multitables.MixedBatches":
        return multitables.mix_batches([a.get_batches("/y", batch_size=50, seed=1, n_procs=0),
                                        b.get_batches("/y", batch_size=50, seed=seed_b, n_procs=0)], [0.7, 0.3], seed=4, per=per)

    saved = make(2)
    for _ in zip(range(9), saved):
        pass
    state = json.loads(json.dumps(saved.state_dict()))
    if refused == "a batch beyond its epoch":
        state["sources"][1]["batch"] = 99  # 300 rows are 6 batches
    other = make(3 if refused == "another seed" else 2)
    head = [batch.copy() for _, batch in zip(range(3), other)]
    before = other.state_dict()
    with pytest.raises(ValueError, match=r"(seed=2 \(here 3\)|batch=99 is beyond the 6)"):
        other.load_state_dict(state)
    assert other.state_dict() == before
    whole = [batch.copy() for _, batch in zip(range(8), make(3 if refused == "another seed" else 2))]
    rest = [batch.copy() for _, batch in zip(range(5), other)]  # it goes on from where it was
    for got, want in zip(head + rest, whole, strict=True):
        np.testing.assert_array_equal(got, want)
