"""The object client (``multitables._io.objects``) against moto's S3 server, a fault proxy in front of it, and a byte-range
HTTP server, all on 127.0.0.1: exact bytes, requests merged and split, retries, an object changed under a read, where
credentials and endpoints come from, and that no secret shows."""

from __future__ import annotations

import contextlib
import functools
import gzip
import os
import logging
import multiprocessing
import pickle
import socket
import threading
import time
import types
import zlib
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multitables.errors import FileChangedError, ObjectStorageError
from multitables._io.objects import credentials as creds_module
from multitables._io.objects.cache import DiskCache, evict
from multitables._io.objects.config import make_store
from multitables._io.objects.credentials import Credentials
from multitables._io.objects.http import ObjectAccessError, ObjectNotFoundError
from multitables._io.objects.listing import expand
from multitables._io.objects.reader import ObjectReader, plan
from multitables._io.objects.urls import matches, parse_url, quote_key, shown
from objfixtures import AKID, BUCKET, SECRET, TOKEN, s3_options

pytestmark = pytest.mark.usefixtures("aws_env")
MiB = 1 << 20
DATA = f"s3://{BUCKET}/data.h5"


@pytest.fixture(scope="module")
def truth(obj_files) -> bytes:
    return (obj_files["folder"] / "data.h5").read_bytes()


def opened(url: str, **options) -> ObjectReader:
    return ObjectReader(url, make_store(options))


# -- URLs, stores, signatures (no server) ------------------------------------------------------------------------------


def test_urls_are_taken_apart_and_shown_without_secrets() -> None:
    assert parse_url("s3://b/a/c.h5").shown == "s3://b/a/c.h5"
    assert shown("https://user@h.example:8443/f.h5?X-Amz-Signature=abc") == "https://h.example:8443/f.h5?..."
    with pytest.raises(ValueError, match="names a bucket and an object"):
        parse_url("s3://bucket-only")
    with pytest.raises(ValueError, match="user and password"):
        parse_url("https://me:pw@h.example/f.h5")
    assert matches("data/train-001.h5", "data/train-*.h5") and not matches("data/old/train-1.h5", "data/*.h5")
    assert quote_key("a b/c+d~e.h5") == "a%20b/c%2Bd~e.h5"
    for url, key in (("s3://b/d/shard-?.h5", "d/shard-?.h5"), ("s3://b/d/a?b?.h5", "d/a?b?.h5")):  # '?' is a pattern's
        assert parse_url(url).key == key and parse_url(url).is_pattern


def test_the_store_comes_from_options_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    store = make_store(None)
    assert (store.endpoint, store.region) == ("http://127.0.0.1:9000", "eu-west-3")
    store = make_store({"endpoint_url": "https://minio.example", "region_name": "ap-south-1"})
    assert (store.endpoint, store.region) == ("https://minio.example", "ap-south-1")
    with pytest.raises(ValueError, match="plain http:// endpoint .* refused"):
        make_store({"endpoint_url": "http://minio.example:9000"})
    assert make_store({"endpoint_url": "http://minio.example:9000", "allow_http": True}).endpoint
    with pytest.raises(ValueError, match="endpoint 'ftp://127.0.0.1:5055' is not an http") as info:  # no user info shown
        make_store({"endpoint_url": f"ftp://{AKID}:{SECRET}@127.0.0.1:5055"})
    assert SECRET not in str(info.value) and AKID not in str(info.value)
    with pytest.raises(TypeError, match="unknown storage option 'endpont_url'"):
        make_store({"endpont_url": "http://127.0.0.1:1"})
    with pytest.raises(ValueError, match="'key' and 'secret' together"):
        make_store({"key": AKID})


def test_a_cache_dir_that_cannot_hold_the_cache_is_refused_naming_the_option(tmp_path: Path) -> None:
    made = tmp_path / "new" / "cache"
    assert make_store({"cache_dir": made}).cache_dir == str(made) and made.is_dir()  # made where missing
    (tmp_path / "afile").write_bytes(b"")
    for folder in (tmp_path / "afile", tmp_path / "afile" / "sub", "/proc/no-cache-here"):
        with pytest.raises(ValueError, match=f"storage option cache_dir='{folder}' cannot hold the cache"):
            make_store({"cache_dir": str(folder)})  # not a FileNotFoundError: that one means a missing object
    with pytest.raises(TypeError, match="cache_dir is a folder's path, not int"):
        make_store({"cache_dir": 5})


