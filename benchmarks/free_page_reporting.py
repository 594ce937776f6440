"""How free page reporting on a virtual machine changes a cold read, and whether settling memory first evens it out.

Run on the machine the benchmark runs on (the file should be 1 GiB or more,
on the disk under test)::

    python benchmarks/free_page_reporting.py FILE [--repeats 4] [--wait 5]

For every repeat it drops FILE's pages from the page cache and reads the file
once with plain buffered reads, four ways: at once; after waiting ``--wait``
seconds (Linux hands freed pages to the host every ~2 s); and both again with
:func:`multitables_bench.cache.settle_free_memory` (the benchmark's step before
every cold pass) between the wait and the read. It prints MB/s and the system
time of each read; see NOTE [free page reporting] in ``multitables_bench/cache.py``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

from multitables_bench.cache import evict, free_page_reporting, settle_free_memory

READ_BYTES = 4 << 20


def read_file(path: str) -> tuple[float, float]:
    """Read ``path`` once, buffered; return (bytes/s, system CPU seconds)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(READ_BYTES)
    n = 0
    try:
        while k := os.readv(fd, [buf]):
            n += k
    finally:
        os.close(fd)
    seconds = time.perf_counter() - t0
    return n / seconds, resource.getrusage(resource.RUSAGE_SELF).ru_stime - before


def main(argv: "list[str] | None" = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--wait", type=float, default=5.0, help="seconds between dropping the pages and reading")
    args = parser.parse_args(argv)
    size = os.path.getsize(args.file)
    ways = {
        "at once": (0.0, False),
        f"after {args.wait:g} s": (args.wait, False),
        "at once, memory settled": (0.0, True),
        f"after {args.wait:g} s, memory settled": (args.wait, True),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, (wait, settle) in ways.items():
            evict(args.file)
            time.sleep(wait)
            if settle:
                settle_free_memory(size)
            results[name].append(read_file(args.file))
    print(f"free page reporting: {'yes' if free_page_reporting() else 'no'}; {args.file}: {size / 1e9:.2f} GB")
    print("| read | MB/s (median) | MB/s, each | system s (median) |")
    print("|---|---:|---|---:|")
    for name, runs in results.items():
        rates = [r / 1e6 for r, _ in runs]
        print(
            f"| {name} | {statistics.median(rates):,.0f} | {', '.join(f'{x:,.0f}' for x in rates)} "
            f"| {statistics.median(s for _, s in runs):.2f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
