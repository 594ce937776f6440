"""The workers a pool started beside this process, which share its CPUs (NOTE [pool workers]).

NOTE [pool workers]
    A process that a pool started (``concurrent.futures.ProcessPoolExecutor``, joblib's loky, a ``multiprocessing``
    ``Process`` per task) is one of several that the pool keeps busy on the same CPUs. A default of a reader per usable
    CPU in each of them starts workers x CPUs readers: with a worker per CPU, as many readers per CPU as there are
    CPUs, each with its ring and open files, all taking turns on the cores the workers already use. (A daemonic
    worker, ``multiprocessing.Pool``'s or a DataLoader's, may start no reader and reads in itself.)

    The defaults count this process's share of the CPUs instead (``_plan.readers.Machine.share``): the CPUs divided
    among the live workers. Its workers are this process and its *siblings*: the processes of the same parent
    (``os.getppid()``: the pool's owner, or the fork server that started them) running the same command line, digits
    aside (a spawned worker's line names descriptors, whose numbers may differ), read from ``/proc``. The pool's
    helpers (its resource tracker, the fork server itself) run another line and are not counted. Only a process that
    ``multiprocessing`` started is looked at (loky's included): a main script, a torchrun rank (``LOCAL_WORLD_SIZE``)
    and a shell's jobs are not a pool's. A worker counts the siblings that run when it plans: a pool that starts its
    workers one task at a time may have started fewer than it will.
"""

from __future__ import annotations

import multiprocessing
import os
import re

#: Where processes are listed (tests point it elsewhere).
PROC = "/proc"

_DIGITS = re.compile(rb"\d+")


def pool_siblings() -> int:
    """How many other live workers of this process's pool there are (NOTE [pool workers]); 0 outside one, or where
    ``/proc`` cannot tell."""
    if multiprocessing.parent_process() is None:
        return 0
    me, parent = os.getpid(), os.getppid()
    line = _command_line(me)
    if line is None:
        return 0
    pids = _children(parent)
    if pids is None:  # a kernel without the children lists: every process's parent (~25 us a process here)
        try:
            pids = [pid for pid in map(int, filter(str.isdigit, os.listdir(PROC))) if _parent(pid) == parent]
        except OSError:
            return 0
    return sum(1 for pid in pids if pid != me and _command_line(pid) == line)


def _children(pid: int) -> "list[int] | None":
    """``pid``'s live children, from its threads' lists (Linux's ``CONFIG_PROC_CHILDREN``); None where there are none."""
    try:
        tasks = os.listdir(f"{PROC}/{pid}/task")
        found = []
        for task in tasks:
            with open(f"{PROC}/{pid}/task/{task}/children", "rb") as f:
                found += [int(child) for child in f.read().split()]
    except OSError:
        return None
    return [child for child in found if _parent(child) == pid]  # not a zombie, nor a pid reused meanwhile


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