def test_aws_addresses_by_region_and_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store({"anon": True, "region": "eu-central-1"})
    assert store.base("my-bucket") == ("https", "my-bucket.s3.eu-central-1.amazonaws.com", 443, "")
    assert store.base("dotted.bucket") == ("https", "s3.eu-central-1.amazonaws.com", 443, "/dotted.bucket")


@pytest.mark.parametrize("token", [None, TOKEN])
@pytest.mark.parametrize("path", ["/b/data.h5", "/b/a%20b/c%2Bd~e.h5", "/b?list-type=2&prefix=a%2Fb"])
def test_the_signer_gives_botocores_signature(monkeypatch: pytest.MonkeyPatch, token, path) -> None:
    import datetime

    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    from multitables._io.objects.sigv4 import sign

    now = datetime.datetime(2026, 11, 26, 7, 0, 0)
    if hasattr(botocore.auth, "get_current_datetime"):
        monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: now)
    else:  # an older botocore (1.31, the [s3] extra's floor) asks datetime.datetime.utcnow()
        monkeypatch.setattr(botocore.auth, "datetime", types.SimpleNamespace(datetime=types.SimpleNamespace(utcnow=lambda: now)))
    extra = {"Range": "bytes=0-99", "If-Match": '"abc"'}
    request = AWSRequest(method="GET", url=f"http://127.0.0.1:9000{path}", headers=dict(extra))
    botocore.auth.S3SigV4Auth(BotoCredentials(AKID, SECRET, token), "s3", "eu-west-1").add_auth(request)
    ours = sign("GET", "127.0.0.1:9000", path, extra, "eu-west-1", AKID, SECRET, token,
                now=now.replace(tzinfo=datetime.timezone.utc))
    assert ours["Authorization"] == request.headers["Authorization"]


def test_plan_merges_neighbours_and_splits_long_ranges() -> None:
    bufs = [memoryview(bytearray(n)) for n in (100, 100, 100, 100)]
    groups = plan([(0, 100), (150, 100), (10_000, 100), (300, 100)], bufs, gap=100, cap=1000)
    assert [(g.start, g.stop) for g in groups] == [(0, 400), (10_000, 10_100)]
    assert [view is None for _, view in groups[0].parts] == [False, True, False, True, False]
    assert [(g.start, g.stop) for g in plan([(0, 10)], [memoryview(bytearray(10))], 0, 4)] == [(0, 4), (4, 8), (8, 10)]


# -- exact bytes ---------------------------------------------------------------------------------------------------


@pytest.fixture(params=["s3", "http"])
def any_reader(request, moto_url, rangesrv):
    url, options = (DATA, s3_options(moto_url)) if request.param == "s3" else (f"{rangesrv.url}/data.h5", {})
    reader = opened(url, part_size=256 << 10, merge_gap=4096, **options)
    yield reader
    reader.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_ranges_are_exact(any_reader, truth, data) -> None:
    size = len(truth)
    starts = data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=8))
    ranges = [(a, data.draw(st.integers(0, min(size - a, 700_000)))) for a in starts]
    outs = [bytearray(n) for _, n in ranges]
    any_reader.read_into(ranges, outs)
    assert [bytes(o) for o in outs] == [truth[a : a + n] for a, n in ranges]


def test_a_long_read_is_split_into_parts_in_flight(rangesrv, truth) -> None:
    active, most, lock = [0], [0], threading.Lock()
    server = rangesrv._srv
    handle = server.RequestHandlerClass.do_GET

    def counting(self):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            time.sleep(0.02)
            handle(self)
        finally:
            with lock:
                active[0] -= 1

    server.RequestHandlerClass.do_GET = counting
    try:
        with opened(f"{rangesrv.url}/data.h5", part_size=128 << 10, max_inflight=3, open_readahead=1) as reader:
            assert bytes(reader.read(0, len(truth))) == truth
            assert reader.stats["requests"] == 1 + -(-len(truth) // (128 << 10))
    finally:
        server.RequestHandlerClass.do_GET = handle
    assert most[0] == 3


# -- retries -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("faults", [["503"] * 3, ["429"], ["500", "500"], ["reset", "reset"], ["short"],
                                    [("stall", 1.5)], ["503", "reset", "short"]], ids=str)
