"""Transforms in the readers (``get_batches(transform=)``; ``_io.blockread.Transform``, ``_train.transforms``)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import h5py
import numpy as np
import pytest

import multitables
from multitables import ReaderError


def write(path: Path, n_rows: int) -> Path:
    """/X rows are (i, -i, 0.5 i), /y is i."""
    i = np.arange(n_rows)
    with h5py.File(path, "w") as f:
        f.create_dataset("/X", data=np.stack([i, -i, 0.5 * i], axis=1).astype("<f8"), chunks=(64, 3), compression="gzip")
        f.create_dataset("/y", data=i.astype("<i8"), chunks=(64,), compression="gzip")
    return path


def first_two_as_float32_with_pid(rows: np.ndarray) -> np.ndarray:
    """A new dtype and row shape, and who ran it."""
    out = np.empty((len(rows), 3), np.float32)
    out[:, :2] = rows[:, :2]
    out[:, 2] = os.getpid()
    return out


def fails_on_row_300(rows: np.ndarray) -> np.ndarray:
    if (rows[:, 0] == 300).any():
        raise ValueError("row 300 is cursed")
    return rows


def grows_a_column(rows: np.ndarray) -> np.ndarray:
    return rows if rows[0, 0] == 0 else np.zeros((len(rows), 4))


def decodes_to_an_image(rows: np.ndarray) -> np.ndarray:
    """1 KiB of stored bytes a row into a (256, 256, 4) uint8 image, 256 times as large: each pixel the row's first byte."""
    first = rows.view(np.uint8).reshape(len(rows), -1)[:, :1]
    return np.broadcast_to(first[:, :, None, None], (len(rows), 256, 256, 4)).copy()


@pytest.fixture
def h5(tmp_path: Path) -> Path:
    return write(tmp_path / "d.h5", 1000)


@pytest.mark.parametrize("n_procs", [0, 2], ids=["in-process", "readers"])
def test_a_transform_runs_where_the_rows_are_read_and_its_rows_stay_aligned(h5: Path, n_procs: int, no_leaks) -> None:
    b = multitables.Streamer(h5).get_batches(
        ["/X", "/y"], batch_size=64, seed=1, n_procs=n_procs, transform={"/X": first_two_as_float32_with_pid}
    )
    pids = set()
    seen = []
    for x, y in b:
        assert x.dtype == np.float32 and x.shape == (len(y), 3)
        np.testing.assert_array_equal(x[:, 0], y)  # the transformed rows are the batch's rows
        np.testing.assert_array_equal(x[:, 1], -y)
        pids.update(x[:, 2].astype(int).tolist())
        seen.extend(y.tolist())
    assert sorted(seen) == list(range(1000))
    if n_procs:
        assert os.getpid() not in pids and len(pids) >= 1  # run in the reader processes, not here
    else:
        assert pids == {os.getpid()}


def draws_once_every_reader_is_in(folder: str, consumer: int, draw: Callable[[], float], rows: np.ndarray) -> np.ndarray:
    """Each row: its first value, then ``draw()`` (one a call) and who ran it. A reader's first call waits (10 s at
    most) until two readers have made one, so that both take blocks, whichever starts first; the consumer's calls
    (learning the output, timing it) do not."""
    if os.getpid() != consumer:
        Path(folder, str(os.getpid())).touch()
        deadline = time.monotonic() + 10
        while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    first = rows[:, 0] if rows.ndim > 1 else rows
    return np.stack([first.astype(np.float64), np.full(len(rows), draw()), np.full(len(rows), os.getpid())], axis=1)


