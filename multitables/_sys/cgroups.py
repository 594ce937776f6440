"""This process's control groups: a controller's files for its group and the groups above it, and the CPUs they allow.

A container or a batch job limits a process through the groups it is in: its memory (``_shm.space``) and its CPU
time, a quota of CPU-seconds a period that every process of the group shares (Docker's ``--cpus``, a Kubernetes
pod's CPU limit). Past the quota the kernel stops the whole group until the next period, so a process that starts
a reader per CPU it can run on, where the quota allows fewer, runs in bursts and waits for the rest of each period.
"""

from __future__ import annotations

import functools
import os

#: Where this process's control groups are described and mounted (tests point these elsewhere).
PROC_SELF_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_dirs(controller: str, v1_file: str, v2_file: str) -> "list[tuple[str, str]]":
    """``(directory, file)`` of this process's ``controller`` group and its ancestors that have ``file``, leaf first:
    ``v1_file`` where the controller is mounted by cgroup v1, else ``v2_file`` in the unified hierarchy."""
    try:
        with open(PROC_SELF_CGROUP) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:  # v1: "N:cpu,cpuacct:/path" (a hybrid machine may have both; the controller is v1 there)
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return _ancestors(os.path.join(CGROUP_ROOT, controller), path, v1_file)
    for line in lines:  # v2: "0::/path"
        if line.startswith("0::"):
            return _ancestors(CGROUP_ROOT, line[3:], v2_file)
    return []


def _ancestors(mount: str, path: str, name: str) -> "list[tuple[str, str]]":
    # Inside a container the path may be the host's: then the mount itself is this process's group.
    parts = [p for p in path.split("/") if p]
    while parts and not os.path.isdir(os.path.join(mount, *parts)):
        parts.pop(0)
    dirs = [os.path.join(mount, *parts[:i]) for i in range(len(parts), -1, -1)]
    return [(d, name) for d in dirs if os.path.exists(os.path.join(d, name))]


@functools.lru_cache(maxsize=None)
def cpu_quota() -> "float | None":
    """The CPUs' worth of time the tightest CPU quota over this process's groups allows (quota / period), or None
    where none limits it. Read once a process (70 us, against a small file's whole stream of 100 us)."""
    tightest = None
    for directory, name in cgroup_dirs("cpu", "cpu.cfs_quota_us", "cpu.max"):
        try:
            with open(os.path.join(directory, name)) as f:
                fields = f.read().split()
            if name == "cpu.max":  # "max 100000" or "<quota> <period>", microseconds
                quota, period = fields[0], fields[1]
            else:  # v1: the period in a file of its own; a quota of -1 is none
                with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
                    quota, period = fields[0], f.read().strip()
            if quota == "max" or int(quota) <= 0 or int(period) <= 0:
                continue
            cpus = int(quota) / int(period)
        except (OSError, ValueError, IndexError):
            continue
        tightest = cpus if tightest is None else min(tightest, cpus)
    return tightest


@functools.lru_cache(maxsize=None)
def cpuset_size() -> "int | None":
    """How many CPUs this process's cpuset group allows, or None where that is not found; read once a process."""
    for directory, name in cgroup_dirs("cpuset", "cpuset.effective_cpus", "cpuset.cpus.effective"):
        try:
            with open(os.path.join(directory, name)) as f:
                n = len(cpu_list(f.read()))
        except (OSError, ValueError):
            continue
        if n:
            return n
    return None


def cpu_list(listing: str) -> "set[int]":
    """The CPUs of a kernel CPU list such as ``"0-3,8,10-11"``; ``ValueError`` where it is not one."""
    cpus: "set[int]" = set()
    for part in listing.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus
