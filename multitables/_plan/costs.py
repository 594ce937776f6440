"""Whether reader processes pay, and where that is worth measuring: the cost model of NOTE [read plan] (pure).

Readers cost what starting them costs (:data:`START_COST_S`, by start method) and save at most ``1 - 1/n`` of a
one-core read and of a transform's work (timed on its first rows: :func:`transform_s`), ``n`` being the readers
that can work at once: the CPUs, or the dataset's chunks of rows (or its blocks, where they cut chunks) where fewer
(:func:`parallel_cpus`). The one-core read time comes from a table of rates by filter and engine, or from a rate the
chunk engine measured on the dataset's first chunks where the answer turns on it; such a sample is small beside the
dataset or not taken (:func:`rate_sample_rows`). Where several datasets are read together, readers go to those they
pay for, in proportion to bytes (:func:`split_readers`).
"""

from __future__ import annotations

from typing import Sequence

#: What it costs to start the readers and see the first block (s), by start method: 2 readers on a 4 MiB file, a
#: fresh process's first stream, on the 2-core development machine idle and beside two busy processes: fork
#: 0.04-0.05 and 0.05-0.09; forkserver 0.28-0.32 and 0.42-0.43 (the server's start: a new interpreter importing
#: numpy, h5py, PyTables and this library); spawn 0.32-0.34 and 0.59-0.62 (each reader imports them, every stream).
#: The fork server's later streams: :data:`READY_SERVER_COST_S` (BENCHMARKS.md, thirtieth session).
START_COST_S = {"fork": 0.05, "forkserver": 0.5, "spawn": 0.55}
#: What starting readers costs where a fork server this library started runs, its modules preloaded: 0.015-0.02
#: and 0.03 s, idle and busy as above; priced as a fork (NOTE [fork server] in ``_sys.forks``).
READY_SERVER_COST_S = START_COST_S["fork"]
#: How many times that cost readers must save: twice with the table's one-core rate, which may be off by
#: :data:`RATE_SPREAD`; 0.9 times with the rate measured on the dataset: two readers here went from 0.93x the
#: consumer where they saved 0.5x the cost at the rate measured (64 MiB of zlib 3, the chunk engine) to 1.17x
#: where they saved 1.0x (128 MiB) (2026-11-26, files in fresh processes; BENCHMARKS.md, seventh session).
MARGIN = {"table": 2.0, "measured": 0.9}
#: Rough one-core decode rates (bytes/s) by engine and HDF5 filter id, to judge whether parallel reading can pay.
#: h5py: deflate ~0.55 GB/s and blosc ~1.5-2 GB/s here, bzip2 far slower, no filter ~3.7 GB/s warm; the chunk engine
#: decodes deflate + shuffle ~2.7x faster than h5py; PyTables decodes deflate ~1.8x and blosc ~2.3x slower (the
#: benchmark's warm one-core figures, BENCHMARKS.md).
_DECODE_RATE = {1: 0.55e9, 307: 0.03e9, 32001: 1.5e9, 32026: 1.5e9, 32004: 1.5e9, 32015: 0.8e9, 32008: 1.5e9}
_ENGINE_SPEED = {"chunks": {1: 2.7}, "tables": {1: 1 / 1.8, 32001: 1 / 2.3}}
_COPY_RATE = 3.5e9


def parallel_pays(
    nbytes: int, filter_ids: "tuple[int, ...]", start_s: float, n_cpus: int, engine: str, transform_s: float = 0.0,
    rate: "float | None" = None,
) -> bool:
    """Whether ``n_cpus`` reader processes can beat ``engine`` reading ``nbytes`` (uncompressed) in the consumer.

    Readers save at most ``(1 - 1/n_cpus)`` of the one-core time, decoding and a transform's (:func:`saved_s`), and
    cost ``start_s`` to start (:func:`start_cost`); they must save :data:`MARGIN` times what they cost.
    Stored bytes (no filter) they never save: a reader's work is the one copy
    the consumer makes itself, reading into its block (1 GiB of float32 rows
    in 512 KiB chunks, medians of 5, ``benchmarks/stored_bytes.py``: two
    readers 0.77-0.87x one h5py process, the consumer alone 0.99-1.26x, pages
    dropped and cached, direct and generator), unless a transform runs on them: then the copy is theirs (into a
    buffer of their own, the transform's output into the slot) and so are ``transform_s``, the transform's one-core
    seconds over the rows read (timed on its first rows: ``Transform.row_s``). ``rate``: the one-core rate (bytes/s)
    measured on the dataset; None: :func:`table_rate`.
    """
    if n_cpus < 2 or not (filter_ids or transform_s > 0):
        return False
    margin = MARGIN["measured" if rate else "table"]
    return saved_s(nbytes, rate or table_rate(filter_ids, engine), n_cpus, transform_s) > margin * start_s