def drawn_by_each_reader(h5: Path, folder: Path, draw: Callable[[], float], make: Callable[..., Any]) -> "dict[int, list[float]]":
    """The draws of each of two readers, a call a block: ``make(stream, path, batch_size, **kwargs)`` makes the
    batches (either get_batches)."""
    folder.mkdir()
    b = make(multitables.Streamer(h5), "/X", 64, shuffle=False, n_procs=2, block_size=64, drop_last=True,
             transform=functools.partial(draws_once_every_reader_is_in, str(folder), os.getpid(), draw))
    drawn: dict[int, list[float]] = {}
    for x in b:  # unshuffled, a batch of 64 is one block of 64
        assert len(set(x[:, 1].tolist())) == 1
        drawn.setdefault(int(x[0, 2]), []).append(float(x[0, 1]))
    b.close()
    return drawn


def test_each_reader_draws_its_own_random_numbers(h5: Path, tmp_path: Path, no_leaks) -> None:
    """An augmentation drawing from np.random in the readers, as a DataLoader's __getitem__ did in its workers, gets
    other numbers in each reader (NOTE [random draws in readers]): forked readers drew the same ones, block for block."""
    drawn = drawn_by_each_reader(h5, tmp_path / "in", np.random.random, lambda s, *a, **k: s.get_batches(*a, **k))
    assert len(drawn) == 2 and sum(map(len, drawn.values())) == 15, drawn
    draws = [d for each in drawn.values() for d in each]
    assert len(set(draws)) == len(draws), drawn



def draw_importing_numpy_random() -> float:
    import numpy.random

    return float(numpy.random.random())


