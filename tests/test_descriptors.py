"""One descriptor per local file in each process, however many datasets read it (NOTE [shared descriptors])."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multitables._io.chunks.pread import PreadFile

#: Seconds a subprocess of these tests may run.
GUARD = 300


def _many(tmp_path: Path, n_datasets: int, n_files: int, rows: int) -> "list[str]":
    """``n_files`` files, each with datasets ``/d000...``: dataset ``i`` holds rows ``i * 100000 + (0, 1, ...)`` over
    the files in turn (contiguous, so the chunk engine reads them with ``pread``)."""
    names = []
    for j in range(n_files):
        name = tmp_path / f"part{j}.h5"
        with h5py.File(name, "w") as f:
            for i in range(n_datasets):
                f[f"d{i:03d}"] = np.arange(j * rows, (j + 1) * rows, dtype="<i4") + i * 100000
        names.append(str(name))
    return names


_BATCHES_UNDER_LIMIT = r"""
import os, resource, sys
import numpy as np
import multitables

resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
files, n, rows = sys.argv[1:-2], int(sys.argv[-2]), int(sys.argv[-1])
baseline = len(os.listdir("/proc/self/fd"))
batches = multitables.Streamer(files).get_batches([f"/d{i:03d}" for i in range(n)], 25, n_procs=0)
seen, most = [], 0
for batch in batches:
    most = max(most, len(os.listdir("/proc/self/fd")))
    assert len(batch) == n
    for i, x in enumerate(batch):  # every dataset's rows are the same rows of the set, in the same order
        assert np.array_equal(x - i * 100000, batch[0]), (i, x, batch[0])
    seen.append(batch[0].copy())
batches.close()
got = np.sort(np.concatenate(seen))
assert np.array_equal(got, np.arange(rows * len(files))), got
print(most - baseline, len(os.listdir("/proc/self/fd")) - baseline)
"""


def test_batches_over_300_datasets_of_2_files_read_under_a_limit_of_256_open_files(tmp_path: Path) -> None:
    """Batches over 300 datasets of a set of 2 files, read in one process limited to 256 open files, failed with
    EMFILE: each dataset's source held a descriptor of each file (600). They share one per file now: every row comes,
    once, the descriptors held while reading are a handful, and after ``close`` the process holds what it held before."""
    files = _many(tmp_path, 300, 2, 100)
    run = subprocess.run([sys.executable, "-c", _BATCHES_UNDER_LIMIT, *files, "300", "100"], capture_output=True,
                         text=True, timeout=GUARD)
    assert run.returncode == 0, run.stderr[-3000:]
    held, after = map(int, run.stdout.split())
    assert held <= 8, f"{held} descriptors held while reading 300 datasets of 2 files"
    assert after == 0, f"{after} descriptors more than before the batches, after close"


_REQUESTS_UNDER_LIMIT = r"""
import os, resource, sys
import numpy as np
import multitables

if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    reader = multitables.Reader(filename=sys.argv[1], n_procs=2)
    datasets = [reader.get_dataset(f"/d{i:03d}") for i in range(300)]
    stage = datasets[0].create_stage(5)
    for i, dataset in enumerate(datasets):
        got = np.asarray(reader.request(dataset[7:12], stage).get())
        assert np.array_equal(got, np.arange(7, 12) + i * 100000), (i, got)
    reader.close(wait=True)
    print("ok")
"""


def test_a_readers_processes_read_300_datasets_of_a_file_under_a_limit_of_256_open_files(tmp_path: Path) -> None:
    """Requests for 300 datasets of one file made a reader process hold a descriptor per dataset (311 of them, EMFILE
    past 256, which the readers inherit); they hold one for the file now, and every request gets its rows."""
    files = _many(tmp_path, 300, 1, 20)
    run = subprocess.run([sys.executable, "-c", _REQUESTS_UNDER_LIMIT, files[0]], capture_output=True, text=True,
                         timeout=GUARD)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok", run.stdout


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_openers_of_a_file_share_one_descriptor_closed_with_the_last(tmp_path: Path, no_leaks: None) -> None:
    """Openers of one file with the same flags and advice share a descriptor, closed with the last of them; other
    advice, or the file's name meaning another file now, opens another."""
    name = _many(tmp_path, 1, 1, 10)[0]
    a, b, index = PreadFile(name), PreadFile(name), PreadFile(name, random=True)
    assert a.fd == b.fd != index.fd  # POSIX_FADV_RANDOM is the open file's: the index's reads keep theirs
    fd = a.fd
    a.close()
    a.close()  # idempotent: b's share stays
    assert _fd_open(fd) and b.identity() == index.identity()
    os.replace(name, name + ".old")
    with h5py.File(name, "w") as f:
        f["d000"] = np.zeros(3, "<i4")
    other = PreadFile(name)  # the name means another inode now: not the descriptor of the one replaced
    assert other.fd != b.fd and other.identity()[:2] != b.identity()[:2]
    for t in (b, index, other):
        t.close()
    assert not _fd_open(fd)


