"""Start the lab's servers as processes on 127.0.0.1: moto's S3 server and the sendfile range server."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The tests' byte-range server, run as a program: one server for the tests, the object benchmark and this harness.
OBJSERVERS = os.path.join(HERE, "..", "..", "tests", "objservers.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, popen: subprocess.Popen, url: str) -> None:
        self.popen = popen
        self.url = url
        self.pid = popen.pid

    def cpu_seconds(self) -> float:
        """user + system CPU of the server process so far (from /proc)."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start_moto(port: "int | None" = None) -> Proc:
    port = port or free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    p = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).read()
            return Proc(p, url)
        except Exception:
            if p.poll() is not None:
                raise RuntimeError("moto_server exited")
            time.sleep(0.2)
    p.kill()
    raise RuntimeError("moto_server did not start")


def self_signed_cert(directory: str) -> "tuple[str, str, str]":
    """A throwaway CA and a certificate for 127.0.0.1 signed by it (openssl CLI): (cert.pem, key.pem, ca.pem).

    (rustls refuses a self-signed certificate used as its own CA: CaUsedAsEndEntity.)
    """
    j = functools.partial(os.path.join, directory)
    run = functools.partial(subprocess.run, check=True, capture_output=True)
    run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", j("ca.key"), "-out", j("ca.pem"),
         "-days", "1", "-subj", "/CN=s3lab test CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", j("key.pem"), "-out", j("leaf.csr"),
         "-subj", "/CN=127.0.0.1"])
    with open(j("ext.cnf"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    run(["openssl", "x509", "-req", "-in", j("leaf.csr"), "-CA", j("ca.pem"), "-CAkey", j("ca.key"),
         "-CAcreateserial", "-out", j("cert.pem"), "-days", "1", "-extfile", j("ext.cnf")])
    return j("cert.pem"), j("key.pem"), j("ca.pem")


def start_rangeserver(root: str, latency: float = 0.0, tls: "tuple | None" = None) -> Proc:
    env = dict(os.environ, PYTHONPATH=HERE)
    cmd = [sys.executable, OBJSERVERS, "--root", root, "--latency", str(latency)]
    if tls:
        cmd += ["--tls-cert", tls[0], "--tls-key", tls[1]]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
    line = p.stdout.readline().split()
    if not line or line[0] != "READY":
        p.kill()
        raise RuntimeError("range server did not start")
    return Proc(p, f"{'https' if tls else 'http'}://127.0.0.1:{line[1]}")
