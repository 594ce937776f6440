"""A forked child and its parent's readers (NOTE [forked children] in ``multitables._procs.pool``).

A program that forks while it holds training batches, a stream or a Reader
gives the child copies of them. Whatever the child does with its copies (use
them, close them, drop them, or just exit normally), the parent's readers go
on. Each case runs in a fresh interpreter, since a child that exits normally
runs the interpreter's exit handlers, which a forked pytest must not.

A daemonic process (a ``multiprocessing.Pool``'s or a DataLoader's worker)
may start no process at all: there the defaults read in the process, and
asking for readers is refused, saying why, before anything starts.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from _forked import in_a_fork

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
    it = iter(batches)
    for _ in range(3):
        (x,) = next(it)  # the readers stay, idle, for the rest of the epoch
    pids = batches.reader_pids
    queue = stream.get_queue("/x", n_procs=2, block_size=50, ordered=True)
    guard = queue.get()
    held = guard.__enter__().copy()  # the parent holds this block's slot across the fork
    reader = multitables.Reader(path, n_procs=2)
    ds = reader.get_dataset("/x")
    stage = ds.create_stage(10)
    held_stage = ds.create_stage(5)
    future = reader.request(ds[:5], held_stage)
    future.wait()  # its rows are in its stage: a child's copy of that stage may hold others by the time it looks
    recv, send = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(recv)
        seen = []
        for use in (lambda: next(it), queue.get, lambda: reader.request(ds[:5], stage), future.get,
                    future.done, future.wait, lambda: reader.request(ds[:5], held_stage)):  # held: the parent's
            try:
                use()
                seen.append("no error")
            except RuntimeError as exc:
                seen.append("refused" if "is a fork of it" in str(exc) else repr(exc))
            except Exception as exc:
                seen.append(repr(exc))
        advice = {}
        for what, use in (("queue", queue.get), ("reader", lambda: reader.request(ds[:5], stage))):
            try:
                use()
            except RuntimeError as exc:
                advice[what] = str(exc)
        (y,) = next(iter(batches))  # a new iteration here: readers of its own, from the same position
        own = {"rows": y.ravel().tolist(), "readers": bool(batches.reader_pids) and not set(batches.reader_pids) & set(pids)}
        os.write(send, json.dumps({"seen": seen, "advice": advice, "own": own}).encode())
        os.close(send)
        if how == "close":
            guard.__exit__(None, None, None)
            batches.close(); queue.close(); reader.close(wait=True)
            os._exit(0)
        if how == "drop":
            del batches, queue, guard, reader, ds, stage, x, future, held_stage
            gc.collect()
            os._exit(0)
        sys.exit(0)  # exit handlers run: multiprocessing's would terminate the readers it believes it started
    os.close(send)
    seen, advice, own = json.loads(os.read(recv, 16384)).values()
    _, status = os.waitpid(child, 0)
    rest = [x for (x,) in batches]  # the rest of the epoch
    own["rows"] = own["rows"] == rest[0].ravel().tolist()
    epoch = np.concatenate([x for (x,) in batches]).ravel()  # the next epoch, whole
    guard.__exit__(None, None, None)
    blocks = [held]
    for g in queue.iter():
        with g as block:
            blocks.append(block.copy())
    blocks = np.concatenate(blocks)
    picked = reader.request(ds[[5, 1]], stage).get()
    first = future.get()
    print(json.dumps({
        "seen": seen, "advice": advice, "own": own, "status": status, "rest": len(rest), "same_readers": batches.reader_pids == pids,
        "epoch": sorted(epoch.tolist()) == list(range(len(epoch))), "epoch_rows": len(epoch),
        "queue": blocks.ravel().tolist() == list(range(1000)), "reader": picked.ravel().tolist() == [5, 1] and first.ravel().tolist() == list(range(5)),
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


class _Garbage:
    """A cycle left to the collector, whose finalizer writes the pid of the process that collected it to ``fd``."""

    def __init__(self, fd: int) -> None:
        self.me, self.fd = self, fd

    def __del__(self) -> None:
        os.write(self.fd, f"{os.getpid()} ".encode())


def _collected_by(read: int, write: int) -> "list[int]":
    os.close(write)
    got = b""
    while chunk := os.read(read, 4096):
        got += chunk
    os.close(read)
    return [int(pid) for pid in got.split()]


@pytest.mark.parametrize("collecting", [True, False])
def test_a_process_forked_as_a_reader_never_collects_the_garbage_it_inherited(collecting: bool) -> None:
    # NOTE [the consumer's garbage]: a CUDA tensor freed in a forked child aborts it. The child's own collections go
    # on, with the collector on or off as it was in the parent.
    from multitables._sys.forks import collector_paused_for_readers

    read, write = os.pipe()
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        with collector_paused_for_readers():
            _Garbage(write)  # here the garbage waits for the collector, as at any fork
            pid = os.fork()
            if pid == 0:
                gc.collect()
                os._exit(0 if gc.isenabled() == collecting else 3)
        assert gc.isenabled() == collecting
    finally:
        (gc.enable if was else gc.disable)()
    assert os.waitpid(pid, 0)[1] == 0
    gc.collect()
    assert _collected_by(read, write) == [os.getpid()]


def test_the_collector_comes_back_once_the_last_of_several_threads_forking_readers_is_done() -> None:
    # Two threads' starts overlapping: the first to end leaves the collector off for the other's forks.
    from multitables._sys.forks import collector_paused_for_readers

    was = gc.isenabled()
    gc.enable()
    try:
        first, second = collector_paused_for_readers(), collector_paused_for_readers()
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)
        assert not gc.isenabled()
        second.__exit__(None, None, None)
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_readers_leave_the_consumers_garbage_to_the_consumer(ids_file: Path, no_leaks: None) -> None:
    import multitables

    consumer = os.getpid()

    def collecting(rows: np.ndarray) -> np.ndarray:  # a transform that makes the readers collect (as any might)
        if os.getpid() != consumer:
            gc.collect()
        return rows

    read, write = os.pipe()
    was = gc.isenabled()
    gc.disable()
    try:
        _Garbage(write)
        b = multitables.Streamer(ids_file).get_batches("/x", 100, n_procs=2, shuffle=False, transform=collecting)
        assert np.concatenate(list(b)).ravel().tolist() == list(range(1000))
        assert len(set(b.reader_pids)) == 2
        b.close()
    finally:
        (gc.enable if was else gc.disable)()
    gc.collect()
    assert _collected_by(read, write) == [consumer]


def test_a_forked_child_reads_the_next_epochs_first_window_itself(tmp_path: Path, no_leaks: None) -> None:
    # The parent read the next epoch's first window ahead into its window buffers, which a fork does not copy (NOTE
    # [window buffers and fork]): a child going on with that epoch reads it again, and gets its rows, not zeros.
    import multitables

    path = tmp_path / "ids.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(1, 20001, dtype="<i8").reshape(-1, 1), chunks=(500, 1), compression="gzip")
    kw = dict(batch_size=100, shuffle=True, seed=1, window=4, block_size=500)
    reference = multitables.Streamer(path).get_batches("/x", n_procs=0, **kw)
    reference.set_epoch(2)
    want = np.concatenate(list(reference)).ravel().tolist()
    batches = multitables.Streamer(path).get_batches("/x", n_procs=2, **kw)
    for epoch in range(2):  # a loop of epochs: epoch 2's first window is read during epoch 1
        batches.set_epoch(epoch)
        for _ in batches:
            pass
    assert batches._carry is not None and batches._carry.filled > 0

    def next_epoch() -> object:
        batches.set_epoch(2)
        got = np.concatenate(list(batches)).ravel().tolist()
        batches.close()
        return got

    assert in_a_fork(next_epoch) == {"result": want}
    batches.set_epoch(2)  # the parent's own read ahead serves it still
    assert np.concatenate(list(batches)).ravel().tolist() == want
    batches.close()


def test_a_forked_child_iterates_its_copy_with_copy_threads_of_its_own(
        ids_file: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None) -> None:
    # Where the batches copy on threads (8 CPUs or more: NOTE [parallel copies]), a fork has none of them: a child
    # that used the parent's copier waited for ever on threads it believed idle.
    import multitables
    import multitables._train.buffers as buffers

    monkeypatch.setattr(buffers, "copy_threads", lambda: 4)
    batches = multitables.Streamer(ids_file).get_batches("/x", 100, n_procs=2, seed=3, window=4, block_size=50)
    first = [x.ravel().tolist() for x in batches]  # the copier's threads made, idle now
    assert batches._memory is not None and batches._memory.copier.threads == 4

    def again() -> object:
        batches.set_epoch(0)
        got = [x.ravel().tolist() for x in batches]
        batches.close()
        return got

    assert in_a_fork(again) == {"result": first}
    batches.close()


@pytest.mark.parametrize("how", ["exit", "close", "drop"])
def test_a_forked_child_neither_uses_nor_stops_its_parents_readers(ids_file: Path, how: str, no_leaks: None) -> None:
    run = subprocess.run([sys.executable, "-c", _SCRIPT, str(ids_file), how], capture_output=True, text=True, timeout=GUARD)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["seen"] == ["refused"] * 7, (
        "a fork's use of the readers, of a request's future, or of an iteration of batches (what it read is not in the "
        "fork), is refused, saying why")
    assert got["own"] == {"rows": True, "readers": True}, "a new iteration of the batches there goes on with readers of its own"
    # What to do instead: a pre-fork server (gunicorn --preload) makes its Reader in each worker.
    assert got["advice"]["reader"].endswith(
        "make a Reader anew in this process; a server that forks its workers (gunicorn with --preload, say) makes one "
        "in each worker (gunicorn's post_fork hook, or at a worker's first request), not in the parent before it forks"
    ), got["advice"]
    assert got["advice"]["queue"].endswith(": make the stream or batches anew here"), got["advice"]
    assert got["status"] == 0, "the child ends cleanly"
    assert got["rest"] == 10 - 3, "the parent's epoch goes on where it was"
    assert got["same_readers"] and got["epoch"] and got["epoch_rows"] == 1000, "and the next epoch is whole"
    assert got["queue"] and got["reader"], "the stream and the Reader go on too"
    assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]


_GENERATOR = textwrap.dedent(
    r"""
    import json, os, sys
    import multitables

    rows = multitables.Streamer(sys.argv[1]).get_generator("/x", n_procs=2, block_size=100, ordered=True)
    first = [int(next(rows)[0]) for _ in range(3)]  # the parent is inside a block lent from its readers' slot
    recv, send = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(recv)
        try:
            seen = f"a row: {int(next(rows)[0])}"
        except RuntimeError as exc:
            seen = "refused" if "is a fork of it" in str(exc) else repr(exc)
        except Exception as exc:
            seen = repr(exc)
        os.write(send, seen.encode())
        os._exit(0)
    os.close(send)
    seen = os.read(recv, 4096).decode()
    os.waitpid(child, 0)
    print(json.dumps({"seen": seen, "parent": first + [int(r[0]) for r in rows] == list(range(1000))}))
    """
)


def test_a_forked_child_walking_its_parents_generator_is_refused_at_its_first_row(ids_file: Path, no_leaks: None) -> None:
    """The rows of the block the parent was walking are its readers' slot, which the parent gives back as it moves
    on: a child that went on walking them got rows of other blocks, silently, once the readers refilled it."""
    run = subprocess.run([sys.executable, "-c", _GENERATOR, str(ids_file)], capture_output=True, text=True, timeout=GUARD)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["seen"] == "refused", "a fork's next row from its parent's readers is refused, saying why"
    assert got["parent"], "the parent's rows go on, whole"
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


_DAEMONIC = textwrap.dedent(
    r"""
    import json, multiprocessing, sys
    import numpy as np
    import multitables

    def job(args):
        path, case = args
        try:
            if case == "default":
                return [int(r[0]) for r in multitables.Streamer(path).get_generator("/x")] == list(range(1000))
            if case == "tables":  # PyTables' up-front probe forks a child where the process may
                got = []
                with multitables.Streamer(path, engine="tables").get_queue("/x", ordered=True) as q:
                    for guard in q.iter():
                        with guard as block:
                            got.append(block.copy())
                return np.concatenate(got).ravel().tolist() == list(range(1000))
            if case == "batches":
                batches = multitables.Streamer(path).get_batches(["/x"], batch_size=100, seed=1)
                epochs = [sorted(np.concatenate([x for (x,) in batches]).ravel().tolist()) for _ in range(2)]
                return epochs == [list(range(1000))] * 2 and batches.reader_pids == []
            if case == "n_procs=2":
                multitables.Streamer(path).get_queue("/x", n_procs=2)
            if case == "Reader":  # readers asked for (by default a Reader reads in a daemonic process: test_inline.py)
                multitables.Reader(path, n_procs=1)
            if case == "inherited":  # a Reader the parent made before the pool forked this worker
                if INHERITED is None:
                    return "not inherited"
                reader, ds, stage = INHERITED
                reader.request(ds[:2], stage).get()
            return "no error"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    INHERITED = None
    if __name__ == "__main__":
        cases = ["default", "tables", "batches", "n_procs=2", "Reader", "inherited"]
        if sys.argv[2] == "fork":
            reader = multitables.Reader(sys.argv[1], n_procs=1)
            INHERITED = reader, reader.get_dataset("/x"), reader.get_dataset("/x").create_stage(2)
        with multiprocessing.get_context(sys.argv[2]).Pool(1) as pool:
            print(json.dumps(dict(zip(cases, pool.map(job, [(sys.argv[1], c) for c in cases])))))
    """
)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_daemonic_worker_reads_in_itself_and_is_told_why_it_cannot_start_readers(
    ids_file: Path, tmp_path: Path, start_method: str, no_leaks: None
) -> None:
    """Rows as h5py's, read in the worker (what the defaults plan there on a large file: ``test_plan``), and a
    refusal that says why where readers are asked for."""
    script = tmp_path / "daemonic.py"  # spawn imports the main module again: a file, not -c
    script.write_text(_DAEMONIC)
    run = subprocess.run([sys.executable, str(script), str(ids_file), start_method], capture_output=True, text=True,
                         timeout=GUARD)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["default"] is True and got["tables"] is True and got["batches"] is True, got
    for case in ("n_procs=2", "Reader"):  # multiprocessing's bare "AssertionError: daemonic processes are not ..."
        assert got[case].startswith("RuntimeError: ") and "this process is daemonic" in got[case], got
        assert repr(str(ids_file)) in got[case], got
    # A Reader's user is told what works for random access (a stream's n_procs=0 does not): test_reader.py
    assert "n_procs=0" in got["n_procs=2"] and "make a Reader with n_procs=0 in each worker" in got["Reader"], got
    if start_method == "fork":  # told it may start none of its own either, not to make one anew
        assert got["inherited"].startswith("RuntimeError: ") and "is a fork of it" in got["inherited"], got
        assert "being daemonic" in got["inherited"] and "n_procs=0 in each worker" in got["inherited"], got
    else:
        assert got["inherited"] == "not inherited", got


def test_streams_leave_multiprocessings_start_method_to_the_user(tmp_path: Path) -> None:
    """Streams, batches and a Reader with the default start method use multiprocessing's default without fixing it:
    the user's later ``set_start_method`` still works, as in a notebook whose cells run in any order."""
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(4000.0).reshape(1000, 4), chunks=(100, 4), compression="gzip")
    script = textwrap.dedent(
        """
        import multiprocessing, sys, multitables
        stream = multitables.Streamer(sys.argv[1])
        with stream.get_queue("/x", n_procs=2) as queue:
            for guard in queue.iter():
                guard.release()
        batches = stream.get_batches("/x", 100, n_procs=1)
        next(iter(batches))
        batches.close()
        with multitables.Reader(sys.argv[1], n_procs=1) as reader:
            reader.get_dataset("/x")
        print(multiprocessing.get_start_method(allow_none=True))
        multiprocessing.set_start_method("spawn")
        rows = 0
        with stream.get_queue("/x", n_procs=1) as queue:
            for guard in queue.iter():
                with guard as block:
                    rows += len(block)
        print(rows, multiprocessing.get_start_method())
        """
    )
    run = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["None", "1000", "spawn"]


