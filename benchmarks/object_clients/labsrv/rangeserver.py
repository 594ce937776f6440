"""A small, fast HTTP/1.1 server of byte ranges on 127.0.0.1, path-style S3 GET/HEAD compatible enough.

* ``GET``/``HEAD /<path>`` serve ``<root>/<path>`` (so ``/bucket/key`` is an S3
  path-style object and ``/file.h5`` a plain HTTP file); one ``Range: bytes=``
  range (``a-b``, ``a-``, ``-n``) answers 206 with ``Content-Range``.
* ``ETag`` (from inode, size and mtime, so an atomic replace changes it),
  ``Last-Modified``, ``Accept-Ranges``; ``If-Match`` answers 412 and
  ``If-None-Match`` 304, as S3 does.
* Bodies go out with ``os.sendfile``: the server costs little CPU, so a client
  measured against it is not capped by a Python server's copies (moto copies
  the whole object for every GET).
* Signatures are not checked (any credentials work; unsigned requests too).
* Faults for tests: :meth:`RangeServer.inject` queues faults applied to the
  next GETs: ``"503"`` (S3 SlowDown XML), ``"429"``, ``"500"``, ``"reset"``
  (headers and part of the body, then a TCP RST), ``"short"`` (a body cut
  short, then close), ``("stall", seconds)`` (wait before answering).

Run as a process: ``python -m labsrv.rangeserver --root DIR --port N`` (prints
``READY <port>``).
"""

from __future__ import annotations

import argparse
import collections
import email.utils
import hashlib
import os
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

S3_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{msg}</Message>'
    "<Resource>{res}</Resource><RequestId>lab</RequestId></Error>"
)


