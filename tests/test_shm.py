"""Shared-memory segments: the owner's mapping holds no descriptor, and memory still in use survives close."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from multitables._shm.segment import Segment


def test_the_owners_mapping_keeps_no_file_descriptor_open(
    shm_mappings: Callable[[], list[str]], fds_on: Callable[[Path], int]
) -> None:
    seg = Segment.create(1 << 16, "test")
    try:
        assert fds_on(Path("/dev/shm") / seg.name) == 0
        assert any(seg.name in m for m in shm_mappings())  # mapped all the same
    finally:
        seg.unlink()
        seg.close()
    assert not any(seg.name in m for m in shm_mappings())


def test_what_an_attached_mapping_writes_the_owner_reads() -> None:
    owner = Segment.create(1 << 16, "test")
    other = Segment.attach(owner.name, 1 << 16)
    try:
        np.frombuffer(other.buf, np.int64, count=4, offset=8192)[:] = [1, 2, 3, 4]
        assert np.frombuffer(owner.buf, np.int64, count=4, offset=8192).tolist() == [1, 2, 3, 4]
    finally:
        owner.unlink()
        other.close()
        owner.close()


def test_kept_ranges_outlive_close_in_private_memory(shm_mappings: Callable[[], list[str]]) -> None:
    seg = Segment.create(1 << 16, "test")
    seg.unlink()
    kept = np.frombuffer(seg.buf, np.float64, count=512, offset=4096)  # holds an export of the mapping
    kept[:] = np.arange(512)
    seg.close(keep=[(4096, kept.nbytes)])
    assert not any(seg.name in m for m in shm_mappings())  # the segment itself is released now
    np.testing.assert_array_equal(kept, np.arange(512))  # and the view still reads its bytes
    kept[:] = -1  # writable, private memory
    assert (kept == -1).all()


def test_close_without_keep_leaves_a_used_mapping_alone(shm_mappings: Callable[[], list[str]]) -> None:
    seg = Segment.create(1 << 16, "test")
    seg.unlink()
    view = np.frombuffer(seg.buf, np.uint8, count=16)
    view[:] = 7
    seg.close()
    name = seg.name
    del seg
    assert any(name in m for m in shm_mappings())  # still in use: not unmapped under the view
    assert (view == 7).all()
    del view  # the last user: the mapping goes with it
    assert not any(name in m for m in shm_mappings())



def _shm_kib(name: str) -> int:
    """KiB of the segment ``name`` this process has in memory (its mapping's Rss in /proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    starts = [i for i, line in enumerate(lines) if name in line]
    assert len(starts) == 1, starts
    for line in lines[starts[0] + 1:]:
        if line.startswith("Rss:"):
            return int(line.split()[1])
    raise AssertionError("no Rss")


def test_held_ranges_outlive_close_in_place_and_every_other_page_is_freed(shm_mappings: Callable[[], list[str]]) -> None:
    """An array made with ``buffer=`` holds the mapping object and no export (a guard's block): close keeps the
    ranges held where they are, frees the segment's other pages, and the mapping goes with the last such array."""
    seg = Segment.create(64 * 4096, "test")
    seg.unlink()
    name = seg.name
    everything = np.ndarray(64 * 4096, np.uint8, buffer=seg.buf)
    everything[:] = 5  # every page in memory
    kept = np.ndarray((2 * 4096 - 100,), np.uint8, buffer=seg.buf, offset=8 * 4096)
    kept[:] = np.arange(kept.size) % 251
    del everything
    before = _shm_kib(name)
    seg.close(held=[(8 * 4096, kept.nbytes)])
    del seg
    after = _shm_kib(name)  # mapped still: the view's bytes are there
    assert before >= 64 * 4 and after <= 2 * 4, (before, after)  # the two pages held, no more
    np.testing.assert_array_equal(kept, np.arange(kept.size) % 251)
    del kept
    assert not any(name in m for m in shm_mappings())

# -- the creation span (NOTE [creation span]) and containers ------------------------------------------------

_CREATE_THEN = r"""
import os, signal, sys
from multiprocessing import resource_tracker
import multitables
from multitables._shm.segment import Segment

what = sys.argv[1]
register = resource_tracker.register

def at_the_worst_moment(name, rtype):
    # Right after shm_open, before anything (the resource tracker included) could clean up.
    print(name, flush=True)
    os.kill(os.getpid(), signal.SIGINT if what == "ctrl-c" else signal.SIGKILL)
    register(name, rtype)

resource_tracker.ensure_running()  # its pipe stays open for the process's life: not ours
resource_tracker.register = at_the_worst_moment
fds = set(os.listdir("/proc/self/fd"))
try:
    Segment.create(1 << 20, "test")
except KeyboardInterrupt:
    print("interrupted", sorted(set(os.listdir("/proc/self/fd")) - fds), flush=True)
"""


def _run_create_then(what: str) -> tuple[str, list[str]]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CREATE_THEN, what], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    return lines[0].lstrip("/"), lines[1:]


