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
import asyncio
import concurrent.futures as cf
import http.client
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from labsrv.servers import start_moto, start_rangeserver  # noqa: E402

import boto3  # noqa: E402
import fsspec  # noqa: E402
import obstore as obs  # noqa: E402
import s3fs  # noqa: E402
from fsspec.asyn import sync  # noqa: E402
from obstore.store import S3Store  # noqa: E402
from transport import open_object  # noqa: E402

MiB = 1 << 20
HOME = os.path.dirname(os.path.abspath(__file__))
GiB = 1 << 30
BUCKET = "lab"
KEY = "big"
SMALL = "small"
AKID, SECRET, REGION = "AKIDLAB", "lab-secret-not-real", "us-east-1"


# ---------------------------------------------------------------------------
# clients: each ``make(url)`` returns an object with ``read_all(ranges, out, inflight)`` and ``get(off, n)``
# ---------------------------------------------------------------------------


class RawHTTP:
    """Baseline: http.client, one persistent connection per thread, body read straight into the caller's buffer."""

    name = "http.client threads, unsigned (baseline)"

    def __init__(self, url: str, cafile: "str | None" = None) -> None:
        self.host, self.port = url.split("//")[1].split(":")
        self.port = int(self.port)
        self.local = threading.local()
        self.ctx = None
        if url.startswith("https"):
            import ssl
            self.ctx = ssl.create_default_context(cafile=cafile)

    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self.local, "c", None)
        if c is None:
            if self.ctx is not None:
                c = self.local.c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx)
            else:
                c = self.local.c = http.client.HTTPConnection(self.host, self.port)
        return c

    def _into(self, key: str, off: int, view: memoryview) -> None:
        for attempt in range(3):
            c = self._conn()
            try:
                c.request("GET", f"/{BUCKET}/{key}", headers={"Range": f"bytes={off}-{off + len(view) - 1}"})
                r = c.getresponse()
                if r.status != 206:
                    raise RuntimeError(f"status {r.status}")
                got = 0
                while got < len(view):
                    k = r.readinto(view[got:])
                    if not k:
                        raise RuntimeError("short body")
                    got += k
                r.read()
                if r.will_close:
                    c.close()
                    self.local.c = None
                return
            except (ConnectionError, http.client.HTTPException):
                c.close()
                self.local.c = None
        raise RuntimeError("raw GET failed")

    def get(self, key: str, off: int, n: int) -> bytes:
        buf = bytearray(n)
        self._into(key, off, memoryview(buf))
        return buf

    def read_all(self, key: str, ranges, out: np.ndarray, inflight: int) -> None:
        mv = memoryview(out)
        with cf.ThreadPoolExecutor(inflight) as ex:
            list(ex.map(lambda r: self._into(key, r[0], mv[r[0]:r[0] + r[1]]), ranges))

    def close(self) -> None:
        pass


class Transport:
    """This lab's prototype (transport/): http.client keep-alive + botocore SigV4, bodies readinto the caller's buffer."""

    name = "transport/ (http.client + SigV4, threads)"

    def __init__(self, url: str, cafile: "str | None" = None) -> None:
        self.url = url
        self.cafile = cafile
        self.readers = {}

    def _reader(self, key: str, inflight: int = 8, rsize: int = 8 * MiB):
        k = (key, inflight, rsize)
        if k not in self.readers:
            self.readers[k] = open_object(f"s3://{BUCKET}/{key}", {
                "endpoint_url": self.url, "key": AKID, "secret": SECRET, "region": REGION,
                "max_inflight": inflight, "merge_gap": 0, "merge_cap": rsize, "open_readahead": 1,
                **({"verify": self.cafile} if self.cafile else {})})
        return self.readers[k]

    def get(self, key: str, off: int, n: int):
        return self._reader(key).read(off, n)

    def read_all(self, key: str, ranges, out: np.ndarray, inflight: int) -> None:
        r = self._reader(key, max(1, inflight), max(n for _, n in ranges))
        mv = memoryview(out)
        # one range per request: no merging (merge_gap=0, merge_cap=range size), as for the other clients
        r.read_into(ranges, [mv[o:o + n] for o, n in ranges])

    def close(self) -> None:
        for r in self.readers.values():
            r.close()