def etag_of(st: os.stat_result) -> str:
    h = hashlib.md5(f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    return f'"{h}"'


def parse_range(header: str, size: int) -> "tuple[int, int] | None | str":
    """(start, stop) for one ``bytes=`` range; None to ignore the header; "416" when unsatisfiable."""
    if not header.startswith("bytes=") or "," in header:
        return None
    a, _, b = header[6:].strip().partition("-")
    try:
        if a == "":
            n = int(b)
            if n == 0:
                return "416"
            return max(0, size - n), size
        start = int(a)
        stop = size if b == "" else min(int(b) + 1, size)
    except ValueError:
        return None
    if start >= size:
        return "416"
    if stop <= start:
        return None
    return start, stop


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without this, Nagle + delayed ACK add 40 ms to small answers
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _error(self, status: int, code: str, msg: str, extra: "dict | None" = None) -> None:
        body = S3_ERROR.format(code=code, msg=msg, res=self.path).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _stats(self) -> None:
        """``GET /__stats``: requests and body bytes so far (not counted itself)."""
        import json
        srv = self.server
        body = json.dumps({"GET": srv.requests["GET"], "HEAD": srv.requests["HEAD"], "bytes": srv.bytes_sent}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self, head: bool) -> None:
        srv = self.server
        if self.path == "/__stats":
            return self._stats()
        with srv.lock:
            srv.requests[self.command] += 1
            srv.headers_seen.append(dict(self.headers))
            fault = srv.faults.popleft() if (not head and srv.faults) else None
        if srv.latency:
            time.sleep(srv.latency)
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        full = os.path.realpath(os.path.join(srv.root, rel))
        if not full.startswith(srv.root + os.sep):
            return self._error(403, "AccessDenied", "outside the root")
        if isinstance(fault, tuple) and fault[0] == "stall":
            time.sleep(fault[1])
            fault = None
        if fault in ("503", "429", "500"):
            code = {"503": "SlowDown", "429": "TooManyRequests", "500": "InternalError"}[fault]
            return self._error(int(fault), code, "injected", {"Retry-After": "0"})
        try:
            fd = os.open(full, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return self._error(404, "NoSuchKey", "The specified key does not exist.")
        try:
            st = os.fstat(fd)
            size = st.st_size
            etag = etag_of(st)
            im = self.headers.get("If-Match")
            if im is not None and im.strip() != "*" and etag not in [t.strip() for t in im.split(",")] \
                    and etag.strip('"') not in [t.strip().strip('"') for t in im.split(",")]:
                return self._error(412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold")
            inm = self.headers.get("If-None-Match")
            if inm is not None and etag.strip('"') in [t.strip().strip('"') for t in inm.split(",")]:
                self.send_response(304)
                self.send_header("ETag", etag)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            rng = self.headers.get("Range")
            span = parse_range(rng, size) if rng else None
            if span == "416":
                return self._error(416, "InvalidRange", "The requested range is not satisfiable",
                                   {"Content-Range": f"bytes */{size}"})
            start, stop = span if span else (0, size)
            n = stop - start
            self.send_response(206 if span else 200)
            self.send_header("Content-Type", "binary/octet-stream")
            self.send_header("Content-Length", str(n))
            self.send_header("ETag", etag)
            self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
            self.send_header("Accept-Ranges", "bytes")
            if span:
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
            self.end_headers()
            if head:
                return
            self.wfile.flush()
            sock = self.connection
            if fault in ("reset", "short"):
                part = max(1, n // 3)
                os.sendfile(sock.fileno(), fd, start, part)
                if fault == "reset":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                return
            with srv.lock:
                srv.bytes_sent += n
            off, left = start, n
            if srv.tls:  # no sendfile through TLS: read and send in 1 MiB pieces
                while left > 0:
                    piece = os.pread(fd, min(left, 1 << 20), off)
                    if not piece:
                        break
                    sock.sendall(piece)
                    off += len(piece)
                    left -= len(piece)
                return
            while left > 0:
                k = os.sendfile(sock.fileno(), fd, off, min(left, 1 << 30))
                if k == 0:
                    break
                off += k
                left -= k
        finally:
            os.close(fd)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        import sys
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client hanging up is normal
            super().handle_error(request, client_address)
    request_queue_size = 128

    def __init__(self, addr, root: str) -> None:
        super().__init__(addr, _Handler)
        self.root = os.path.realpath(root)
        self.lock = threading.Lock()
        self.faults: collections.deque = collections.deque()
        self.requests: collections.Counter = collections.Counter()
        self.headers_seen: collections.deque = collections.deque(maxlen=1000)
        self.latency = 0.0  # seconds added before every answer (an emulated distant bucket)
        self.bytes_sent = 0
        self.tls = False


class RangeServer:
    """The server in a thread of this process (for tests): ``with RangeServer(root) as srv: srv.url``."""

    def __init__(self, root: str, port: int = 0, latency: float = 0.0) -> None:
        self._srv = _Server(("127.0.0.1", port), root)
        self._srv.latency = latency
        self.port = self._srv.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)

    def start(self) -> "RangeServer":
        self._thread.start()
        return self

    def inject(self, *faults) -> None:
        with self._srv.lock:
            self._srv.faults.extend(faults)

    def clear_faults(self) -> None:
        with self._srv.lock:
            self._srv.faults.clear()

    @property
    def requests(self) -> collections.Counter:
        return self._srv.requests

    @property
    def latency(self) -> float:
        return self._srv.latency

    @latency.setter
    def latency(self, v: float) -> None:
        self._srv.latency = v

    @property
    def headers_seen(self):
        return self._srv.headers_seen

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()

    def __enter__(self) -> "RangeServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added before every answer")
    ap.add_argument("--tls-cert", help="serve https with this certificate (PEM) ...")
    ap.add_argument("--tls-key", help="... and this key")
    a = ap.parse_args()
    srv = _Server(("127.0.0.1", a.port), a.root)
    srv.latency = a.latency
    if a.tls_cert:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.tls_cert, a.tls_key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        srv.tls = True
    print("READY", srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
