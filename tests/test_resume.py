"""A saved position and the data it was taken on (``multitables._train.resume``, NOTE [resumed data]): a copy of the
files resumes, other data is refused naming what differs before the position moves or a reader starts (other values
of the same bytes too: NOTE [data sums]), and a state saved before the identity, or its sums, were recorded still
loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables

KW = dict(batch_size=50, seed=4, block_size=100, window=2, n_procs=1)


def write_set(folder: Path, cuts: "list[int]", scale: float = 1.0, dtype: str = "<f8", name: str = "part") -> "list[str]":
    """A set of files of /X rows ``scale * (i, -i)`` and /y ``i`` for rows ``i`` of ``cuts``' parts, zlib-compressed."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, (a, b) in enumerate(zip(cuts, cuts[1:])):
        i = np.arange(a, b)
        path = folder / f"{name}-{k}.h5"
        with h5py.File(path, "w") as f:
            x = (scale * np.stack([i, -i], axis=1)).astype(dtype)
            f.create_dataset("X", data=x, chunks=(50, 2), compression="gzip", shuffle=True)
            f.create_dataset("y", data=i.astype("<i8"), chunks=(50,), compression="gzip")
            f.create_dataset("Z", data=x, chunks=(50, 2), compression="gzip")
        paths.append(str(path))
    return paths


def saved_mid_epoch(files: "list[str]", paths=("/X", "/y")) -> "tuple[dict, list[np.ndarray]]":
    """A state saved after 3 batches (through JSON), and the /y of the rest of that epoch from the same batches."""
    b = multitables.Streamer(files).get_batches(list(paths), **KW)
    it = iter(b)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(b.state_dict()))
    rest = [batch[-1].copy() for batch in it]
    b.close()
    return state, rest


def test_a_copy_of_the_files_elsewhere_under_other_names_resumes_with_the_next_batch(tmp_path: Path) -> None:
    """A node-local copy: other folder, names, inodes and times; the same bytes."""
    files = write_set(tmp_path / "shared", [0, 600, 1000])
    state, rest = saved_mid_epoch(files)
    assert [d["rows"] for d in state["identity"]] == [[600, 400]] * 2
    assert [d["files"] for d in state["identity"]] == [["part-0.h5", "part-1.h5"]] * 2
    (tmp_path / "local").mkdir()
    copies = [shutil.copyfile(f, tmp_path / "local" / f"copy-{k}.h5") for k, f in enumerate(files)]
    resumed = multitables.Streamer([str(c) for c in copies]).get_batches(["/X", "/y"], **KW)
    resumed.check_state_dict(state)  # accepted, and nothing moved: the batches resumed are those after the state
    resumed.load_state_dict(state)
    got = [y for _x, y in resumed]
    assert len(got) == len(rest) and all(np.array_equal(a, b) for a, b in zip(got, rest))


def _changed(tmp_path: Path, how: str) -> "tuple[list[str], list[str], str]":
    """Files changed ``how`` since the state was saved on ``write_set(.., [0, 600, 1000])``, the paths to read and the
    error expected."""
    if how == "rows moved between files":  # the same 1000 rows in all, so the order's n_rows is the same
        return write_set(tmp_path / "new", [0, 500, 1000]), ["/X", "/y"], r"/X: file 0 \(part-0.h5, the state's " \
            r"part-0.h5\) has 500 rows, the state's 600; /X: file 1 .* has 500 rows, the state's 400; /y: file 0"
    if how == "written again":  # the same rows, type and shape, other values: other bytes
        return write_set(tmp_path / "new", [0, 600, 1000], scale=3.5), ["/X", "/y"], \
            r"/X: file 0 \(part-0.h5, the state's part-0.h5\) is \d+ bytes, the state's \d+"
    if how == "another type":
        return write_set(tmp_path / "new", [0, 600, 1000], dtype="<f4"), ["/X", "/y"], \
            r"/X: dtype 'float32', the state's 'float64'"
    if how == "a file more":
        return write_set(tmp_path / "new", [0, 600, 1000, 1100]), ["/X", "/y"], r"/X: 3 file\(s\), the state's 2"
    assert how == "another dataset"
    return write_set(tmp_path / "new", [0, 600, 1000]), ["/Z", "/y"], r"/Z: path '/Z', the state's '/X'"


@pytest.mark.parametrize("how", ["rows moved between files", "written again", "another type", "a file more",
                                 "another dataset"])
