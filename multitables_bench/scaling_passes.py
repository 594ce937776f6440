"""The passes of the scaling section, each in a fresh process forked from a server (``python -m multitables_bench.scaling_passes``).

Every pass reads the whole dataset once (``memcpy``: copies memory) and
answers a :class:`PassResult` (NOTE [a fresh process per pass]). The kinds:

* ``h5py``: one process reading the dataset in order, ``read_direct`` into
  one buffer, a block at a time (the baseline);
* ``multitables``: ``Streamer.get_queue(n_procs=n, remainder=True)``, every
  block taken and released, counted (:func:`multitables_bench.counters.drain_counted`);
* ``processes``: what a user would write instead: ``n`` plain h5py processes
  (a ``multiprocessing`` pool), each opening the file and reading its own
  contiguous share of blocks into its own buffer; nothing is handed over;
* ``dataloader``: the other thing a user would write:
  ``torch.utils.data.DataLoader(num_workers=n, batch_size=None)`` over a
  map-style dataset whose item ``i`` is block ``i``, read with h5py;
* ``memcpy``: ``n`` processes at once, each ``np.copyto`` between two
  buffers of ``memcpy_mib`` MiB it has already touched, ``MEMCPY_COPIES``
  times; the rate is every byte copied over the time from the first start to
  the last end;
* ``inflate``: what the cores alone give a zlib file's readers: ``n``
  processes at once, each inflating the file's first stored chunks in memory
  (libdeflate, as the chunk engine does; no shuffle undone, nothing read or
  handed over) until it has made ``memcpy_mib`` MiB; timed as ``memcpy``.

Each pass is timed from the first thing a user's program would do (open the
file, create the ``Streamer``, the pool or the ``DataLoader``) to the last
block. Every contender reads one value of every page of every block it gets
(:func:`multitables_bench.counters.touch`), as a consumer using it would.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
import zlib
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Optional

import numpy as np

from multitables_bench.counters import drain_counted, touch
from multitables_bench.files import h5py_with_filters
from multitables_bench.records import NODE, ROW_VALUES

#: Copies each memcpy process makes between its two buffers.
MEMCPY_COPIES = 8
#: MiB of rows whose stored chunks an inflate process decodes, again and again.
INFLATE_SOURCE_MIB = 8
KINDS = ("h5py", "multitables", "processes", "dataloader", "memcpy", "inflate")


@dataclass(frozen=True)
class PassSpec:
    """What one pass reads, and how."""

    kind: str
    path: str = ""
    #: Processes, workers or readers (multitables: None asks for the default).
    n: "int | None" = 1
    #: Rows per block (h5py, processes, dataloader).
    block_rows: int = 1
    n_rows: int = 0
    #: Keep the first value of every row read (the tests' check that each row is read once).
    record: bool = False
    memcpy_mib: int = 256


@dataclass(frozen=True)
class PassResult:
    """What one pass did and how long it took."""

    seconds: float
    rows: int = 0
    nbytes: int = 0
    #: multitables: the readers that ran, the engine and the rows per block it chose.
    n_used: "int | None" = None
    engine: str = ""
    block_rows: "int | None" = None
    #: multitables: the window's counters per GiB (:meth:`multitables_bench.counters.Counted.per_gib`) and its size.
    counters: "dict[str, float] | None" = None
    readers_counted: "tuple[int, int] | None" = None
    #: With ``record``: the first value of every row read, in the order read.
    first_values: Optional[list[float]] = field(default=None)
    #: multitables: where the pass's seconds went (:data:`PHASES`), in order; they add up to ``seconds``.
    phases: "dict[str, float] | None" = None


#: A multitables pass's parts: the Streamer and get_queue (plan, ring, readers started), the wait for the
#: first block, the other blocks, and closing (readers joined; the ring's unmapping only starts there after a
#: whole pass, NOTE [release off the path] in ``multitables._sys.release``).
PHASES = ("get_queue", "first_block", "rest", "close")


def _blocks(n_rows: int, block_rows: int) -> list[tuple[int, int]]:
    return [(a, min(a + block_rows, n_rows)) for a in range(0, n_rows, block_rows)]


def read_share(path: str, blocks: list[tuple[int, int]], block_rows: int, record: bool) -> tuple[int, Optional[list[float]]]:
    """Open ``path`` and read ``blocks`` (row ranges) in order into one buffer: (rows read, first values or None)."""
    buffer = np.empty((block_rows, ROW_VALUES), np.float32)
    firsts: list[float] = []
    rows = 0
    with h5py_with_filters().File(path, "r") as f:
        ds = f[NODE]
        for a, b in blocks:
            out = buffer[: b - a]
            ds.read_direct(out, np.s_[a:b])
            touch(out)
            rows += b - a
            if record:
                firsts += out[:, 0].tolist()
    return rows, firsts if record else None


def _read_share_args(args: tuple[str, list[tuple[int, int]], int, bool]) -> tuple[int, Optional[list[float]]]:
    return read_share(*args)


def h5py_pass(spec: PassSpec) -> PassResult:
    """One process, in order."""
    t0 = time.perf_counter()
    rows, firsts = read_share(spec.path, _blocks(spec.n_rows, spec.block_rows), spec.block_rows, spec.record)
    return PassResult(time.perf_counter() - t0, rows, rows * ROW_VALUES * 4, first_values=firsts)


def processes_pass(spec: PassSpec) -> PassResult:
    """``n`` plain h5py processes, each its own contiguous share of the blocks."""
    import multiprocessing

    n = spec.n or 1
    blocks = _blocks(spec.n_rows, spec.block_rows)
    shares = [[blocks[i] for i in part] for part in np.array_split(np.arange(len(blocks)), n)]
    t0 = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(n) as pool:
        done = pool.map(_read_share_args, [(spec.path, share, spec.block_rows, spec.record) for share in shares], 1)
    seconds = time.perf_counter() - t0
    rows = sum(r for r, _ in done)
    firsts = [v for _, f in done for v in (f or [])] if spec.record else None
    return PassResult(seconds, rows, rows * ROW_VALUES * 4, n_used=n, first_values=firsts)


class H5Blocks:
    """A map-style dataset as a user writes it: item ``i`` is block ``i`` of rows, h5py opened once per worker."""

    def __init__(self, path: str, n_rows: int, block_rows: int) -> None:
        self.path, self.blocks = path, _blocks(n_rows, block_rows)
        self._ds: Any = None

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> np.ndarray:
        if self._ds is None:
            self._ds = h5py_with_filters().File(self.path, "r")[NODE]
        a, b = self.blocks[i]
        return self._ds[a:b]


def dataloader_pass(spec: PassSpec) -> PassResult:
    """``DataLoader(H5Blocks, batch_size=None, num_workers=n)``, every block taken in order."""
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows, firsts = 0, []
    for tensor in DataLoader(H5Blocks(spec.path, spec.n_rows, spec.block_rows), batch_size=None, num_workers=spec.n or 0):
        block = tensor.numpy()
        touch(block)
        rows += len(block)
        if spec.record:
            firsts += block[:, 0].tolist()
    seconds = time.perf_counter() - t0
    return PassResult(seconds, rows, rows * ROW_VALUES * 4, n_used=spec.n, first_values=firsts if spec.record else None)


def multitables_pass(spec: PassSpec) -> PassResult:
    """Direct access from a fresh ``Streamer``, the remainder included; counted after the first lap."""
    import multitables

    firsts: list[float] = []
    marks = [time.perf_counter()]  # the phases' ends, after this start

    def keep(i: int, block: np.ndarray) -> None:
        if i == 0:
            marks.append(time.perf_counter())
        if spec.record:
            firsts.extend(block[:, 0].tolist())

    with multitables.Streamer(spec.path).get_queue(NODE, n_procs=spec.n, remainder=True) as queue:
        marks.append(time.perf_counter())
        n_blocks = -(-spec.n_rows // queue.block_size)
        rows, nbytes, counted = drain_counted(queue, n_blocks, on_block=keep)
        used, engine, block_rows = queue.n_procs, queue.engine, queue.block_size
        marks.append(time.perf_counter())
    marks.append(time.perf_counter())
    phases = dict(zip(PHASES, np.diff(marks).tolist())) if len(marks) == len(PHASES) + 1 else None
    return PassResult(marks[-1] - marks[0], rows, nbytes, used, engine, block_rows,
                      counted.per_gib() if counted else None,
                      (counted.readers_counted, counted.readers_total) if counted else None,
                      firsts if spec.record else None, phases)


def _copy_loop(nbytes: int, copies: int, ready: Any, go: Any, results: Any) -> None:
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    dst.fill(0)  # both touched (np.zeros would map zero pages lazily): no fault in the timed loop
    ready.put(None)
    go.wait()
    t0 = time.perf_counter()
    for _ in range(copies):
        np.copyto(dst, src)
    results.put((t0, time.perf_counter()))


def memcpy_pass(spec: PassSpec) -> PassResult:
    """``n`` processes copying at once; ``nbytes`` is every byte copied (each read once and written once)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    n, nbytes = spec.n or 1, spec.memcpy_mib << 20
    ready, go, results = ctx.SimpleQueue(), ctx.Event(), ctx.SimpleQueue()
    procs = [ctx.Process(target=_copy_loop, args=(nbytes, MEMCPY_COPIES, ready, go, results)) for _ in range(n)]
    return _all_at_once(procs, ready, go, results, n * MEMCPY_COPIES * nbytes)


