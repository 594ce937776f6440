"""Object storage (issue 31, item 7): one HDF5 file in an emulated distant bucket, read three ways.

The bucket is ``tests/objservers.py``'s byte-range server (path-style S3
GET/HEAD, ``sendfile``), started as a process on 127.0.0.1 with a latency
added before every answer and a bandwidth cap shared by all answers. The file
is written once: ``--rows`` rows of 256 float32 (1 KiB each) of smooth,
compressible values, zlib 3 + shuffle, PyTables' chunking. Each pass reads
every row of ``/data``:

* ``multitables``: ``Streamer("s3://bench/data.h5").get_queue("/data")`` (the
  chunk engine's ranged GETs), every block taken and released; with the
  default ``n_procs`` and with ``--n-procs`` readers;
* ``h5py + s3fs``: ``h5py.File(s3fs_file)["/data"]``, read in blocks of 4 MiB
  of rows into one buffer, with s3fs's default block size (50 MiB, read ahead)
  and with 4 MiB blocks;
* ``download, then read``: the whole object fetched (multitables' client:
  8 MiB parts, 8 in flight) into a local file, then streamed from there with
  multitables (the page cache warm: the file was just written).

Printed: per way, the median wall time of ``--repeats`` passes, MB/s of rows
delivered (uncompressed) and of bytes fetched, the requests (GETs and HEADs,
counted by the server) and bytes fetched per pass, as Markdown. ``--client``
instead times the client alone, as the lab measured obstore and s3fs
(``BENCHMARKS.md``, "Object storage: the client"): a ``--client`` MiB object
of random bytes read whole into one buffer, in 1 and 8 MiB parts, 1, 4 and 16
in flight, with no latency and no cap; MiB/s and the client's CPU seconds per
GiB (this process's user + system time). The h5py way needs ``s3fs``. Run from
the checkout::

    python benchmarks/object_storage.py --latency 0.05 --rate 250e6 --repeats 5 --n-procs 8
    python benchmarks/object_storage.py --client 256
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import multitables  # noqa: E402
from multitables._io.objects.config import make_store  # noqa: E402
from multitables._io.objects.reader import ObjectReader  # noqa: E402

KEY, SECRET = "AKIDBENCH", "bench-secret"  # the server checks no signature


def write(path: Path, rows: int) -> None:
    import tables

    t = np.linspace(0, 60, 256, dtype="f4")
    with tables.open_file(path, "w") as f:
        data = f.create_earray("/", "data", tables.Float32Atom(), (0, 256), filters=tables.Filters(3, "zlib", shuffle=True),
                               expectedrows=rows)
        rng = np.random.default_rng(0)
        for start in range(0, rows, 16384):
            n = min(16384, rows - start)
            phase = rng.uniform(0, 6.3, (n, 1)).astype("f4")
            data.append((np.sin(t + phase) * 100).round(1))


def start_server(root: Path, latency: float, rate: float) -> "tuple[subprocess.Popen, str]":
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "objservers.py"), "--root", str(root), "--latency",
                             str(latency), "--rate", str(rate)], stdout=subprocess.PIPE, text=True)
    line = (proc.stdout.readline() if proc.stdout else "").split()
    if not line or line[0] != "READY":
        proc.kill()
        raise RuntimeError("the range server did not start")
    return proc, f"http://127.0.0.1:{line[1]}"


def counts(endpoint: str) -> "dict[str, int]":
    with urllib.request.urlopen(f"{endpoint}/__stats") as answer:
        return json.loads(answer.read())


def multitables_pass(url: str, options: dict, n_procs: "int | None") -> Callable[[], int]:
    def run() -> int:
        n = 0
        stream = multitables.Streamer(url, storage_options=options)
        with stream.get_queue("/data", n_procs=n_procs, remainder=True) as queue:
            for guard in queue.iter():
                with guard as block:
                    n += block.nbytes
        return n

    return run


def h5py_s3fs_pass(endpoint: str, block_size: "int | None") -> Callable[[], int]:
    def run() -> int:
        import h5py
        import s3fs

        fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=endpoint, skip_instance_cache=True)
        kwargs = {} if block_size is None else {"block_size": block_size}
        with fs.open("bench/data.h5", "rb", **kwargs) as fileobj, h5py.File(fileobj, "r") as f:
            ds = f["/data"]
            rows = 4096
            out = np.empty((rows,) + ds.shape[1:], ds.dtype)
            n = 0
            for start in range(0, ds.shape[0], rows):
                stop = min(start + rows, ds.shape[0])
                ds.read_direct(out, np.s_[start:stop], np.s_[: stop - start])
                n += out[: stop - start].nbytes
        return n

    return run


def download_pass(url: str, options: dict, scratch: Path) -> Callable[[], int]:
    def run() -> int:
        local = scratch / "downloaded.h5"
        with ObjectReader(url, make_store(options)) as reader:
            buffer = np.empty(reader.size, np.uint8)
            reader.read_into([(0, reader.size)], [buffer])
        buffer.tofile(local)
        n = 0
        with multitables.Streamer(str(local)).get_queue("/data", remainder=True) as queue:
            for guard in queue.iter():
                with guard as block:
                    n += block.nbytes
        local.unlink()
        return n

    return run


def client_cost(size_mib: int, repeats: int) -> None:
    """The client alone: the whole object into one buffer; MiB/s and CPU s/GiB, median of ``repeats``."""
    import resource

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "bench").mkdir()
        (root / "bench" / "blob").write_bytes(np.random.default_rng(1).bytes(size_mib << 20))
        server, endpoint = start_server(root, 0.0, 0.0)
        try:
            print(f"{size_mib} MiB object, loopback, no latency, no cap; median of {repeats}\n")
            print("| part | in flight | MiB/s | client CPU s/GiB |")
            print("|---|---|---|---|")
            for part in (1, 8):
                for inflight in (1, 4, 16):
                    options = {"endpoint_url": endpoint, "anon": True, "part_size": part << 20,
                               "max_inflight": inflight, "open_readahead": 1}
                    rates, cpus = [], []
                    for _ in range(repeats):
                        buffer = np.empty(size_mib << 20, np.uint8)
                        before = resource.getrusage(resource.RUSAGE_SELF)
                        t = time.perf_counter()
                        with ObjectReader("s3://bench/blob", make_store(options)) as reader:
                            reader.read_into([(0, reader.size)], [buffer])
                        seconds = time.perf_counter() - t
                        after = resource.getrusage(resource.RUSAGE_SELF)
                        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                        rates.append(size_mib / seconds)
                        cpus.append(cpu / (size_mib / 1024))
                    print(f"| {part} MiB | {inflight} | {statistics.median(rates):.0f} | {statistics.median(cpus):.2f} |",
                          flush=True)
        finally:
            server.terminate()
            server.wait(10)


def measure(run: Callable[[], int], endpoint: str, repeats: int) -> "dict[str, Any]":
    times, rows, fetched = [], 0, []
    for _ in range(repeats):
        before = counts(endpoint)
        t = time.perf_counter()
        rows = run()
        times.append(time.perf_counter() - t)
        after = counts(endpoint)
        fetched.append({k: after[k] - before[k] for k in after})
    seconds = statistics.median(times)
    last = fetched[-1]
    return {"s": seconds, "MB/s": rows / seconds / 1e6, "fetched MB/s": last["bytes"] / seconds / 1e6,
            "GET": last["GET"], "HEAD": last["HEAD"], "MB fetched": last["bytes"] / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=131_072, help="rows of 1 KiB (default: 128 MiB of data)")
    ap.add_argument("--latency", type=float, default=0.05, help="seconds added before every answer")
    ap.add_argument("--rate", type=float, default=250e6, help="bytes/s of all answers together (2 Gbit/s: 250e6)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-procs", type=int, default=4, help="readers of the second multitables pass")
    ap.add_argument("--skip", nargs="*", default=[], help="ways to leave out: multitables h5py download")
    ap.add_argument("--client", type=int, default=0, help="time the client alone on an object of this many MiB")
    a = ap.parse_args()
    if a.client:
        client_cost(a.client, a.repeats)
        return
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "bench").mkdir()
        write(root / "bench" / "data.h5", a.rows)
        size = (root / "bench" / "data.h5").stat().st_size
        server, endpoint = start_server(root, a.latency, a.rate)
        os.environ.update({"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": endpoint})
        options: dict = {}
        url = "s3://bench/data.h5"
        ways: "list[tuple[str, Callable[[], int]]]" = []
        if "multitables" not in a.skip:
            ways += [("multitables, default n_procs", multitables_pass(url, options, None)),
                     (f"multitables, n_procs={a.n_procs}", multitables_pass(url, options, a.n_procs))]
        if "h5py" not in a.skip:
            ways += [("h5py + s3fs, default block (50 MiB)", h5py_s3fs_pass(endpoint, None)),
                     ("h5py + s3fs, 4 MiB blocks", h5py_s3fs_pass(endpoint, 4 << 20))]
        if "download" not in a.skip:
            ways += [("download (multitables' client), then multitables", download_pass(url, options, root))]
        try:
            print(f"{a.rows} rows of 1 KiB ({a.rows * 1024 / 1e6:.0f} MB of data, {size / 1e6:.1f} MB file), "
                  f"latency {a.latency * 1e3:.0f} ms, cap {a.rate * 8 / 1e9:.2f} Gbit/s, median of {a.repeats}\n")
            print("| way | s | MB/s (data) | MB/s (fetched) | GETs | HEADs | MB fetched |")
            print("|---|---|---|---|---|---|---|")
            for name, run in ways:
                r = measure(run, endpoint, a.repeats)
                print(f"| {name} | {r['s']:.2f} | {r['MB/s']:.0f} | {r['fetched MB/s']:.0f} | {r['GET']} | {r['HEAD']} "
                      f"| {r['MB fetched']:.1f} |", flush=True)
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
