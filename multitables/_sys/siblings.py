"""The processes started beside this one to do the same work on the same CPUs (NOTE [CPU siblings]).

NOTE [CPU siblings]
    Work is often run as several processes of one program on one machine: a pool's workers
    (``concurrent.futures.ProcessPoolExecutor``, joblib's loky, ``torch.multiprocessing.spawn``), a launcher's ranks
    (torchrun, ``mpirun``, ``srun``) or a shell's jobs (``for i in 1 2 3 4; do python train.py & done``). A default
    of a reader per usable CPU in each of them starts processes x CPUs readers: 8 ranks on 16 CPUs, 128 readers, each
    with its ring and open files, all taking turns on the cores the ranks already use. (A daemonic worker,
    ``multiprocessing.Pool``'s or a DataLoader's, may start no reader and reads in itself.)

    The defaults count this process's share of the CPUs instead (``_plan.readers.Machine.share``): the CPUs it may run
    on divided among itself and its *siblings*, the live processes of the same parent (``os.getppid()``: the pool's
    owner, the fork server that started them, the launcher or the shell) running the same command line, digits aside
    (a spawned worker's line names descriptors, whose numbers may differ), that may run on one of its CPUs (their
    affinity, ``Cpus_allowed_list``: a rank pinned to CPUs of its own shares them with none), read from ``/proc``.
    The pool's helpers (its resource tracker, the fork server itself) run another line and are not counted. Where
    ``multiprocessing`` started this process, its pool's owner's siblings share the CPUs too (a pool in each of
    several ranks: ranks x workers). Where torchrun started it (``LOCAL_WORLD_SIZE``, which ``available_cpus``
    divides by), its siblings are the ranks already counted, and are not counted again. A process counts the
    siblings that run when it plans: launchers start their ranks at once, but a pool that starts its workers one
    task at a time may have started fewer than it will.
"""

from __future__ import annotations

import multiprocessing
import os
import re

from .cgroups import cpu_list

#: Where processes are listed (tests point it elsewhere).
PROC = "/proc"

_DIGITS = re.compile(rb"\d+")


def cpu_siblings() -> int:
    """How many live processes share this one's CPUs beside it (NOTE [CPU siblings]); 0 where ``/proc`` cannot
    tell."""
    me, owner = os.getpid(), multiprocessing.parent_process()
    ranks_counted = "LOCAL_WORLD_SIZE" in os.environ  # torchrun's: available_cpus divides by them
    if owner is None:
        return 0 if ranks_counted else _siblings(me, os.getppid(), me)
    owners = 1 if ranks_counted or owner.pid is None else _siblings(owner.pid, _parent(owner.pid), me) + 1
    return (_siblings(me, os.getppid(), me) + 1) * owners - 1


def _siblings(pid: int, parent: "int | None", on: int) -> int:
    """The live processes of ``parent`` running ``pid``'s command line, ``pid`` aside, that may run on one of the CPUs
    of process ``on``."""
    if parent is None or parent <= 0:
        return 0
    others = _children(parent)
    if others is None:  # a kernel without the children lists: every process's parent (~25 us a process here)
        try:
            others = [p for p in map(int, filter(str.isdigit, os.listdir(PROC))) if _parent(p) == parent]
        except OSError:
            return 0
    others = [p for p in others if p != pid]
    line = _command_line(pid) if others else None  # most processes are their parent's only child: read no more
    if line is None:
        return 0
    same = [p for p in others if _command_line(p) == line and _parent(p) == parent]  # not a zombie, nor a pid reused
    cpus = _allowed(on) if same else None
    return sum(1 for p in same if _shares(p, cpus))


def _allowed(pid: int) -> "set[int] | None":
    """The CPUs ``pid`` may run on (its affinity), from ``/proc/PID/status``; None where that cannot be read."""
    try:
        with open(f"{PROC}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Cpus_allowed_list:"):
                    return cpu_list(line.split(b":", 1)[1].decode())
    except (OSError, ValueError):
        pass
    return None


def _shares(pid: int, cpus: "set[int] | None") -> bool:
    allowed = _allowed(pid)
    return cpus is None or allowed is None or not allowed.isdisjoint(cpus)  # unknown: counted, as sharing


def _children(pid: int) -> "list[int] | None":
    """``pid``'s children as its threads' lists give them (Linux's ``CONFIG_PROC_CHILDREN``), zombies included; None
    where there are none."""
    try:
        found = []
        for task in os.listdir(f"{PROC}/{pid}/task"):
            with open(f"{PROC}/{pid}/task/{task}/children", "rb") as f:
                found += [int(child) for child in f.read().split()]
    except OSError:
        return None
    return found


def stat_fields(pid: int) -> "list[bytes]":
    """The fields of ``/proc/PID/stat`` after the process's name (which may hold spaces and parentheses), from its
    state on; ``OSError`` where it cannot be read (``FileNotFoundError``: gone)."""
    with open(f"{PROC}/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2 :].split()


def _parent(pid: int) -> "int | None":
    try:
        fields = stat_fields(pid)
    except OSError:  # gone meanwhile, or not ours to read
        return None
    return int(fields[1]) if len(fields) > 1 and fields[0] != b"Z" else None  # a zombie works no more


def _command_line(pid: int) -> "bytes | None":
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            line = f.read()
    except OSError:
        return None
    return _DIGITS.sub(b"#", line) if line else None
