#!/usr/bin/env python
"""Measure obstore against fsspec+s3fs as the byte-range client for multitables (issue 31, item 4).

Everything listens on 127.0.0.1. Two servers, each its own process:

* moto's S3 server (``moto_server``): a real S3 implementation, used for time
  to first byte, moto's own ceiling, and the behaviour checks (ETag,
  If-Match, credentials, anonymous access, fork);
* ``tests/objservers.py``'s range server: a path-style S3 GET/HEAD server that sends bodies
  with ``os.sendfile``, so throughput and client CPU are not capped by
  moto's per-request cost (moto copies the whole object for every GET,
  under a per-key lock).

Prints markdown tables. ``python measure_clients.py`` takes about 3 minutes
on 2 cores; ``--quick`` about two (the fork checks wait out their hangs).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from labsrv.servers import start_moto, start_rangeserver  # noqa: E402

import boto3  # noqa: E402
import fsspec  # noqa: E402
import obstore as obs  # noqa: E402
import s3fs  # noqa: E402
from checks import behaviour_checks  # noqa: E402
from clients import (  # noqa: E402
    AKID, BUCKET, KEY, REGION, SECRET, SMALL, MiB, ObstoreAsync, ObstoreGetRanges, ObstoreThreads, RawHTTP,
    S3fsAsync, S3fsCatRanges, Transport,
)

GiB = 1 << 30


def cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def fmt_spread(xs, fmt="{:.0f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def measure_read_all(client, server, key: str, nbytes: int, rsize: int, inflight: int, reps: int, truth: np.ndarray):
    ranges = [(o, min(rsize, nbytes - o)) for o in range(0, nbytes, rsize)]
    out = np.empty(nbytes, np.uint8)
    out[:] = 0  # fault the pages in before timing
    rates, cpus, scpus = [], [], []
    for rep in range(reps):
        c0, s0, t0 = cpu_self(), server.cpu_seconds(), time.perf_counter()
        client.read_all(key, ranges, out, inflight)
        dt = time.perf_counter() - t0
        c1, s1 = cpu_self(), server.cpu_seconds()
        if rep == 0 and not np.array_equal(out, truth[:nbytes]):
            raise AssertionError(f"{client.name}: wrong bytes")
        rates.append(nbytes / MiB / dt)
        cpus.append((c1 - c0) * GiB / nbytes)
        scpus.append((s1 - s0) * GiB / nbytes)
    return rates, cpus, scpus


def ttfb(client, key: str, size: int, n: int = 20, rsize: int = 4096) -> list:
    rng = np.random.default_rng(1)
    client.get(key, 0, rsize)  # warm the connection
    times = []
    for off in rng.integers(0, size - rsize, n):
        t0 = time.perf_counter()
        b = client.get(key, int(off), rsize)
        times.append((time.perf_counter() - t0) * 1e3)
        assert len(b) == rsize
    return times


def cold_first_byte(cls, url: str, key: str, n: int = 5) -> list:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        c = cls(url)
        c.get(key, 0, 4096)
        times.append((time.perf_counter() - t0) * 1e3)
        c.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=256, help="the object read whole on the fast server")
    ap.add_argument("--moto-mib", type=int, default=16, help="bytes read from moto's 256 MiB object per run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="64 MiB object, 1 repetition")
    ap.add_argument("--no-tls", action="store_true", help="skip the https section")
    a = ap.parse_args()
    if a.quick:
        a.size_mib, a.reps, a.moto_mib = 64, 1, 8
    t_start = time.time()
    size = a.size_mib * MiB
    tmp = tempfile.mkdtemp(prefix="s3lab-")
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, BUCKET))
    truth = np.frombuffer(np.random.default_rng(0).bytes(max(size, 256 * MiB)), np.uint8)
    with open(os.path.join(root, BUCKET, KEY), "wb") as fh:
        fh.write(truth[:size].tobytes())
    small = truth[:64 << 10].tobytes()
    with open(os.path.join(root, BUCKET, SMALL), "wb") as fh:
        fh.write(small)
    moto = start_moto()
    fast = start_rangeserver(root)
    try:
        s3 = boto3.client("s3", endpoint_url=moto.url, aws_access_key_id=AKID, aws_secret_access_key=SECRET,
                          region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key=KEY, Body=truth[:256 * MiB].tobytes(), ACL="public-read")
        s3.put_object(Bucket=BUCKET, Key=SMALL, Body=small, ACL="public-read")
        s3.put_object(Bucket=BUCKET, Key="public", Body=small, ACL="public-read")
        s3.put_object(Bucket=BUCKET, Key="private", Body=small)
        print(f"# Client measurements ({time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}, "
              f"{os.cpu_count()} CPUs, Python {platform.python_version()})\n")
        print(f"`{' '.join([os.path.basename(sys.executable)] + sys.argv)}`; obstore {obs.__version__}, "
              f"s3fs {s3fs.__version__}, fsspec {fsspec.__version__}, boto3 {boto3.__version__}\n")

        # -- time to first byte --------------------------------------------------------------
        print("## (a) Time to first byte: a 4 KiB ranged GET, ms, median (min-max) of 20, warm connection;"
              " cold = new client + first GET, median of 5\n")
        print("| client | moto, 64 KiB object | moto, 256 MiB object | range server | cold, moto 64 KiB |")
        print("|---|---|---|---|---|")
        for cls in (RawHTTP, Transport, ObstoreAsync, S3fsAsync):
            cm, cf_ = cls(moto.url), cls(fast.url)
            t_small = ttfb(cm, SMALL, len(small))
            t_big = ttfb(cm, KEY, 256 * MiB, n=5)
            t_fast = ttfb(cf_, KEY, size)
            cold = cold_first_byte(cls, moto.url, SMALL)
            print(f"| {cls.name} | {fmt_spread(t_small, '{:.2f}')} | {fmt_spread(t_big, '{:.0f}')} (n=5) | "
                  f"{fmt_spread(t_fast, '{:.2f}')} | {fmt_spread(cold, '{:.1f}')} |")
        print()

        # -- moto's ceiling ------------------------------------------------------------------
        print(f"## moto's ceiling: the first {a.moto_mib} MiB of moto's 256 MiB object; MiB/s of one run; "
              "client CPU s/GiB (median); moto's CPU s/GiB\n")
        print("| client | range | in flight | MiB/s | client CPU s/GiB | moto CPU s/GiB |")
        print("|---|---|---|---|---|---|")
        for cls in (RawHTTP, Transport, ObstoreAsync, S3fsAsync):
            c = cls(moto.url)
            for rsize, inflight in ((MiB, 1), (MiB, 16), (8 * MiB, 16)):
                rates, cpus, scpus = measure_read_all(c, moto, KEY, a.moto_mib * MiB, rsize, inflight, 1, truth)
                print(f"| {cls.name} | {rsize // MiB} MiB | {inflight} | {rates[0]:.0f} | "
                      f"{cpus[0]:.2f} | {scpus[0]:.0f} |", flush=True)
        print()

        # -- throughput and CPU on the fast server ------------------------------------------------
        print(f"## (b, c) Whole {a.size_mib} MiB object from the sendfile range server: MiB/s median (min-max) of {a.reps}; "
              "client CPU s/GiB median (min-max); server CPU s/GiB median\n")
        print("| client | range | in flight | MiB/s | client CPU s/GiB | server CPU s/GiB |")
        print("|---|---|---|---|---|---|")
        clients = (RawHTTP, Transport, ObstoreAsync, ObstoreThreads, S3fsAsync, S3fsCatRanges)
        for cls in clients:
            c = cls(fast.url)
            c.get(KEY, 0, 4096)
            for rsize in (MiB, 4 * MiB, 8 * MiB):
                for inflight in (1, 4, 16):
                    rates, cpus, scpus = measure_read_all(c, fast, KEY, size, rsize, inflight, a.reps, truth)
                    print(f"| {cls.name} | {rsize // MiB} MiB | {inflight} | {fmt_spread(rates)} | "
                          f"{fmt_spread(cpus, '{:.2f}')} | {statistics.median(scpus):.2f} |", flush=True)
        c = ObstoreGetRanges(fast.url)
        for rsize in (MiB, 8 * MiB):
            rates, cpus, scpus = measure_read_all(c, fast, KEY, size, rsize, 0, a.reps, truth)
            print(f"| {c.name} | {rsize // MiB} MiB | <=10 | {fmt_spread(rates)} | "
                  f"{fmt_spread(cpus, '{:.2f}')} | {statistics.median(scpus):.2f} |", flush=True)
        print()

        # -- the same over TLS ------------------------------------------------------------------
        if not a.no_tls:
            from labsrv.servers import self_signed_cert
            cert, key, ca = self_signed_cert(tmp)
            tls = start_rangeserver(root, tls=(cert, key))
            try:
                print(f"## (b, c) over TLS (https, a throwaway CA trusted by each client): whole {a.size_mib} MiB object; "
                      f"MiB/s median (min-max) of {a.reps}; client CPU s/GiB median (min-max); server CPU s/GiB\n")
                print("| client | range | in flight | MiB/s | client CPU s/GiB | server CPU s/GiB |")
                print("|---|---|---|---|---|---|")
                for cls in (RawHTTP, Transport, ObstoreAsync, ObstoreThreads, S3fsAsync):
                    c = cls(tls.url, ca)
                    c.get(KEY, 0, 4096)
                    for rsize, inflight in ((MiB, 16), (8 * MiB, 4)):
                        rates, cpus, scpus = measure_read_all(c, tls, KEY, size, rsize, inflight, a.reps, truth)
                        print(f"| {cls.name} | {rsize // MiB} MiB | {inflight} | {fmt_spread(rates)} | "
                              f"{fmt_spread(cpus, '{:.2f}')} | {statistics.median(scpus):.2f} |", flush=True)
                print()
            finally:
                tls.stop()

        # -- behaviour --------------------------------------------------------------------
        print("## (d, e, f) Behaviour checks (moto unless said)\n")
        print("| check | obstore | s3fs / fsspec |")
        print("|---|---|---|")
        for label, o, s in behaviour_checks(moto, fast, s3, root, truth):
            print(f"| {label} | {o} | {s} |".replace("\n", " "))
        print(f"\n(total {time.time() - t_start:.0f} s)")
    finally:
        moto.stop()
        fast.stop()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
