"""NOTE [CPU siblings] in ``_sys.siblings``: the processes that share this one's CPUs (a pool's other workers, a
launcher's or a shell's other jobs), read from /proc; and, with real processes, the default readers each starts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import _jobs

import pytest

_JOBS = str(Path(__file__).parent / "_jobs.py")


@pytest.mark.parametrize("children_lists", [True, False], ids=["children lists", "every process scanned"])
def test_a_processs_siblings_are_its_parents_live_children_of_its_command_line_on_its_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children_lists: bool
) -> None:
    """Counted: the parent's other children running this command line, its descriptors' numbers aside, on one of its
    CPUs. Not counted: the pool's helpers (another line), a zombie, another parent's child of the same line, one
    pinned to other CPUs. Where torchrun started this process, its ranks (``LOCAL_WORLD_SIZE``) on the launcher's
    affinity, which they all inherit, stand for its siblings."""
    import multiprocessing
    import os

    from multitables._sys import siblings

    me, parent, other = os.getpid(), os.getppid(), 1
    worker = b"python\0-c\0from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=%d, pipe_handle=%d)\0"
    procs = {
        me: (parent, "S", worker % (5, 7)),
        900001: (parent, "S", worker % (5, 9)),  # a sibling whose pipe got another descriptor
        900002: (parent, "R", worker % (5, 7)),
        900003: (parent, "S", b"python\0-c\0from multiprocessing.resource_tracker import main;main(5)\0"),
        900004: (parent, "Z", worker % (5, 7)),  # dead, not yet reaped
        900005: (other, "S", worker % (5, 7)),
        900006: (parent, "S", worker % (5, 7)),  # pinned to CPUs of its own
        900010: (900020, "S", b"python\0train.py\0"),  # a pool's owner: a shell's job, one of two
        900011: (900020, "S", b"python\0train.py\0"),
    }
    for pid, (ppid, state, line) in procs.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_bytes(b"%d (py thon) %s %d 1 1" % (pid, state.encode(), ppid))
        (tmp_path / str(pid) / "cmdline").write_bytes(line)
        (tmp_path / str(pid) / "status").write_text(f"Name:\tpy\nCpus_allowed_list:\t{'6-7' if pid == 900006 else '0-3,5'}\n")
    if children_lists:
        for ppid in (parent, other, 900020):
            task = tmp_path / str(ppid) / "task" / str(ppid)
            task.mkdir(parents=True)
            task.joinpath("children").write_text(" ".join(str(p) for p, (pp, _, _) in procs.items() if pp == ppid) + " ")
    monkeypatch.setattr(siblings, "PROC", str(tmp_path))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: SimpleNamespace(pid=None))  # its owner unknown
    assert siblings.cpu_siblings() == 2
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)  # a launcher's or a shell's job: the same
    assert siblings.cpu_siblings() == 2
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: SimpleNamespace(pid=900010))
    assert siblings.cpu_siblings() == 3 * 2 - 1  # a pool of 3 workers in each of 2 jobs
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # torchrun's ranks, on the CPUs of the cpuset: each pool's owner
    monkeypatch.setattr(siblings, "cpuset_size", lambda: len(os.sched_getaffinity(0)))
    assert siblings.cpu_siblings() == 3 * 3 - 1
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)
    assert siblings.cpu_siblings() == 2


# -- real processes: each reports its default readers (``tests/_jobs.py``) -----------------------------------------------


def _run(args: "list[str]", timeout: float = 300) -> str:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LOCAL_WORLD_SIZE"}
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def _shell_jobs(path: Path, cpus: "list[str]", folder: Path) -> "list[tuple[int, int]]":
    """Jobs started as a shell's ``python job.py &`` (or a launcher's ranks): children of one process, running one
    command line, each pinned to its entry of ``cpus`` ("-": not pinned). Their (siblings, a Reader's readers)."""
    folder.mkdir(parents=True)
    script = f"import subprocess, sys; jobs = [subprocess.Popen([sys.executable, {_JOBS!r}, {str(folder)!r}, " \
             f"{str(path)!r}, cpu, {str(len(cpus))!r}]) for cpu in {cpus!r}]; sys.exit(max(j.wait() for j in jobs))"
    _run(["-c", script])
    return sorted(_jobs.read(folder))  # type: ignore[no-any-return]


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    import h5py
    import numpy as np

    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(4000.0).reshape(1000, 4), chunks=(100, 4), compression="gzip")
    return path