class ObstoreAsync:
    name = "obstore get_range_async + asyncio.Semaphore"

    def __init__(self, url: str, cafile: "str | None" = None) -> None:
        copts = {"allow_http": True, "timeout": "300s"}
        if cafile:
            copts["root_certificate"] = open(cafile).read()
        self.store = S3Store(BUCKET, endpoint=url, region=REGION, access_key_id=AKID, secret_access_key=SECRET,
                             client_options=copts)

    def get(self, key: str, off: int, n: int):
        return obs.get_range(self.store, key, start=off, length=n)

    def read_all(self, key: str, ranges, out: np.ndarray, inflight: int) -> None:
        async def main() -> None:
            sem = asyncio.Semaphore(inflight)

            async def one(off: int, n: int) -> None:
                async with sem:
                    b = await obs.get_range_async(self.store, key, start=off, length=n)
                out[off:off + n] = np.frombuffer(b, np.uint8)

            await asyncio.gather(*(one(o, n) for o, n in ranges))

        asyncio.run(main())

    def close(self) -> None:
        pass


class ObstoreThreads(ObstoreAsync):
    name = "obstore get_range (sync) in a thread pool"

    def read_all(self, key: str, ranges, out: np.ndarray, inflight: int) -> None:
        def one(r) -> None:
            off, n = r
            out[off:off + n] = np.frombuffer(obs.get_range(self.store, key, start=off, length=n), np.uint8)

        with cf.ThreadPoolExecutor(inflight) as ex:
            list(ex.map(one, ranges))


class ObstoreGetRanges(ObstoreAsync):
    name = "obstore get_ranges (its own <=10 in flight)"

    def read_all(self, key: str, ranges, out: np.ndarray, inflight: int) -> None:
        starts = [o for o, _ in ranges]
        lengths = [n for _, n in ranges]
        for (off, n), b in zip(ranges, obs.get_ranges(self.store, key, starts=starts, lengths=lengths, coalesce=0)):
            out[off:off + n] = np.frombuffer(b, np.uint8)


class S3fsAsync:
    name = "s3fs _cat_file on its loop + asyncio.Semaphore"

    def __init__(self, url: str, cafile: "str | None" = None) -> None:
        ck = {"region_name": REGION, **({"verify": cafile} if cafile else {})}
        self.fs = s3fs.S3FileSystem(key=AKID, secret=SECRET, endpoint_url=url, client_kwargs=ck,
                                    config_kwargs={"max_pool_connections": 64}, skip_instance_cache=True,
                                    cache_regions=False)

    def get(self, key: str, off: int, n: int) -> bytes:
        return self.fs.cat_file(f"{BUCKET}/{key}", start=off, end=off + n)

    def read_all(self, key: str, ranges, out: np.ndarray, inflight: int) -> None:
        path = f"{BUCKET}/{key}"

        async def main() -> None:
            sem = asyncio.Semaphore(inflight)

            async def one(off: int, n: int) -> None:
                async with sem:
                    b = await self.fs._cat_file(path, start=off, end=off + n)
                out[off:off + n] = np.frombuffer(b, np.uint8)

            await asyncio.gather(*(one(o, n) for o, n in ranges))

        sync(self.fs.loop, main)

    def close(self) -> None:
        pass


class S3fsCatRanges(S3fsAsync):
    name = "s3fs cat_ranges(batch_size=in flight)"

    def read_all(self, key: str, ranges, out: np.ndarray, inflight: int) -> None:
        path = f"{BUCKET}/{key}"
        res = self.fs.cat_ranges([path] * len(ranges), [o for o, _ in ranges], [o + n for o, n in ranges],
                                 batch_size=inflight, on_error="raise")
        for (off, n), b in zip(ranges, res):
            out[off:off + n] = np.frombuffer(b, np.uint8)


# ---------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# behaviour checks, each in a fresh interpreter (fork, environment)
# ---------------------------------------------------------------------------

