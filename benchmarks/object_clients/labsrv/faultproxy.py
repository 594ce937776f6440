"""A tiny HTTP/1.1 proxy on 127.0.0.1 in front of one upstream (moto), injecting faults into GETs.

``with FaultProxy("http://127.0.0.1:<moto>") as p: p.url`` forwards every
request (method, path, query and headers as they are, so signatures stay
valid) and copies the answer back. :meth:`inject` queues faults for the next
GETs: ``"503"`` (S3 SlowDown), ``"429"``, ``"500"``, ``"reset"`` (the answer's
headers and a third of its body, then a TCP RST), ``"short"`` (a third of the
body, then close), ``("stall", s)`` (wait ``s`` seconds before answering),
``("call", fn)`` (run ``fn()`` before forwarding: e.g. overwrite the object).
``drop_if_match=True`` strips ``If-Match`` on the way (a server that ignores it).
Headers of every request are recorded in ``headers_seen``.
"""

from __future__ import annotations

import collections
import http.client
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *a) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_HEAD(self) -> None:
        self._forward()

    def do_GET(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def _forward(self) -> None:
        srv = self.server
        with srv.lock:
            srv.headers_seen.append(dict(self.headers))
            srv.requests[self.command] += 1
            fault = srv.faults.popleft() if (self.command == "GET" and srv.faults) else None
        if isinstance(fault, tuple):
            if fault[0] == "stall":
                time.sleep(fault[1])
            elif fault[0] == "call":
                fault[1]()
            fault = None
        if fault in ("503", "429", "500"):
            code = {"503": "SlowDown", "429": "TooManyRequests", "500": "InternalError"}[fault]
            body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
            self.send_response(int(fault))
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        if srv.drop_if_match:
            headers = {k: v for k, v in headers.items() if k.lower() != "if-match"}
        length = int(self.headers.get("Content-Length", "0") or 0)
        body = self.rfile.read(length) if length else None
        up = http.client.HTTPConnection(srv.upstream.hostname, srv.upstream.port, timeout=60)
        try:
            up.request(self.command, self.path, body=body, headers=headers)
            resp = up.getresponse()
            data = resp.read()
        finally:
            up.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP and k.lower() != "content-length":
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault in ("reset", "short") and len(data) > 1:
            self.wfile.write(data[: max(1, len(data) // 3)])
            self.wfile.flush()
            if fault == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address) -> None:
        import sys
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client hanging up is normal
            super().handle_error(request, client_address)


class FaultProxy:
    def __init__(self, upstream: str, drop_if_match: bool = False) -> None:
        self._srv = _Server(("127.0.0.1", 0), _Handler)
        self._srv.upstream = urlsplit(upstream)
        self._srv.lock = threading.Lock()
        self._srv.faults = collections.deque()
        self._srv.requests = collections.Counter()
        self._srv.headers_seen = collections.deque(maxlen=2000)
        self._srv.drop_if_match = drop_if_match
        self.port = self._srv.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)

    @property
    def drop_if_match(self) -> bool:
        return self._srv.drop_if_match

    @drop_if_match.setter
    def drop_if_match(self, v: bool) -> None:
        self._srv.drop_if_match = v

    def inject(self, *faults) -> None:
        with self._srv.lock:
            self._srv.faults.extend(faults)

    def clear(self) -> None:
        with self._srv.lock:
            self._srv.faults.clear()
            self._srv.requests.clear()
            self._srv.headers_seen.clear()
        self._srv.drop_if_match = False

    @property
    def pending(self) -> int:
        return len(self._srv.faults)

    @property
    def requests(self) -> collections.Counter:
        return self._srv.requests

    @property
    def headers_seen(self):
        return self._srv.headers_seen

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