def test_readers_draw_their_own_numbers_where_the_consumer_never_imported_numpy_random(h5: Path, tmp_path: Path) -> None:
    """numpy 2 imports ``numpy.random`` when first used, and readers do not import it at start (it cost each 10-18
    ms): one whose transform imports it seeds it from the OS then, so the readers' draws still differ."""
    script = (
        "import json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import test_transforms as t\n"
        "from pathlib import Path\n"
        "assert 'numpy.random' not in sys.modules, 'imported before the stream: the test tries nothing'\n"
        "drawn = t.drawn_by_each_reader(Path(sys.argv[2]), Path(sys.argv[3]), t.draw_importing_numpy_random,\n"
        "                               lambda s, *a, **k: s.get_batches(*a, **k))\n"
        "print(json.dumps(drawn))\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), str(h5), str(tmp_path / "in")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    drawn = json.loads(run.stdout)
    assert len(drawn) == 2 and sum(map(len, drawn.values())) == 15, drawn
    draws = [d for each in drawn.values() for d in each]
    assert len(set(draws)) == len(draws), drawn

@pytest.mark.parametrize("shuffle", [False, True])
def test_an_error_in_a_transform_comes_back_with_its_traceback(h5: Path, shuffle: bool, no_leaks) -> None:
    """It names the rows the transform was given: a block of 256, which a reader reads a chunk at a time at first."""
    b = multitables.Streamer(h5).get_batches("/X", batch_size=50, shuffle=shuffle, n_procs=2, block_size=256,
                                             transform=fails_on_row_300)
    with pytest.raises(ReaderError) as info:
        list(b)
    assert isinstance(info.value, ValueError) and "row 300 is cursed" in str(info.value)
    assert "fails_on_row_300" in info.value.remote_traceback
    assert info.value.rows == (256, 512) and "rows 256:512 of '/X'" in str(info.value)


def test_a_transform_that_changes_its_output_is_stopped_with_a_reason(h5: Path) -> None:
    b = multitables.Streamer(h5).get_batches("/X", batch_size=50, shuffle=False, n_procs=0, block_size=64, transform=grows_a_column)
    with pytest.raises(TypeError, match="on its first call"):
        list(b)


def test_a_resumed_run_with_a_transform_goes_on_with_the_next_batch(h5: Path) -> None:
    stream = multitables.Streamer(h5)
    kw = dict(batch_size=100, seed=4, n_procs=2, transform={"/X": first_two_as_float32_with_pid})
    whole = [y.copy() for _x, y in stream.get_batches(["/X", "/y"], **kw)]
    b = stream.get_batches(["/X", "/y"], **kw)
    for i, _batch in enumerate(b):
        if i == 3:
            break
    again = stream.get_batches(["/X", "/y"], **kw)
    again.load_state_dict(b.state_dict())
    rest = [y for _x, y in again]
    assert len(rest) == len(whole) - 4
    for got, want in zip(rest, whole[4:]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "paths, kwargs, error, match",
    [
        ("/X", dict(transform=3), TypeError, "a function or a dict"),
        (["/X", "/y"], dict(transform=fails_on_row_300), ValueError, "give a dict of path to function"),
        (["/X", "/y"], dict(transform={"/Z": fails_on_row_300}), KeyError, "paths not read"),
        ("/X", dict(transform=lambda rows: rows[:1]), TypeError, "one row per row"),
        ("/X", dict(transform=lambda rows: rows.tolist()), TypeError, "must return a numpy array"),
        ("/X", dict(transform=lambda rows: rows.astype(object)), TypeError, "plain numbers"),
    ],
)
def test_bad_transforms_are_refused_before_any_reader_starts(h5: Path, paths, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        multitables.Streamer(h5).get_batches(paths, batch_size=10, **kwargs)


def test_a_transform_spawned_readers_cannot_get_is_refused_up_front(h5: Path) -> None:
    stream = multitables.Streamer(h5, start_method="spawn")
    with pytest.raises(TypeError, match="picklable for the spawn start method"):
        stream.get_batches("/X", batch_size=10, transform=lambda rows: rows)


#: Transforms a notebook's cell makes, and the function or class of the session each names.
INTERACTIVE = {"function": ("halve", "halve"), "lambda": ("lambda rows: rows / 2", "<lambda>"),
               "partial": ("functools.partial(halve, by=2)", "halve"), "object": ("Halve()", "Halve")}


@pytest.mark.parametrize("kind", sorted(INTERACTIVE))
@pytest.mark.parametrize("start_method", ["spawn", "forkserver", "fork"])
def test_a_transform_of_an_interactive_session_is_refused_up_front_where_readers_cannot_import_it(
    h5: Path, start_method: str, kind: str
) -> None:
    """A notebook's functions and classes live in a __main__ without a file: they pickle by name, and a spawned or
    forkserver reader cannot import them (it died with exit code 1, its AttributeError on stderr only); so cannot
    a partial of one or an object of one of its classes (that object's check itself raised an AttributeError). A
    lambda is told the same, not to become a function of the session. A forked reader has them all."""
    transform, named = INTERACTIVE[kind]
    script = (
        "import functools, sys, multitables\n"
        "def halve(rows, by=2):\n"
        "    return rows / by\n"
        "class Halve:\n"
        "    def __call__(self, rows):\n"
        "        return rows / 2\n"
        f"stream = multitables.Streamer(sys.argv[1], start_method={start_method!r})\n"
        "try:\n"
        f"    batches = stream.get_batches('/X', batch_size=10, transform={transform}, n_procs=1)\n"
        "except TypeError as exc:\n"
        "    print('refused:', exc)\n"
        "else:\n"
        "    print('rows:', len(next(iter(batches))))\n"
        "    batches.close()\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(h5)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    if start_method == "fork":
        assert run.stdout.strip() == "rows: 10"
    else:
        assert run.stdout.startswith(f"refused: transform for '/X' is defined in an interactive session ({named} in a ")
        assert "define it in a module (a .py file) and import it, or use start_method='fork'" in run.stdout


def test_a_spawned_reader_that_cannot_get_its_transform_reports_why(h5: Path, tmp_path: Path) -> None:
    """A function the script defines only in the consumer (here under an ``if`` that no check can read) pickles by
    name, but a spawned reader imports the script as another module, without it. The reader died before it could
    report (exit code 1), Python printing why on the consumer's stderr; it now unpickles what it was sent in its own
    code (NOTE [semaphore names]), and reports the error, of its type, with its traceback. (One under ``if __name__ ==
    "__main__":`` is refused up front: the test below.)"""
    script = tmp_path / "train.py"
    script.write_text(
        "import multiprocessing, sys, multitables\n"
        "if multiprocessing.current_process().name == 'MainProcess':\n"
        "    def halve(rows):\n"
        "        return rows / 2\n"
        "if __name__ == '__main__':\n"
        "    batches = multitables.Streamer(sys.argv[1], start_method='spawn').get_batches(\n"
        "        '/X', batch_size=10, transform=halve, n_procs=1)\n"
        "    try:\n"
        "        next(iter(batches))\n"
        "    except multitables.ReaderError as exc:\n"
        "        print('said:', exc)\n"
    )
    run = subprocess.run([sys.executable, str(script), str(h5)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    said = run.stdout.splitlines()[0]
    assert said.startswith("said: Caught AttributeError in reader 0 (pid ") and "while starting to read" in said
    assert "'halve'" in said and "Original traceback in the reader" in run.stdout and "Traceback" not in run.stderr


def test_transform_and_fields_do_not_go_together(tmp_path: Path) -> None:
    import tables

    rows = np.zeros(100, [("a", "<i4"), ("b", "<f8")])
    with tables.open_file(tmp_path / "t.h5", "w") as f:
        f.create_table("/", "table", rows)
    with pytest.raises(ValueError, match="do not go together"):
        multitables.Streamer(tmp_path / "t.h5").get_batches("/table", batch_size=10, fields=["a"], transform=lambda r: r)


def test_the_transform_snippet_of_the_training_docs_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import textwrap

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.rst").read_text()
    section = text[text.index("Work per sample in the readers") :]
    snippet = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section).group(1)  # type: ignore[union-attr]
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "train.h5", 3000)
    scope: dict = {"__name__": "__main__"}
    exec(textwrap.dedent(snippet), scope)
    x, y = scope["x"], scope["y"]
    assert x.dtype == np.float32 and x.shape == (len(y), 3)
    raw = np.stack([y, -y, 0.5 * y], axis=1).astype(np.float64)
    np.testing.assert_allclose(x, ((raw - raw.mean(axis=1, keepdims=True)) / 10).astype(np.float32), rtol=1e-6)


def test_the_plan_prices_a_transformed_dataset_as_work_for_the_readers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from multitables._train import feed

    with h5py.File(tmp_path / "stored.h5", "w") as f:  # no filter: readers pay only for a transform's work
        f.create_dataset("/X", data=np.zeros((256, 3)), chunks=(64, 3))
        f.create_dataset("/y", data=np.zeros(256), chunks=(64,))
    seen = []
    real = feed.plan_batches
    monkeypatch.setattr(feed, "plan_batches", lambda shapes, *a, **k: seen.append(shapes) or real(shapes, *a, **k))
    multitables.Streamer(str(tmp_path / "stored.h5")).get_batches(["/X", "/y"], 32, transform={"/X": lambda r: r * 2}).close()
    assert [s.transformed for s in seen[0]] == [True, False]


def sleeps_10ms_a_row(rows: np.ndarray) -> np.ndarray:
    """A costly transform: 10 ms a row (an image decoder, an augmentation)."""
    time.sleep(0.01 * len(rows))
    return rows * 2


def doubles(rows: np.ndarray) -> np.ndarray:
    """A cheap transform: microseconds a call."""
    return rows * 2


class SlowFirstCall:
    """Cheap, but its first call takes 0.3 s (an import, a cache filled, a JIT), as no reader's call does."""

    def __init__(self) -> None:
        self.called = False

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        if not self.called:
            self.called = True
            time.sleep(0.3)
        return rows * 2


@pytest.mark.parametrize(
    "transform, n_rows, n_procs, readers",
    [(sleeps_10ms_a_row, 1000, None, "some"), (doubles, 1000, None, 0), (SlowFirstCall(), 1000, None, 0),
     (doubles, 1_000_000, None, 0), (sleeps_10ms_a_row, 1000, 0, 0), (doubles, 1000, 1, 1)],
    ids=["costly-default", "cheap-default", "warm-up-default", "cheap-many-rows-default", "costly-asked-0",
         "cheap-asked-1"],
)
def test_the_default_readers_count_a_transforms_time_on_a_dataset_cheap_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transform, n_rows: int, n_procs: "int | None", readers: "int | str"
) -> None:
    """Rows of 3 float64 stored without a filter (a copy to read): a transform of 10 ms a row is 10 s an epoch of 1000,
    which readers share out; one of microseconds is not worth their start, nor is one whose first call only is slow,
    nor a call's own microseconds over a million rows (the second, timed call takes thousands of rows, NOTE
    [transforms]); an ``n_procs`` given is taken as asked (NOTE [read plan] in ``_plan.readers``)."""
    monkeypatch.setattr("multitables._plan.readers.available_cpus", lambda: 2)  # the same answer on any machine
    path = tmp_path / "stored.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("/X", data=np.zeros((n_rows, 3)), chunks=(min(n_rows // 16, 4096), 3))
    with multitables.Streamer(path).get_batches("/X", 100, n_procs=n_procs, transform=transform) as batches:
        if readers == "some":
            assert batches.n_procs[0] > 0
        else:
            assert batches.n_procs == [readers]


class SleepsACall:
    """A transform whose cost is a call's, whatever its rows (a lock, a launch, a round trip)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        time.sleep(self.seconds)
        return rows * 2


@pytest.mark.parametrize(
    "call_s, row_s, first_s, jitter, fitted",
    [(1e-3, 0.0, 0.0, 0.0, (1e-3, 0.0)), (0.0, 1e-5, 0.0, 0.0, (0.0, 1e-5)), (1e-4, 1e-6, 0.0, 0.0, (1e-4, 1e-6)),
     (1e-4, 1e-6, 0.3, 0.0, (1e-4, 1e-6)), (1e-3, 0.0, 0.0, 2e-4, (1e-3, 0.0))],
    ids=["a-call", "a-row", "both", "warm-up", "tilted-down"],
)
def test_a_line_through_a_small_and_a_large_call_prices_a_call_and_a_row(
    monkeypatch: pytest.MonkeyPatch, call_s: float, row_s: float, first_s: float, jitter: float, fitted: tuple
) -> None:
    """NOTE [transforms]: calls on 2 rows and on more give a call's and a row's time; the first call's warm-up never
    enters (the lesser of two small calls stands), and a small call slowed by noise, which tilts the line down (the
    larger call no dearer), prices calls only, at the lesser time, never a negative cost."""
    from multitables._train import transforms

    took = lambda _found, _rows, n: call_s + row_s * n + (jitter if n == 2 else 0.0)  # noqa: E731
    monkeypatch.setattr(transforms, "_time_call", took)
    node = SimpleNamespace(n_rows=100_000)
    found = SimpleNamespace(read_nbytes=24, row_nbytes=24, first_s=took(None, None, 2) + first_s)
    options = SimpleNamespace(read_rows=lambda _node, start, stop: np.zeros((stop - start, 3)))
    got = transforms.price(options, node, found, 1e9, 100_000, 25)  # readers never shown to pay: the line is drawn
    assert got == pytest.approx(fitted, abs=1e-9) and min(got) >= 0


class Clock:
    """The transforms module's clock, moved only by the transform :meth:`costing` makes: each of its calls takes what
    it says, whatever else runs on the machine."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[np.ndarray] = []

    def perf_counter(self) -> float:
        return self.now

    def costing(self, call_s: float, row_s: float) -> Callable[[np.ndarray], np.ndarray]:
        """A transform (a closure: its calls here are construction's) of ``call_s`` a call and ``row_s`` a row that
        records the first column of each call's rows and then doubles them in place."""

        def transform(rows: np.ndarray) -> np.ndarray:
            self.calls.append(rows[:, 0].copy())
            self.now += call_s + row_s * len(rows)
            rows *= 2
            return rows

        return transform


@pytest.mark.parametrize(
    "call_s, row_s, chunk, n_procs, sizes, readers",
    [(0.0, 0.01, 64, 0, [2], [0]), (0.0, 0.01, 64, 2, [2], [2]), (0.0, 0.01, 1000, None, [2], [0]),
     (0.0, 0.01, 64, None, [2, 4], [2]), (0.05, 0.0, 64, None, [2, 3], [2])],
    ids=["asked-0", "asked-2", "one-chunk-default", "10ms-a-row-default", "50ms-a-call-default"],
)
def test_construction_calls_a_transform_no_more_than_the_readers_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call_s: float, row_s: float, chunk: int, n_procs: "int | None",
    sizes: list, readers: list
) -> None:
    """1,000 rows: construction calls a transform on its first 2 rows to learn its output, and on more only where its
    price can change the readers (NOTE [transforms]): not where ``n_procs`` is given for one dataset, nor where one
    reader would read the dataset's one chunk; a costly one, once more, on as few rows as show that readers pay
    (10 ms a row: 4 rows, 40 ms, over 6 blocks; 50 ms a call: 3 rows, which also tell a call's cost from a row's).
    Each call gets a fresh copy of the first rows."""
    from multitables._train import transforms

    monkeypatch.setattr("multitables._plan.readers.available_cpus", lambda: 2)  # the same answer on any machine
    clock = Clock()
    monkeypatch.setattr(transforms, "time", clock)
    path = tmp_path / "stored.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("/X", data=np.arange(3000.0).reshape(1000, 3), chunks=(chunk, 3))
    with multitables.Streamer(path, start_method="fork").get_batches(
            "/X", 100, n_procs=n_procs, transform=clock.costing(call_s, row_s)) as batches:
        assert [len(rows) for rows in clock.calls] == sizes
        assert all((rows == 3.0 * np.arange(len(rows))).all() for rows in clock.calls)
        assert batches.n_procs == readers
        priced = batches._feed._planning.shapes[0]  # a call's cost as a call's, a row's as a row's
        assert (priced.transform_call_s, priced.transform_row_s) == pytest.approx((call_s, row_s))


@pytest.mark.parametrize("call_s, block_size, readers", [(2e-4, None, 0), (2e-4, 4096, 0), (0.05, 4096, "some")],
                         ids=["0.2ms-one-block", "0.2ms-25-blocks", "50ms-25-blocks"])
def test_a_transforms_time_a_call_is_priced_once_a_block_not_once_a_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call_s: float, block_size: "int | None", readers: "int | str"
) -> None:
    """100,000 rows of 24 B, stored: a transform that sleeps 0.2 ms a call, timed on 2 rows, was priced at 0.1 ms a
    row, 10 s an epoch, and got readers; it costs a call a block (NOTE [transforms]): 0.2 ms an epoch in one block,
    5 ms in 25, which no start of readers is worth even where a busy machine stretches a sleep several times. At
    50 ms a call, 25 calls are 1.25 s: readers share them."""
    monkeypatch.setattr("multitables._plan.readers.available_cpus", lambda: 2)  # the same answer on any machine
    path = tmp_path / "stored.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("/X", data=np.zeros((100_000, 3)), chunks=(4096, 3))
    with multitables.Streamer(path).get_batches("/X", 100, block_size=block_size, shuffle=False,
                                                transform=SleepsACall(call_s)) as batches:
        if readers == "some":
            assert batches.n_procs[0] > 0
        else:
            assert batches.n_procs == [readers]


