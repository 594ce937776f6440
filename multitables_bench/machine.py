"""Describing the machine: CPU, memory, and the disk and filesystem the benchmark file sits on; library versions."""

from __future__ import annotations

import os
import platform
from typing import Any

import numpy as np


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _read_text(path: str) -> "str | None":
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_model() -> str:
    for line in (_read_text("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_bytes() -> "int | None":
    for line in (_read_text("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def mount_of(path: str) -> dict[str, str]:
    """The mount holding ``path``, from /proc/self/mountinfo: mount point, device numbers, filesystem, source."""
    real = os.path.realpath(path)
    best: dict[str, str] = {}
    for line in (_read_text("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 2:
            continue
        point = fields[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.get("mount", "")):
            best = {"mount": point, "devno": fields[2], "fstype": tail[0], "source": tail[1]}
    return best


def block_device(devno: str) -> dict[str, Any]:
    """The disk behind ``major:minor``: its name, rotational flag, RAID level (md) and the devices under it."""
    sys_dev = f"/sys/dev/block/{devno}"
    if not os.path.exists(sys_dev):
        return {}
    real = os.path.realpath(sys_dev)
    name = os.path.basename(real)
    disk = os.path.basename(os.path.dirname(real)) if os.path.exists(os.path.join(real, "partition")) else name
    rotational = _read_text(f"/sys/block/{disk}/queue/rotational")
    slaves = sorted(os.listdir(f"/sys/block/{disk}/slaves")) if os.path.isdir(f"/sys/block/{disk}/slaves") else []
    return {
        "device": f"/dev/{name}",
        "disk": disk,
        "rotational": None if rotational is None else rotational == "1",
        "raid_level": _read_text(f"/sys/block/{disk}/md/level"),
        "model": _read_text(f"/sys/block/{disk}/device/model"),
        "underlying": slaves,
    }


def machine_info(path: str) -> dict[str, Any]:
    """CPU model and count, memory, and the device and filesystem ``path`` sits on."""
    mount = mount_of(path)
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "memory_bytes": memory_bytes(),
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "file": {"path": os.path.abspath(path), **mount, **block_device(mount.get("devno", ""))},
    }


def versions() -> dict[str, str]:
    import h5py
    import hdf5plugin
    import tables
    import tqdm

    import multitables

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "multitables": multitables.__version__,
        "tables": tables.__version__,
        "tables HDF5": tables.hdf5_version,
        "h5py": h5py.__version__,
        "h5py HDF5": h5py.version.hdf5_version,
        "hdf5plugin": hdf5plugin.version,
        "tqdm": tqdm.__version__,
    }