def test_a_state_on_other_data_is_refused_naming_what_differs_before_anything_moves(tmp_path: Path, how: str) -> None:
    state, _rest = saved_mid_epoch(write_set(tmp_path / "old", [0, 600, 1000]))
    files, paths, match = _changed(tmp_path, how)
    b = multitables.Streamer(files).get_batches(paths, **KW)
    before = b.state_dict()
    for load in (b.check_state_dict, b.load_state_dict):  # the check alone says the same
        with pytest.raises(ValueError, match="the state was saved on other data than .* holds now: " + match) as caught:
            load(state)
        assert "A copy of the same files resumes" in str(caught.value)
        assert b.state_dict() == before and b.reader_pids == []  # nothing moved, nothing started
    b.close()


def test_a_state_saved_before_the_identity_was_recorded_loads_and_resumes(tmp_path: Path) -> None:
    files = write_set(tmp_path / "d", [0, 600, 1000])
    state, rest = saved_mid_epoch(files)
    old = {k: v for k, v in state.items() if k != "identity"}  # as states were saved before
    resumed = multitables.Streamer(files).get_batches(["/X", "/y"], **KW)
    resumed.load_state_dict(old)
    got = [y for _x, y in resumed]
    assert len(got) == len(rest) and all(np.array_equal(a, b) for a, b in zip(got, rest))


def test_a_mix_refuses_a_source_on_other_data_before_any_source_moves(tmp_path: Path) -> None:
    a_files, b_files = write_set(tmp_path / "a", [0, 600, 1000]), write_set(tmp_path / "b", [0, 300])
    make = lambda bf: multitables.mix_batches(  # noqa: E731
        [multitables.Streamer(a_files).get_batches("/y", **KW), multitables.Streamer(bf).get_batches("/y", **KW)],
        [0.5, 0.5], seed=1)
    mixed = make(b_files)
    it = iter(mixed)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(mixed.state_dict()))
    mixed.close()
    other = make(write_set(tmp_path / "b2", [0, 300], scale=3.5))  # /y the same: the file's bytes differ by /X
    before = other.state_dict()
    for load in (other.check_state_dict, other.load_state_dict):
        with pytest.raises(ValueError, match=r"other data than source 1 holds now: /y \(part-0.h5\) is \d+ bytes"):
            load(state)
        assert other.state_dict() == before
    other.close()


def test_a_download_of_the_objects_resumes_where_the_objects_stopped(rangesrv, obj_files, tmp_path: Path) -> None:
    """Objects read over HTTP, the state resumed on a local copy of them: an object's size is its file's bytes."""
    urls = [f"{rangesrv.url}/shard-{i}.h5" for i in range(3)]
    kw = dict(batch_size=500, seed=2, block_size=1024, n_procs=0)
    b = multitables.Streamer(urls, storage_options={"backoff_base": 0.01}).get_batches("/y", **kw)
    it = iter(b)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(b.state_dict()))
    rest = list(it)
    assert state["identity"][0]["files"] == ["shard-0.h5", "shard-1.h5", "shard-2.h5"]
    assert state["identity"][0]["sums"] == [None] * 3  # an object is not read to be summed (NOTE [data sums])
    local = [shutil.copyfile(obj_files["folder"] / f"shard-{i}.h5", tmp_path / f"s{i}.h5") for i in range(3)]
    resumed = multitables.Streamer([str(p) for p in local]).get_batches("/y", **kw)
    resumed.load_state_dict(state)
    got = list(resumed)
    assert len(got) == len(rest) and all(np.array_equal(a, b) for a, b in zip(got, rest))
    changed = multitables.Streamer([str(p) for p in local[:2]] + [urls[0]]).get_batches("/y", **kw)
    with pytest.raises(ValueError, match=r"/y: file 2 \(shard-0.h5, the state's shard-2.h5\) has 7000 rows"):
        changed.load_state_dict(state)


