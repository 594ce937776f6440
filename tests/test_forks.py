"""A forked child and its parent's readers (NOTE [forked children] in ``multitables._procs.pool``).

A program that forks while it holds training batches, a stream or a Reader
gives the child copies of them. Whatever the child does with its copies (use
them, close them, drop them, or just exit normally), the parent's readers go
on. Each case runs in a fresh interpreter, since a child that exits normally
runs the interpreter's exit handlers, which a forked pytest must not.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

#: Guards against a hang only (the parent used to wait for ever on its next batch).
GUARD = 120.0

_SCRIPT = textwrap.dedent(
    r"""
    import gc, json, os, sys
    import numpy as np
    import multitables

    path, how = sys.argv[1], sys.argv[2]
    stream = multitables.Streamer(path)
    batches = stream.get_batches(["/x"], batch_size=100, n_procs=2, shuffle=True, seed=1)
    for i, (x,) in enumerate(batches):
        if i == 2:
            break  # the readers stay, idle, for the rest of the epoch
    pids = batches.reader_pids
    queue = stream.get_queue("/x", n_procs=2, block_size=50, ordered=True)
    guard = queue.get()
    held = guard.__enter__().copy()  # the parent holds this block's slot across the fork
    reader = multitables.Reader(path, n_procs=2)
    ds = reader.get_dataset("/x")
    stage = ds.create_stage(10)
    recv, send = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(recv)
        seen = []
        for use in (lambda: next(iter(batches)), queue.get, lambda: reader.request(ds[:5], stage)):
            try:
                use()
                seen.append("no error")
            except RuntimeError as exc:
                seen.append("refused" if "is a fork of it" in str(exc) else repr(exc))
            except Exception as exc:
                seen.append(repr(exc))
        os.write(send, json.dumps(seen).encode())
        os.close(send)
        if how == "close":
            guard.__exit__(None, None, None)
            batches.close(); queue.close(); reader.close(wait=True)
            os._exit(0)
        if how == "drop":
            del batches, queue, guard, reader, ds, stage, x
            gc.collect()
            os._exit(0)
        sys.exit(0)  # exit handlers run: multiprocessing's would terminate the readers it believes it started
    os.close(send)
    seen = json.loads(os.read(recv, 4096))
    _, status = os.waitpid(child, 0)
    rest = [x for (x,) in batches]  # the rest of the epoch
    epoch = np.concatenate([x for (x,) in batches]).ravel()  # the next epoch, whole
    guard.__exit__(None, None, None)
    blocks = [held]
    for g in queue.iter():
        with g as block:
            blocks.append(block.copy())
    blocks = np.concatenate(blocks)
    picked = reader.request(ds[[5, 1]], stage).get()
    print(json.dumps({
        "seen": seen, "status": status, "rest": len(rest), "same_readers": batches.reader_pids == pids,
        "epoch": sorted(epoch.tolist()) == list(range(len(epoch))), "epoch_rows": len(epoch),
        "queue": blocks.ravel().tolist() == list(range(1000)), "reader": picked.ravel().tolist() == [5, 1],
    }))
    batches.close(); queue.close(); reader.close(wait=True)
    """
)


@pytest.fixture(scope="module")
def ids_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``/x``: 1,000 rows, each its own number, zlib in 50-row chunks."""
    path = tmp_path_factory.mktemp("forks") / "ids.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(1000, dtype="<i8").reshape(1000, 1), chunks=(50, 1), compression="gzip")
    return path


@pytest.mark.parametrize("how", ["exit", "close", "drop"])
def test_a_forked_child_neither_uses_nor_stops_its_parents_readers(ids_file: Path, how: str, no_leaks: None) -> None:
    run = subprocess.run([sys.executable, "-c", _SCRIPT, str(ids_file), how], capture_output=True, text=True, timeout=GUARD)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["seen"] == ["refused"] * 3, "a fork's use of the readers is refused, saying why"
    assert got["status"] == 0, "the child ends cleanly"
    assert got["rest"] == 10 - 3, "the parent's epoch goes on where it was"
    assert got["same_readers"] and got["epoch"] and got["epoch_rows"] == 1000, "and the next epoch is whole"
    assert got["queue"] and got["reader"], "the stream and the Reader go on too"
    assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]
