"""The CPUs a process may use for readers: its affinity, its control groups' CPU quota, its share among the ranks
torchrun started on the machine (NOTE [CPU siblings]). The groups are files written here, as the kernel lays them out
(v1 and v2)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from multitables._plan import readers as planner
from multitables._sys import cgroups


@pytest.fixture
def groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The cgroup mount, empty; ``/proc/self/cgroup`` written by each test. The once-a-process reads forgotten."""
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", str(tmp_path / "fs"))
    monkeypatch.setattr(cgroups, "PROC_SELF_CGROUP", str(tmp_path / "self_cgroup"))
    for read in (cgroups.cpu_quota, cgroups.cpuset_size):
        read.cache_clear()
    yield tmp_path
    for read in (cgroups.cpu_quota, cgroups.cpuset_size):
        read.cache_clear()


def write(root: Path, files: "dict[str, str]") -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def test_a_v2_quota_is_the_tightest_over_the_group_and_its_ancestors(groups: Path) -> None:
    (groups / "self_cgroup").write_text("0::/kubepods/pod1/c1\n")
    write(groups / "fs", {
        "cpu.max": "max 100000",  # the root: no limit
        "kubepods/cpu.max": "1600000 100000",  # 16 CPUs for every pod
        "kubepods/pod1/cpu.max": "250000 100000",  # 2.5 for this one
        "kubepods/pod1/c1/cpu.max": "max 100000",
    })  # fmt: skip
    assert cgroups.cpu_quota() == 2.5


def test_a_v1_quota_has_its_period_in_a_file_of_its_own_and_minus_one_is_none(groups: Path) -> None:
    (groups / "self_cgroup").write_text("4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n0::/\n")
    write(groups / "fs" / "cpu" / "docker" / "abc", {"cpu.cfs_quota_us": "150000", "cpu.cfs_period_us": "50000"})
    write(groups / "fs" / "cpu", {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"})
    assert cgroups.cpu_quota() == 3.0
    write(groups / "fs" / "cpu" / "docker" / "abc", {"cpu.cfs_quota_us": "-1"})
    cgroups.cpu_quota.cache_clear()
    assert cgroups.cpu_quota() is None


def test_inside_a_container_the_hosts_path_names_the_mount_itself(groups: Path) -> None:
    (groups / "self_cgroup").write_text("0::/system.slice/docker-abc.scope\n")  # the host's path, not mounted here
    write(groups / "fs", {"cpu.max": "200000 100000", "cpuset.cpus.effective": "0-3,8,10-11"})
    assert cgroups.cpu_quota() == 2.0
    assert cgroups.cpuset_size() == 7


def test_no_groups_no_limits(groups: Path) -> None:
    assert cgroups.cpu_quota() is None and cgroups.cpuset_size() is None  # no /proc/self/cgroup at all
    (groups / "self_cgroup").write_text("0::/\n")
    write(groups / "fs", {"cpu.max": "garbage"})
    cgroups.cpu_quota.cache_clear()
    assert cgroups.cpu_quota() is None


@pytest.mark.parametrize(
    "affinity,cpuset,quota,ranks,sharing,expected",
    [
        (16, 16, None, None, 0, 16),
        (16, 16, 2.5, None, 0, 3),  # a quota's worth, rounded up
        (16, 16, 0.2, None, 0, 1),  # at least one
        (16, 16, None, "8", 0, 2),  # eight ranks share the machine
        (16, 16, 8.0, "8", 0, 1),  # and its quota
        (2, 16, None, "8", 0, 2),  # each rank pinned to its own two CPUs: they are its own
        (2, 16, 8.0, "8", 0, 1),  # the quota is the group's, shared all the same
        (4, 16, None, "2", 1, 2),  # taskset -c 0-3 torchrun: the ranks share the launcher's four
        (4, 16, 8.0, "2", 1, 2),  # and the quota, of which they take no more than their CPUs
        (4, 16, 2.0, "2", 1, 1),
        (16, None, None, "4", 0, 4),  # no cpuset found: the machine's CPUs
        (16, 16, None, "nonsense", 0, 16),
        (16, 16, None, "1", 0, 16),
    ],
)
def test_the_cpus_for_readers(
    monkeypatch: pytest.MonkeyPatch, affinity: int, cpuset: "int | None", quota: "float | None", ranks: "str | None",
    sharing: int, expected: int,
) -> None:
    """A process's share of the CPUs (``Machine.share``): its affinity and its quota, among torchrun's ranks; where the
    affinity is narrower than the cpuset, among the ranks that ``/proc`` shows on it (``sharing`` beside this one)."""
    from multitables._sys import siblings

    monkeypatch.setattr(planner.os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.setattr(planner.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(siblings, "cpuset_size", lambda: cpuset)
    monkeypatch.setattr(planner, "cpu_quota", lambda: quota)
    monkeypatch.setattr(siblings, "_siblings", lambda pid, parent, on: sharing)
    monkeypatch.setattr(siblings, "_launched", lambda pid: 0)
    if ranks is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
    assert planner.Machine.here("fork").share == expected  # what every plan is made for


def test_a_stream_under_a_quota_of_one_cpu_reads_in_this_process(
    groups: Path, monkeypatch: pytest.MonkeyPatch, make_array
) -> None:
    """The default's readers are the quota's: on a container limited to one CPU, none pay."""
    import numpy as np

    import multitables
    from multitables._plan import costs

    monkeypatch.setattr(planner.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(costs, "START_COST_S", {"fork": 0.0, "forkserver": 0.0, "spawn": 0.0})  # readers always pay
    stream = multitables.Streamer(make_array(np.arange(4000.0).reshape(1000, 4), chunkshape=(50, 4)))
    (groups / "self_cgroup").write_text("0::/\n")
    write(groups / "fs", {"cpu.max": "100000 100000"})
    with stream.get_queue("/data") as queue:
        assert queue.n_procs == 0
    write(groups / "fs", {"cpu.max": "300000 100000"})
    cgroups.cpu_quota.cache_clear()
    with stream.get_queue("/data") as queue:
        assert queue.n_procs == 3
