"""Running a script under the disk model (``multitables_bench/diskmodel.py``), for the tests that use it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any


def run_under(model: Any, script: str, *args: str) -> str:
    """Run ``script`` in a child process under ``model`` (a :class:`~multitables_bench.diskmodel.DiskModel`); its stdout."""
    done = subprocess.run([sys.executable, "-c", script, *args], env=model.env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout
