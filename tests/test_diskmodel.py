"""The disk model (``multitables_bench/diskmodel.py``): its accounting for known read patterns, in child processes.

Every assertion is on the model's own counters (reads, seeks, bytes, how a
read splits over RAID 0's disks) and on the bytes read through it; none on
time. The models here are fast (microsecond seeks, GB/s rates) so that the
tests do not wait for them. Needs ``gcc``, as the model does.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from _diskmodel import run_under

from multitables_bench import diskmodel
from multitables_bench.diskmodel import DiskModel

REPO = Path(__file__).resolve().parents[1]
KiB, MiB = 1 << 10, 1 << 20
#: Fast parameters: the accounting is the same as at 8 ms and 150 MB/s, the sleeps are negligible.
FAST = {"seek_ms": 0.001, "mbps": 100_000.0}
FILE_SIZE = 4 * MiB

#: A child that runs "offset length" commands from stdin with os.pread and answers each with the bytes' hash.
SERVE = r"""
import hashlib, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for line in sys.stdin:
    off, n = map(int, line.split())
    print(hashlib.sha256(os.pread(fd, n, off)).hexdigest(), flush=True)
"""


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "disk" / "data.bin"
    path.parent.mkdir()
    path.write_bytes(os.urandom(FILE_SIZE))
    return path


def make_model(tmp_path: Path, shim: Path, kind: str = "hdd", **kw: "float | bool") -> DiskModel:
    state_dir = tmp_path / "state"
    state_dir.mkdir(exist_ok=True)
    params = {**FAST, **kw}
    return DiskModel.create(state_dir, kind, shim=shim, **params)  # type: ignore[arg-type]


@pytest.fixture
def hdd(tmp_path: Path, shim: Path) -> Iterator[DiskModel]:
    with make_model(tmp_path, shim) as model:
        yield model


@pytest.fixture
def raid0(tmp_path: Path, shim: Path) -> Iterator[DiskModel]:
    with make_model(tmp_path, shim, "raid0") as model:
        yield model


class Reader:
    """A child process under the model that reads what it is told, one read at a time."""

    def __init__(self, model: DiskModel, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE, str(path)], env=model.env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def pread(self, offset: int, n: int) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{offset} {n}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


@pytest.fixture
def two_readers(data_file: Path) -> Iterator[Callable[[DiskModel], list[Reader]]]:
    """Starts two :class:`Reader` children of ``data_file`` under a model; closes them after the test."""
    started: list[Reader] = []

    def start(model: DiskModel) -> list[Reader]:
        started.extend(Reader(model, data_file) for _ in range(2))
        return started[-2:]

    yield start
    for r in started:
        r.close()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_shim_and_the_python_side_agree_on_the_state_layout(shim: Path) -> None:
    lib = ctypes.CDLL(str(shim))
    lib.dm_state_size.restype = ctypes.c_size_t
    assert lib.dm_state_size() == ctypes.sizeof(diskmodel._State)
    assert lib.dm_version() == diskmodel._VERSION


def test_the_shim_is_built_once_per_source(shim: Path) -> None:
    assert diskmodel.build_shim(shim.parent) == shim


def test_sequential_reads_seek_once_and_deliver_the_file(hdd: DiskModel, data_file: Path) -> None:
    script = r"""
import hashlib, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY); h = hashlib.sha256(); off = 0
while chunk := os.pread(fd, 256 * 1024, off):
    h.update(chunk); off += len(chunk)
print(h.hexdigest())
"""
    with hdd.charging(data_file.parent):
        digest = run_under(hdd, script, str(data_file)).strip()
    s = hdd.stats()
    assert digest == sha(data_file.read_bytes())
    assert (s.calls, s.seeks, s.bytes) == (FILE_SIZE // (256 * KiB), 1, FILE_SIZE)
    assert s.disks[0].reads == s.calls and s.split_calls == 0


@pytest.mark.parametrize("how", ["readinto", "preadv", "readv"])
def test_every_read_call_is_charged_where_it_reads(hdd: DiskModel, data_file: Path, how: str) -> None:
    # FileIO.readinto is read() at the file position; os.preadv may be preadv or preadv2; os.readv is readv().
    script = r"""
import os, sys
how, path = sys.argv[1], sys.argv[2]; buf = bytearray(64 * 1024); got = 0
if how == "readinto":
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            got += n
else:
    fd = os.open(path, os.O_RDONLY)
    while n := (os.preadv(fd, [buf], got) if how == "preadv" else os.readv(fd, [buf])):
        got += n
