"""Streams inside a CPU quota (a container's ``--cpus``), each package in turn. Needs root and a writable cgroup.

Usage: python benchmarks/cpu_quota.py FILE --packages A B [--cpus 1] [--runs 3]

Makes a child group ``multitables-quota`` with a quota of ``--cpus`` CPUs (cgroup v2 ``cpu.max``, else v1's
``cpu`` controller), runs in it, per package (a directory holding a ``multitables`` folder, put first on
``sys.path``; ``.`` for this checkout), a fresh interpreter that reads dataset ``/data`` of FILE five times by
default (``get_queue``, ``n_procs`` left out), and removes the group. Printed per run: the readers taken, the
median pass and the median of each pass's longest wait for a block (past its quota the kernel stops the whole
group until the next period: 100 ms). Runs alternate between the packages.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

_RUN = r"""
import statistics, sys, time
sys.path.insert(0, sys.argv[1])
import multitables
stream = multitables.Streamer(sys.argv[2])
times, waits = [], []
for _ in range(5):
    t = last = time.perf_counter()
    worst = 0.0
    with stream.get_queue("/data") as queue:
        for guard in queue.iter():
            with guard:
                pass
            now = time.perf_counter()
            worst, last = max(worst, now - last), now
    times.append(time.perf_counter() - t)
    waits.append(worst)
print(f"readers {queue.n_procs}  pass {statistics.median(times):.3f} s  longest wait {statistics.median(waits) * 1e3:.1f} ms")
"""


def make_group(cpus: float) -> str:
    """The group's directory, its quota set."""
    v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    group = "/sys/fs/cgroup/multitables-quota" if v2 else "/sys/fs/cgroup/cpu/multitables-quota"
    os.makedirs(group, exist_ok=True)
    period = 100_000
    if v2:
        with open(os.path.join(group, "cpu.max"), "w") as f:
            f.write(f"{int(cpus * period)} {period}")
    else:
        with open(os.path.join(group, "cpu.cfs_period_us"), "w") as f:
            f.write(str(period))
        with open(os.path.join(group, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(int(cpus * period)))
    return group


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--packages", nargs="+", default=["."])
    p.add_argument("--cpus", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    group = make_group(args.cpus)
    try:
        for _ in range(args.runs):
            for pkg in args.packages:
                enter = f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -c \"$0\" \"$@\""
                run = subprocess.run(["sh", "-c", enter, _RUN, os.path.abspath(pkg), args.file], capture_output=True,
                                     text=True)
                if run.returncode:
                    sys.exit(run.stderr[-3000:])
                print(f"{pkg}: {run.stdout.strip()}")
    finally:
        os.rmdir(group)


if __name__ == "__main__":
    main()