def test_retries_recover_exact_bytes(proxy, truth, faults) -> None:
    with opened(DATA, open_readahead=1, read_timeout=0.5, **s3_options(proxy.url)) as reader:
        proxy.inject(*faults)
        assert bytes(reader.read(100_000, 300_000)) == truth[100_000:400_000]
        assert reader.stats["retries"] == len(faults) and proxy.pending == 0


def test_retry_after_is_taken_in_seconds_or_as_an_http_date() -> None:
    import email.utils

    from multitables._io.objects.http import _retry_after

    assert _retry_after("7") == 7.0 and _retry_after(None) is None and _retry_after("soon") is None
    assert 2.0 < _retry_after(email.utils.formatdate(time.time() + 3, usegmt=True)) <= 3.0  # type: ignore[operator]
    assert _retry_after(email.utils.formatdate(time.time() - 60, usegmt=True)) == 0.0


def test_a_cut_body_resumes_where_it_stopped(rangesrv, truth) -> None:
    with opened(f"{rangesrv.url}/data.h5", open_readahead=1, backoff_base=0.01) as reader:
        rangesrv.inject("short")
        before = len(rangesrv.headers_seen)
        assert bytes(reader.read(0, 600_000)) == truth[:600_000]
        asked = [h["Range"] for h in list(rangesrv.headers_seen)[before:]]
    assert asked == ["bytes=0-599999", "bytes=200000-599999"]


def test_no_server_past_the_retries_is_also_a_connection_error_and_no_answer_a_timeout() -> None:
    """A URL with no server gave an ObjectStorageError that ``except ConnectionError`` (what requests, urllib3 and
    fsspec users write) missed: refused past the retries it is both, and a server that never answers gives a
    TimeoutError; each still an ObjectStorageError and an OSError."""
    import multitables

    with socket.socket() as closed:  # a port that was free: nothing listens there once closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(ConnectionError) as caught:
        multitables.Streamer(f"https://127.0.0.1:{port}/f.h5", storage_options={"attempts": 2, "backoff_base": 0.01}
                             ).get_queue("/d", n_procs=0)
    assert isinstance(caught.value, ObjectStorageError) and not isinstance(caught.value, TimeoutError)
    assert f"https://127.0.0.1:{port}/f.h5 bytes [0, " in str(caught.value) and "ConnectionRefusedError" in str(caught.value)
    with socket.socket() as silent:  # accepts (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/f.h5"
        with pytest.raises(TimeoutError) as caught:
            opened(url, attempts=2, backoff_base=0.01, read_timeout=0.2)
    assert isinstance(caught.value, ObjectStorageError) and not isinstance(caught.value, ConnectionError)
    assert "gave up after 2 attempts; last: no answer (timed out" in str(caught.value), str(caught.value)


def test_giving_up_names_the_object_and_range_and_no_secret(proxy, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="multitables")
    with opened(DATA, open_readahead=1, attempts=3, token=TOKEN, **s3_options(proxy.url)) as reader:
        proxy.inject("503", "503", "503")
        with pytest.raises(ObjectStorageError) as caught:
            reader.read(1000, 2000)
    message = str(caught.value)
    assert f"{DATA} bytes [1000, 3000): gave up after 3 attempts; last: HTTP 503 SlowDown" in message
    assert not isinstance(caught.value, (ConnectionError, TimeoutError))  # the server answered, with a refusal
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "attempt 2 of 3" in logged
    for secret in (SECRET, TOKEN):
        assert secret not in message + repr(caught.value) + logged


# -- an object that changes ----------------------------------------------------------------------------------------


def test_an_overwritten_object_is_a_change(moto_url, s3, truth) -> None:
    s3.put_object(Bucket=BUCKET, Key="mut1.h5", Body=truth[: 2 * MiB])
    with opened(f"s3://{BUCKET}/mut1.h5", open_readahead=1, **s3_options(moto_url)) as reader:
        assert bytes(reader.read(0, 100)) == truth[:100]
        s3.put_object(Bucket=BUCKET, Key="mut1.h5", Body=truth[::-1][: 2 * MiB])
        with pytest.raises(FileChangedError, match=rf"s3://{BUCKET}/mut1.h5 changed while it was being read"):
            reader.read(100, 100)


def test_a_change_is_seen_where_the_server_ignores_if_match(proxy, s3, truth) -> None:
    s3.put_object(Bucket=BUCKET, Key="mut2.h5", Body=truth[:MiB])
    with opened(f"s3://{BUCKET}/mut2.h5", open_readahead=1, **s3_options(proxy.url)) as reader:
        proxy.drop_if_match = True
        s3.put_object(Bucket=BUCKET, Key="mut2.h5", Body=truth[MiB : 2 * MiB])
        with pytest.raises(FileChangedError, match="its ETag is"):
            reader.read(100, 100)
        s3.delete_object(Bucket=BUCKET, Key="mut2.h5")
        with pytest.raises(FileChangedError, match="it is gone"):
            reader.read(100, 100)


