"""``benchmarks/object_storage.py --url``: the object benchmark against an endpoint named on its command line.

A real endpoint is not reachable from the tests; the byte-range server of the
object tests (on 127.0.0.1) stands in for one. What is asserted is what a pass
delivered (every byte of the dataset, by each way), not how fast.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def test_the_object_benchmark_reads_an_endpoint_named_on_its_command_line(rangesrv: Any, obj_files: Any, aws_env: None) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "object_storage.py"), "--url", f"{rangesrv.url}/data.h5",
         "--dataset", "/x", "--repeats", "2", "--n-procs", "2", "--skip", "h5py", "h5coro"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,  # the timeout: a hang guard only
    )
    assert done.returncode == 0, done.stderr
    header, *_ = [line for line in done.stdout.splitlines() if line.startswith(f"{rangesrv.url}/data.h5")]
    assert header.startswith(f"{rangesrv.url}/data.h5, /x, object ")
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in done.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| way")}
    assert rows == {name: f"{obj_files['x'].nbytes / 1e6:.3f}" for name in (
        "multitables, default n_procs", "multitables, n_procs=2", "download (multitables' client), then multitables")}
