"""NOTE [pool workers] in ``_sys.siblings``: a pool's other workers, this process's siblings, read from /proc."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("children_lists", [True, False], ids=["children lists", "every process scanned"])
def test_a_workers_siblings_are_its_parents_live_children_of_its_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children_lists: bool
) -> None:
    """Counted: the parent's other children running this command line, its descriptors' numbers aside. Not counted:
    the pool's helpers (another line), a zombie, another parent's child of the same line; nothing outside a process
    multiprocessing started."""
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
    }
    for pid, (ppid, state, line) in procs.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_bytes(b"%d (py thon) %s %d 1 1" % (pid, state.encode(), ppid))
        (tmp_path / str(pid) / "cmdline").write_bytes(line)
    if children_lists:
        for ppid in (parent, other):
            task = tmp_path / str(ppid) / "task" / str(ppid)
            task.mkdir(parents=True)
            task.joinpath("children").write_text(" ".join(str(p) for p, (pp, _, _) in procs.items() if pp == ppid) + " ")
    monkeypatch.setattr(siblings, "PROC", str(tmp_path))
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    assert siblings.pool_siblings() == 2
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)  # a main script: no pool
    assert siblings.pool_siblings() == 0