# -- where credentials come from, and what fails clearly ------------------------------------------------------------


def _credential_sent(proxy) -> str:
    auth = proxy.headers_seen[-1].get("Authorization", "")
    return auth.split("Credential=")[1].split("/")[0] if "Credential=" in auth else ""


def test_environment_variables_give_credentials_endpoint_and_region(proxy, monkeypatch, truth) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-value")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    with ObjectReader(DATA, make_store(None)) as reader:
        assert bytes(reader.read(0, 10)) == truth[:10]
    assert _credential_sent(proxy) == "AKIDFROMENV" and "/eu-west-3/s3/" in proxy.headers_seen[-1]["Authorization"]


def test_profile_files_give_credentials_endpoint_and_region(proxy, monkeypatch, tmp_path, truth) -> None:
    (tmp_path / "credentials").write_text("[lab]\naws_access_key_id = AKIDFROMPROFILE\naws_secret_access_key = ps\n")
    (tmp_path / "config").write_text(f"[profile lab]\nregion = ap-south-1\nendpoint_url = {proxy.url}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "lab")
    with ObjectReader(DATA, make_store(None)) as reader:
        assert bytes(reader.read(0, 10)) == truth[:10]
    assert _credential_sent(proxy) == "AKIDFROMPROFILE" and "/ap-south-1/s3/" in proxy.headers_seen[-1]["Authorization"]


def test_a_missing_profile_is_named(moto_url, monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"could not be resolved \(profile 'nope-prof'\): ProfileNotFound"):
        opened(DATA, endpoint_url=moto_url, profile="nope-prof")
    monkeypatch.setenv("AWS_PROFILE", "nope-env")
    with pytest.raises(ValueError, match=r"could not be resolved \(profile 'nope-env'\): ProfileNotFound"):
        opened(DATA, endpoint_url=moto_url)


def test_missing_objects_credentials_and_access_fail_clearly(moto_url, truth) -> None:
    with pytest.raises(ObjectNotFoundError, match=rf"s3://{BUCKET}/nope.h5: HTTP 404 NoSuchKey") as caught:
        opened(f"s3://{BUCKET}/nope.h5", **s3_options(moto_url))
    assert isinstance(caught.value, FileNotFoundError)
    with pytest.raises(ValueError, match=rf"no AWS credentials found for {DATA}.*'anon': True"):
        opened(DATA, endpoint_url=moto_url)
    with pytest.raises(ObjectAccessError, match="access denied") as caught:
        opened(DATA, endpoint_url=moto_url, anon=True)
    assert isinstance(caught.value, PermissionError)
    with opened(f"s3://{BUCKET}/public/data.h5", endpoint_url=moto_url, anon=True) as reader:  # public-read
        assert bytes(reader.read(5, 10)) == truth[5:15]


def test_a_server_without_byte_ranges_is_refused(tmp_path) -> None:
    (tmp_path / "f.h5").write_bytes(b"x" * 300_000)
    handler = functools.partial(type("Quiet", (SimpleHTTPRequestHandler,), {"log_message": lambda *a: None}),
                                directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ObjectStorageError, match="ignores byte ranges"):
            opened(f"http://127.0.0.1:{server.server_address[1]}/f.h5")
    finally:
        server.shutdown()
        server.server_close()


class _Encoding(BaseHTTPRequestHandler):
    """Ranges of ``server.body``: gzip-encoded on the way under ``/gzip``, as they are elsewhere; a redirect to the
    gzipped ones under ``/moved``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.body)))  # type: ignore[attr-defined]
        self.send_header("ETag", '"e1"')
        self.end_headers()

    def do_GET(self) -> None:
        body = self.server.body  # type: ignore[attr-defined]
        if self.path.startswith("/eu-bucket/"):  # as AWS answers a bucket asked for at another region's endpoint
            sent = b"<Error><Code>PermanentRedirect</Code><Endpoint>eu-bucket.s3.eu-west-1.amazonaws.com</Endpoint></Error>"
            self.send_response(301)
            self.send_header("x-amz-bucket-region", "eu-west-1")
            self.send_header("Content-Length", str(len(sent)))
            self.end_headers()
            self.wfile.write(sent)
            return
        if self.path.startswith("/forbidden"):  # as a presigned URL past its expiry is answered
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/moved"):
            self.send_response(302)
            self.send_header("Location", "/gzip/f.h5?X-Amz-Signature=SIG0123")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        first, _, last = self.headers["Range"][len("bytes="):].partition("-")
        start, stop = int(first), min(int(last) + 1, len(body))
        gzipped = self.path.startswith("/gzip")
        sent = gzip.compress(body[start:stop]) if gzipped else body[start:stop]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(body)}")
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(sent)))
        self.send_header("ETag", '"e1"')
        self.end_headers()
        self.wfile.write(sent)


@pytest.mark.parametrize("cache", [False, True])
def test_a_body_encoded_on_the_way_a_redirect_or_a_refusal_of_a_url_say_what_they_are(truth, tmp_path, cache) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Encoding)
    server.body = os.urandom(100_000)  # type: ignore[attr-defined]  # gzip makes it longer: no short body to see
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    options = {"backoff_base": 0.01, **({"cache_dir": str(tmp_path)} if cache else {})}
    try:
        with pytest.raises(ObjectStorageError, match=r"gzip/f.h5 bytes \[0, \d+\): .*Content-Encoding: gzip"):
            with opened(f"{base}/gzip/f.h5", **options) as reader:  # with a cache: a HEAD, then the bytes
                reader.read(0, 8)
        with pytest.raises(ObjectStorageError, match=r"HTTP 302: the server redirects to http://127.0.0.1:\d+/gzip/f.h5\?\.\.\.;"):
            opened(f"{base}/moved/f.h5")
        with pytest.raises(ObjectAccessError, match=r"HTTP 403: access denied \(the server refuses it; a presigned URL"):
            opened(f"{base}/forbidden/f.h5?X-Amz-Signature=SIG0123")  # not 'credentials' nor 'anon': never signed
        with pytest.raises(ObjectStorageError, match=r"s3://eu-bucket/f.h5 bytes \[0, \d+\): HTTP 301 PermanentRedirect: "
                                                     r"the bucket is in region eu-west-1, not us-east-1: pass storage_options"):
            opened("s3://eu-bucket/f.h5", endpoint_url=base, anon=True)
    finally:
        server.shutdown()
        server.server_close()


class _HeadWithoutSize(_Encoding):
    def do_HEAD(self) -> None:  # as dynamic servers and some proxies answer a HEAD: no Content-Length
        self.send_response(200)
        self.send_header("ETag", '"e1"')
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()


def test_a_head_without_a_size_leaves_the_cache_to_a_ranged_get(tmp_path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HeadWithoutSize)
    server.daemon_threads = True
    server.body = b"\x89HDF\r\n\x1a\n" + os.urandom(400_000)  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with opened(f"http://127.0.0.1:{server.server_address[1]}/plain/f.h5", cache_dir=str(tmp_path)) as reader:
            assert reader.size == len(server.body)  # type: ignore[attr-defined]  # not 0: 'not an HDF5 file'
            assert bytes(reader.read(300_000, 1000)) == server.body[300_000:301_000]  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


class _ClosesIdle(_Encoding):
    timeout = 0.3  # closes a kept-alive connection idle this long, as web servers and S3 do


@pytest.mark.parametrize("attempts", [1, 6])
def test_connections_the_server_closed_while_idle_cost_no_attempt(attempts) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ClosesIdle)
    server.daemon_threads = True
    server.body = os.urandom(3 * MiB)  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/plain/f.h5"
    try:
        with opened(url, attempts=attempts, backoff_base=0.01, part_size=64 << 10, merge_gap=0) as reader:
            for _ in range(2):  # 16 GETs in flight leave up to 16 idle connections; then the server closes them
                assert bytes(reader.read(MiB, 16 * (64 << 10))) == server.body[MiB : 2 * MiB]  # type: ignore[attr-defined]
                time.sleep(0.6)
                assert bytes(reader.read(2 * MiB, 100)) == server.body[2 * MiB : 2 * MiB + 100]  # type: ignore[attr-defined]
            assert reader.stats["retries"] == 0
    finally:
        server.shutdown()
        server.server_close()


def test_a_refused_certificate_or_a_missing_ca_file_fail_at_once_saying_so(tmp_path) -> None:
    import datetime
    import ipaddress
    import ssl

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    (tmp_path / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Encoding)
    server.body = os.urandom(1000)  # type: ignore[attr-defined]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "ca.pem", tmp_path / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}/plain/f.h5"
    try:
        started = time.monotonic()
        with pytest.raises(ObjectStorageError, match=r"f.h5: the server's TLS certificate is refused .*'verify'"):
            opened(url, backoff_base=1.0)  # not tried again: a back-off of seconds would show
        assert time.monotonic() - started < 1.0
        with pytest.raises(ValueError, match=r"storage option verify='/no/such/ca.pem' is not a CA bundle's file"):
            opened(url, verify="/no/such/ca.pem")
        with opened(url, verify=tmp_path / "ca.pem") as reader:  # a path-like names the file too
            assert bytes(reader.read(0, 1000)) == server.body  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


# -- secrets never kept ---------------------------------------------------------------------------------------------


def test_credentials_travel_only_to_a_process_being_started(moto_url) -> None:
    store = make_store(s3_options(moto_url, token=TOKEN))
    blob = pickle.dumps(store)
    assert SECRET.encode() not in blob and TOKEN.encode() not in blob and "***" in repr(store.given)
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(store.given.get())
    assert repr(Credentials(AKID, SECRET, TOKEN)) == "Credentials(***)"
    from multiprocessing import context

    class Starting:  # what multiprocessing sets while it pickles a new process's arguments
        pass

    context.set_spawning_popen(Starting())
    try:
        spawned = pickle.dumps(store)
    finally:
        context.set_spawning_popen(None)
    assert SECRET.encode() in spawned
    with creds_module._GIVEN_LOCK:
        creds_module._GIVEN.pop(store.given.name)
    assert pickle.loads(blob).given.get() is None  # a process never given them
    assert pickle.loads(spawned).given.get().current() == (AKID, SECRET, TOKEN)  # registered on arrival


# -- listing -------------------------------------------------------------------------------------------------------


def test_a_pattern_lists_the_prefix_and_keeps_its_matches_sorted(moto_url) -> None:
    store = make_store(s3_options(moto_url))
    assert expand(f"s3://{BUCKET}/shards/shard-*.h5", store) == [f"s3://{BUCKET}/shards/shard-{i}.h5" for i in range(3)]
    with pytest.raises(FileNotFoundError, match="No object matches"):
        expand(f"s3://{BUCKET}/shards/none-*.h5", store)


# -- fork ----------------------------------------------------------------------------------------------------------


def _child_reads(reader, queue, want) -> None:
    try:
        queue.put(bytes(reader.read(MiB // 2, 300_000)) == want)
    except BaseException as exc:  # noqa: BLE001 - sent home
        queue.put(repr(exc))


def test_a_reader_used_in_the_parent_works_in_forked_children(moto_url, truth) -> None:
    ctx = multiprocessing.get_context("fork")
    with opened(DATA, part_size=128 << 10, **s3_options(moto_url)) as reader:
        assert bytes(reader.read(0, 600_000)) == truth[:600_000]  # connections and threads in the parent
        queue = ctx.Queue()
        children = [ctx.Process(target=_child_reads, args=(reader, queue, truth[MiB // 2 : MiB // 2 + 300_000]))
                    for _ in range(2)]
        for child in children:
            child.start()
        results = [queue.get(timeout=30) for _ in children]
        for child in children:
            child.join(10)
        assert results == [True, True]
        assert bytes(reader.read(MiB // 2, 10)) == truth[MiB // 2 : MiB // 2 + 10]  # and still in the parent


# -- the local cache -----------------------------------------------------------------------------------------------


def test_the_cache_serves_a_second_read_with_no_request(rangesrv, truth, tmp_path) -> None:
    options = {"cache_dir": str(tmp_path / "cache"), "part_size": 128 << 10}
    with opened(f"{rangesrv.url}/data.h5", **options) as reader:
        assert bytes(reader.read(1000, 500_000)) == truth[1000:501_000]
    gets = rangesrv.requests["GET"]
    with opened(f"{rangesrv.url}/data.h5", **options) as reader:  # a HEAD to look, then the cache
        assert bytes(reader.read(1000, 500_000)) == truth[1000:501_000]
    assert rangesrv.requests["GET"] == gets and rangesrv.requests["HEAD"] == 2
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_a_url_signed_again_finds_its_pieces_in_the_cache(rangesrv, truth, tmp_path) -> None:
    """A presigned URL is signed anew for each job (its signature and date change): the cache is keyed without them,
    so the second job reads no byte from the server; a parameter that names what is served (versionId) stays."""
    options = {"cache_dir": str(tmp_path / "cache"), "part_size": 128 << 10}
    signed = ("{}/data.h5?versionId=7&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date={}&X-Amz-Expires=3600"
              "&X-Amz-SignedHeaders=host&X-Amz-Signature={}")
    with opened(signed.format(rangesrv.url, "20261129T070000Z", "ab" * 32), **options) as reader:
        assert bytes(reader.read(1000, 300_000)) == truth[1000:301_000]
    gets = rangesrv.requests["GET"]
    for again in (signed.format(rangesrv.url, "20261130T080000Z", "cd" * 32),
                  f"{rangesrv.url}/data.h5?versionId=7&AWSAccessKeyId=AK&Expires=1&Signature=x%2By",  # SigV2
                  f"{rangesrv.url}/data.h5?versionId=7&sv=2024-01-01&se=2026-12-01&sp=r&sig=abc"):  # Azure's SAS
        with opened(again, **options) as reader:
            assert bytes(reader.read(1000, 300_000)) == truth[1000:301_000]
        assert rangesrv.requests["GET"] == gets, again
    with opened(f"{rangesrv.url}/data.h5?versionId=8&X-Amz-Signature=ef", **options) as reader:  # another version
        assert bytes(reader.read(1000, 300_000)) == truth[1000:301_000]
    assert rangesrv.requests["GET"] > gets


def _fill(url, folder, queue) -> None:
    try:
        with ObjectReader(url, make_store({"cache_dir": folder, "part_size": 64 << 10})) as reader:
            queue.put(bytes(reader.read(0, reader.size)))
    except BaseException as exc:  # noqa: BLE001 - sent home
        queue.put(repr(exc))


def test_processes_fill_the_cache_at_once(rangesrv, truth, tmp_path) -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    folder = str(tmp_path / "cache")
    fillers = [ctx.Process(target=_fill, args=(f"{rangesrv.url}/data.h5", folder, queue)) for _ in range(3)]
    for p in fillers:
        p.start()
    results = [queue.get(timeout=60) for _ in fillers]
    for p in fillers:
        p.join(10)
    assert all(r == truth for r in results)
    pieces = sorted((tmp_path / "cache").rglob("*.piece"))
    assert len(pieces) == -(-len(truth) // (64 << 10)) and not list((tmp_path / "cache").rglob("*.tmp"))
    assert b"".join(p.read_bytes()[:-4] for p in sorted(pieces, key=lambda p: int(p.stem))) == truth  # less each sum


@pytest.mark.parametrize("how", ["a byte changed", "its last byte changed", "cut short", "grown", "written without a sum"])
def test_a_piece_changed_on_disk_since_it_was_written_is_fetched_again(rangesrv, truth, tmp_path, how) -> None:
    """A bad disk, a program writing into the cache, a crash that kept the rename and lost the bytes: the piece is
    read as missing, fetched again and written anew (NOTE [object cache]); never handed over as the object's bytes."""
    options = {"cache_dir": str(tmp_path / "cache"), "part_size": 64 << 10}
    piece, n = 3 * (64 << 10), 64 << 10
    with opened(f"{rangesrv.url}/data.h5", **options) as reader:
        assert bytes(reader.read(piece, n)) == truth[piece : piece + n]
    (path,) = (tmp_path / "cache").rglob("3.piece")
    good = path.read_bytes()
    bad = {"a byte changed": good[:600] + bytes([good[600] ^ 1]) + good[601:],
           "its last byte changed": good[:-1] + bytes([good[-1] ^ 0x80]), "cut short": good[:-5],
           "grown": good + b"\0", "written without a sum": good[:-4]}[how]
    with open(path, "r+b") as f:  # in place, as a disk or another program would
        f.write(bad)
        f.truncate(len(bad))
    gets = rangesrv.requests["GET"]
    warned = pytest.warns(RuntimeWarning, match=r"cached piece .*3\.piece does not match its CRC-32") \
        if how.endswith("changed") else contextlib.nullcontext()
    with warned, opened(f"{rangesrv.url}/data.h5", **options) as reader:
        assert bytes(reader.read(piece, n)) == truth[piece : piece + n]
    assert rangesrv.requests["GET"] == gets + 1 and path.read_bytes() == good  # fetched again, and written anew
    assert good == truth[piece : piece + n] + zlib.crc32(truth[piece : piece + n]).to_bytes(4, "little")
    with opened(f"{rangesrv.url}/data.h5", **options) as reader:
        assert bytes(reader.read(piece, n)) == truth[piece : piece + n]
    assert rangesrv.requests["GET"] == gets + 1  # and served from the cache again


def test_a_cache_that_cannot_keep_a_piece_leaves_the_read_to_the_server(rangesrv, truth, tmp_path, monkeypatch) -> None:
    import errno

    def full(*args) -> None:  # a full disk, a folder of another user's: what the probe at the start cannot foresee
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskCache, "put", full)
    with pytest.warns(RuntimeWarning, match=r"cache_dir=.*pieces cannot be written there \(No space left on device\)"):
        with opened(f"{rangesrv.url}/data.h5", cache_dir=str(tmp_path), part_size=64 << 10) as reader:
            assert bytes(reader.read(300_000, 200_000)) == truth[300_000:500_000]