def _all_at_once(procs: "list[Any]", ready: Any, go: Any, results: Any, nbytes: int) -> PassResult:
    """Start ``procs``, let them go together once each is ready, and time them from the first start to the last end."""
    for p in procs:
        p.start()
    for _ in procs:
        ready.get()
    go.set()  # every process has its buffers touched: all start together
    spans = [results.get() for _ in procs]
    for p in procs:
        p.join()
    for q in (ready, results):
        q.close()
    seconds = max(b for _, b in spans) - min(a for a, _ in spans)
    return PassResult(seconds, 0, nbytes, n_used=len(procs))


def _stored_chunks(path: str, nbytes: int) -> "tuple[list[bytes], int]":
    """The first stored chunks of ``path``'s dataset that hold at least ``nbytes`` of rows (all, if fewer), and the
    bytes of rows a chunk holds."""
    with h5py_with_filters().File(path, "r") as f:
        ds = f[NODE]
        chunk_rows = ds.chunks[0]
        chunk_nbytes = chunk_rows * ds.dtype.itemsize * int(np.prod(ds.shape[1:]))
        starts = range(0, min(len(ds), -(-nbytes // chunk_nbytes) * chunk_rows), chunk_rows)
        return [bytes(ds.id.read_direct_chunk((a,) + (0,) * (ds.ndim - 1))[1]) for a in starts], chunk_nbytes


def _inflate_loop(chunks: "list[bytes]", chunk_nbytes: int, rounds: int, ready: Any, go: Any, results: Any) -> None:
    try:
        from imagecodecs import deflate_decode  # the chunk engine's inflater (multitables._io.chunks.codecs.deflate)
    except ImportError:  # pragma: no cover - imagecodecs is a dependency
        deflate_decode = None
    out = np.empty(chunk_nbytes, np.uint8)
    out.fill(0)  # touched: no fault in the timed loop
    ready.put(None)
    go.wait()
    t0 = time.perf_counter()
    for _ in range(rounds):
        for chunk in chunks:
            if deflate_decode is not None:
                deflate_decode(chunk, out=out)
            else:  # pragma: no cover
                zlib.decompress(chunk)
    results.put((t0, time.perf_counter()))


def inflate_pass(spec: PassSpec) -> PassResult:
    """``n`` processes at once inflating the file's first chunks; ``nbytes`` is every byte of rows they made."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    n = spec.n or 1
    chunks, chunk_nbytes = _stored_chunks(spec.path, INFLATE_SOURCE_MIB << 20)
    rounds = max(1, (spec.memcpy_mib << 20) // (len(chunks) * chunk_nbytes))
    ready, go, results = ctx.SimpleQueue(), ctx.Event(), ctx.SimpleQueue()
    procs = [ctx.Process(target=_inflate_loop, args=(chunks, chunk_nbytes, rounds, ready, go, results))
             for _ in range(n)]
    return _all_at_once(procs, ready, go, results, n * rounds * len(chunks) * chunk_nbytes)


PASSES = {"h5py": h5py_pass, "multitables": multitables_pass, "processes": processes_pass,
          "dataloader": dataloader_pass, "memcpy": memcpy_pass, "inflate": inflate_pass}


def run(spec: PassSpec) -> PassResult:
    """The pass ``spec`` asks for, in this process."""
    return PASSES[spec.kind](spec)


def preload(torch: bool) -> None:
    """Import what the passes use (importing is no pass's work): h5py with its filters, multitables, torch if asked;
    and what a process starts or loads once, when it first streams: the codec libraries multitables' chunk engine
    loads on its first read (imagecodecs' deflate and blosc extensions, c-blosc2's library), and multiprocessing's
    resource tracker (a Python interpreter of its own), which every pass forked from here shares."""
    from multiprocessing import resource_tracker

    import multitables  # noqa: F401
    from multitables._io.chunks.codecs.libraries import blosc2_library, imagecodecs_function

    h5py_with_filters()
    for name in ("deflate_decode", "blosc_decode"):
        imagecodecs_function(name)  # imagecodecs loads a codec's extension module when it is first asked for
    blosc2_library()
    resource_tracker.ensure_running()

    if torch:
        import torch as _torch  # noqa: F401


def serve(requests: IO[str], replies: IO[str]) -> None:
    """For each line of ``requests`` (a :class:`PassSpec` as JSON), fork a process that runs it; reply a line.

    NOTE [a fresh process per pass]
        The server imports the libraries once and reads nothing; every pass
        runs in a child forked from it, which exits when the pass ends, so no
        pass inherits another's open files, caches, mappings or memory, and
        none pays for interpreter start and imports (torch's take seconds).
        The child's stdout goes to stderr: only replies reach ``replies``.
        Before forking, the server's objects are frozen out of the cyclic
        garbage collector (``gc.freeze``): a collection in a child would
        otherwise write to every page of the inherited heap, and count a
        copy-on-write fault for each in the pass's consumer.
    """
    gc.freeze()
    for line in requests:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the pass
            os.close(r)
            os.dup2(2, 1)
            try:
                reply = {"result": asdict(run(PassSpec(**json.loads(line))))}
            except BaseException:
                reply = {"error": traceback.format_exc()}
            with os.fdopen(w, "w") as f:
                f.write(json.dumps(reply))
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            text = f.read()
        _, status = os.waitpid(pid, 0)
        replies.write((text or json.dumps({"error": f"the pass process ended with status {status}"})) + "\n")
        replies.flush()


def main(argv: "list[str] | None" = None) -> None:
    """``python -m multitables_bench.scaling_passes [--torch]``: serve passes on stdin and stdout."""
    preload("--torch" in (sys.argv[1:] if argv is None else argv))
    serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