FORK_SNIPPET = r'''
import os, sys, signal, asyncio, threading
kind, mode = sys.argv[1], sys.argv[2]
URL, AKID, SECRET = os.environ["LAB_URL"], "AKIDLAB", "lab-secret-not-real"
def make():
    if kind.startswith("obstore"):
        from obstore.store import S3Store
        return S3Store("lab", endpoint=URL, region="us-east-1", access_key_id=AKID, secret_access_key=SECRET,
                       client_options={"allow_http": True, "timeout": "20s"})
    if kind == "transport":
        sys.path.insert(0, os.environ["LAB_HOME"])
        from transport import open_object
        return open_object("s3://lab/small", {"endpoint_url": URL, "key": AKID, "secret": SECRET})
    import s3fs
    return s3fs.S3FileSystem(key=AKID, secret=SECRET, endpoint_url=URL, client_kwargs={"region_name": "us-east-1"},
                             skip_instance_cache=(mode != "cached"))
def read(c):
    if kind == "obstore":
        import obstore as obs
        return bytes(obs.get_range(c, "small", start=100000 % 65536, length=16))
    if kind == "obstore-async":
        import obstore as obs
        async def f():
            return bytes(await obs.get_range_async(c, "small", start=100000 % 65536, length=16))
        return asyncio.run(f())
    if kind == "transport":
        return bytes(c.read(0, 16))
    return c.cat_file("lab/small", start=100000 % 65536, end=100000 % 65536 + 16)
c = make()
want = read(c)                                   # the parent uses its client first
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    signal.alarm(10)
    try:
        cc = c if mode == "inherited" else make()
        ok = read(cc) == want
        os.write(w, b"ok" if ok else b"child wrong bytes")
        os._exit(0)
    except BaseException as e:
        os.write(w, ("child error " + type(e).__name__ + ": " + str(e).splitlines()[0][:120]).encode())
        os._exit(3)
os.close(w)
_, status = os.waitpid(pid, 0)
msg = os.read(r, 4096).decode()
if os.WIFSIGNALED(status):
    msg = f"child HANG (killed by SIGALRM after 10 s)"
print(msg, end="", flush=True)
threading.Timer(10, lambda: (print("; parent's next request HANGS", flush=True), os._exit(0))).start()
after = read(c) == want                          # and the parent's client still works
print(f"; parent after: {'ok' if after else 'wrong bytes'}", flush=True)
os._exit(0)
'''

ENV_SNIPPET = r'''
import os, sys
kind = sys.argv[1]
try:
    if kind == "obstore":
        import obstore as obs
        from obstore.store import S3Store
        extra = {}
        if os.environ.get("LAB_BOTO3_PROVIDER"):
            from obstore.auth.boto3 import Boto3CredentialProvider
            extra["credential_provider"] = Boto3CredentialProvider()
        if os.environ.get("LAB_SKIP_SIGNATURE"):
            extra["skip_signature"] = True
        s = S3Store("lab", **extra)
        print("ok", obs.head(s, os.environ.get("LAB_KEY", "small"))["size"])
    else:
        import s3fs
        kw = {"anon": True} if os.environ.get("LAB_SKIP_SIGNATURE") else {}
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **kw)
        print("ok", fs.info("lab/" + os.environ.get("LAB_KEY", "small"))["size"])
except Exception as e:
    print("error", type(e).__name__, str(e).replace("\n", " ")[:160])
'''


def run_snippet(code: str, args, env: dict, timeout: float = 60) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    base["HOME"] = env.pop("HOME", tempfile.mkdtemp())  # no ~/.aws of the user's
    base.update(env)
    try:
        p = subprocess.run([sys.executable, "-c", code, *args], env=base, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout} s"
    out = (p.stdout.strip() or p.stderr.strip().splitlines()[-1:] or ["(nothing)"])
    return out if isinstance(out, str) else out[0]