print(got)
"""
    with hdd.charging(data_file.parent):
        assert int(run_under(hdd, script, how, str(data_file))) == FILE_SIZE
    s = hdd.stats()
    assert (s.calls, s.seeks, s.bytes) == (FILE_SIZE // (64 * KiB), 1, FILE_SIZE)


def test_alternating_far_apart_reads_seek_every_time(hdd: DiskModel, data_file: Path) -> None:
    script = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY); half = os.path.getsize(sys.argv[1]) // 2
for i in range(0, half, 256 * 1024):
    os.pread(fd, 256 * 1024, i); os.pread(fd, 256 * 1024, half + i)
"""
    with hdd.charging(data_file.parent):
        run_under(hdd, script, str(data_file))
    s = hdd.stats()
    assert s.calls == FILE_SIZE // (256 * KiB) and s.seeks == s.calls and s.bytes == FILE_SIZE


def test_two_processes_share_one_head(hdd: DiskModel, data_file: Path, two_readers: Callable[[DiskModel], list[Reader]]) -> None:
    a, b = two_readers(hdd)
    half, step = FILE_SIZE // 2, 256 * KiB
    content = data_file.read_bytes()
    with hdd.charging(data_file.parent):
        # Each process reads its own half in order; interleaved, every read moves the one head.
        for i in range(0, 4 * step, step):
            assert a.pread(i, step) == sha(content[i : i + step])
            assert b.pread(half + i, step) == sha(content[half + i : half + i + step])
    assert (hdd.stats().calls, hdd.stats().seeks) == (8, 8)
    with hdd.charging(data_file.parent):
        # Taking consecutive ranges in turn, each process continues where the other left off: one seek.
        for i in range(0, 8 * step, 2 * step):
            a.pread(i, step)
            b.pread(i + step, step)
    assert (hdd.stats().calls, hdd.stats().seeks) == (8, 1)