def test_threads_opening_and_closing_one_file_share_one_descriptor(tmp_path: Path, no_leaks: None) -> None:
    name = _many(tmp_path, 1, 1, 10)[0]
    held, fds, errors = [], set(), []
    lock, go = threading.Lock(), threading.Barrier(8)

    def churn() -> None:
        try:
            go.wait(10)
            for _ in range(300):
                PreadFile(name).close()
            keep = PreadFile(name)
            with lock:
                held.append(keep)
                fds.add(keep.fd)
        except BaseException as exc:  # pragma: no cover - said below
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(held) == 8 and len(fds) == 1, (errors, fds)
    for t in held:
        t.close()
    assert not _fd_open(fds.pop())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.booleans()), max_size=30))
def test_descriptors_held_are_the_files_and_advice_open(tmp_path: Path, steps: "list[tuple[bool, int, bool]]") -> None:
    """Open (True) or close (False) a transport of file ``k`` with or without random advice, in any order: the process
    holds one descriptor per (file, advice) with an opener, and none once every opener is closed."""
    names = [str(tmp_path / f"f{k}.bin") for k in range(3)]
    for name in names:
        if not os.path.exists(name):
            Path(name).write_bytes(bytes(range(256)))
    before = len(os.listdir("/proc/self/fd"))
    open_: "list[tuple[int, bool, PreadFile]]" = []
    for opening, k, random in steps:
        if opening:
            open_.append((k, random, PreadFile(names[k], random=random)))
        elif open_:
            open_.pop(k % len(open_))[2].close()
        assert len(os.listdir("/proc/self/fd")) - before == len({(k, r) for k, r, _ in open_})
        for k, _, t in open_:  # each reads its own file
            out = bytearray(4)
            assert t.read_into(10 + k, out) == 4 and out == bytes(range(10 + k, 14 + k))
    for _, _, t in open_:
        t.close()
    assert len(os.listdir("/proc/self/fd")) == before


_FORKED = r"""
import os, sys
from multitables._io.chunks.pread import PreadFile

name = sys.argv[1]
inherited, twin = PreadFile(name), PreadFile(name)
fd = inherited.fd
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    code = 1
    try:
        out = bytearray(4)
        assert inherited.read_into(8, out) == 4 and out == bytes(range(8, 12))  # the inherited descriptor reads
        own = PreadFile(name)  # opened anew: not the consumer's open file (its readahead, its advice)
        assert own.fd != fd, (own.fd, fd)
        inherited.close()
        assert os.fstat(fd) and twin.read_into(0, out) == 4  # the twin still holds the inherited one
        twin.close()
        twin.close()
        try:
            os.fstat(fd)
        except OSError:
            pass
        else:
            raise AssertionError("the inherited descriptor stayed open in the child after its last opener closed")
        # The number may be a new file's now: a close of it from the table would be wrong; none happens.
        again = os.open(name, os.O_RDONLY)
        own.close()
        assert os.path.samestat(os.fstat(again), os.stat(name))
        os.close(again)
        os.write(w, b"ok")
        code = 0
    finally:
        os._exit(code)
os.close(w)
said = os.read(r, 16)
_, status = os.waitpid(pid, 0)
assert said == b"ok" and status == 0, (said, status)
out = bytearray(4)
assert inherited.fd == fd and inherited.read_into(4, out) == 4 and out == bytes(range(4, 8))  # the parent's: unharmed
inherited.close()
assert os.fstat(fd)
twin.close()
try:
    os.fstat(fd)
except OSError:
    print("closed")
"""


def test_a_forked_child_reads_and_closes_what_it_inherited_and_opens_its_own(tmp_path: Path) -> None:
    """A forked reader inherits the consumer's descriptors and their counts: it reads through them, and closes each
    once, with the last of its inherited openers; what it opens itself is its own descriptor, not the parent's. The
    parent's descriptor and count are its own, unharmed by the child."""
    name = tmp_path / "bytes.bin"
    name.write_bytes(bytes(range(256)))
    run = subprocess.run([sys.executable, "-c", _FORKED, str(name)], capture_output=True, text=True, timeout=GUARD,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "closed", run.stdout


@pytest.mark.parametrize("direct", [False, True])
def test_direct_and_page_cache_openers_keep_apart(tmp_path: Path, direct: bool, no_leaks: None) -> None:
    name = tmp_path / "bytes.bin"
    name.write_bytes(bytes(range(256)) * 64)
    try:
        other = PreadFile(str(name), "direct" if direct else "page")
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    page = PreadFile(str(name))
    assert (other.fd == page.fd) is (not direct)
    other.close()
    page.close()