def behaviour_checks(moto, fast, s3, root: str, truth: np.ndarray) -> list:
    rows = []
    # (d) buffers
    st = ObstoreAsync(fast.url)
    b = st.get(KEY, 0, MiB)
    mv = memoryview(b)
    a1, a2 = np.frombuffer(b, np.uint8), np.frombuffer(b, np.uint8)
    fsb = S3fsAsync(fast.url).get(KEY, 0, MiB)
    rows.append(("(d) what a ranged read returns",
                 f"`{type(b).__module__}.{type(b).__name__}`; memoryview readonly={mv.readonly}, contiguous={mv.c_contiguous}; "
                 f"two np.frombuffer views share memory={np.shares_memory(a1, a2)} (zero-copy), writeable={a1.flags.writeable}",
                 f"`{type(fsb).__name__}` (aiohttp body joined into a new bytes); np.frombuffer zero-copy but read-only"))
    rows.append(("(d) read into a caller's buffer",
                 "no readinto API (get/get_range/ReadableFile.read return Bytes): one memcpy from Rust's buffer into ours",
                 "no readinto API (cat_file/cat_ranges/S3File.read return bytes): one memcpy, plus the join inside aiohttp"))
    # (e) identity + If-Match on moto (ranged GET) with the object overwritten between reads
    s3.put_object(Bucket=BUCKET, Key="mut", Body=b"A" * 100_000)
    ostore = ObstoreAsync(moto.url).store
    meta = obs.head(ostore, "mut")
    etag = meta["e_tag"]
    r1 = obs.get(ostore, "mut", options={"range": (0, 10), "if_match": etag}).bytes()
    s3.put_object(Bucket=BUCKET, Key="mut", Body=b"B" * 100_000)
    try:
        obs.get(ostore, "mut", options={"range": (10, 20), "if_match": etag}).bytes()
        o_res = "NOT detected"
    except Exception as e:
        o_res = f"raises `{type(e).__module__}.{type(e).__name__}`"
    got_meta = obs.get(ostore, "mut", options={"range": (0, 10)}).meta
    rows.append(("(e) identity", f"head -> e_tag={meta['e_tag'][:10]}..., version={meta['version']}; every GetResult.meta has e_tag",
                 "info() -> ETag, VersionId (VersionId only with version_aware=True)"))
    s3.put_object(Bucket=BUCKET, Key="mut", Body=b"A" * 100_000)
    fs = S3fsAsync(moto.url).fs
    f = fs.open(f"{BUCKET}/mut", "rb", block_size=4096, cache_type="none")
    f.read(10)
    s3.put_object(Bucket=BUCKET, Key="mut", Body=b"C" * 100_000)
    try:
        f.seek(50_000)
        f.read(10)
        s_res = "file object NOT detected"
    except Exception as e:
        s_res = f"S3File.read raises `{type(e).__name__}` (it sends IfMatch=ETag from open)"
    fs.invalidate_cache()
    info = fs.info(f"{BUCKET}/mut")
    try:
        sync(fs.loop, fs._call_s3, "get_object", Bucket=BUCKET, Key="mut", Range="bytes=0-9", IfMatch='"0000"')
        s_low = "low-level get_object(IfMatch) NOT detected"
    except Exception as e:
        s_low = f"low-level `_call_s3('get_object', IfMatch=...)` raises `{type(e).__name__}`"
    rows.append(("(e) If-Match on a ranged GET after an overwrite (moto)",
                 f"`get(options={{'range':..., 'if_match': etag}})` {o_res}; get_range/get_ranges take no if_match; "
                 f"r1={bytes(r1)[:3]!r}, meta after={got_meta['e_tag'][:10]}...",
                 f"{s_res}; cat_file/cat_ranges take no IfMatch; {s_low}"))
    # (f) environment, profile files, anonymous: each in a fresh interpreter
    home = tempfile.mkdtemp()
    os.makedirs(os.path.join(home, ".aws"))
    with open(os.path.join(home, ".aws", "credentials"), "w") as fh:
        fh.write(f"[lab]\naws_access_key_id = {AKID}\naws_secret_access_key = {SECRET}\n")
    with open(os.path.join(home, ".aws", "config"), "w") as fh:
        fh.write(f"[profile lab]\nregion = {REGION}\nendpoint_url = {moto.url}\n")
    env_std = {"AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": moto.url, "AWS_REGION": REGION}
    cases = [
        ("(f) AWS_ACCESS_KEY_ID/SECRET + AWS_ENDPOINT_URL=http://127.0.0.1 + AWS_REGION", env_std),
        ("(f) same + AWS_ALLOW_HTTP=true", dict(env_std, AWS_ALLOW_HTTP="true")),
        ("(f) profile files only (AWS_PROFILE=lab, ~/.aws/credentials + config with endpoint_url)",
         {"HOME": home, "AWS_PROFILE": "lab", "AWS_ALLOW_HTTP": "true"}),
        ("(f) anonymous, public-read object (obstore skip_signature / s3fs anon)",
         {"AWS_ENDPOINT_URL": moto.url, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true", "LAB_SKIP_SIGNATURE": "1",
          "LAB_KEY": "public"}),
        ("(f) anonymous, private object", {"AWS_ENDPOINT_URL": moto.url, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true",
                                           "LAB_SKIP_SIGNATURE": "1", "LAB_KEY": "private"}),
    ]
    for label, env in cases:
        rows.append((label, run_snippet(ENV_SNIPPET, ["obstore"], dict(env)), run_snippet(ENV_SNIPPET, ["s3fs"], dict(env))))
    rows.append(("(f) profile files, obstore with `obstore.auth.boto3.Boto3CredentialProvider` (endpoint from env)",
                 run_snippet(ENV_SNIPPET, ["obstore"], {"HOME": home, "AWS_PROFILE": "lab", "AWS_ALLOW_HTTP": "true",
                                                        "AWS_ENDPOINT_URL": moto.url, "LAB_BOTO3_PROVIDER": "1"}), "(n/a)"))
    # fork
    for mode, label in (("inherited", "client made in the parent, used in a forked child"),
                        ("fresh", "client made fresh in the forked child"),
                        ("cached", "s3fs: S3FileSystem(same args) in the child (fsspec's instance cache)")):
        t = run_snippet(FORK_SNIPPET, ["transport", mode], {"LAB_URL": moto.url, "LAB_HOME": HOME}) if mode != "cached" else "(n/a)"
        o = run_snippet(FORK_SNIPPET, ["obstore", mode], {"LAB_URL": moto.url}) if mode != "cached" else "(n/a)"
        oa = run_snippet(FORK_SNIPPET, ["obstore-async", mode], {"LAB_URL": moto.url}) if mode != "cached" else "(n/a)"
        s = run_snippet(FORK_SNIPPET, ["s3fs", mode], {"LAB_URL": moto.url})
        rows.append((f"(f) fork: {label}", f"sync: {o}; async: {oa}", s + (f" / transport/: {t}" if mode != "cached" else "")))
    # plain HTTP(S) URLs, against the range server and against python's http.server (no Range)
    rows.extend(fault_checks(root, truth))
    rows.append(http_checks(fast))
    rows.append(http_checks_norange())
    return rows