def test_a_batch_beyond_its_epoch_is_refused_before_the_position_moves(tmp_path: Path) -> None:
    files = write_set(tmp_path / "d", [0, 600])
    state, _rest = saved_mid_epoch(files, paths=("/y",))
    b = multitables.Streamer(files).get_batches("/y", **{**KW, "n_procs": 0})
    head = [y.copy() for _, y in zip(range(2), b)]
    before = b.state_dict()
    with pytest.raises(ValueError, match="batch=99 is beyond the 12 batches of that epoch"):
        b.load_state_dict({**state, "batch": 99, "step": 99})
    assert b.state_dict() == before
    whole = [y.copy() for _, y in zip(range(5), multitables.Streamer(files).get_batches("/y", **{**KW, "n_procs": 0}))]
    for got, want in zip(head + [y.copy() for _, y in zip(range(3), b)], whole, strict=True):
        np.testing.assert_array_equal(got, want)


def write_plain(folder: Path, parts: "list[np.ndarray]") -> "list[str]":
    """A set of files of /X ``parts[k]`` and /y its row numbers, stored as they are: other values keep every file's
    bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, offset = [], 0
    for k, x in enumerate(parts):
        path = folder / f"plain-{k}.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("X", data=x, chunks=(50, 2))
            f.create_dataset("y", data=np.arange(offset, offset + len(x)), chunks=(50,))
        offset += len(x)
        paths.append(str(path))
    return paths


PLAIN = [np.arange(300.0).reshape(150, 2), np.arange(300.0, 500.0).reshape(100, 2)]  # files of 3 and 2 chunks


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_one_value_written_again_in_one_file_is_refused_and_a_copy_is_not(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    folder = tmp_path_factory.mktemp("values")
    state = multitables.Streamer(write_plain(folder / "old", PLAIN)).get_batches(["/X", "/y"], **KW).state_dict()
    k = data.draw(st.integers(0, len(PLAIN) - 1), label="file")
    row, col = data.draw(st.integers(0, len(PLAIN[k]) - 1), label="row"), data.draw(st.integers(0, 1), label="col")
    new = [x.copy() for x in PLAIN]
    new[k][row, col] = data.draw(st.floats(allow_nan=False).filter(lambda v: v != PLAIN[k][row, col]), label="value")
    copy = multitables.Streamer(write_plain(folder / "copy", PLAIN)).get_batches(["/X", "/y"], **KW)
    copy.check_state_dict(json.loads(json.dumps(state)))
    changed = multitables.Streamer(write_plain(folder / "new", new)).get_batches(["/X", "/y"], **KW)
    with pytest.raises(ValueError, match=rf"/X: file {k} \(plain-{k}.h5, the state's plain-{k}.h5\) holds other "
                                         rf"values: the sum of its sampled stored bytes is "
                                         rf"[0-9a-f]{{8}}, the state's [0-9a-f]{{8}} \(NOTE \[data sums\]\)"):
        changed.check_state_dict(state)


def test_rows_shuffled_otherwise_are_refused_and_resume_once_the_state_drops_its_sums(tmp_path: Path) -> None:
    """Preprocessing run again with another seed: the same file bytes, other rows at each place. A user who means it
    takes the sums out of the state and keeps the other checks; a state saved before sums were taken loads so too."""
    files = write_plain(tmp_path / "old", PLAIN)
    state, _rest = saved_mid_epoch(files)
    assert all(len(d["sums"]) == 2 and None not in d["sums"] for d in state["identity"])
    shuffled = [x[np.random.default_rng(k).permutation(len(x))] for k, x in enumerate(PLAIN)]
    again = write_plain(tmp_path / "again", shuffled)
    assert [Path(p).stat().st_size for p in again] == [Path(p).stat().st_size for p in files]
    b = multitables.Streamer(again).get_batches(["/X", "/y"], **KW)
    before = b.state_dict()
    with pytest.raises(ValueError, match=r"/X: file 0 \(plain-0.h5, .*\) holds other values: .*; /X: file 1 .* holds "
                                         r"other values: .*without each dataset's 'sums': the other checks stay"):
        b.load_state_dict(state)
    assert b.state_dict() == before and b.reader_pids == []
    unsummed = {**state, "identity": [{k: v for k, v in d.items() if k != "sums"} for d in state["identity"]]}
    with pytest.raises(ValueError, match=r"/X: file 1 \(plain-1.h5, the state's plain-1.h5\) has 100 rows"):
        b.load_state_dict({**unsummed, "identity": [{**d, "rows": [100, 150]} for d in unsummed["identity"]]})
    b.load_state_dict(unsummed)  # the other checks stay; these pass
    _state, rest = saved_mid_epoch(again)
    got = [y for _x, y in b]
    assert len(got) == len(rest) and all(np.array_equal(g, r) for g, r in zip(got, rest))