_SERVER_SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing, os, sys
    import multitables
    from multitables._plan import costs, readers
    from multitables._sys import forks

    multiprocessing.set_start_method("forkserver")
    readers.available_cpus = lambda: 2
    costs._DECODE_RATE[1] /= 1024  # this 256 KiB file priced as 256 MiB of it would be
    if sys.argv[2] == "theirs":  # a fork server this library did not start: without the readers' modules
        first = multiprocessing.Process(target=os.getpid)
        first.start()
        first.join()
    stream = multitables.Streamer(sys.argv[1], engine="h5py")
    seen = []
    for _ in range(4):
        with stream.get_queue("/x") as queue:
            rows = 0
            for guard in queue.iter():
                with guard as block:
                    rows += len(block)
            seen.append([queue.n_procs, rows, forks.server_ready()])
    print(json.dumps(seen))
    """
)


@pytest.mark.parametrize("server", ["none", "theirs"])
def test_the_fork_servers_first_start_is_bought_once_streams_forwent_its_price(tmp_path: Path, server: str) -> None:
    """NOTE [fork server] in ``multitables._sys.forks``: under ``forkserver`` a stream too small to pay for the
    server's first start reads in the consumer; once such streams have forgone that price, the next starts readers,
    and the server it starts, with the readers' modules loaded, makes every later start cheap. A server someone else
    started never gets cheap: each start from it imports the readers' modules."""
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        data = np.random.default_rng(0).random((64, 1024), "f4")
        f.create_dataset("x", data=data, chunks=(8, 1024), compression="gzip")
    run = subprocess.run([sys.executable, "-c", _SERVER_SCRIPT, str(path), server], capture_output=True, text=True,
                         timeout=GUARD)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout)
    if server == "none":
        assert seen == [[0, 64, False], [0, 64, False], [2, 64, True], [2, 64, True]]
    else:
        assert seen == [[0, 64, False]] * 4


