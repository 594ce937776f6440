"""The lent machine's script (``benchmarks/lent_machine.sh``) runs its steps here, at a small size.

A lent machine is had for minutes, and a step that a change of the package
broke (a script looking a name up where it no longer lives) is found there
only by spending them. The steps that need CUDA skip themselves here; the
one that holds 4 GiB (``start-methods``) and the CUDA tests (run by this
suite anyway) are left out for time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STEPS = ["scaling", "probe", "startup", "startup-forkserver", "gpu", "batches", "device-ratio", "window-waits", "epoch-start", "epoch-scale"]


def test_the_lent_machines_steps_run_here_at_16_mib(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # the GPU steps import it, as the lent machine has it
    out = tmp_path / "out"
    # The script's steps run ``python3``: this interpreter's, where pytest runs from a venv not activated.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    run = subprocess.run(["bash", "benchmarks/lent_machine.sh", str(out), "16", *STEPS], cwd=REPO,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "LENT_REPEATS": "1", "PATH": path})
    ended = dict(re.findall(r"^([\w-]+): rc (\d+) in ", run.stdout, re.M))
    if ended != {step: "0" for step in STEPS}:
        logs = ""
        if (out / "logs.tgz").exists():
            with tarfile.open(out / "logs.tgz") as tar:
                for member in tar.getmembers():
                    if member.name.endswith(".log") and ended.get(member.name[:-4]) != "0":
                        logs += f"\n--- {member.name}\n" + tar.extractfile(member).read().decode()[-3000:]  # type: ignore[union-attr]
        raise AssertionError(f"steps that did not end with rc 0: {ended}\n{run.stdout[-2000:]}{run.stderr[-2000:]}{logs}")
