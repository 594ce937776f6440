"""Where an object's stream spends the time before its first block (issue #31): a timeline of one pass's start.

Serves a file of ``--rows`` rows (``object_storage.write``: 1 KiB smooth rows,
``--complib``) from ``tests/objservers.py``'s range server in this process,
with ``--latency`` s before every answer and a ``--rate`` B/s cap, and opens
``Streamer("s3://bench/data.h5").get_queue("/data")`` on it with the default
readers. Printed, in seconds from the start: each batch of ranged reads this
process makes (the look, HDF5's metadata through the file object, the chunk
index) with its ranges and bytes and the caller, the ring's creation, the
readers' start and attach, and the first and last blocks. Run from the
checkout::

    python benchmarks/object_startup.py --rows 1048576 --latency 0.05 --rate 250e6
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import multitables  # noqa: E402
import object_storage  # noqa: E402
from multitables._io.objects import reader as objects_reader  # noqa: E402
from multitables._procs import pool  # noqa: E402
from multitables._shm import ring  # noqa: E402
from multitables_bench.calls import time_calls  # noqa: E402
from objservers import RangeServer  # noqa: E402

T0 = [0.0]


def now() -> float:
    return time.perf_counter() - T0[0]


def traced(owner: Any, name: str, describe: Callable[..., str]) -> None:
    """Print ``owner.name``'s calls in this process: start and end (s from T0), and ``describe(*args)``."""
    me = os.getpid()

    def done(t0: float, t1: float, args: tuple) -> None:
        if os.getpid() == me:  # not in the forked readers
            print(f"{t0 - T0[0]:7.3f} - {t1 - T0[0]:7.3f}  {describe(*args)}", flush=True)

    time_calls(owner, name, done)


def reads(_self: Any, ranges: Any, *_: Any) -> str:
    caller = next((f"{os.path.basename(f.filename)}:{f.name}" for f in reversed(traceback.extract_stack()[:-3])
                   if "objects" not in f.filename), "?")
    return f"{len(ranges)} ranged read(s), {sum(n for _, n in ranges) / 1e3:,.0f} kB, from byte {ranges[0][0]:,} ({caller})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1 << 20)
    p.add_argument("--complib", default="zlib")
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--rate", type=float, default=250e6)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp())
    (root / "bench").mkdir()
    object_storage.write(root / "bench" / "data.h5", args.rows, args.complib)
    traced(objects_reader.ObjectReader, "read_into", reads)
    traced(ring.Ring, "create", lambda *a: "the ring created")
    traced(pool.ReaderPool, "start", lambda *a: "the readers started (fork)")
    traced(pool.ReaderPool, "wait_attached", lambda *a: "the readers attached (each maps the ring)")
    with RangeServer(str(root), latency=args.latency, rate=args.rate) as srv:
        os.environ.update(AWS_ENDPOINT_URL=srv.url, AWS_ACCESS_KEY_ID=object_storage.KEY,
                          AWS_SECRET_ACCESS_KEY=object_storage.SECRET, AWS_REGION="us-east-1")
        T0[0] = time.perf_counter()
        with multitables.Streamer("s3://bench/data.h5").get_queue("/data", remainder=True) as queue:
            print(f"{now():7.3f}            get_queue returned: {queue.n_procs} readers, blocks of {queue.block_size:,} rows")
            for k, guard in enumerate(queue.iter()):
                with guard:
                    pass
                if k == 0:
                    print(f"{now():7.3f}            the first block", flush=True)
            print(f"{now():7.3f}            the last block; {srv.bytes_sent / 1e6:,.1f} MB sent")


if __name__ == "__main__":
    main()