@pytest.fixture
def two_cpus() -> "list[str]":
    import os

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    return [str(cpu) for cpu in cpus[:2]]


def test_a_shells_jobs_share_their_cpus(rows_file: Path, tmp_path: Path, two_cpus: "list[str]", no_leaks: None) -> None:
    """``for i in 1 2; do python job.py & done`` (``mpirun`` and ``srun`` start their ranks alike, whatever their
    environment says): each job started a reader per CPU, two jobs two per CPU. Now each counts the other and splits
    the CPUs with it (on a share of one CPU a Reader reads in the job); jobs pinned to CPUs of their own share none."""
    import os

    share = len(os.sched_getaffinity(0)) // 2
    assert _shell_jobs(rows_file, ["-", "-"], tmp_path / "free") == [(1, share if share > 1 else 0)] * 2
    assert _shell_jobs(rows_file, [two_cpus[0]] * 2, tmp_path / "same") == [(1, 0)] * 2
    assert _shell_jobs(rows_file, two_cpus, tmp_path / "own") == [(0, 1)] * 2


def test_spawned_ranks_pinned_to_cpus_of_their_own_do_not_share_them(
    rows_file: Path, tmp_path: Path, two_cpus: "list[str]", no_leaks: None
) -> None:
    """Ranks that ``multiprocessing`` spawned (as ``torch.multiprocessing.spawn`` does), each pinned to a CPU of its
    own: each counted the other all the same, halving its one CPU, and a Reader read in the rank. Now each reads
    with one reader, as a process alone on one CPU; unpinned, they share the CPUs as before."""
    import os

    share = len(os.sched_getaffinity(0)) // 2
    script = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import _jobs; " \
             f"_jobs.spawn_ranks({str(tmp_path / '%s')!r}, {str(rows_file)!r}, %r)"
    _run(["-c", script % ("own", two_cpus)])
    assert sorted(_jobs.read(tmp_path / "own")) == [(0, 1)] * 2
    _run(["-c", script % ("free", ["-", "-"])])
    assert sorted(_jobs.read(tmp_path / "free")) == [(1, share if share > 1 else 0)] * 2


