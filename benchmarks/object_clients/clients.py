"""The byte-range clients ``measure_clients.py`` compares, each behind the same two calls.

``Client(url, cafile=None)`` talks path-style S3 to ``url`` (bucket ``lab``);
``get(key, off, n)`` returns bytes and ``read_all(key, ranges, out, inflight)``
fills ``out`` (a numpy uint8 array owned by the caller) from ``(offset, length)``
ranges with at most ``inflight`` requests at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import http.client
import threading

import numpy as np
import obstore as obs
import s3fs
from fsspec.asyn import sync
from obstore.store import S3Store

from transport import open_object

MiB = 1 << 20
BUCKET = "lab"
KEY = "big"
SMALL = "small"
AKID, SECRET, REGION = "AKIDLAB", "lab-secret-not-real", "us-east-1"


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
