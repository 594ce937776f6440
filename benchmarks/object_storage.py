"""Object storage (issue 31, item 7): one HDF5 file in an emulated distant bucket, read three ways.

The bucket is ``tests/objservers.py``'s byte-range server (path-style S3
GET/HEAD, ``sendfile``), started as a process on 127.0.0.1 with a latency
added before every answer and a bandwidth cap shared by all answers. The file
is written once: ``--rows`` rows of 256 float32 (1 KiB each) of smooth,
compressible values, ``--complib`` (zlib, or blosc and its compressors, as
PyTables names them) at ``--complevel`` 3 + shuffle, PyTables' chunking. Each
pass reads every row of ``/data``:

* ``multitables``: ``Streamer("s3://bench/data.h5").get_queue("/data")`` (the
  chunk engine's ranged GETs), every block taken and released; with the
  default ``n_procs`` and with ``--n-procs`` readers;
* ``h5py + s3fs``: ``h5py.File(s3fs_file)["/data"]``, read in blocks of 4 MiB
  of rows into one buffer, with s3fs's default block size (50 MiB, read ahead)
  and with 4 MiB blocks;
* ``h5coro`` (optional: skipped, with the reason, where it is not
  installed): ``H5Coro(...).readDatasets(["/data"])`` through its S3 driver
  (boto3, the endpoint from ``AWS_ENDPOINT_URL``) and its HTTP driver
  (requests); its result is compared with the file's rows once. h5coro 1.0.7
  decodes deflate and shuffle only: on other filters it is skipped, with why;
* ``download, then read``: the whole object fetched (multitables' client:
  8 MiB parts, 8 in flight) into a local file, then streamed from there with
  multitables (the page cache warm: the file was just written).

Printed: per way, the median wall time of ``--repeats`` passes, MB/s of rows
delivered (uncompressed) and of bytes fetched, the fraction of the cap the
bytes fetched reach, the requests (GETs and HEADs, counted by the server)
and bytes fetched per pass, and for multitables the requests against the
fewest that fetch what its plan reads, when its first block came and the
fraction of the cap the bytes of its other blocks reached after that
(``fewest``: the first look, one GET
per ``part_size`` of each block's stored bytes, one per range of chunk-index
leaves the look's first bytes do not hold, leaves closer than the ranged
transport's ``SMALL_GAP`` one range: merged across more, their reads would
fetch data between them); and the CPU each pass costs (medians): this process and its
reaped children (the reader processes) in user + system seconds, the
server's process, and the machine's CPUs busy over the pass (from
``/proc/stat``: other processes' work included), as Markdown. ``--client``
instead times the client alone, as the lab measured obstore and s3fs
(``BENCHMARKS.md``, "Object storage: the client"): a ``--client`` MiB object
of random bytes read whole into one buffer, in 1 and 8 MiB parts, 1, 4 and 16
in flight, with no latency and no cap; MiB/s and the client's CPU seconds per
GiB (this process's user + system time). The h5py way needs ``s3fs``.
``--url`` instead reads an object of a real endpoint (``s3://bucket/key.h5``,
the keys and endpoint from the usual places; or ``https://...``), dataset
``--dataset``, the same ways (h5py through fsspec's file object): seconds, MB/s of
data and of the object's size, the first block, and CPU; no server counts the
requests there. Run from the checkout::

    python benchmarks/object_storage.py --latency 0.05 --rate 250e6 --repeats 5 --n-procs 8
    python benchmarks/object_storage.py --complib blosc --rows 1048576 --skip download
    python benchmarks/object_storage.py --client 256
    python benchmarks/object_storage.py --url s3://my-bucket/train/shard-0.h5 --dataset /X --n-procs 16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
try:
    from multitables._io.chunks.ranged import SMALL_GAP  # noqa: E402
except ImportError:  # a checkout before it (an A/B): the same
    SMALL_GAP = 16 << 10
from multitables._io.objects.config import make_store  # noqa: E402
from multitables._io.objects.reader import ObjectReader  # noqa: E402

KEY, SECRET = "AKIDBENCH", "bench-secret"  # the server checks no signature


def write(path: Path, rows: int, complib: str = "zlib", complevel: int = 3, chunk_rows: "int | None" = None) -> None:
    import tables

    t = np.linspace(0, 60, 256, dtype="f4")
    with tables.open_file(path, "w") as f:
        data = f.create_earray("/", "data", tables.Float32Atom(), (0, 256),
                               filters=tables.Filters(complevel, complib, shuffle=True), expectedrows=rows,
                               chunkshape=None if chunk_rows is None else (chunk_rows, 256))
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


class Timed:
    """A pass that notes, in ``blocks``, the seconds from its start to each block it delivered (the last pass's)."""

    def __init__(self, run: Callable[["list[float]"], int]) -> None:
        self._run = run
        self.blocks: "list[float]" = []

    def __call__(self) -> int:
        self.blocks = []
        return self._run(self.blocks)


def multitables_pass(url: str, options: dict, n_procs: "int | None", path: str = "/data") -> Timed:
    def run(blocks: "list[float]") -> int:
        n = 0
        t = time.perf_counter()
        stream = multitables.Streamer(url, storage_options=options)
        with stream.get_queue(path, n_procs=n_procs, remainder=True) as queue:
            for guard in queue.iter():
                with guard as block:
                    n += block.nbytes
                blocks.append(time.perf_counter() - t)
        return n

    return Timed(run)


def h5py_fsspec_pass(url: str, block_size: "int | None", path: str = "/data", **storage: Any) -> Callable[[], int]:
    """h5py over a file object of fsspec's (s3fs for ``s3://``), ``storage`` given to the file system."""
    def run() -> int:
        import fsspec
        import h5py
        import hdf5plugin  # noqa: F401  (blosc's filter for HDF5)

        fs, target = fsspec.core.url_to_fs(url, **storage)
        kwargs = {} if block_size is None else {"block_size": block_size}
        with fs.open(target, "rb", **kwargs) as fileobj, h5py.File(fileobj, "r") as f:
            ds = f[path]
            rows = 4096
            out = np.empty((rows,) + ds.shape[1:], ds.dtype)
            n = 0
            for start in range(0, ds.shape[0], rows):
                stop = min(start + rows, ds.shape[0])
                ds.read_direct(out, np.s_[start:stop], np.s_[: stop - start])
                n += out[: stop - start].nbytes
        return n

    return run


def h5coro_pass(resource: str, driver: str, truth: "list[np.ndarray]", path: str = "/data") -> Callable[[], int]:
    """h5coro reading ``path`` whole, by its S3 driver (boto3; ``resource`` is ``bucket/key``) or its HTTP driver
    (``resource``: the URL); the first pass's rows are compared with ``truth[0]`` (the file's rows, where given),
    which is then dropped."""
    def run() -> int:
        from h5coro import h5coro, s3driver, webdriver

        # Keys and endpoint: the environment.
        h5 = h5coro.H5Coro(resource, s3driver.S3Driver if driver == "s3" else webdriver.HTTPDriver, credentials={})
        try:
            values = h5.readDatasets([path], block=True)[path]
            if values is None:
                raise RuntimeError("h5coro gave no values (its log says why)")
            values = np.asarray(values)
            if truth:
                if values.shape != truth[0].shape or not np.array_equal(values, truth[0]):
                    raise RuntimeError(f"h5coro's rows differ from the file's ({values.dtype} {values.shape})")
                truth.clear()
            return values.nbytes
        finally:
            h5.close()

    return run


#: The HDF5 filters h5coro decodes (deflate, shuffle): ``h5coro/h5dataset.py``, 1.0.7.
H5CORO_FILTERS = {1: "deflate", 2: "shuffle"}


def h5coro_problem(path: Path) -> "str | None":
    """Why the h5coro ways cannot read ``/data`` of ``path`` (None: they can)."""
    import h5py

    try:
        import h5coro  # noqa: F401
    except ImportError as exc:
        return f"h5coro is not installed ({exc}); pip install h5coro"
    with h5py.File(path, "r") as f:
        plist = f["/data"].id.get_create_plist()
        filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    others = [f for f in filters if f not in H5CORO_FILTERS]
    if others:
        # Tried on a small file: h5coro 1.0.7 takes the filter message without a word and copies the compressed chunks
        # as if stored raw, failing at the end with "ValueError: buffer is smaller than requested size"; on this
        # file's 1 GiB it spun a core for minutes first.
        return (f"h5coro decodes {' and '.join(H5CORO_FILTERS.values())} only, and this file's rows have HDF5 filter "
                f"{', '.join(map(str, others))} ({'blosc' if 32001 in others else 'not theirs'}): h5coro does not refuse "
                f"it, it takes the compressed chunks for raw ones (on a small file: ValueError: buffer is smaller than "
                f"requested size)")
    return None


def index_leaves(path: Path) -> int:
    """Leaves of the chunk index of ``/data`` in ``path``."""
    import h5py

    from multitables._io.chunks.btree import open_btree_index
    from multitables._io.chunks.grid import ChunkGrid
    from multitables._io.chunks.hdf5lib import header_address

    with h5py.File(path, "r") as f:
        ds = f["/data"]
        index = open_btree_index(ds, ChunkGrid(ds.shape, ds.chunks), str(path), header_address(ds.id))
        return 0 if index is None else index.n_leaves


def fewest_requests(path: Path, n_procs: "int | None", head: int, part: int, gap: int) -> int:
    """The fewest GETs that fetch what a multitables pass over ``path`` reads (see the module docstring)."""
    import h5py

    from multitables._io.chunks.btree import NODE_READ, open_btree_index
    from multitables._io.chunks.grid import ChunkGrid
    from multitables._io.chunks.hdf5lib import header_address
    from multitables._plan.readers import DatasetShape, Machine, cap_readers, default_block_size, default_readers

    with h5py.File(path, "r") as f:
        ds = f["/data"]
        chunk_rows = ds.chunks[0]
        spans = sorted((info.byte_offset, info.size, info.chunk_offset[0]) for info in
                       (ds.id.get_chunk_info(i) for i in range(ds.id.get_num_chunks())))
        index = open_btree_index(ds, ChunkGrid(ds.shape, ds.chunks), str(path), header_address(ds.id))
        leaves = sorted(index._base + a for a in index._addrs) if index is not None else []  # noqa: SLF001
        n_rows, row_nbytes = ds.shape[0], ds.dtype.itemsize * int(np.prod(ds.shape[1:]))
    machine = Machine.here()
    if n_procs is None:  # as the plan does (multitables._plan.readers.plan_stream)
        n_procs = default_readers(DatasetShape(n_rows, row_nbytes, chunk_rows, remote=True), "chunks", machine)
    readers = cap_readers(n_procs, None, machine.cpus)
    block = default_block_size(n_rows, row_nbytes, chunk_rows, readers, remote=True)
    blocks: "dict[int, list[int]]" = {}
    for offset, size, row in spans:
        first, last = blocks.setdefault(row // block, [offset, offset + size])
        blocks[row // block] = [min(first, offset), max(last, offset + size)]
    n = 1 + sum(-(-(b - a) // part) for a, b in blocks.values())
    end = -1
    for addr in leaves:
        if addr + NODE_READ <= head:
            continue
        if addr - end > gap:
            n += 1
        end = addr + NODE_READ
    return n


def download_pass(url: str, options: dict, scratch: Path, path: str = "/data") -> Callable[[], int]:
    def run() -> int:
        local = scratch / "downloaded.h5"
        with ObjectReader(url, make_store(options)) as reader:
            buffer = np.empty(reader.size, np.uint8)
            reader.read_into([(0, reader.size)], [buffer])
        buffer.tofile(local)
        n = 0
        with multitables.Streamer(str(local)).get_queue(path, remainder=True) as queue:
            for guard in queue.iter():
                with guard as block:
                    n += block.nbytes
        local.unlink()
        return n

    return run


def client_cost(size_mib: int, repeats: int) -> None:
    """The client alone: the whole object into one buffer; MiB/s and CPU s/GiB, median of ``repeats``."""
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


def cpu_seconds() -> "tuple[float, float]":
    """User + system seconds of this process, and of its children reaped so far (the reader processes of a pass)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


def process_cpu(pid: int) -> float:
    """User + system seconds of process ``pid`` (the server) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> "tuple[float, float]":
    """(busy, all) CPU seconds of the machine so far, every CPU together (``/proc/stat``)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    total = sum(ticks[:8])  # guest time is counted in user already
    return (total - idle) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")


def measure(run: Callable[[], int], endpoint: str, server_pid: int, repeats: int) -> "dict[str, Any]":
    times, rows, fetched, ours, server, busy, first, steady = [], 0, [], [], [], [], [], []
    for _ in range(repeats):
        before = counts(endpoint)
        cpu0, srv0, m0 = cpu_seconds(), process_cpu(server_pid), machine_busy()
        t = time.perf_counter()
        rows = run()
        times.append(time.perf_counter() - t)
        cpu1, srv1, m1 = cpu_seconds(), process_cpu(server_pid), machine_busy()
        after = counts(endpoint)
        fetched.append({k: after[k] - before[k] for k in after})
        ours.append(cpu1[0] - cpu0[0] + cpu1[1] - cpu0[1])
        server.append(srv1 - srv0)
        busy.append((m1[0] - m0[0]) / max(m1[1] - m0[1], 1e-9) * (os.cpu_count() or 1))
        blocks = getattr(run, "blocks", [])
        if len(blocks) > 1:  # the first block's arrival, and the rate of the bytes of the others after it
            first.append(blocks[0])
            steady.append(fetched[-1]["bytes"] * (len(blocks) - 1) / len(blocks) / (blocks[-1] - blocks[0]) / 1e6)
    seconds = statistics.median(times)
    last = fetched[-1]
    return {"s": seconds, "MB/s": rows / seconds / 1e6, "fetched MB/s": last["bytes"] / seconds / 1e6,
            "GET": last["GET"], "HEAD": last["HEAD"], "MB fetched": last["bytes"] / 1e6, "times": times,
            "CPU s": statistics.median(ours), "server CPU s": statistics.median(server), "busy": statistics.median(busy),
            "first": statistics.median(first) if first else None, "after MB/s": statistics.median(steady) if steady else None}


def remote(url: str, path: str, n_procs: int, repeats: int, skip: "list[str]") -> None:
    """The ways against an object of a real endpoint (credentials and endpoint from the environment): seconds, MB/s
    of data and of the object's size, the first block, CPU s; medians of ``repeats``."""
    from multitables._io.objects.urls import parse_url

    options: dict = {}
    with ObjectReader(url, make_store(options)) as reader:
        size, shown = reader.size, reader.shown
    ways: "list[tuple[str, Callable[[], int]]]" = []
    skipped: "list[str]" = []
    if "multitables" not in skip:
        ways += [("multitables, default n_procs", multitables_pass(url, options, None, path)),
                 (f"multitables, n_procs={n_procs}", multitables_pass(url, options, n_procs, path))]
    if "h5py" not in skip:
        ways += [("h5py + fsspec, its default block", h5py_fsspec_pass(url, None, path)),
                 ("h5py + fsspec, 4 MiB blocks", h5py_fsspec_pass(url, 4 << 20, path))]
    if "h5coro" not in skip:
        try:
            import h5coro  # noqa: F401

            where = parse_url(url)
            resource = f"{where.bucket}/{where.key}" if where.kind == "s3" else url
            ways += [(f"h5coro, {where.kind} driver", h5coro_pass(resource, where.kind, [], path))]
        except ImportError as exc:
            skipped.append(f"h5coro: skipped, not installed ({exc})")
    with tempfile.TemporaryDirectory() as scratch:
        if "download" not in skip:
            ways += [("download (multitables' client), then multitables", download_pass(url, options, Path(scratch), path))]
        print(f"{shown}, {path}, object {size / 1e6:.1f} MB, {os.cpu_count()} CPUs, median of "
              f"{repeats}\n")
        print("| way | s | MB of data | MB/s (data) | MB/s (object) | first block s | CPU s (ours) |")
        print("|---|---|---|---|---|---|---|")
        for name, run in ways:
            try:
                times, ours, first, rows = [], [], [], 0
                for _ in range(repeats):
                    cpu0, t = cpu_seconds(), time.perf_counter()
                    rows = run()
                    times.append(time.perf_counter() - t)
                    cpu1 = cpu_seconds()
                    ours.append(cpu1[0] - cpu0[0] + cpu1[1] - cpu0[1])
                    first += getattr(run, "blocks", [])[:1]
            except Exception as exc:  # a way that cannot read this object: say why, go on
                print(f"| {name} | cannot read it: {type(exc).__name__}: {exc} |" + " |" * 5, flush=True)
                continue
            s = statistics.median(times)
            first_s = f"{statistics.median(first):.2f}" if first else ""
            print(f"| {name} | {s:.2f} | {rows / 1e6:.3f} | {rows / s / 1e6:.0f} | {size / s / 1e6:.0f} | {first_s} "
                  f"| {statistics.median(ours):.2f} |", flush=True)
    for line in skipped:
        print(f"\n{line}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=131_072, help="rows of 1 KiB (default: 128 MiB of data)")
    ap.add_argument("--complib", default="zlib", help="PyTables' compression library: zlib, blosc, blosc:lz4, ...")
    ap.add_argument("--complevel", type=int, default=3)
    ap.add_argument("--chunk-rows", type=int, help="rows per chunk (default: PyTables' choice, 256 here); fewer make "
                    "a larger chunk index")
    ap.add_argument("--latency", type=float, default=0.05, help="seconds added before every answer")
    ap.add_argument("--rate", type=float, default=250e6, help="bytes/s of all answers together (2 Gbit/s: 250e6)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-procs", type=int, default=4, help="readers of the second multitables pass")
    ap.add_argument("--skip", nargs="*", default=[], help="ways to leave out: multitables h5py h5coro download")
    ap.add_argument("--client", type=int, default=0, help="time the client alone on an object of this many MiB")
    ap.add_argument("--url", help="read this object of a real endpoint instead (s3://bucket/key.h5, https://...)")
    ap.add_argument("--dataset", default="/data", help="with --url: the dataset to read")
    a = ap.parse_args()
    if a.client:
        client_cost(a.client, a.repeats)
        return
    if a.url:
        remote(a.url, a.dataset, a.n_procs, a.repeats, a.skip)
        return
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "bench").mkdir()
        local = root / "bench" / "data.h5"
        write(local, a.rows, a.complib, a.complevel, a.chunk_rows)
        size = local.stat().st_size
        server, endpoint = start_server(root, a.latency, a.rate)
        try:
            os.environ.update({"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": endpoint})
            os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")  # boto3 (h5coro's S3 driver) wants one
            options: dict = {}
            url = "s3://bench/data.h5"
            tuning = make_store(options).tuning
            ways: "list[tuple[str, Callable[[], int], int | None]]" = []  # name, pass, fewest requests (multitables)
            skipped: "list[str]" = []
            if "multitables" not in a.skip:
                fewest = [fewest_requests(local, n, tuning.open_readahead, tuning.part_size, SMALL_GAP)
                          for n in (None, a.n_procs)]
                ways += [("multitables, default n_procs", multitables_pass(url, options, None), fewest[0]),
                         (f"multitables, n_procs={a.n_procs}", multitables_pass(url, options, a.n_procs), fewest[1])]
            if "h5py" not in a.skip:
                fs = {"key": KEY, "secret": SECRET, "endpoint_url": endpoint, "skip_instance_cache": True}
                ways += [("h5py + s3fs, default block (50 MiB)", h5py_fsspec_pass(url, None, **fs), None),
                         ("h5py + s3fs, 4 MiB blocks", h5py_fsspec_pass(url, 4 << 20, **fs), None)]
            if "h5coro" not in a.skip:
                problem = h5coro_problem(local)
                if problem is None:
                    import h5py
                    import hdf5plugin  # noqa: F401  (h5py reads blosc's rows with it)

                    with h5py.File(local, "r") as f:
                        truth = f["/data"][:]
                    ways += [("h5coro, S3 driver (boto3)", h5coro_pass("bench/data.h5", "s3", [truth]), None),
                             ("h5coro, HTTP driver (requests)", h5coro_pass(f"{endpoint}/bench/data.h5", "http", [truth]),
                              None)]
                    del truth
                else:
                    skipped.append(f"h5coro: skipped, {problem}")
            if "download" not in a.skip:
                ways += [("download (multitables' client), then multitables", download_pass(url, options, root), None)]
            cap = a.rate / 1e6
            leaves = index_leaves(local)
            print(f"{a.rows} rows of 1 KiB ({a.rows * 1024 / 1e6:.0f} MB of data, {size / 1e6:.1f} MB file, "
                  f"{a.complib} {a.complevel} + shuffle, {a.rows * 1024 / size:.1f}x, {leaves} chunk-index leaves), latency {a.latency * 1e3:.0f} ms, "
                  f"cap {a.rate * 8 / 1e9:.2f} Gbit/s, {os.cpu_count()} CPUs, median of {a.repeats}\n")
            print("| way | s | MB/s (data) | MB/s (fetched) | x cap | first block s | x cap after it | GETs | HEADs "
                  "| MB fetched | requests / fewest | CPU s (ours) | CPU s (server) | CPUs busy (machine) |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            passes: "list[tuple[str, list[float]]]" = []
            for name, run, fewest_n in ways:
                try:
                    r = measure(run, endpoint, server.pid, a.repeats)
                    passes.append((name, r["times"]))
                except Exception as exc:  # a way that cannot read this file: say why, go on
                    print(f"| {name} | cannot read it: {type(exc).__name__}: {exc} |" + " |" * 12, flush=True)
                    continue
                ratio = "" if fewest_n is None else f"{r['GET'] + r['HEAD']} / {fewest_n} = {(r['GET'] + r['HEAD']) / fewest_n:.2f}"
                cap_x = f"{r['fetched MB/s'] / cap:.2f}" if cap else ""
                first_s = "" if r["first"] is None else f"{r['first']:.2f}"
                after_x = "" if r["after MB/s"] is None or not cap else f"{r['after MB/s'] / cap:.2f}"
                print(f"| {name} | {r['s']:.2f} | {r['MB/s']:.0f} | {r['fetched MB/s']:.0f} | {cap_x} | {first_s} "
                      f"| {after_x} | {r['GET']} "
                      f"| {r['HEAD']} | {r['MB fetched']:.1f} | {ratio} | {r['CPU s']:.2f} | {r['server CPU s']:.2f} "
                      f"| {r['busy']:.2f} |", flush=True)
            print("\nEvery pass (s): " + "; ".join(f"{name}: " + ", ".join(f"{t:.2f}" for t in times)
                                                  for name, times in passes))
            for line in skipped:
                print(f"\n{line}")
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
