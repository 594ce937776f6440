"""What users hand over as a file (``multitables._io.names``, NOTE [naming files]): names, ``file://`` URLs, and what
is no name, refused before anything opens with the error a Python user expects and what to pass instead."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import h5py
import numpy as np
import pytest
import tables

import multitables

ROWS = 300


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    """``data.h5`` with ``/data``: ``ROWS`` rows of 4 float32."""
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f["data"] = np.arange(ROWS * 4, dtype="<f4").reshape(ROWS, 4)
    return path


def _read_all(source: Any, n_procs: int = 2) -> np.ndarray:
    with multitables.Streamer(source).get_queue("/data", n_procs=n_procs, remainder=True, ordered=True) as queue:
        blocks = []
        for guard in queue.iter():
            with guard as block:
                blocks.append(block.copy())
    return np.concatenate(blocks)


#: Every face that takes a file: the Streamer (and with it its batches), the Reader.
FACES: "dict[str, Callable[[Any], Any]]" = {
    "Streamer": lambda source: multitables.Streamer(source).get_queue("/data", n_procs=2),
    "get_batches": lambda source: multitables.Streamer(source).get_batches("/data", 10, n_procs=2),
    "Reader": lambda source: multitables.Reader(source, n_procs=2),
}


# -- what is no name ---------------------------------------------------------------------------------------------------


@pytest.fixture
def handles(data_file: Path) -> Iterator[dict[str, Any]]:
    """Open objects users of h5py, PyTables and ``open()`` hand over, each with the words its refusal must hold."""
    h5 = h5py.File(data_file, "r")
    memory = h5py.File(data_file.with_name("in-memory.h5"), "w", driver="core", backing_store=False)
    memory["data"] = np.zeros((10, 2))
    with tables.open_file(data_file.with_name("table.h5"), "w") as f:
        f.create_table("/", "table", {"x": tables.Int32Col()}).append([(1,)] * 10)
    pt = tables.open_file(data_file.with_name("table.h5"), "r")
    binary = open(data_file, "rb")
    table_name = str(data_file.with_name("table.h5"))
    try:
        yield {
            "h5py.File": (h5, [repr(str(data_file)), "file.filename"]),
            "h5py.Dataset": (h5["data"], [repr(str(data_file)), "'/data'", "dataset.name"]),
            "h5py.File in memory": (memory, ["driver='core'", "write it to a file"]),
            "tables.File": (pt, [repr(table_name), "file.filename"]),
            "tables.Table": (pt.root.table, [repr(table_name), "'/table'", "node._v_pathname"]),
            "tables.Column": (pt.root.table.cols.x, [repr(table_name), "'/table'", "field='x'"]),
            "open binary file": (binary, [repr(str(data_file)), "file.name"]),
            "io.BytesIO": (io.BytesIO(data_file.read_bytes()), ["in memory has no name"]),
            "set": ({str(data_file), str(data_file.with_name("other.h5"))}, ["no order", "sorted(files)"]),
            "bytearray": (bytearray(os.fsencode(data_file)), ["not bytearray", "bytes(name)"]),
            "list of h5py.Dataset": ([h5["data"]], [repr(str(data_file)), "'/data'"]),
        }
    finally:
        for handle in (h5, memory, pt, binary):
            handle.close()


HANDLES = ["h5py.File", "h5py.Dataset", "h5py.File in memory", "tables.File", "tables.Table", "tables.Column",
           "open binary file", "io.BytesIO", "set", "bytearray", "list of h5py.Dataset"]


@pytest.mark.parametrize("face", list(FACES))
@pytest.mark.parametrize("kind", HANDLES)
def test_what_is_no_name_is_refused_saying_what_to_pass(handles: dict[str, Any], kind: str, face: str,
                                                        no_leaks: None) -> None:
    """These used to be iterated as lists of names: a file object's lines, a dataset's rows, a File's keys (read as
    files of the working directory: FileNotFoundError 'data'), a set in another order each run."""
    handle, words = handles[kind]
    with pytest.raises(TypeError) as info:
        FACES[face](handle)
    for word in words:
        assert word in str(info.value)


def test_the_names_a_refusal_gives_read_the_node(handles: dict[str, Any], data_file: Path, no_leaks: None) -> None:
    """What a refusal says to pass works: the file's name and the dataset's path."""
    dataset = handles["h5py.Dataset"][0]
    stream = multitables.Streamer(dataset.file.filename)
    assert np.array_equal(np.stack(list(stream.get_generator(dataset.name, n_procs=2, ordered=True))), dataset[()])


# -- names that cannot mean a file -------------------------------------------------------------------------------------


@pytest.mark.parametrize("face", list(FACES))
def test_an_empty_name_is_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, face: str, no_leaks: None) -> None:
    """It used to name the working directory: IsADirectoryError for a directory the caller never named."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        FACES[face]("")
    assert info.value.filename == "" and "empty" in str(info.value)