def test_raid0_splits_reads_at_the_stripes(
    raid0: DiskModel, data_file: Path, two_readers: Callable[[DiskModel], list[Reader]]
) -> None:
    stripe = diskmodel.STRIPE
    reader = two_readers(raid0)[0]
    with raid0.charging(data_file.parent):
        reader.pread(0, 4 * stripe)  # stripes 0-3: two on each disk, contiguous there
    s = raid0.stats()
    assert s.split_calls == 1 and s.calls == 1 and s.bytes == 4 * stripe
    assert [(d.reads, d.seeks, d.bytes) for d in s.disks] == [(1, 1, 2 * stripe), (1, 1, 2 * stripe)]
    with raid0.charging(data_file.parent):
        reader.pread(stripe // 2, stripe)  # the second half of stripe 0 and the first of stripe 1
    s = raid0.stats()
    assert s.split_calls == 1 and [d.bytes for d in s.disks] == [stripe // 2, stripe // 2]
    with raid0.charging(data_file.parent):
        for k in range(8):  # one stripe a read: the disks take turns, each reading on where it left off
            reader.pread(k * stripe, stripe)
    s = raid0.stats()
    assert s.split_calls == 0 and s.seeks == 2
    assert [(d.reads, d.bytes) for d in s.disks] == [(4, 4 * stripe), (4, 4 * stripe)]


def test_raid0_disks_keep_their_own_heads(
    raid0: DiskModel, data_file: Path, two_readers: Callable[[DiskModel], list[Reader]]
) -> None:
    stripe, half = diskmodel.STRIPE, FILE_SIZE // 2
    a, b = two_readers(raid0)
    with raid0.charging(data_file.parent):
        # a reads the even stripes of the first half (disk 0), b the odd stripes of the second (disk 1): no head is shared.
        for k in range(0, 8, 2):
            a.pread(k * stripe, stripe)
            b.pread(half + (k + 1) * stripe, stripe)
    s = raid0.stats()
    assert s.seeks == 2 and [(d.reads, d.seeks) for d in s.disks] == [(4, 1), (4, 1)]


def test_a_short_skip_forward_is_read_over_within_the_readahead(tmp_path: Path, shim: Path, data_file: Path) -> None:
    script = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for k in range(8):
    os.pread(fd, 64 * 1024, k * 96 * 1024)  # 64 KiB, then skip 32 KiB
"""
    for readahead, seeks in ((0, 8), (MiB, 1)):
        with make_model(tmp_path, shim, readahead=readahead) as model, model.charging(data_file.parent):
            run_under(model, script, str(data_file))
            assert model.stats().seeks == seeks
            assert model.stats().disks[0].bytes == 8 * 64 * KiB  # bytes asked for; the gaps cost time only


def test_a_read_overlapping_the_last_one_comes_from_the_drive_buffer(tmp_path: Path, shim: Path, data_file: Path) -> None:
    # O_DIRECT readers round each read out to whole pages, so the next one starts a page before the last one ended.
    script = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for k in range(8):
    os.pread(fd, 64 * 1024, k * 60 * 1024)  # 64 KiB, then back 4 KiB
"""
    for readahead, seeks in ((0, 8), (MiB, 1)):
        with make_model(tmp_path, shim, readahead=readahead, page_cache=False) as model, model.charging(data_file.parent):
            run_under(model, script, str(data_file))
            assert model.stats().seeks == seeks


def test_a_page_read_once_is_served_by_the_page_cache(hdd: DiskModel, data_file: Path, tmp_path: Path, shim: Path) -> None:
    # Two processes read the same 1 MiB (as every reader process reads the file's metadata): the disk reads it once.
    script = "import os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nos.pread(fd, 1 << 20, 0)"
    with hdd.charging(data_file.parent):
        run_under(hdd, script, str(data_file))
        run_under(hdd, script, str(data_file))
    s = hdd.stats()
    assert (s.calls, s.cached_calls, s.bytes, s.seeks) == (2, 1, MiB, 1)
    with hdd.charging(data_file.parent):  # every pass starts with the cache empty
        run_under(hdd, script, str(data_file))
    assert (hdd.stats().cached_calls, hdd.stats().bytes) == (0, MiB)
    with make_model(tmp_path, shim, page_cache=False, readahead=0) as bare, bare.charging(data_file.parent):
        run_under(bare, script, str(data_file))
        run_under(bare, script, str(data_file))
        assert (bare.stats().cached_calls, bare.stats().bytes, bare.stats().seeks) == (0, 2 * MiB, 2)


def test_the_page_cache_reads_whole_pages_and_only_those_missing(hdd: DiskModel, data_file: Path) -> None:
    script = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.pread(fd, 100, 5000)            # page 1: one page from the disk
os.pread(fd, 3 * 4096, 4096)       # pages 1-3: pages 2 and 3 from the disk, continuing
os.pread(fd, 10, 3 * 4096 + 7)     # page 3 again: from the cache
"""
    with hdd.charging(data_file.parent):
        run_under(hdd, script, str(data_file))
    s = hdd.stats()
    assert (s.calls, s.cached_calls, s.bytes, s.seeks) == (3, 1, 3 * 4096, 1)


def test_o_direct_reads_bypass_the_page_cache(tmp_path: Path, shim: Path, data_file: Path) -> None:
    script = r"""
import mmap, os, sys
buf = mmap.mmap(-1, 1 << 20)  # page aligned, as O_DIRECT needs
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
for _ in range(2):
    os.preadv(fd, [buf], 0)
"""
    with make_model(tmp_path, shim, readahead=0) as hdd, hdd.charging(data_file.parent):  # no drive buffer either
        done = subprocess.run([sys.executable, "-c", script, str(data_file)], env=hdd.env(), capture_output=True, text=True)
        if done.returncode != 0 and "Invalid argument" in done.stderr:
            pytest.fail(f"the test directory's filesystem refuses O_DIRECT: {done.stderr}")
        assert done.returncode == 0, done.stderr
        assert (hdd.stats().cached_calls, hdd.stats().bytes, hdd.stats().seeks) == (0, 2 * MiB, 2)


def test_a_willneed_hint_reads_ahead_on_the_disk_queue(hdd: DiskModel, data_file: Path) -> None:
    # multitables hints the block a reader will read next: the disk reads it (queued, in the background), the read
    # that follows finds it cached.
    script = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 1 << 20, os.POSIX_FADV_WILLNEED)
os.pread(fd, 1 << 20, 0)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)  # to the end of the file: only the rest is read
os.posix_fadvise(fd, 0, 1 << 20, os.POSIX_FADV_DONTNEED)  # other advice: not modelled
"""
    with hdd.charging(data_file.parent):
        run_under(hdd, script, str(data_file))
    s = hdd.stats()
    assert (s.hints, s.calls, s.cached_calls, s.bytes, s.seeks) == (2, 1, 1, FILE_SIZE, 1)


def test_cachestat_counts_the_pages_of_the_modelled_page_cache(tmp_path: Path, shim: Path, data_file: Path) -> None:
    # multitables asks how much of a range is cached (cachestat) before it hints it: the model answers from its own
    # page cache, or the benchmark's disk passes would see no hints at all (the real cache holds the file).
    script = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
class Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]
class Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]
fd = os.open(sys.argv[1], os.O_RDONLY)
def cached(offset, n):
    got = Stat()
    assert libc.syscall(ctypes.c_long(451), ctypes.c_long(fd), ctypes.byref(Range(offset, n)), ctypes.byref(got),
                        ctypes.c_long(0)) == 0, ctypes.get_errno()
    return got.cache