def test_ctrl_c_while_a_segment_is_created_leaves_no_name_and_no_descriptor() -> None:
    name, rest = _run_create_then("ctrl-c")
    assert rest == ["interrupted []"]  # KeyboardInterrupt came through, and no descriptor is left open
    assert not (Path("/dev/shm") / name).exists()


def test_a_name_left_by_a_creator_killed_mid_creation_is_removed_at_the_next_creation(monkeypatch) -> None:
    import multitables._shm.segment as shm

    name, _ = _run_create_then("sigkill")  # SIGKILL cannot be caught: the name stays behind
    leftover = Path("/dev/shm") / name
    assert leftover.exists()
    old = leftover.stat().st_mtime - shm.ORPHAN_AGE - 1
    os.utime(leftover, (old, old))  # as if the kill was minutes ago
    monkeypatch.setattr(shm, "_swept", False)  # this process's first creation
    seg = Segment.create(1 << 16, "test")
    seg.unlink()
    seg.close()
    assert not leftover.exists()


def test_the_sweep_leaves_young_names_live_creators_and_other_names_alone(tmp_path: Path, monkeypatch) -> None:
    import multitables._shm.segment as shm

    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))
    monkeypatch.setattr(shm, "unlink_orphan", lambda name: (tmp_path / name).unlink())
    dead = 2**22 + 12345  # above the default pid_max: no such process
    old = time.time() - shm.ORPHAN_AGE - 1
    for name, mtime in [
        (f"multitables_{dead}_aa", old),  # a leftover: removed
        (f"multitables_{dead}_bb", time.time()),  # young: a creation may still be under way elsewhere
        (f"multitables_{os.getpid()}_cc", old),  # its creator lives
        ("other_program_dd", old),
    ]:
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, (mtime, mtime))
    assert shm.sweep_orphans() == [f"multitables_{dead}_aa"]
    assert {p.name for p in tmp_path.iterdir()} == {f"multitables_{dead}_bb", f"multitables_{os.getpid()}_cc", "other_program_dd"}


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_ring_past_the_containers_memory_limit_is_a_space_error_not_an_oom_kill(
    tmp_path: Path, monkeypatch, version: str
) -> None:
    """Shared memory counts against the memory cgroup; past its limit the kernel kills instead of failing."""
    import multitables
    import multitables._shm.space as shm
    from multitables._sys import cgroups

    mib = 1 << 20
    if version == "v1":
        group = tmp_path / "memory" / "docker" / "abc"
        cgroup_line = "4:memory:/docker/abc\n0::/\n"
        files = {"memory.limit_in_bytes": 200 * mib, "memory.usage_in_bytes": 150 * mib}
        stat = f"total_active_file {10 * mib}\ntotal_inactive_file {5 * mib}\nactive_file 1\n"
    else:
        group = tmp_path / "docker" / "abc"
        cgroup_line = "0::/docker/abc\n"
        files = {"memory.max": 200 * mib, "memory.current": 150 * mib}
        stat = f"active_file {10 * mib}\ninactive_file {5 * mib}\nshmem {mib}\n"
    group.mkdir(parents=True)
    for fname, value in files.items():
        (group / fname).write_text(f"{value}\n")
    (group / "memory.stat").write_text(stat)
    (tmp_path / "self_cgroup").write_text(cgroup_line)
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(cgroups, "PROC_SELF_CGROUP", str(tmp_path / "self_cgroup"))
    # 200 MiB limit, 150 MiB used of which 15 MiB is file cache the kernel reclaims: 65 MiB free.
    assert shm.cgroup_free_bytes() == (65 * mib, 200 * mib, 135 * mib)
    with pytest.raises(multitables.ShmSpaceError, match=r"memory cgroup.*limit is 200\.0 MiB.*bytes short") as info:
        shm.check_space(256 * mib, "The ring")
    assert f"{256 * mib - 65 * mib:,} bytes short" in str(info.value) and "read_ahead or block_size" in str(info.value)
    shm.check_space(64 * mib, "The ring")  # what fits passes
    (group / files_limit(version)).write_text("max\n" if version == "v2" else f"{2**63 - 4096}\n")
    assert shm.cgroup_free_bytes() is None  # no limit: nothing to check