@pytest.mark.parametrize("block_size, n_procs, readers", [(None, None, 0), (None, 2, 1), (100, None, 2), (100, 2, 2)],
                         ids=["default", "asked-2", "blocks-of-100", "blocks-of-100-asked-2"])
def test_a_dataset_in_one_chunk_gets_readers_for_its_transform_where_its_blocks_cut_the_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_size: "int | None", n_procs: "int | None", readers: int
) -> None:
    """1,000 rows in one chunk, 10 ms a row: its default block is the chunk, which one reader reads, whatever is
    asked (the limit, NOTE [read plan]); blocks of 100 rows cut the chunk, and the default readers count them (each
    reads its rows of the chunk), as those asked for do. The rows are the same."""
    monkeypatch.setattr("multitables._plan.readers.available_cpus", lambda: 2)  # the same answer on any machine
    path = tmp_path / "one.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("/X", data=np.arange(3000.0).reshape(1000, 3), chunks=(1000, 3))
    with multitables.Streamer(path).get_batches("/X", 100, block_size=block_size, n_procs=n_procs, seed=1,
                                                transform=sleeps_10ms_a_row) as batches:
        assert batches.n_procs == [readers]
        if readers == 2 and n_procs is None:
            got = np.concatenate(list(batches))
            assert sorted(got[:, 0].tolist()) == [6.0 * i for i in range(1000)]


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_blocks_of_a_transform_that_writes_more_than_it_reads_are_planned_on_what_it_writes(
    tmp_path: Path, shuffle: bool, no_leaks: None
) -> None:
    """96 rows of 1 KiB in chunks of 48 (48 KiB), decoded into 256 KiB images: planned on the bytes read, a block was
    a whole chunk, 48 rows (12 MiB a slot). Planned on the larger, the bytes written, a block holds what fits the
    target, 16 rows (4 MiB), a third of a chunk (NOTE [read plan] in ``_plan.readers``); the rows are the same."""
    from multitables._plan.readers import TARGET_BLOCK_BYTES

    path = tmp_path / "images.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("/x", data=np.array([bytes([i]) * 1024 for i in range(96)], "S1024"), chunks=(48,))
    seen = []
    with multitables.Streamer(path).get_batches("/x", batch_size=8, n_procs=1, shuffle=shuffle, seed=3,
                                                transform=decodes_to_an_image) as batches:
        assert batches.block_size == 16
        for batch in batches:
            queue = batches._feed.queues[0]
            assert queue.slot_memory()[1] // queue.read_ahead <= TARGET_BLOCK_BYTES
            assert batch.shape == (8, 256, 256, 4) and (batch == batch[:, :1, :1, :1]).all()
            seen.extend(batch[:, 0, 0, 0].tolist())
    assert (sorted(seen) if shuffle else seen) == list(range(96)) and (seen != sorted(seen)) == shuffle


def test_a_transform_defined_under_the_main_guard_is_refused_up_front_where_readers_run_the_script_again(
    h5: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script's function defined under ``if __name__ == "__main__":`` pickles by name, but a reader started by
    spawn or forkserver imports the script as another module, without it: it died before it could report. Refused
    here, before any reader starts (NOTE [the main script again] in ``multitables._sys.forks``)."""
    import types

    script = tmp_path / "train.py"
    source = (
        "import multitables\n"
        "if __name__ == '__main__':\n"
        "    def halve(rows):\n"
        "        return rows / 2\n"
        f"    batches = multitables.Streamer({str(h5)!r}, start_method='spawn').get_batches(\n"
        "        '/X', batch_size=10, transform=halve, n_procs=1)\n"
    )
    script.write_text(source)
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.raises(TypeError) as caught:
        exec(compile(source, str(script), "exec"), vars(main))
    assert str(caught.value) == (
        "transform for '/X' (halve) is defined under 'if __name__ == \"__main__\":', which readers started by spawn "
        "do not run (they import the script as another module): define it at the script's top level, before that "
        "'if', or use start_method='fork'"
    )