@pytest.mark.parametrize("face", list(FACES))
def test_a_tilde_is_not_expanded_and_the_error_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, face: str,
                                                       no_leaks: None) -> None:
    """As open() and h5py: not expanded. The error used to name '<cwd>/~/x.h5', never the name given."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(FileNotFoundError) as info:
        FACES[face]("~/x.h5")
    assert info.value.filename == "~/x.h5"
    assert "os.path.expanduser" in str(info.value) and repr(str(tmp_path / "home" / "x.h5")) in str(info.value)


def test_a_file_named_with_a_tilde_is_read(data_file: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None) -> None:
    monkeypatch.chdir(data_file.parent)
    (data_file.parent / "~").mkdir()
    os.link(data_file, data_file.parent / "~" / "x.h5")
    assert len(_read_all("~/x.h5")) == ROWS


@pytest.mark.parametrize("face", list(FACES))
@pytest.mark.parametrize("url", ["gs://bucket/x.h5", "hf://datasets/x/y.h5", "ftp://host/x.h5"])
def test_a_url_of_a_scheme_not_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, face: str,
                                               no_leaks: None) -> None:
    """It used to be a local path: FileNotFoundError for '<cwd>/gs:/bucket/x.h5'."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="does not read") as info:
        FACES[face](url)
    assert repr(url) in str(info.value) and "s3://" in str(info.value)


def test_a_nul_in_a_name_is_refused_naming_it(no_leaks: None) -> None:
    with pytest.raises(ValueError) as info:
        multitables.Streamer("x\0.h5")
    assert repr("x\0.h5") in str(info.value)


_UNREADABLE = """
import sys, multitables
for face in (lambda: multitables.Streamer(sys.argv[1]).get_queue("/data", n_procs=2), lambda: multitables.Reader(sys.argv[1])):
    try:
        face()
    except PermissionError as exc:
        print(exc.filename, "|", exc)
"""


def test_a_file_this_process_may_not_read_is_a_permission_error_naming_it(data_file: Path, no_leaks: None) -> None:
    """As open() says it. It used to be HDF5's sentence ('Unable to determine if file is accessible as hdf5 (unable
    to open file: name = ..., errno = 13, ...)'), the name inside it, and no ``filename``."""
    data_file.chmod(0)
    command = [sys.executable, "-c", _UNREADABLE, str(data_file)]
    if os.geteuid() == 0:  # root reads any file: run it without the capabilities that let it
        if shutil.which("setpriv") is None:
            pytest.skip("run as root, and no setpriv to drop CAP_DAC_OVERRIDE with")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] + command
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    for line in lines:
        assert line == f"{data_file} | [Errno 13] Permission denied: this process may not read the HDF5 file: '{data_file}'"


# -- file:// URLs ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["file://", "file://localhost", "FILE://"])
def test_a_file_url_names_a_local_file(data_file: Path, prefix: str, no_leaks: None) -> None:
    """It used to be a relative path: FileNotFoundError for '<cwd>/file:/...'."""
    spaced = data_file.with_name("a file é.h5")
    data_file.rename(spaced)
    url = prefix + Path(spaced).as_uri()[len("file://"):]  # percent-escaped: 'a%20file%20%C3%A9.h5'
    assert "%20" in url
    stream = multitables.Streamer(url)
    assert stream.filename == str(spaced)
    assert len(_read_all(url)) == ROWS
    reader = multitables.Reader(url, n_procs=0)
    try:
        assert reader.get_dataset("/data").shape == (ROWS, 4)
    finally:
        reader.close(wait=True)


def test_a_file_url_of_another_host_is_refused(no_leaks: None) -> None:
    with pytest.raises(ValueError, match="names a file on host 'server'"):
        multitables.Streamer("file://server/share/x.h5")


# -- names taken as they are -------------------------------------------------------------------------------------------


class _PathLike:
    def __init__(self, path: str) -> None:
        self._path = path

    def __fspath__(self) -> str:
        return self._path


@pytest.mark.parametrize("kind", ["str", "Path", "PathLike", "bytes", "generator", "mixed list", "numpy names"])
def test_every_kind_of_name_reads_the_same_rows(data_file: Path, kind: str, no_leaks: None) -> None:
    name = str(data_file)
    source = {
        "str": name, "Path": data_file, "PathLike": _PathLike(name), "bytes": os.fsencode(name),
        "generator": (p for p in [data_file]), "mixed list": [data_file, name], "numpy names": np.array([name]),
    }[kind]
    got = _read_all(source)
    with h5py.File(data_file, "r") as f:
        expected = f["data"][()]
    assert np.array_equal(got, np.concatenate([expected] * (2 if kind == "mixed list" else 1)))