def files_limit(version: str) -> str:
    return "memory.limit_in_bytes" if version == "v1" else "memory.max"


_CAPPED = r"""
import os, resource
from multitables._shm.segment import SHM_PREFIX, Segment
vm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    Segment.create(256 << 20, "test")
except OSError as exc:
    print(exc.errno, exc)
print(sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"{SHM_PREFIX}{os.getpid()}_")))
"""


def test_a_segment_past_the_address_space_cap_says_its_size_and_what_asks_less() -> None:
    """Under ``ulimit -v`` mapping a ring failed with a bare "[Errno 12] Cannot allocate memory"; its name is
    left in /dev/shm by no one."""
    import errno
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CAPPED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    said, left = done.stdout.splitlines()
    assert said.startswith(f"{errno.ENOMEM} ") and f"mapping a shared-memory segment of {256 << 20} bytes" in said, said
    assert "ulimit -v" in said and "a smaller read_ahead or block_size asks less" in said, said
    assert left == "[]"


def _dev_shm_reports_free(monkeypatch, nbytes: int) -> None:
    """statvfs of /dev/shm says ``nbytes`` free, whatever is allocated (as before a ring's readers map it)."""
    real = os.statvfs

    def statvfs(path: str) -> os.statvfs_result:
        st = real(path)
        if path != "/dev/shm":
            return st
        return os.statvfs_result((st.f_bsize, 4096, st.f_blocks, st.f_bfree, nbytes // 4096, st.f_files,
                                  st.f_ffree, st.f_favail, st.f_flag, st.f_namemax))

    monkeypatch.setattr(os, "statvfs", statvfs)


def test_a_rings_pages_still_to_come_count_as_taken_until_allocated(monkeypatch) -> None:
    """A ring's slots are allocated by its readers after the stream started (NOTE [slots and page tables] in
    ``ring``): statvfs does not see them yet, so a second stream made at once was checked against space the first
    takes, and one of the two readers' mappings failed later. They count as taken until allocated, or closed."""
    import multitables
    import multitables._shm.space as shm

    mib = 1 << 20
    _dev_shm_reports_free(monkeypatch, 16 * mib)
    monkeypatch.setattr(shm, "cgroup_free_bytes", lambda: None)
    seg = Segment.create(8 * mib, "test", reserve=False)
    try:
        assert seg.unallocated() == 8 * mib and shm.shm_free_bytes() == 8 * mib
        with pytest.raises(multitables.ShmSpaceError, match=r"needs 9\.0 MiB .* has 8\.0 MiB \(8,388,608 bytes\) free"):
            shm.check_space(9 * mib, "The ring")
        seg.populate(0, 3 * mib)  # what a reader maps is allocated: no longer to come
        assert seg.unallocated() == 5 * mib and shm.shm_free_bytes() == 11 * mib
        shm.check_space(9 * mib, "The ring")
    finally:
        seg.unlink()
        seg.close()
    assert shm.shm_free_bytes() == 16 * mib  # a closed segment promises nothing
    reserved = Segment.create(8 * mib, "test")  # reserved at creation: statvfs sees it at once, so no promise
    try:
        assert shm.shm_free_bytes() == 16 * mib
    finally:
        reserved.unlink()
        reserved.close()


_SEMAPHORES = r"""
import gc, multiprocessing, os, sys
from multitables._shm.semaphores import unlink_names

ctx = multiprocessing.get_context(sys.argv[1])
sems = [ctx.Semaphore(0), ctx.Lock(), ctx.BoundedSemaphore(2)]
names = [s._semlock.name for s in sems if s._semlock.name]
print(unlink_names(sems), unlink_names(sems), [os.path.exists(f"/dev/shm/sem.{n[1:]}") for n in names])
sems[0].release()
print(sems[0].acquire(timeout=1))
del sems
gc.collect()
"""


@pytest.mark.parametrize("method, unlinked", [("spawn", 3), ("forkserver", 3), ("fork", 0)])
def test_semaphore_names_go_at_once_and_nothing_unlinks_or_warns_of_them_later(method: str, unlinked: int) -> None:
    """NOTE [semaphore names]: each name is unlinked once, taken off the resource tracker and off the exit handlers
    (which would fail on it, and the tracker warn of a leak, at the program's end), and the semaphore still works."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _SEMAPHORES, method], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n") == [f"{unlinked} 0 {[False] * unlinked}", "True", ""]
    assert run.stderr == ""  # the tracker's output too: it ends after the program
