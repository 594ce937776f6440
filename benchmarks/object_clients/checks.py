"""Behaviour checks of the object clients (buffers, ETag and If-Match, credentials, fork, faults, plain HTTP).

Whatever may hang or read the environment runs in a fresh interpreter
(``run_snippet``) with a time limit; each check returns table rows for
``measure_clients.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time

import fsspec
import numpy as np
import obstore as obs
from fsspec.asyn import sync

from clients import AKID, BUCKET, KEY, MiB, REGION, SECRET, ObstoreAsync, S3fsAsync, Transport

HOME = os.path.dirname(os.path.abspath(__file__))


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
    fs.info(f"{BUCKET}/mut")  # the fresh listing s3fs would open from
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