def test_the_cache_evicts_the_least_recently_used_beyond_its_size(rangesrv, truth, tmp_path) -> None:
    folder = tmp_path / "cache"
    options = {"cache_dir": str(folder), "part_size": 64 << 10, "cache_size": 4 * (64 << 10)}
    with opened(f"{rangesrv.url}/data.h5", **options) as reader:
        for i in range(8):  # eight pieces, one at a time: the first ones go
            assert bytes(reader.read(i * (64 << 10), 10)) == truth[i * (64 << 10) : i * (64 << 10) + 10]
            time.sleep(0.01)
    kept = sorted(int(p.stem) for p in folder.rglob("*.piece"))
    assert sum(p.stat().st_size for p in folder.rglob("*.piece")) <= 4 * (64 << 10)
    assert kept and kept[-1] == 7 and 0 not in kept
    assert evict(str(folder), 64 << 10) <= 64 << 10
    assert DiskCache.key("u", "1:e::", 2) != DiskCache.key("u", "1:f::", 2)


# -- what a local-files user pays, and how objects are planned ------------------------------------------------------


def test_importing_the_library_imports_no_object_client_nor_reading_library() -> None:
    """Every spawned reader, DataLoader worker and command line imports the package: it pays for no HTTP client, TLS,
    XML, botocore (NOTE [objects on demand] in ``_io.objects``) nor a reading library before a file asks for one."""
    import subprocess
    import sys

    absent = ("botocore", "boto3", "ssl", "http.client", "email", "xml.etree", "h5py", "tables", "torch")
    code = f"import sys, multitables; print(sorted(m for m in {absent!r} if m in sys.modules))"
    found = subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True)
    assert found.stdout.strip() == "[]", f"import multitables imports {found.stdout.strip()}"