def test_a_program_is_the_same_however_its_command_line_spells_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's ranks run ``[sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]`` beside the user's
    ``python -u train.py``: the same program. Another script, other arguments or another interpreter are not."""
    from multitables._sys import siblings

    (tmp_path / "work").mkdir()
    (tmp_path / "bin").mkdir()
    lines = {
        1: ("python", "work", b"python\0-u\0-X\0dev\0train.py\0--lr\0001\0"),
        2: ("python", "bin", b"/v/bin/python\0../work/./train.py\0--lr\0002\0"),  # digits aside
        3: ("python", "work", b"python\0eval.py\0--lr\0001\0"),
        4: ("python", "work", b"python\0train.py\0--lr\0"),
        5: ("python2", "work", b"python\0train.py\0--lr\0001\0"),
        6: ("python", "work", b"python\0-m\0pkg.train\0"),
        7: ("python", "bin", b"/v/bin/python\0-m\0pkg.train\0"),
    }
    for pid, (exe, cwd, line) in lines.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "exe").symlink_to(tmp_path / "bin" / exe)
        (tmp_path / str(pid) / "cwd").symlink_to(tmp_path / cwd)
        (tmp_path / str(pid) / "cmdline").write_bytes(line)
    monkeypatch.setattr(siblings, "PROC", str(tmp_path))
    programs = {pid: siblings._program(pid) for pid in lines}
    assert programs[1] == programs[2] and programs[6] == programs[7]
    assert len({programs[p] for p in (1, 3, 4, 5, 6)}) == 5
    assert siblings._program(8) is None  # gone



def _torchrun(launcher: str, path: Path, folder: Path, pinned: str, cpus: str) -> "list[tuple[int, int]]":
    """Two ranks torchrun started (``launcher``: its script, or ``-m torch.distributed.run --nnodes 1``), itself
    pinned to the CPUs ``pinned`` as ``taskset -c`` does ("-": not), each rank to its entry of ``cpus`` ("-,-":
    neither). Their (siblings, a Reader's readers)."""
    import sys

    pytest.importorskip("torch")
    folder.mkdir(parents=True)
    run = [str(Path(sys.executable).parent / "torchrun")] if launcher == "torchrun" else launcher.split()
    command = [*run, "--standalone", "--nproc_per_node=2", _JOBS, str(folder), str(path), cpus, "2"]
    pin = "" if pinned == "-" else f"os.sched_setaffinity(0, {{{pinned}}}); "
    _run(["-c", f"import os, sys; {pin}os.execv(sys.executable, [sys.executable, *{command!r}])"])
    return sorted(_jobs.read(folder))  # type: ignore[no-any-return]


@pytest.mark.parametrize("launcher", ["torchrun", "-m torch.distributed.run --nnodes 1"])
def test_torchruns_ranks_on_one_narrowed_affinity_share_it(
    launcher: str, rows_file: Path, tmp_path: Path, two_cpus: "list[str]", no_leaks: None
) -> None:
    """``taskset -c 0 torchrun --nproc_per_node=2``: the ranks inherit an affinity narrower than the cpuset, which read
    as ranks pinned to CPUs of their own, so each counted the CPU as its own and a Reader started a reader in each.
    Now they share it, and read in the ranks."""
    assert _torchrun(launcher, rows_file, tmp_path / "one", two_cpus[0], "-,-") == [(1, 0)] * 2


def test_torchruns_ranks_share_what_they_inherit_and_not_what_each_is_pinned_to(
    rows_file: Path, tmp_path: Path, two_cpus: "list[str]", no_leaks: None
) -> None:
    """Unpinned, torchrun's ranks share the launcher's CPUs as a shell's jobs do (a share of one CPU: a Reader reads in
    the rank); each pinned to a CPU of its own, they share none."""
    import os

    share = len(os.sched_getaffinity(0)) // 2
    assert _torchrun("torchrun", rows_file, tmp_path / "free", "-", "-,-") == [(1, share if share > 1 else 0)] * 2
    assert _torchrun("torchrun", rows_file, tmp_path / "own", "-", ",".join(two_cpus)) == [(0, 1)] * 2


def test_lightnings_ranks_count_the_rank_that_started_them_and_it_counts_them(
    rows_file: Path, tmp_path: Path, two_cpus: "list[str]", no_leaks: None
) -> None:
    """PyTorch Lightning's ``strategy="ddp"`` (its process tree, without Lightning): rank 0 is the user's ``python -u
    _jobs.py``, which starts the other ranks as ``[sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]`` with
    ``LOCAL_RANK`` set, and holds a forked worker. Rank 0 counted no sibling (its parent's only child) and rank 1 none
    either (its parent's only child of its command line): each took every CPU. Now each counts the other, not the
    forked worker; pinned each to CPUs of its own, none."""
    import os
    import subprocess
    import sys

    share = len(os.sched_getaffinity(0)) // 2
    for name, cpus, expected in [("free", "-,-", (1, share if share > 1 else 0)), ("own", ",".join(two_cpus), (0, 1))]:
        (tmp_path / name).mkdir()
        args = [sys.executable, "-u", Path(_JOBS).name, str(tmp_path / name), str(rows_file), cpus, "2", "launch"]
        env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_WORLD_SIZE", "LOCAL_RANK")}
        run = subprocess.run(args, cwd=Path(_JOBS).parent, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        assert sorted(_jobs.read(tmp_path / name)) == [expected] * 2, name
