"""The calls into h5py's HDF5 that h5py does not wrap: they wait for h5py's lock, as h5py's own calls do."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import pytest
from h5py._objects import phil

from multitables._io.chunks.hdf5lib import chunk_address_base, header_address, leaves_edge_chunks_unfiltered

from _guards import hang_guard


@pytest.fixture
def dataset(tmp_path: Path) -> Any:
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.arange(100.0).reshape(50, 2), chunks=(10, 2), compression="gzip")
    with h5py.File(path, "r") as f:
        yield f["data"]


#: Each call, and its argument made from the dataset beforehand (h5py takes its lock to make it).
CALLS: "dict[str, tuple[Callable[[Any], object], Callable[[Any], Any]]]" = {
    "header_address": (header_address, lambda ds: ds.id),
    "leaves_edge_chunks_unfiltered": (leaves_edge_chunks_unfiltered, lambda ds: ds.id.get_create_plist()),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_a_call_waits_while_another_thread_holds_h5pys_lock(dataset: Any, call: str) -> None:
    """h5py's HDF5 has no thread safety of its own: two threads in it at once broke its state (small files
    streamed in this process from several threads crashed, ``tests/test_backends.py``)."""
    fn, make_argument = CALLS[call]
    argument = make_argument(dataset)
    got: list[object] = []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with phil:
            holding.set()
            release.wait()

    holder = threading.Thread(target=hold)
    caller = threading.Thread(target=lambda: got.append(fn(argument)))
    with hang_guard(30, f"{call} with h5py's lock held by another thread"):
        holder.start()
        holding.wait()
        caller.start()
        caller.join(0.5)
        waited = caller.is_alive()
        release.set()
        holder.join()
        caller.join()
    assert waited, f"{call} ran HDF5 while another thread held h5py's lock"
    assert len(got) == 1 and got[0] is not None


def test_a_chunks_address_as_hdf5_lists_it_plus_the_base_is_where_its_bytes_are(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """HDF5 before 1.14.4 (h5py 3.10-3.11's wheels) lists chunk addresses without the userblock (HDF5 issue 3003):
    the chunk engine read another chunk's bytes there (wrong rows, or a decode error)."""
    path = tmp_path / "ub.h5"
    data = np.arange(400, dtype="<i8").reshape(100, 4)
    with h5py.File(path, "w", userblock_size=4096) as f:
        f.create_dataset("data", data=data, chunks=(10, 4))
    stored = path.read_bytes()
    with h5py.File(path, "r") as f:
        dsid = f["data"].id
        for k in (0, 5):
            where = stored.find(data[10 * k : 10 * k + 10].tobytes())
            assert dsid.get_chunk_info(k).byte_offset + chunk_address_base(dsid) == where > 4096
        monkeypatch.setattr(h5py.version, "hdf5_version_tuple", (1, 14, 3))
        assert chunk_address_base(dsid) == 4096
        monkeypatch.setattr(h5py.version, "hdf5_version_tuple", (1, 14, 4))
        assert chunk_address_base(dsid) == 0
