#!/usr/bin/env python
"""How soon a failure reaches the user, and how soon readers are gone: the times ``docs/failures.rst`` promises.

The failure tests assert what happens (which error, naming whom, what is left);
this measures how long it takes, with real processes and real signals:

* ``killed``: a reader is SIGKILLed while the consumer streams; seconds until
  ``get()`` raises ``ReaderError`` (promise: 2 s);
* ``killed-blocked``: the same while the consumer waits in ``get()`` for the
  dead reader's block (promise: 2 s);
* ``close``: ``queue.close()`` in a cyclic stream; seconds until every reader
  has exited and the ring is unmapped (promise: 2 s);
* ``break``: ``break`` out of ``get_generator``, the generator dropped; the same
  (promise: 2 s);
* ``orphans``: the consumer process is SIGKILLed; seconds until its readers
  have exited (promise: about half a second, at most about a second);
* ``request``: a ``Reader``'s reader is SIGKILLed while ``future.get()`` waits
  for its share; seconds until it raises (promise: a fraction of a second).

Prints a markdown table: median and max of ``--reps`` runs per case.

    python benchmarks/failure_latency.py --reps 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import psutil

import multitables
from multitables import Reader, ReaderError, Streamer
from multitables._shm.segment import SHM_PREFIX

ROWS, ROW, CHUNK = 20_000, 16, 500
POLL = 0.001  # seconds between looks at the process table
GUARD = 30.0  # a case that takes longer than this is reported as hung

PROMISES = {
    "killed": "2 s",
    "killed-blocked": "2 s",
    "close": "2 s",
    "break": "2 s",
    "orphans": "about 0.5 s",
    "request": "a fraction of a second",
}


def make_file(path: Path) -> None:
    data = np.arange(ROWS * ROW, dtype=np.float32).reshape(ROWS, ROW)
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, chunks=(CHUNK, ROW), compression="gzip", compression_opts=1)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def ring_mapped() -> bool:
    with open("/proc/self/maps") as f:
        return any(f"/dev/shm/{SHM_PREFIX}" in line for line in f)


def seconds_until(condition: Callable[[], bool], t0: float) -> float:
    while not condition():
        if time.monotonic() - t0 > GUARD:
            raise TimeoutError(f"not within {GUARD} s")
        time.sleep(POLL)
    return time.monotonic() - t0


def raise_seconds(step: Callable[[], object], t0: float) -> float:
    """Seconds from ``t0`` until ``step()`` raises ReaderError (called until it does)."""
    try:
        while time.monotonic() - t0 < GUARD:
            step()
    except ReaderError:
        return time.monotonic() - t0
    raise TimeoutError(f"no ReaderError within {GUARD} s")


def case_killed(h5: Path) -> float:
    with Streamer(str(h5)).get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True) as q:
        q.get().release()
        victim = q.reader_pids[1]
        os.kill(victim, signal.SIGKILL)
        return raise_seconds(lambda: q.get().release(), time.monotonic())


def case_killed_blocked(h5: Path) -> float:
    with Streamer(str(h5)).get_queue("/data", n_procs=1, block_size=CHUNK, read_ahead=2, cyclic=True) as q:
        (victim,) = q.reader_pids
        os.kill(victim, signal.SIGSTOP)
        killed_at: list[float] = []

        def kill() -> None:
            killed_at.append(time.monotonic())
            os.kill(victim, signal.SIGKILL)

        killer = threading.Timer(0.3, kill)  # fires while the consumer waits in get()
        killer.start()
        try:
            raise_seconds(lambda: q.get().release(), time.monotonic())
            return time.monotonic() - killed_at[0]
        finally:
            killer.join()


def case_close(h5: Path) -> float:
    q = Streamer(str(h5)).get_queue("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True)
    q.get().release()
    pids = q.reader_pids
    t0 = time.monotonic()
    q.close()
    return seconds_until(lambda: all(gone(p) for p in pids) and not ring_mapped(), t0)


def case_break(h5: Path) -> float:
    before = {c.pid for c in psutil.Process().children()}
    gen = Streamer(str(h5)).get_generator("/data", n_procs=2, block_size=CHUNK, read_ahead=4, cyclic=True)
    for _ in gen:
        break
    pids = [c.pid for c in psutil.Process().children() if c.pid not in before and "resource_tracker" not in " ".join(c.cmdline())]
    t0 = time.monotonic()
    del gen
    return seconds_until(lambda: all(gone(p) for p in pids) and not ring_mapped(), t0)


CONSUMER = textwrap.dedent(
    """
    import json, sys, multitables
    q = multitables.Streamer(sys.argv[1]).get_queue("/data", n_procs=2, block_size=500, read_ahead=4, cyclic=True)
    q.get().release()
    print(json.dumps(q.reader_pids), flush=True)
    while True:
        q.get().release()
    """
)


def case_orphans(h5: Path) -> float:
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, str(h5)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        pids = json.loads(proc.stdout.readline())
        time.sleep(0.2)  # streaming in full swing
        t0 = time.monotonic()
        proc.kill()
        proc.wait(GUARD)
        return seconds_until(lambda: all(gone(p) for p in pids), t0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def case_request(h5: Path) -> float:
    with Reader(str(h5), n_procs=2) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(ROWS)
        victim = reader.reader_pids[1]
        os.kill(victim, signal.SIGSTOP)  # its share of the request waits in its inbox
        future = reader.request(ds[:], stage)
        killed_at: list[float] = []

        def kill() -> None:
            killed_at.append(time.monotonic())
            os.kill(victim, signal.SIGKILL)

        killer = threading.Timer(0.3, kill)  # fires while get() waits
        killer.start()
        try:
            future.get(timeout=GUARD)
        except ReaderError:
            return time.monotonic() - killed_at[0]
        finally:
            killer.join()
        raise AssertionError("the request was served by a dead reader")


CASES: dict[str, Callable[[Path], float]] = {
    "killed": case_killed,
    "killed-blocked": case_killed_blocked,
    "close": case_close,
    "break": case_break,
    "orphans": case_orphans,
    "request": case_request,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10, help="runs per case (default 10)")
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mt-latency-") as tmp:
        h5 = Path(tmp) / "data.h5"
        make_file(h5)
        print(f"multitables {multitables.__version__}, Python {platform.python_version()}, "
              f"{len(os.sched_getaffinity(0))} CPUs; `python benchmarks/failure_latency.py --reps {a.reps}`\n")
        print("| case | median s | max s | promise (docs/failures.rst) |")
        print("|---|---|---|---|")
        for name in a.cases:
            times = [CASES[name](h5) for _ in range(a.reps)]
            print(f"| {name} | {statistics.median(times):.3f} | {max(times):.3f} | {PROMISES[name]} |", flush=True)


if __name__ == "__main__":
    main()