def test_a_fork_server_started_once_objects_were_read_preloads_the_object_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client is imported where a URL is read (NOTE [objects on demand] in ``_io.objects``): a fork server started
    after that imports it once, not each reader it forks."""
    import importlib
    import multiprocessing
    from multiprocessing import forkserver

    from multitables._procs.pool import preload_in_forkserver

    importlib.import_module("multitables._io.objects.fileobj")  # as looking at an object does
    monkeypatch.setattr(forkserver._forkserver, "_preload_modules", ["__main__"])
    preload_in_forkserver(multiprocessing.get_context("forkserver"))
    assert "multitables._io.objects.fileobj" in forkserver._forkserver._preload_modules


def test_an_object_is_read_in_larger_blocks_by_more_readers() -> None:
    from multitables._plan.readers import REMOTE_BLOCK_BYTES, DatasetShape, Machine, plan_stream

    machine = Machine(2, "fork")
    local = DatasetShape(1 << 20, 1024, 64, (1,))
    remote = DatasetShape(1 << 20, 1024, 64, (1,), remote=True)
    a, b = plan_stream(local, "chunks", machine), plan_stream(remote, "chunks", machine)
    assert (a.n_procs, a.block_size * 1024) == (2, 4 << 20)
    assert (b.n_procs, b.block_size * 1024) == (8, REMOTE_BLOCK_BYTES)  # REMOTE_MIN_READERS, within 4 per CPU
    one_cpu = plan_stream(remote, "chunks", Machine(1, "fork"))
    assert (one_cpu.n_procs, one_cpu.read_ahead) == (4, 6)
    assert plan_stream(DatasetShape(1000, 1024, 64, (1,), remote=True), "chunks", machine).n_procs == 0
