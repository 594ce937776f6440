"""A function run in a forked child of the test's process, for the tests of what a fork inherits."""

from __future__ import annotations

import gc
import json
import os
import signal
from typing import Callable


def in_a_fork(run: "Callable[[], object]", seconds: int = 60) -> object:
    """``run()`` in a forked child (killed by an alarm after ``seconds``: a hang fails the test), its result as JSON
    (``{"result": ...}``, or ``{"error": repr}``); the collector off across the fork, so that the child frees nothing
    of this process's by collecting (where CUDA runs, freeing a tensor would abort it)."""
    read, write = os.pipe()
    collecting = gc.isenabled()
    gc.disable()
    try:
        pid = os.fork()
        if pid == 0:
            os.close(read)
            signal.alarm(seconds)
            try:
                got = {"result": run()}
            except BaseException as exc:  # noqa: BLE001 - said to the parent
                got = {"error": repr(exc)}
            os.write(write, json.dumps(got).encode())
            os._exit(0)
    finally:
        if collecting:
            gc.enable()
    os.close(write)
    said = b""
    while chunk := os.read(read, 65536):  # before the wait: a child blocks on a full pipe until it is read
        said += chunk
    os.close(read)
    status = os.waitpid(pid, 0)[1]
    assert status == 0, f"the child ended with status {status} (a signal's number in the low bits: 14, it hung)"
    return json.loads(said)
