"""Jobs that report their default readers, for NOTE [CPU siblings]: started as a shell's jobs or a launcher's ranks
(``python _jobs.py FOLDER FILE CPU JOBS``), spawned as ranks (:func:`spawn_ranks`), or as Lightning's launcher starts
them (``python _jobs.py FOLDER FILE CPU JOBS launch``: :func:`launch`). Each waits until every job runs, as ranks
meet in ``init_process_group``, pinned to CPU ``CPU`` where not "-" (``CPU`` a list "0,1": its rank's entry, by
``LOCAL_RANK``), then writes its siblings and a default Reader's readers into ``FOLDER`` (:func:`read`)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

#: Seconds the jobs may take to meet before one fails instead of hanging.
GUARD = 120.0


def _meet(folder: Path, stage: str, jobs: int) -> None:
    (folder / f"{stage}-{os.getpid()}").touch()
    deadline = time.monotonic() + GUARD
    while sum(name.startswith(stage) for name in os.listdir(folder)) < jobs:
        assert time.monotonic() < deadline, f"not every job reached {stage}"
        time.sleep(0.01)


def job(folder: str, path: str, cpu: str, jobs: int) -> None:
    """One job: its siblings and a default Reader's readers, written as ``counted-PID``."""
    import multitables
    from multitables._plan.readers import Machine

    cpu = cpu.split(",")[int(os.environ.get("LOCAL_RANK", "0"))]
    if cpu != "-":
        os.sched_setaffinity(0, {int(cpu)})
    _meet(Path(folder), "started", jobs)
    siblings = Machine.here().siblings
    with multitables.Reader(path) as reader:
        Path(folder, f"counted-{os.getpid()}").write_text(f"{siblings} {reader.n_procs}")
    _meet(Path(folder), "done", jobs)  # none gone while another counts


def spawn_ranks(folder: str, path: str, cpus: "list[str]") -> None:
    """A rank per entry of ``cpus``, spawned as ``torch.multiprocessing.spawn`` starts them (non-daemonic)."""
    import multiprocessing

    os.makedirs(folder)
    spawn = multiprocessing.get_context("spawn")
    ranks = [spawn.Process(target=job, args=(folder, path, cpu, len(cpus))) for cpu in cpus]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(GUARD + 60)
    assert all(rank.exitcode == 0 for rank in ranks), [rank.exitcode for rank in ranks]


def launch(argv: "list[str]") -> None:
    """Rank 0 of ``JOBS``, as Lightning's ``strategy="ddp"`` makes it: this process, the user's, starts the other ranks
    running its command line as ``[sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]``, ``LOCAL_RANK`` (not
    ``LOCAL_WORLD_SIZE``) set in every rank's environment, its own too (the others' tells them to start no ranks); it
    holds a forked worker meanwhile, as a DataLoader's (not a rank)."""
    import multiprocessing
    import subprocess

    jobs = int(argv[4])
    os.environ.update(NODE_RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(jobs))
    command = [sys.executable, os.path.abspath(argv[0]), *argv[1:]]
    ranks = [subprocess.Popen(command, env=dict(os.environ, LOCAL_RANK=str(rank))) for rank in range(1, jobs)]
    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(GUARD,), daemon=True)
    worker.start()
    try:
        job(argv[1], argv[2], argv[3], jobs)
    finally:
        worker.kill()
        worker.join()
    assert all(rank.wait(GUARD + 60) == 0 for rank in ranks), [rank.returncode for rank in ranks]


def read(folder: Path) -> "list[tuple[int, int]]":
    """Each job's (siblings, readers)."""
    return [tuple(map(int, p.read_text().split())) for p in folder.glob("counted-*")]  # type: ignore[misc]


if __name__ == "__main__":
    if sys.argv[5:] == ["launch"] and "LOCAL_RANK" not in os.environ:
        launch(sys.argv)
    else:
        job(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