def _run_as_main(monkeypatch: pytest.MonkeyPatch, script: Path, source: str) -> dict:
    """Run ``source`` as the main script ``script`` of this process (its file written, its module ``__main__``)."""
    import types

    script.write_text(source)
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    exec(compile(source, str(script), "exec"), vars(main))
    return vars(main)


def test_a_script_that_reads_at_its_top_level_is_told_to_guard_it_before_any_reader_starts(
    ids_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_leaks: None
) -> None:
    """Readers started by spawn or forkserver (Python 3.14's default) run the main script again: at its top level,
    outside ``if __name__ == "__main__":``, they would start readers of theirs, which multiprocessing refuses. They
    died, and the consumer said only that (or, where the fork server runs the script, ``EOFError``); now the consumer
    refuses first, naming the script's line (NOTE [the main script again] in ``multitables._sys.forks``)."""
    script = tmp_path / "train.py"
    source = (
        "import multitables\n"
        f"stream = multitables.Streamer({str(ids_file)!r}, start_method='forkserver')\n"
        "with stream.get_queue('/x', n_procs=1) as queue:\n"
        "    pass\n"
    )
    with pytest.raises(RuntimeError) as caught:
        _run_as_main(monkeypatch, script, source)
    assert str(caught.value) == (
        f"{script}, line 3, reads {str(ids_file)!r} with reader processes from the script's top level, and readers "
        "started by forkserver (forkserver is the default from Python 3.14 on Linux, spawn on macOS) run the script "
        "again, which would start readers of theirs: put the script's code under 'if __name__ == \"__main__\":' "
        "(NOTE [the main script again] in multitables._sys.forks), or give start_method='fork'"
    )


