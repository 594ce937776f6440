"""What the hints of the blocks ahead cost a pass of a cached file, in the consumer (issue #29; NOTE [hints on cached bytes]).

Reads every block of ``/data`` of ``--file`` with ``get_queue(n_procs=0)``
(the consumer reads, hinting one block ahead on a compressed file, as one
reader does) ``--passes`` times per engine, the page cache warm, and times
each call of the source's ``prefetch``. Printed per engine: the median over
passes of the hints' milliseconds a pass, the calls a pass, and the median
pass. ``PYTHONPATH`` may name another copy of the package, to compare two.
The scaling section's blosc file (``multitables-benchmark --sections scaling
--section-mib 1024 --file bench/scal.h5`` writes ``bench/scal-scaling-blosc-3.h5``)::

    PYTHONPATH=<before> python benchmarks/hint_cost.py --file bench/scal-scaling-blosc-3.h5
    python benchmarks/hint_cost.py --file bench/scal-scaling-blosc-3.h5
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import multitables
from multitables._io.chunks.source import ChunkSource
from multitables._io.h5py_engine import H5pySource


def timed_prefetch(spent: list[float]) -> None:
    """Wrap both engines' ``prefetch`` to add each call's seconds and a count to ``spent`` ([seconds, calls])."""
    for cls in (ChunkSource, H5pySource):
        original = cls.prefetch

        def prefetch(self: Any, start: int, stop: int, _original: Any = original) -> None:
            t = time.perf_counter()
            _original(self, start, stop)
            spent[0] += time.perf_counter() - t
            spent[1] += 1

        cls.prefetch = prefetch  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", required=True, help="an HDF5 file with a compressed /data")
    parser.add_argument("--engines", nargs="+", default=["chunks", "h5py"])
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    spent = [0.0, 0]
    timed_prefetch(spent)
    print(f"multitables from {multitables.__file__}")
    for engine in args.engines:
        hints, passes, calls = [], [], 0
        for _ in range(args.passes + 1):  # the first pass warms the page cache and the imports, untimed
            spent[:] = [0.0, 0]
            t = time.perf_counter()
            with multitables.Streamer(args.file, engine=engine).get_queue("/data", n_procs=0, remainder=True) as q:
                for guard in q.iter():
                    with guard:
                        pass
            passes.append(time.perf_counter() - t)
            hints.append(spent[0])
            calls = int(spent[1])
        print(f"{engine}: hints {statistics.median(hints[1:]) * 1e3:.2f} ms a pass ({calls} calls), "
              f"pass {statistics.median(passes[1:]) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