print(cached(0, 1 << 20), end=" ")                      # nothing read yet
os.pread(fd, 5000, 4096)                                 # pages 1 and 2
print(cached(0, 1 << 20), cached(4096, 4096), end=" ")
os.posix_fadvise(fd, 2 << 20, 1 << 20, os.POSIX_FADV_WILLNEED)
print(cached(2 << 20, 1 << 20), end=" ")                 # queued on the disk, not arrived
time.sleep(0.5)
print(cached(2 << 20, 1 << 20), cached(0, 0))            # arrived; length 0: to the end of the file
"""
    with make_model(tmp_path, shim, seek_ms=50.0) as slow, slow.charging(data_file.parent):  # a hint takes 50 ms
        out = run_under(slow, script, str(data_file))
        s = slow.stats()
    assert out.split() == ["0", "2", "1", "0", "256", "258"]
    assert (s.calls, s.hints, s.bytes) == (1, 1, 2 * 4096 + MiB)  # asking reads nothing from the disk


def test_only_files_under_the_root_and_only_while_charging(hdd: DiskModel, data_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.bin"
    other.write_bytes(b"x" * MiB)
    script = "import sys\nfor p in sys.argv[1:]: open(p, 'rb').read()"
    run_under(hdd, script, str(data_file))
    assert hdd.stats().calls == 0  # not charging
    with hdd.charging(data_file.parent):
        run_under(hdd, script, str(data_file), str(other))
    assert hdd.stats().bytes == FILE_SIZE  # the other file is not under the root
    with hdd.charging(data_file):  # a root may be one file
        run_under(hdd, script, str(data_file), str(other))
    assert hdd.stats().bytes == FILE_SIZE


def test_child_processes_read_through_the_same_model(hdd: DiskModel, data_file: Path, tmp_path: Path) -> None:
    # A file, not -c: spawn's children import the parent's main module to find the target.
    script = tmp_path / "children.py"
    script.write_text(r"""
import multiprocessing as mp, os, sys
def read(off):
    fd = os.open(sys.argv[1], os.O_RDONLY)
    os.pread(fd, 1 << 20, off)
if __name__ == "__main__":
    for method in ("fork", "spawn"):
        p = mp.get_context(method).Process(target=read, args=(0 if method == "fork" else 3 << 20,))  # past the read-ahead
        p.start(); p.join(); assert p.exitcode == 0
""")
    with hdd.charging(data_file.parent):
        done = subprocess.run([sys.executable, str(script), str(data_file)], env=hdd.env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    s = hdd.stats()
    assert (s.calls, s.bytes, s.seeks) == (2, 2 * MiB, 2)


def test_bad_parameters_are_refused(tmp_path: Path, shim: Path) -> None:
    with pytest.raises(ValueError, match="unknown disk model"):
        DiskModel.create(tmp_path, "ssd", shim=shim)
    with pytest.raises(ValueError, match="mbps > 0"):
        DiskModel.create(tmp_path, "hdd", mbps=0, shim=shim)
    assert not list(tmp_path.iterdir())


def test_close_removes_the_state_file(tmp_path: Path, shim: Path) -> None:
    model = make_model(tmp_path, shim)
    assert os.path.exists(model.path)
    model.close()
    model.close()
    assert not os.path.exists(model.path)


def test_the_benchmark_reads_every_pass_through_the_model(tmp_path: Path, shim: Path) -> None:
    # --disk-model re-runs the benchmark under the model; each pass logs what the model charged.
    env = {**os.environ, "MULTITABLES_BENCH_CACHE": str(shim.parent)}
    cmd = [sys.executable, "multitables_benchmark.py", "--quick", "--disk-model", "raid0", "--seek-ms", "0.01",
           "--disk-mbps", "20000", "--engines", "chunks", "--modes", "direct", "--complevels", "3", "--max_procs", "2",
           "--no-small-files", "--file", str(tmp_path / "bench.h5")]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "disk model, raid0: 2 disks striped at 64 KiB" in done.stdout
    passes = [line for line in done.stderr.replace("\r", "\n").splitlines() if " repeat 1 cycle 1: " in line]
    assert len(passes) == 7  # O_DIRECT, 3 single-process readers, chunks n_procs=1, 2, default
    charged = re.compile(r"model: (\d+) seeks.*, (\d+) reads \((\d+) cached\), (\d+) hints, ([\d,]+) MB")
    for line in passes:
        found = charged.search(line)
        assert found, line
        seeks, reads, _, _, mb = (int(g.replace(",", "")) for g in found.groups())
        assert seeks >= 2 and reads > 0 and mb >= 28, line  # the whole file (32 MiB of data, 29-34 MB stored) reached it