def test_where_the_main_script_calls_and_defines_what_a_script_run_again_would_not_see(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call from a top-level line in no ``if`` (an ``if`` after it in its loop is none) runs again (any ``if`` may be a guard of the user's own); a
    function defined under ``if __name__ == "__main__":`` (not under its ``else``, nor under another ``if``) does not."""
    from multitables._sys.forks import unguarded_main_call, under_main_guard

    scope = _run_as_main(monkeypatch, tmp_path / "job.py", (
        "from multitables._sys.forks import unguarded_main_call\n"
        "def top(rows):\n"
        "    return rows\n"
        "bare = unguarded_main_call()\n"
        "for _ in range(1):\n"
        "    looped = unguarded_main_call()\n"
        "if True:\n"
        "    guarded = unguarded_main_call()\n"
        "for calls in [unguarded_main_call()]:\n"
        "    if calls:\n"
        "        break\n"
        "if __name__ == '__main__':\n"
        "    def under(rows):\n"
        "        return rows\n"
        "else:\n"
        "    def other(rows):\n"
        "        return rows\n"
        "    under = other\n"
        "if __name__ != '__main__':\n"
        "    pass\n"
        "else:\n"
        "    def reversed_guard(rows):\n"
        "        return rows\n"
    ))
    script = str(tmp_path / "job.py")
    assert (scope["bare"], scope["looped"], scope["guarded"], scope["calls"]) == ((script, 4), (script, 6), None, (script, 9))
    assert unguarded_main_call() is None  # called from no statement of the script
    assert [under_main_guard(scope[name]) for name in ("top", "under", "reversed_guard")] == [False, True, False]
    assert under_main_guard(under_main_guard) is False  # not the script's


def test_threads_that_look_at_the_main_script_at_once_parse_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dask worker's threads each making a Reader looked at the main script at once: two parses side by side, which
    CPython 3.11's ast does not survive ("AST constructor recursion depth mismatch", a SystemError). One parses."""
    import ast
    import threading
    import time

    from multitables._sys import forks

    script = tmp_path / "job.py"
    script.write_text("x = 1\n")
    parses, parse = [], ast.parse

    def slow_parse(*args: object, **kwargs: object) -> ast.Module:
        parses.append(threading.get_ident())
        time.sleep(0.2)  # the other thread arrives meanwhile
        return parse(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(forks.ast, "parse", slow_parse)  # a new file's name: no parse of it cached
    trees: list[object] = []
    threads = [threading.Thread(target=lambda: trees.append(forks._parse(str(script)))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(trees) == 2 and all(isinstance(t, ast.Module) for t in trees)
    assert len(parses) == 1, "two threads parsed the script at once"


_UNDER_A_POOLS_OWN_START_METHOD = r"""
import multiprocessing, multiprocessing.context, multiprocessing.popen_fork, multiprocessing.process, sys
import multitables

class Popen:  # as joblib's loky starts its workers' children: a Popen with no close()
    def __init__(self, process):
        self._popen = multiprocessing.popen_fork.Popen(process)
    def __getattr__(self, name):
        if name == "close":
            raise AttributeError("'Popen' object has no attribute 'close'")
        return getattr(self._popen, name)

class Process(multiprocessing.process.BaseProcess):
    _start_method = "pools"
    @staticmethod
    def _Popen(process):
        return Popen(process)

class Context(multiprocessing.context.BaseContext):
    _name = "pools"
    Process = Process

multiprocessing.context._concrete_contexts["pools"] = Context()
multiprocessing.set_start_method("pools", force=True)  # what loky does in its workers
if __name__ == "__main__":
    with multitables.Reader(sys.argv[1], n_procs=1) as reader:
        ds = reader.get_dataset("/data")
        rows = reader.request(ds[:5], ds.create_stage(5)).get()
    with multitables.Streamer(sys.argv[1]).get_queue("/data", n_procs=1, block_size=10, ordered=True) as queue:
        first = queue.get()
        with first as block:
            print(rows.tolist() == block[:5].tolist(), queue.reader_pids != [])
"""


def test_readers_start_by_a_standard_method_under_a_pools_own_default(tmp_path: Path) -> None:
    """joblib's loky sets a start method of its own in its workers, whose processes multiprocessing cannot close: a
    Reader made in a task failed at its close ("'Popen' object has no attribute 'close'"), its semaphores counted as
    leaked by loky's tracker. Readers start by the platform's default there."""
    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("/data", data=np.arange(100, dtype="<i8"), chunks=(10,))
    script = tmp_path / "task.py"
    script.write_text(_UNDER_A_POOLS_OWN_START_METHOD)
    run = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["True", "True"]


@pytest.mark.parametrize("case", ["child-plans", "plan-made", "plan-in-progress"])
def test_a_forked_child_going_on_with_its_parents_iteration_leaves_its_next_epoch_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, no_leaks: None) -> None:
    # NOTE [the next epoch in steps]: after an epoch's first batch the next epoch is planned on the copier's thread and
    # published by a later batch. A child that went on with the parent's iteration there published it to the
    # parent's readers (which then gave the parent's next epochs rows of the wrong epoch), having planned it itself
    # or found the parent's plan made; or, the parent's plan in progress on a thread the fork does not have, waited
    # for it for ever in the epoch's last window, where nothing is left for later.
    import time

    import multitables
    from multitables._plan.epoch import EpochSettings

    path = tmp_path / "ids.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(20000, dtype="<i8").reshape(-1, 1), chunks=(100, 1), compression="gzip")
    # One window an epoch (no step is early: the child's first plans and publishes), or windows of two batches.
    kw = dict(batch_size=100, shuffle=True, seed=1, block_size=100, window=200 if case == "child-plans" else 2)
    reference = multitables.Streamer(path).get_batches("/x", n_procs=0, **kw)
    want = []
    for epoch in range(3):
        reference.set_epoch(epoch)
        want.append(np.concatenate(list(reference)).ravel().tolist())
    reference.close()
    if case == "plan-in-progress":
        real_plan = EpochSettings.rank_epoch
        monkeypatch.setattr(EpochSettings, "rank_epoch",
                            lambda self, e, r: (time.sleep(1.0 if e else 0), real_plan(self, e, r))[1])
    batches = multitables.Streamer(path).get_batches("/x", n_procs=2, **kw)
    batches.set_epoch(0)  # a loop of epochs
    it = iter(batches)
    fork_at = {"child-plans": 1, "plan-made": 2, "plan-in-progress": 198}[case]  # batches out before the fork
    got = [next(it) for _ in range(fork_at)]  # the plan is handed over in the second batch's call
    time.sleep(0.2)  # made by now, but the slow one
    said = in_a_fork(lambda: next(it), 30)
    assert "RuntimeError" in said.get("error", "") and "fork" in said["error"], said
    rows = np.concatenate(got + list(it)).ravel().tolist()
    for epoch in (1, 2):
        batches.set_epoch(epoch)
        rows += np.concatenate(list(batches)).ravel().tolist()
    assert rows == want[0] + want[1] + want[2]
    batches.close()