def fault_checks(root: str, truth: np.ndarray) -> list:
    """Each client with its default retry settings, against the range server (in this process) injecting faults."""
    from objservers import RangeServer  # the tests' byte-range server (tests/objservers.py)
    rows = []
    with RangeServer(root) as srv:
        clients = [("obstore", ObstoreAsync(srv.url)), ("s3fs", S3fsAsync(srv.url)), ("transport", Transport(srv.url))]
        for c in clients:
            c[1].get(KEY, 0, 16)
        results = {}
        for label, faults in (("2 x 503 SlowDown", ["503", "503"]), ("1 x 429", ["429"]),
                              ("3 x 500", ["500"] * 3), ("connection reset mid-body", ["reset"]),
                              ("body cut short, then close", ["short"])):
            for name, c in clients:
                srv.clear_faults()
                srv.inject(*faults)
                t0 = time.perf_counter()
                try:
                    b = c.get(KEY, 3 * MiB, MiB)
                    ok = bytes(b) == truth[3 * MiB:4 * MiB].tobytes()
                    res = f"{'recovered' if ok else 'WRONG BYTES'} ({time.perf_counter() - t0:.2f} s)"
                except Exception as e:
                    res = f"raises `{type(e).__name__}` ({time.perf_counter() - t0:.2f} s)"
                results.setdefault(label, {})[name] = res
        srv.clear_faults()
        for label, r in results.items():
            rows.append((f"(retry) {label}, a 1 MiB ranged GET, default settings", r["obstore"],
                         f"{r['s3fs']} / transport/: {r['transport']}"))
    return rows


def http_checks(fast) -> tuple:
    from obstore.store import HTTPStore
    hs = HTTPStore.from_url(f"{fast.url}/{BUCKET}/", client_options={"allow_http": True})
    m = obs.head(hs, KEY)
    b = obs.get_range(hs, KEY, start=5, length=10)
    hfs = fsspec.filesystem("http", skip_instance_cache=True)
    info = hfs.info(f"{fast.url}/{BUCKET}/{KEY}")
    hb = hfs.cat_file(f"{fast.url}/{BUCKET}/{KEY}", start=5, end=15)
    ok = bytes(b) == hb
    return ("(f) plain http:// URL, Range-capable server",
            f"HTTPStore.from_url(allow_http): head size={m['size']}, e_tag={'yes' if m['e_tag'] else 'no'}; get_range ok={ok}",
            f"HTTPFileSystem: info size={info['size']}, ETag={'yes' if info.get('ETag') else 'no'}; cat_file(start,end) ok={ok}")


def http_checks_norange() -> tuple:
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
    from obstore.store import HTTPStore
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "f.bin"), "wb") as fh:
        fh.write(os.urandom(100_000))
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    class QuietServer(ThreadingHTTPServer):
        def handle_error(self, request, client_address):  # a client hanging up early is expected here
            pass

    srv = QuietServer(("127.0.0.1", 0), functools.partial(Quiet, directory=d))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        hs = HTTPStore.from_url(url + "/", client_options={"allow_http": True})
        b = obs.get_range(hs, "f.bin", start=5, length=10)
        o = f"returned {len(b)} bytes (no error)"
    except Exception as e:
        o = f"raises `{type(e).__name__}`: {str(e).splitlines()[0][:90]}"
    try:
        hfs = fsspec.filesystem("http", skip_instance_cache=True)
        hb = hfs.cat_file(url + "/f.bin", start=5, end=15)
        s = f"returned {len(hb)} bytes"
    except Exception as e:
        s = f"raises `{type(e).__name__}`: {str(e).splitlines()[0][:90]}"
    srv.shutdown()
    srv.server_close()
    return ("(f) plain http:// URL, server ignoring Range (python -m http.server)", o, s)


# ---------------------------------------------------------------------------


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
