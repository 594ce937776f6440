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
    several ranks: ranks x workers). Where torchrun started it (``LOCAL_WORLD_SIZE``: ``torchrun``, ``python
    -m torch.distributed.run``, ``accelerate launch --multi_gpu``), its siblings are its ranks that may run on its
    CPUs: every rank where its affinity is its cpuset's (each inherits the launcher's), else those ``/proc`` shows on
    them, for an affinity narrower than the cpuset is the launcher's as much as a rank's own: ``taskset -c 0-3
    torchrun`` (or ``numactl``) narrows the launcher's, which its ranks inherit and share, while ranks pinned each to
    CPUs of their own share none. (A CPU quota is the group's: every rank's, pinned or not; ``available_cpus``.)
    Lightning's launcher (``strategy="ddp"``) runs rank 0 in the user's process, which starts the other ranks as
    ``[sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]``, ``LOCAL_RANK`` (not ``LOCAL_WORLD_SIZE``) set
    in every rank's environment: a rank (``LOCAL_RANK``) that ``multiprocessing`` did not start also counts the
    process that started it and those it started otherwise than by ``multiprocessing`` (forked, its pools' workers
    and its readers run its command line too), where they run its program (``_program``: the same executable, and
    past the interpreter's options the same script, however named, and arguments, digits aside); its ``ddp_spawn``
    and ``ddp_fork`` ranks are a ``multiprocessing`` pool's workers. A process counts the siblings that run when it
    plans: launchers start their ranks at once, but a pool that starts its workers one task at a time may have
    started fewer than it will.
"""

from __future__ import annotations

import multiprocessing
import os
import re

from .cgroups import cpu_list, cpuset_size

#: Where processes are listed (tests point it elsewhere).
PROC = "/proc"

_DIGITS = re.compile(rb"\d+")


def cpu_siblings() -> int:
    """How many live processes share this one's CPUs beside it (NOTE [CPU siblings]); 0 where ``/proc`` cannot
    tell."""
    me, owner, ranks = os.getpid(), multiprocessing.parent_process(), torchrun_ranks()
    if owner is None:
        if ranks is not None:
            return ranks[1] - 1
        launched = _launched(me) if "LOCAL_RANK" in os.environ else 0  # a rank's: Lightning's may start ranks
        return _siblings(me, os.getppid(), me) + launched
    if ranks is not None:
        owners = ranks[1]
    else:
        owners = 1 if owner.pid is None else _siblings(owner.pid, _parent(owner.pid), me) + 1
    return (_siblings(me, os.getppid(), me) + 1) * owners - 1


def torchrun_ranks() -> "tuple[int, int] | None":
    """torchrun's ranks on this machine (``LOCAL_WORLD_SIZE``) and those of them that may run on one of this process's
    CPUs, its own rank included; None where torchrun did not start it (NOTE [CPU siblings])."""
    try:
        ranks = max(1, int(os.environ["LOCAL_WORLD_SIZE"]))
    except (KeyError, ValueError):
        return None
    owner = multiprocessing.parent_process()  # in a pool's worker, the rank is its owner
    rank = os.getpid() if owner is None else owner.pid
    if ranks == 1 or rank is None or len(os.sched_getaffinity(0)) >= (cpuset_size() or os.cpu_count() or 0):
        return ranks, ranks  # the launcher's affinity, which every rank inherits: all share it
    return ranks, 1 + min(ranks - 1, _siblings(rank, _parent(rank), os.getpid()))  # narrowed: by whom, /proc tells


def _launched(pid: int) -> int:
    """The ranks beside process ``pid`` (this one, not started by ``multiprocessing``) that Lightning's launcher makes,
    on one of its CPUs: the rank that started it and the ranks it started, running its program (:func:`_program`)."""
    program = _program(pid)
    if program is None:
        return 0
    ours = {p.pid for p in multiprocessing.active_children()}  # its pools' workers, its readers: forked, its program
    kin = [p for p in _children(pid) or () if p not in ours] + [os.getppid()]
    cpus = _allowed(pid)
    return sum(1 for p in kin if _program(p) == program and _shares(p, cpus))


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


def _program(pid: int) -> "tuple[str, bytes] | None":
    """What ``pid`` runs however its command line spells it: its executable and, past the interpreter's options, its
    script's real path (``-m``'s module, ``-c``'s command as given) and arguments, digits aside. Lightning starts its
    ranks as ``[sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]``, beside a ``python -u train.py``."""
    try:
        exe, cwd = os.readlink(f"{PROC}/{pid}/exe"), os.readlink(f"{PROC}/{pid}/cwd")
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            args = f.read().removesuffix(b"\0").split(b"\0")[1:]
    except OSError:  # gone, or not ours to read
        return None
    i = 0
    while i < len(args) and args[i].startswith(b"-") and args[i] not in (b"-c", b"-m", b"-"):
        i += 2 if args[i] in (b"-W", b"-X") else 1  # their value apart: the next argument
    if i < len(args) and not args[i].startswith(b"-"):
        args[i] = os.fsencode(os.path.realpath(os.path.join(cwd, os.fsdecode(args[i]))))
    return exe, _DIGITS.sub(b"#", b"\0".join(args[i:]))