def transform_s(row_s: float, call_s: float, n_rows: int, block_size: "int | None") -> float:
    """One core's seconds of a transform of ``row_s`` a row and ``call_s`` a call (beyond its rows') over ``n_rows``
    rows in blocks of ``block_size`` (None: one block): a call a block (NOTE [transforms] in ``_io.blockread``)."""
    return call_s * (-(-n_rows // block_size) if block_size else 1) + row_s * n_rows


def transform_stake_s(
    nbytes: int, filter_ids: "tuple[int, ...]", start_s: float, n_cpus: int, engine: str, rate: "float | None" = None
) -> float:
    """One core's seconds of a transform above which :func:`parallel_pays` says ``n_cpus`` readers (2 or more) pay:
    what its price is weighed against; 0 or less where they pay for the read alone, with any transform."""
    margin = MARGIN["measured" if rate else "table"]
    return margin * start_s / (1 - 1 / n_cpus) - nbytes / (rate or table_rate(filter_ids, engine))


def table_rate(filter_ids: "tuple[int, ...]", engine: str) -> float:
    """The table's one-core rate (bytes/s) for ``engine`` decoding ``filter_ids``: the slowest filter's."""
    speed = _ENGINE_SPEED.get(engine, {})
    return min((_DECODE_RATE.get(f, _COPY_RATE) * speed.get(f, 1.0) for f in filter_ids), default=_COPY_RATE)


def saved_s(nbytes: int, rate: float, n_cpus: int, transform_s: float = 0.0) -> float:
    """Seconds ``n_cpus`` readers save at most of a one-core read of ``nbytes`` at ``rate`` (bytes/s) and of a
    transform's ``transform_s`` (one core's seconds)."""
    return (nbytes / rate + transform_s) * (1 - 1 / n_cpus)


def start_cost(start_method: str, server_ready: bool = False, forgone_s: float = 0.0) -> float:
    """Seconds readers started by ``start_method`` cost (:data:`START_COST_S`; an unknown method: the dearest).

    The fork server's: :data:`READY_SERVER_COST_S` where one this library started runs (``server_ready``), else its
    first start's less what streams have forgone meanwhile (``forgone_s``; NOTE [fork server] in ``_sys.forks``).
    """
    if start_method == "forkserver":
        return READY_SERVER_COST_S if server_ready else max(READY_SERVER_COST_S, START_COST_S[start_method] - forgone_s)
    return START_COST_S.get(start_method, max(START_COST_S.values()))


#: How far the table's rates are from a machine's: h5py decodes smooth blosc 3 at 2.9-3.3 GB/s on this 2-core
#: machine and 1.3-1.8 on a lent 16-core Xeon, the chunk engine zlib 3 at 1.0-1.2 and 0.53-0.69 (BENCHMARKS.md,
#: 2026-11-26, seventh session); beyond it either way, the table's answer stands.
RATE_SPREAD = 2.5


#: Uncompressed bytes (whole chunks, at least) that the rate is measured on, read twice (``StreamOptions.
#: measure_rate``): 0.8 ms in all here on zlib 3 (2.1 ms for 1 MiB, the same rate within 3%), against passes of
#: 0.05-0.7 s where it is measured.
RATE_SAMPLE_BYTES = 512 << 10
#: The sample is at most this share of the dataset: where one chunk is more, nothing is measured and the table
#: decides. A 64 MiB dataset of gzip 1 in one chunk took 2.2x its in-process read when its one chunk was decoded
#: twice more to measure; in four chunks, 1.5x (``benchmarks/large_chunks.py``, BENCHMARKS.md, twenty-ninth session).
RATE_SAMPLE_SHARE = 1 / 32


def parallel_cpus(cpus: int, n_rows: int, chunk_rows: "int | None", block_size: "int | None" = None) -> int:
    """How many of ``cpus`` readers can work at once: one per chunk of rows at most (a block is whole chunks), or one
    per block of ``block_size`` rows where blocks cut chunks (each reader reads its rows of one)."""
    if not chunk_rows:
        return cpus
    unit = block_size if block_size and block_size < chunk_rows else chunk_rows
    return max(1, min(cpus, -(-n_rows // unit)))


def rate_sample_rows(n_rows: int, row_nbytes: int, chunk_rows: "int | None") -> int:
    """Rows the rate is measured on, from row 0: whole chunks of :data:`RATE_SAMPLE_BYTES`, or of the dataset's
    :data:`RATE_SAMPLE_SHARE` if less, at least one; 0 where one chunk is more than that share (nothing measured)."""
    unit = chunk_rows or 1
    unit_nbytes = max(1, unit * row_nbytes)
    nbytes = n_rows * row_nbytes
    if unit_nbytes > nbytes * RATE_SAMPLE_SHARE:
        return 0
    want = min(RATE_SAMPLE_BYTES, int(nbytes * RATE_SAMPLE_SHARE))
    return min(n_rows, unit * -(-want // unit_nbytes))


def split_readers(nbytes: Sequence[int], pays: Sequence[bool], n_procs: "int | None", cpus: int) -> list[int]:
    """Reader processes per dataset: shared in proportion to bytes, small datasets read in-process.

    ``pays[i]`` says whether readers can pay for dataset ``i`` at all (:func:`parallel_pays`). ``n_procs=None``
    shares ``cpus`` among those; if there are none, everything is read in-process. An explicit ``n_procs`` is shared
    the same way, and goes to the largest dataset when none pays."""
    n = len(nbytes)
    if n_procs == 0:
        return [0] * n
    total = cpus if n_procs is None else n_procs
    big = [i for i in range(n) if pays[i]]
    if not big:
        if n_procs is None:
            return [0] * n
        big = [max(range(n), key=lambda i: nbytes[i])]
    big.sort(key=lambda i: -nbytes[i])
    big = big[:total]  # more big datasets than processes: the largest get one each
    weight = sum(nbytes[i] for i in big) or 1
    out = [0] * n
    for i in big:
        out[i] = 1
    # Largest remainders: hand out what is left beyond one each, in proportion to bytes.
    spare = total - len(big)
    shares = {i: spare * nbytes[i] / weight for i in big}
    for i in big:
        out[i] += int(shares[i])
    left = spare - sum(int(x) for x in shares.values())
    for i in sorted(big, key=lambda i: -(shares[i] - int(shares[i])))[:left]:
        out[i] += 1
    return out
