"""The PyTorch adapter: tensors without a copy, DataLoader, set_epoch, and real data parallelism with gloo."""

from __future__ import annotations

import functools
import inspect
import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
import typing
import warnings
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'multitables[torch]')")

import multitables  # noqa: E402
import multitables.torch as mtt  # noqa: E402
from _typecheck import expected_of, mypy_says  # noqa: E402
from test_batches import SignalAtCall  # noqa: E402
from test_docs import _example_files  # noqa: E402
from test_transforms import drawn_by_each_reader  # noqa: E402


ROOT = Path(__file__).resolve().parent.parent
#: Seconds the two-rank run may take (it takes a few: two interpreters importing torch).
DDP_TIMEOUT = 240


def write(path: Path, n_rows: int) -> Path:
    """/X rows are (i, -i), /y is i."""
    import h5py

    i = np.arange(n_rows)
    with h5py.File(path, "w") as f:
        f.create_dataset("X", data=np.stack([i, -i], axis=1).astype("<f8"), chunks=(64, 2), compression="gzip")
        f.create_dataset("y", data=i.astype("<i8"), chunks=(256,))
    return path


@pytest.fixture
def h5(tmp_path: Path) -> Path:
    return write(tmp_path / "d.h5", 1003)


def test_tensors_share_the_batch_arrays_memory(h5: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = []
    from_numpy = torch.from_numpy

    def spy(array: np.ndarray) -> "torch.Tensor":
        tensor = from_numpy(array)
        made.append((array.ctypes.data, tensor.data_ptr(), array.flags.writeable))
        return tensor

    monkeypatch.setattr(mtt.torch, "from_numpy", spy)
    batches = mtt.get_batches(multitables.Streamer(h5), ["/X", "/y"], 100, n_procs=0)
    seen = []
    for x, y in batches:
        assert isinstance(x, torch.Tensor) and x.dtype == torch.float64 and y.dtype == torch.int64
        assert torch.equal(x[:, 0].long(), y)
        seen.append(y)
    assert len(made) == 2 * len(batches) and all(a == t and w for a, t, w in made), "a batch was copied"
    assert sorted(torch.cat(seen).tolist()) == list(range(1003))


def test_to_tensor_converts_byte_order_and_names_bad_dtypes() -> None:
    a = np.arange(6, dtype=">f4")
    t = mtt.to_tensor(a)
    assert t.dtype == torch.float32 and t.tolist() == a.tolist()
    native = np.arange(6, dtype="<i4")
    assert mtt.to_tensor(native).data_ptr() == native.ctypes.data
    with pytest.raises(TypeError, match="'/table'"):
        mtt.to_tensor(np.zeros(3, [("a", "<i4"), ("b", "<f8")]), "/table")


def test_the_length_is_what_one_pass_gives_as_pytorch_counts_it(h5: Path) -> None:
    stream = multitables.Streamer(h5)
    three = mtt.get_batches(stream, ["/X", "/y"], batch_size=64, n_procs=0, epochs=3)
    loader = torch.utils.data.DataLoader(three, batch_size=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch warns where a pass gives more than len()
        assert len(loader) == 3 * len(three.batches) == sum(1 for _ in loader) == 48
    endless = mtt.get_batches(stream, ["/X", "/y"], batch_size=64, n_procs=0, epochs=None)
    with pytest.raises(TypeError, match="endless"):
        len(endless)


def test_inside_a_dataloader_with_set_epoch(h5: Path) -> None:
    batches = mtt.get_batches(multitables.Streamer(h5), ["/X", "/y"], batch_size=64, seed=1, n_procs=1)
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    assert len(loader) == len(batches) == 16
    orders = []
    for epoch in range(2):
        batches.set_epoch(epoch)
        rows = []
        for x, y in loader:
            assert torch.equal(x[:, 1].long(), -y)
            rows.append(y)
        orders.append(torch.cat(rows))
        assert sorted(orders[-1].tolist()) == list(range(1003))
    assert not torch.equal(orders[0], orders[1])
    assert batches.epoch == 2
    batches.set_epoch(0)  # back to epoch 0: the same order
    assert torch.equal(torch.cat([y for _, y in loader]), orders[0])


def test_state_dict_through_the_adapter(h5: Path) -> None:
    def make() -> mtt.TorchBatches:
        return mtt.get_batches(multitables.Streamer(h5), "/y", 100, seed=2, n_procs=0)

    whole = torch.cat(list(make()))
    first = make()
    head = []
    for i, y in enumerate(first):
        head.append(y)
        if i == 3:
            break
    again = make()
    again.load_state_dict(first.state_dict())
    assert torch.equal(torch.cat(head + list(again)), whole)


def from_file(h5: Path) -> "tuple[np.ndarray, np.ndarray]":
    import h5py

    with h5py.File(h5, "r") as f:
        return f["X"][:], f["y"][:]


def epoch_of(h5: Path, **kwargs: object) -> mtt.TorchBatches:
    return mtt.get_batches(multitables.Streamer(h5), ["/X", "/y"], 64, seed=3, n_procs=1, **kwargs)  # type: ignore[arg-type]


def check_epoch(h5: Path, got: list) -> None:
    """``got``: one epoch of (x, y) tensors, 64 rows each but the last; every row of the file once, /X with /y."""
    X, y = from_file(h5)
    assert [tuple(b[0].shape) for b in got] == [(64, 2)] * 15 + [(43, 2)]
    assert [tuple(b[1].shape) for b in got] == [(64,)] * 15 + [(43,)]
    for xb, yb in got:
        assert xb.dtype == torch.float64 and yb.dtype == torch.int64
        assert np.array_equal(xb.numpy(), X[yb.numpy()])
    assert np.array_equal(np.sort(torch.cat([b[1] for b in got]).numpy()), y)


def test_iterating_the_dataset_and_a_dataloader_without_batching_give_the_same_batches(h5: Path, no_leaks: None) -> None:
    direct = [(x, y) for x, y in epoch_of(h5)]
    check_epoch(h5, direct)
    loaded = [(x, y) for x, y in torch.utils.data.DataLoader(epoch_of(h5), batch_size=None)]
    assert len(loaded) == len(direct)
    assert all(torch.equal(a, b) for d, l in zip(direct, loaded) for a, b in zip(d, l))
    single = torch.utils.data.DataLoader(mtt.get_batches(multitables.Streamer(h5), "/y", 100, n_procs=0), batch_size=None)
    assert [tuple(y.shape) for y in single] == [(100,)] * 10 + [(3,)]


@pytest.mark.parametrize(
    "kwargs", [{}, {"batch_size": 1}, {"batch_size": 4}, {"batch_size": 4, "drop_last": True}], ids=repr
)
def test_a_dataloader_that_batches_again_is_refused_before_any_batch(h5: Path, kwargs: dict, no_leaks: None) -> None:
    batches = epoch_of(h5)
    loader = torch.utils.data.DataLoader(batches, **kwargs)
    with pytest.raises(RuntimeError, match=r"batches of batches, of shape \(batch_size, 64, \.\.\.\)") as info:
        next(iter(loader))
    assert "Write DataLoader(dataset, batch_size=None), or iterate over the dataset itself" in str(info.value)
    assert batches.state_dict()["batch"] == 0, "a batch was read"
    del info
    check_epoch(h5, list(batches))  # the dataset itself is still whole


def test_dataloader_workers_are_refused_before_any_batch(
    h5: Path, no_leaks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    # PyTorch waits this long for each worker whose dataset raised before it kills it (any
    # dataset: its shutdown does not reach such workers); 5 s by default.
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.2)
    batches = epoch_of(h5)
    for context in ("fork", "spawn"):
        # fork: the workers raise and the loader re-raises at the first next(); spawn (and
        # forkserver, Python 3.14's default): pickling the dataset for the worker raises.
        loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=2, multiprocessing_context=context)
        with pytest.raises(RuntimeError, match=r"DataLoader worker processes \(num_workers > 0\)") as info:
            next(iter(loader))
        assert "Write DataLoader(dataset, batch_size=None) with num_workers=0" in str(info.value)
        del info, loader
        gc.collect()  # the loader's iterator stops its workers
    assert batches.state_dict()["batch"] == 0, "a batch was read"
    check_epoch(h5, list(batches))
    with pytest.raises(RuntimeError, match="nor be pickled"):  # not "cannot pickle 'generator'"
        pickle.dumps(batches)


class _Over(torch.utils.data.IterableDataset):
    """A user's own dataset over batches made in the main process."""

    def __init__(self, batches: multitables.Batches) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def test_batches_copied_into_several_workers_are_refused_not_read_twice(
    h5: Path, no_leaks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each worker of a DataLoader iterates its copy of what the main process made: every row twice with two workers.
    One worker reads each row once."""
    import gc

    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.2)
    batches = multitables.Streamer(h5).get_batches("/y", batch_size=100, seed=3, n_procs=0)
    loader = torch.utils.data.DataLoader(_Over(batches), batch_size=None, num_workers=2)
    with pytest.raises(RuntimeError, match="every worker would give every row, 2 times each") as info:
        next(iter(loader))
    del info, loader
    gc.collect()
    rows = [t.numpy() for t in torch.utils.data.DataLoader(_Over(batches), batch_size=None, num_workers=1)]
    assert sorted(np.concatenate(rows).tolist()) == list(range(1003))


#: Accelerate's DataLoaderDispatcher (accelerate/data_loader.py) as far as the adapter meets it: its ``__iter__``
#: iterates a DataLoader of the dataset and hands batches out through ``_fetch_batches``; process 0's batch is split
#: between the ranks. Compiled as a module of ``accelerate`` so that the frames look as they do under Accelerate.
_DISPATCHER = """
class DataLoaderDispatcher:
    def __init__(self, dataset):
        self.dataset = dataset

    def _fetch_batches(self, iterator):
        return next(iterator, None)

    def __iter__(self):
        iterator = self.base.__iter__()
        while (batch := self._fetch_batches(iterator)) is not None:
            yield batch

    @property
    def base(self):
        return DataLoader(self.dataset, batch_size=None)
"""


def accelerate_dispatcher() -> type:
    space: dict = {"__name__": "accelerate.data_loader", "DataLoader": torch.utils.data.DataLoader}
    exec(compile(_DISPATCHER, "accelerate/data_loader.py", "exec"), space)
    return space["DataLoaderDispatcher"]


def test_accelerates_dispatcher_over_batches_split_between_ranks_is_refused_before_any_batch(
    h5: Path, no_leaks: None
) -> None:
    """accelerator.prepare(DataLoader(batches, batch_size=None)) dispatches by default: process 0 reads and splits
    each batch between the ranks, the others never read theirs, so one rank's part would be all an epoch trains on."""
    dispatcher = accelerate_dispatcher()
    stream = multitables.Streamer(h5)
    for rank in (0, 1):
        part = mtt.get_batches(stream, ["/X", "/y"], 64, seed=3, n_procs=1, rank=rank, world_size=2)
        with pytest.raises(RuntimeError, match=f"they are rank {rank}'s part of 2 already") as info:
            next(iter(dispatcher(part)))
        assert "Iterate the batches on every rank without preparing them" in str(info.value)
        assert part.state_dict()["batch"] == 0, "a batch was read"
        del info
        part.close()
    whole = epoch_of(h5)  # one rank of one, or world_size=1 on each rank: process 0 reads every row, as dispatched
    check_epoch(h5, [tuple(b) for b in dispatcher(whole)])


def test_fields_give_a_dict_of_tensors(table_file: "tuple[Path, np.ndarray]") -> None:
    path, rows = table_file
    batches = mtt.get_batches(multitables.Streamer(path), "/table", 100, fields=["a", "v"], n_procs=0)
    got = list(torch.utils.data.DataLoader(batches, batch_size=None))
    assert len(got) == 10 and all(list(b) == ["a", "v"] for b in got)
    a = torch.cat([b["a"] for b in got]).numpy()
    v = torch.cat([b["v"] for b in got]).numpy()
    assert sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(v, rows["v"][a])


def test_the_adapter_wraps_only_batches() -> None:
    with pytest.raises(TypeError, match="wraps multitables Batches"):
        mtt.TorchBatches([1, 2, 3])  # type: ignore[arg-type]


RANK_SCRIPT = r"""
import datetime, json, sys
import torch, torch.distributed as dist
import multitables, multitables.torch as mtt

rank, world, store, h5, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
# rank and world_size are not given: they come from torch.distributed.
batches = mtt.get_batches(multitables.Streamer(h5), ["/X", "/y"], 32, seed=4, n_procs=1, block_size=64, window=3)
assert (batches.batches.rank, batches.batches.world_size) == (rank, world)
loader = torch.utils.data.DataLoader(batches, batch_size=None)
epochs = []
for epoch in range(2):
    batches.set_epoch(epoch)
    rows = []
    for x, y in loader:
        assert torch.equal(x[:, 0].long(), y)
        step = torch.tensor([len(y)])
        dist.all_reduce(step)  # like DDP's gradient sync: a rank with fewer batches would hang here
        rows.append(y.tolist())
    epochs.append(rows)
dist.barrier()
with open(out, "w") as f:
    json.dump(epochs, f)
dist.destroy_process_group()
"""


def test_two_ranks_with_gloo_see_every_row_once_in_equal_steps(tmp_path: Path) -> None:
    h5 = write(tmp_path / "d.h5", 1003)  # 502 + 501 rows: the ranks' last batches differ
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    world = 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(world), str(tmp_path / "store"), str(h5), str(tmp_path / f"out{r}.json")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for r in range(world)
    ]
    try:
        outputs = [p.communicate(timeout=DDP_TIMEOUT)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{outputs[r]}"
    results = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(world)]
    for epoch in range(2):
        per_rank = [results[r][epoch] for r in range(world)]
        assert len({len(batches) for batches in per_rank}) == 1, "the ranks took different numbers of steps"
        rows = [row for batches in per_rank for batch in batches for row in batch]
        assert sorted(rows) == list(range(1003)), "the ranks together did not see every row exactly once"
        assert all(len(batch) == 32 for batches in per_rank for batch in batches[:-1])
    assert results[0][0] != results[0][1], "epoch 1 repeated epoch 0's order"


def test_the_example_trains_on_two_sharded_sources_and_resumes(tmp_path: Path) -> None:
    """``examples/train.py``: the loss falls over rounds, and a run restarted from its checkpoint goes on."""
    run = [sys.executable, str(ROOT / "examples" / "train.py"), "--rows", "20000", "--shards", "3",
           "--dir", str(tmp_path / "data"), "--checkpoint", str(tmp_path / "ckpt.pt")]  # fmt: skip
    first = subprocess.run([*run, "--rounds", "3"], capture_output=True, text=True, timeout=DDP_TIMEOUT)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [f"{s}-{i:03d}.h5" for s in ("extra", "train") for i in range(3)]
    losses = [float(line.split("loss ")[1].split()[0]) for line in first.stdout.splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0]
    again = subprocess.run([*run, "--rounds", "4"], capture_output=True, text=True, timeout=DDP_TIMEOUT)
    assert again.returncode == 0, again.stderr
    assert [line.split(":")[0] for line in again.stdout.splitlines()] == ["rank 0 round 3"]


def test_a_mix_of_batches_as_tensors(tmp_path: Path) -> None:
    files = [write(tmp_path / "a.h5", 400), write(tmp_path / "b.h5", 300)]

    def mix(steps: "int | None" = 20) -> multitables.MixedBatches:
        sources = [multitables.Streamer(f).get_batches(["/X", "/y"], 32, seed=i, n_procs=0) for i, f in enumerate(files)]
        return multitables.mix_batches(sources, [0.5, 0.5], seed=3, steps=steps)

    reference = [(x.copy(), y.copy()) for x, y in mix()]
    wrapped = mtt.TorchBatches(mix())
    assert len(wrapped) == 20
    got = list(torch.utils.data.DataLoader(wrapped, batch_size=None))
    assert len(got) == 20
    for (x, y), (rx, ry) in zip(got, reference):
        assert isinstance(x, torch.Tensor) and torch.equal(x, torch.from_numpy(rx)) and torch.equal(y, torch.from_numpy(ry))
    with pytest.raises(AttributeError, match="no epochs"):
        wrapped.set_epoch(1)
    # A loop asks before it calls (Accelerate's: if hasattr(dataset, "set_epoch")): a mix has none, batches have it.
    assert not hasattr(wrapped, "set_epoch") and hasattr(mtt.TorchBatches(mix().sources[0]), "set_epoch")
    with pytest.raises(RuntimeError, match="batch_size=None"):
        iter(torch.utils.data.DataLoader(wrapped))
    with pytest.raises(TypeError, match="endless"):
        len(mtt.TorchBatches(mix(None)))


# -- what a user's type checker sees (read here from the annotations: the tests run no type checker) ------------

#: typing.get_overloads is Python 3.11's; on 3.10 the overloads are the same, only not listed.
needs_overloads = pytest.mark.skipif(not hasattr(typing, "get_overloads"), reason="typing.get_overloads is Python 3.11's")


def keywords(function: Callable[..., object]) -> dict[str, object]:
    """``function``'s keyword-only parameters in order, with their defaults (``inspect.Parameter.empty``: required)."""
    return {p.name: p.default for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_torch_batches_are_generic_in_the_tensors_they_yield() -> None:
    """``TorchBatches[torch.Tensor]`` in an annotation: batches of one tensor each, what iterating it gives."""
    assert typing.get_origin(mtt.TorchBatches[torch.Tensor]) is mtt.TorchBatches
    (kind,) = mtt.TorchBatches.__parameters__
    assert typing.get_type_hints(mtt.TorchBatches.__iter__)["return"] == typing.Iterator[kind]


@needs_overloads
def torch_draw() -> float:
    return torch.rand(1, dtype=torch.float64).item()


def test_each_reader_draws_its_own_torch_random_numbers(h5: Path, tmp_path: Path, no_leaks: None) -> None:
    """torch.rand in a transform, as in a DataLoader worker's __getitem__, gives other numbers in each reader (NOTE
    [random draws in readers]): torch's generator starts from one seed in every process, and forks copy its state."""
    drawn = drawn_by_each_reader(h5, tmp_path / "in", torch_draw, mtt.get_batches)
    assert len(drawn) == 2 and sum(map(len, drawn.values())) == 1003 // 64, drawn
    draws = [d for each in drawn.values() for d in each]
    assert len(set(draws)) == len(draws), drawn


def test_a_transform_that_returns_a_tensor_is_told_to_return_an_array(h5: Path) -> None:
    """A DataLoader's __getitem__ often ends in a tensor; moved into a transform as it was, the error says what to give."""
    with pytest.raises(TypeError, match=r"got Tensor; return np\.asarray\(\.\.\.\) of it"):
        mtt.get_batches(multitables.Streamer(h5), "/X", 64, transform=lambda rows: torch.from_numpy(rows).float())


def test_the_coming_from_dataloader_example_runs_as_written_and_resumes_after_its_last_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None) -> None:
    """docs/training.rst's "Coming from DataLoader": 1,000 rows in batches of 64, drop_last: 15 a pass, 45 steps; the
    last checkpoint (step 40) is at batch 10 of epoch 2, so the resumed batches give the 5 batches left."""
    text = (ROOT / "docs" / "training.rst").read_text()
    section = text[text.index("Coming from DataLoader\n---") :]
    snippet = re.search(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", section).group(1)  # type: ignore[union-attr]
    _example_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__main__"}
    exec(compile(textwrap.dedent(snippet), "docs/training.rst, Coming from DataLoader", "exec"), scope)
    assert len(scope["train"]) == 1000 // 64 and scope["step"] == 3 * (1000 // 64)
    assert scope["left"] == 5 * 64
    assert 0 <= scope["correct"] <= 1000


@pytest.mark.parametrize(
    "keyword, value, told",
    [("num_workers", 2, "n_procs="), ("persistent_workers", True, "live from epoch to epoch"),
     ("sampler", None, "rank= and world_size="), ("generator", None, "seed="), ("collate_fn", None, "transform="),
     ("worker_init_fn", None, "transform="), ("prefetch_factor", 2, "read_ahead=")],
)
def test_dataloader_keywords_given_to_get_batches_say_what_takes_their_place(
        h5: Path, keyword: str, value: object, told: str) -> None:
    """Code moved from a DataLoader keyword by keyword hears where each went, before any reader starts, from both
    get_batches; the pin_memory of the batches (which multitables.torch takes) points at the adapter."""
    stream = multitables.Streamer(h5)
    for make in (stream.get_batches, functools.partial(mtt.get_batches, stream)):
        with pytest.raises(TypeError, match=f"takes no {keyword} .*{re.escape(told)}.*Coming from DataLoader"):
            make(["/X", "/y"], 64, **{keyword: value})
    with pytest.raises(TypeError, match=r"takes no pin_memory .*multitables\.torch\.get_batches"):
        stream.get_batches(["/X", "/y"], 64, pin_memory=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_workers'"):  # not DataLoader's: Python's own
        stream.get_batches(["/X", "/y"], 64, n_workers=2)


def test_get_batches_spells_out_its_own_keywords_then_every_keyword_of_batches() -> None:
    """``device`` and ``pin_memory``, then each keyword as ``Batches`` takes it: a typo is a type checker's error."""
    batches = keywords(multitables.Batches.__init__)
    overloads = typing.get_overloads(mtt.get_batches)
    assert len(overloads) == 4
    for overload in overloads:
        given = keywords(overload)
        assert list(given) == ["device", "pin_memory", *batches]
        assert given["device"] is None and given["pin_memory"] is False
        assert {k: given[k] for k in batches if k != "fields"} == {k: v for k, v in batches.items() if k != "fields"}
    fields = [keywords(overload)["fields"] for overload in overloads]
    assert fields.count(inspect.Parameter.empty) == 1 and fields.count(None) == 3


@needs_overloads
def test_the_tensors_a_type_checker_sees_follow_the_arrays_of_the_batches() -> None:
    """As ``Streamer.get_batches``' kinds (tests/test_batches.py), in tensors; wrapping batches (or a mix) keeps them."""
    TorchBatches, Batches, MixedBatches = mtt.TorchBatches, multitables.Batches, multitables.MixedBatches
    made = {}
    for overload in typing.get_overloads(mtt.get_batches):
        hints = typing.get_type_hints(overload)
        made[hints["paths"], hints["fields"]] = hints["return"]
    assert made == {
        (str, type(None)): TorchBatches[torch.Tensor],
        (str, Sequence[str]): TorchBatches[dict[str, torch.Tensor]],
        (Sequence[str], type(None)): TorchBatches[tuple[torch.Tensor, ...]],
        (str, Sequence[str] | None): TorchBatches[torch.Tensor | dict[str, torch.Tensor]],
    }
    wrapped = {}
    for overload in typing.get_overloads(TorchBatches.__init__):
        hints = typing.get_type_hints(overload)
        wrapped[hints["batches"]] = hints["self"]
    (kind,) = Batches.__parameters__  # any other kind of batches: any kind of tensors
    assert wrapped == {
        Batches[np.ndarray] | MixedBatches[np.ndarray]: TorchBatches[torch.Tensor],
        Batches[tuple[np.ndarray, ...]] | MixedBatches[tuple[np.ndarray, ...]]: TorchBatches[tuple[torch.Tensor, ...]],
        Batches[dict[str, np.ndarray]] | MixedBatches[dict[str, np.ndarray]]: TorchBatches[dict[str, torch.Tensor]],
        Batches[kind] | MixedBatches[kind]: TorchBatches[mtt.TensorBatch],
    }


#: What ``mypy --strict`` says of each line marked ``# reveal`` or ``# error`` (as tests/test_batches.py's USER_CODE).
USER_CODE = """
from typing import Sequence
import multitables
import multitables.torch as mtt
from torch.utils.data import DataLoader

def train(stream: multitables.Streamer, fields: Sequence[str] | None) -> None:
    reveal_type(mtt.get_batches(stream, "/x", 8))  # reveal: TorchBatches[Tensor]
    reveal_type(mtt.get_batches(stream, "/t", 8, fields=["a"]))  # reveal: TorchBatches[dict[str, Tensor]]
    reveal_type(mtt.get_batches(stream, ["/x", "/y"], 8, device="cpu"))  # reveal: TorchBatches[tuple[Tensor, ...]]
    reveal_type(mtt.get_batches(stream, "/t", 8, fields=fields))  # reveal: TorchBatches[Tensor | dict[str, Tensor]]
    reveal_type(mtt.TorchBatches(stream.get_batches(["/x", "/y"], 8)))  # reveal: TorchBatches[tuple[Tensor, ...]]
    mix = multitables.mix_batches([stream.get_batches("/x", 8), stream.get_batches("/x", 8, seed=1)], [1, 1])
    reveal_type(mtt.TorchBatches(mix))  # reveal: TorchBatches[Tensor]
    reveal_type(DataLoader(mtt.get_batches(stream, "/x", 8), batch_size=None))  # reveal: torch.utils.data.dataloader.DataLoader[Tensor]
    mtt.get_batches(stream, ["/x", "/y"], 8, fields=["a"])  # error: call-overload
    mtt.get_batches(stream, "/x", 8, device=0)  # error: call-overload
    mtt.TorchBatches(stream)  # error: call-overload
"""


def test_a_type_checker_sees_the_tensors_and_reports_columns_of_several_paths(tmp_path: Path) -> None:
    """What a user's ``mypy --strict`` says of the adapter: the tensors each call gives, an error for the calls that
    raise, ``fields=`` with several paths among them."""
    assert mypy_says(USER_CODE, tmp_path) == expected_of(USER_CODE)


@pytest.mark.parametrize("function", [mtt.get_batches, mtt.TorchBatches.__init__, mtt.to_tensor])
def test_the_adapters_annotations_resolve_at_run_time(function: Callable[..., object]) -> None:
    """``typing.get_type_hints`` (what run-time checkers and IDEs' introspection call) finds every name they use."""
    for each in [function, *getattr(typing, "get_overloads", lambda _: [])(function)]:
        typing.get_type_hints(each)


def test_the_adapter_says_what_it_wraps(h5: Path) -> None:
    stream = multitables.Streamer(h5)
    batches = stream.get_batches("/y", 100)
    assert repr(mtt.TorchBatches(batches)) == f"<multitables.torch.TorchBatches of {batches!r}>"
    assert repr(mtt.TorchBatches(batches, device="cpu")) == f"<multitables.torch.TorchBatches of {batches!r}, device='cpu'>"


def test_rows_a_tensor_cannot_hold_are_refused_when_the_adapter_is_made(tmp_path: Path, table_file: "tuple[Path, np.ndarray]") -> None:
    """Strings, or a table's records without fields=, are refused by get_batches, naming the path, before any reader
    starts: not at the first batch, once the first window (up to 256 MiB) was read."""
    import h5py

    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        f["names"] = np.array([b"r%d" % i for i in range(100)])
        f["y"] = np.arange(100)
    stream = multitables.Streamer(path)
    with pytest.raises(TypeError, match="'/names'"):
        mtt.get_batches(stream, ["/y", "/names"], 10, n_procs=0)
    table = multitables.Streamer(table_file[0])
    with pytest.raises(TypeError, match="'/table'"):
        mtt.get_batches(table, "/table", 10, n_procs=0)
    sources = [stream.get_batches("/names", 10, n_procs=0), stream.get_batches("/y", 10, n_procs=0)]
    with pytest.raises(TypeError, match="'/names'"):
        mtt.TorchBatches(multitables.mix_batches(sources, [0.5, 0.5]))
    # What a tensor holds still goes: columns of the table, and numbers.
    assert list(next(iter(mtt.get_batches(table, "/table", 10, fields=["a", "v"], n_procs=0)))) == ["a", "v"]
    assert next(iter(mtt.get_batches(stream, "/y", 10, n_procs=0))).dtype == torch.int64


class Preempted(Exception):
    """What a job's SIGUSR1 handler raises to leave its loop and checkpoint (SLURM's ``--signal``)."""


def _signal_in_each_call_of_a_step(batches, handler) -> "tuple[list[list[int]], int]":
    """Iterate ``batches`` (tensors of /y, or tuples whose last is /y), and through every other step have a signal
    come at each call and return of the library's frames in turn (one per pass), its handler ``handler(batches)``,
    until a step goes by with none: (the rows the loops got, the passes). After each signal, the position counts
    exactly the batches got."""
    import gc
    import signal

    hook = SignalAtCall(sys._getframe().f_code)
    got: "list[list[int]]" = []

    gc.collect()
    gc.disable()  # a collection runs finalizers anywhere: there Python drops a handler's exception too
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: handler(batches))
    try:
        armed, done = False, False
        while not done:
            try:
                for y in batches:
                    got.append((y[-1] if isinstance(y, tuple) else y).tolist())  # the loop has the batch
                    if armed:  # a whole step went by with no signal: every call of it had one
                        done = True
                        break
                    if len(got) % 2 == 0:  # every other batch: through the next batch's step
                        hook.arm()
                        armed = True
                else:
                    hook.landing, armed = hook.landing + 1, False  # a close: the loop ended at the step
            except Preempted:
                hook.landing, armed = hook.landing + 1, False
            finally:
                sys.setprofile(None)
            assert batches.state_dict()["step"] == len(got), f"signal at call/return {hook.landing - 1} of a step"
    finally:
        signal.signal(signal.SIGUSR1, old)
        gc.enable()
        batches.close()
    return got, hook.landing


def _planned_y(path: Path, paths, batch_size: int, epochs: int) -> "list[list[int]]":
    ref = multitables.Streamer(path).get_batches(paths, batch_size, seed=1, n_procs=0)
    planned = []
    for epoch in range(epochs):
        ref.set_epoch(epoch)
        planned += [(y[-1] if isinstance(y, tuple) else y).tolist() for y in ref]
    ref.close()
    return planned


@pytest.mark.parametrize("paths", ["/y", ["/X", "/y"]])
def test_a_signal_handler_that_raises_mid_step_leaves_no_tensor_batch_counted_that_the_loop_did_not_get(
    tmp_path: Path, paths
) -> None:
    """As for the batches themselves (NOTE [delivered batches]): the tensors are made in the batches' own loop,
    before the batch counts, so a handler that raises (a preemption's) at any call of the adapter's step leaves the
    position at exactly the batches the loop got; the rows got are each epoch's, none twice, none skipped."""
    path = write(tmp_path / "d.h5", 300)
    b = mtt.get_batches(multitables.Streamer(path), paths, 20, seed=1, n_procs=0, epochs=None)

    def preempted(batches) -> None:
        raise Preempted

    got, landings = _signal_in_each_call_of_a_step(b, preempted)
    assert landings > 10, "signals came at each call of a step"
    assert got == _planned_y(path, paths, 20, len(got) // 15 + 1)[: len(got)]


@pytest.mark.parametrize("then", ["returns", "raises"])
def test_a_signal_handler_may_close_the_batches_in_the_middle_of_a_step(tmp_path: Path, then: str) -> None:
    """A SIGTERM handler that closes the batches while a batch is being made (NOTE [closed mid-step]): no
    "generator already executing"; the loop ends at that step (or the handler's exception comes out of it), the
    batch being made uncounted, and the next loop goes on from the first batch not got."""
    path = write(tmp_path / "d.h5", 300)
    b = mtt.get_batches(multitables.Streamer(path), "/y", 20, seed=1, n_procs=0, epochs=None)

    def close(batches) -> None:
        batches.close()
        if then == "raises":
            raise Preempted

    got, landings = _signal_in_each_call_of_a_step(b, close)
    assert landings > 10, "signals came at each call of a step"
    assert got == _planned_y(path, "/y", 20, len(got) // 15 + 1)[: len(got)]
