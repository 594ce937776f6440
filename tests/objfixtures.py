"""Fixtures of the object-storage tests: S3 (moto's server, a fault proxy in front of it) and a byte-range HTTP server,
all on 127.0.0.1, and HDF5 files in both. Imported by ``conftest.py``.

No test reaches any address but the loopback: every ``AWS_*`` variable of the
user is removed, the profile files point nowhere and the instance-metadata
lookup is off (:func:`aws_env`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from objservers import FaultProxy, RangeServer

BUCKET = "mt-test"
AKID = "AKIDTESTONLY0001"
SECRET = "test-secret-Zq8vX2pL9"
TOKEN = "test-session-token-Yh3kW7"
#: Rows of the test arrays (float32, 16 per row): about 1.3 MB, 160 chunks of 512 rows.
ROWS = 20_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS setting of the user's, no profile files, no instance metadata."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def _arrays() -> "dict[str, np.ndarray]":
    rng = np.random.default_rng(31)
    x = rng.standard_normal((ROWS, 16)).astype("f4").round(2)
    return {"x": x, "y": np.arange(ROWS, dtype="i8")}  # /y is the row's number: a batch's /x rows are x[y]


@pytest.fixture(scope="session")
def obj_files(tmp_path_factory: pytest.TempPathFactory) -> "dict[str, Any]":
    """HDF5 files for the buckets: one file (zlib arrays /x and /y, and a Table /t), and 3 shards of /x and /y."""
    import tables

    folder = tmp_path_factory.mktemp("objects")
    arrays = _arrays()
    zlib = tables.Filters(complevel=3, complib="zlib", shuffle=True)
    table = np.zeros(ROWS, [("a", "<i4"), ("b", "<f8")])
    table["a"], table["b"] = np.arange(ROWS), np.arange(ROWS) * 0.5
    with tables.open_file(folder / "data.h5", "w") as f:
        f.create_carray("/", "x", obj=arrays["x"], filters=zlib, chunkshape=(512, 16))
        f.create_carray("/", "y", obj=arrays["y"], filters=zlib, chunkshape=(2048,))
        f.create_table("/", "t", table, filters=zlib, chunkshape=(1024,))
        f.create_carray("/", "b", obj=arrays["x"], filters=tables.Filters(5, "blosc:lz4"), chunkshape=(512, 16))
    cuts = [0, 7_000, 12_000, ROWS]
    for i in range(3):
        with tables.open_file(folder / f"shard-{i}.h5", "w") as f:
            for name in ("x", "y"):
                part = arrays[name][cuts[i] : cuts[i + 1]]
                f.create_carray("/", name, obj=part, filters=zlib, chunkshape=(512,) + part.shape[1:])
    (folder / "not-hdf5.h5").write_bytes(b"just some bytes, not HDF5" * 100)
    (folder / "empty.h5").write_bytes(b"")
    return {"folder": folder, "x": arrays["x"], "y": arrays["y"], "t": table}


@pytest.fixture(scope="session")
def moto_url(obj_files: "dict[str, Any]") -> Iterator[str]:
    """moto's S3 server on 127.0.0.1, with the bucket and its objects: ``data.h5``, ``shards/shard-{0,1,2}.h5``,
    ``not-hdf5.h5``, ``empty.h5``, ``public/data.h5`` (readable anonymously)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    s3 = boto3_client(url)
    s3.create_bucket(Bucket=BUCKET)
    folder = obj_files["folder"]
    s3.upload_file(str(folder / "data.h5"), BUCKET, "data.h5")
    s3.upload_file(str(folder / "not-hdf5.h5"), BUCKET, "not-hdf5.h5")
    s3.upload_file(str(folder / "empty.h5"), BUCKET, "empty.h5")
    for i in range(3):
        s3.upload_file(str(folder / f"shard-{i}.h5"), BUCKET, f"shards/shard-{i}.h5")
    s3.upload_file(str(folder / "shard-0.h5"), BUCKET, "shards/old/shard-9.h5")  # not matched by shards/shard-*.h5
    s3.put_object(Bucket=BUCKET, Key="public/data.h5", Body=(folder / "data.h5").read_bytes(), ACL="public-read")
    yield url
    server.stop()


def boto3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=AKID, aws_secret_access_key=SECRET,
                        region_name="us-east-1")


@pytest.fixture
def s3(moto_url: str) -> Any:
    """A boto3 client of the test bucket's server (to change objects under a stream)."""
    return boto3_client(moto_url)


def s3_options(endpoint: str, **more: Any) -> "dict[str, Any]":
    """``storage_options`` for the test server: its endpoint, the test credentials, fast retries."""
    return {"endpoint_url": endpoint, "key": AKID, "secret": SECRET, "region": "us-east-1",
            "backoff_base": 0.01, "backoff_max": 0.05, **more}


@pytest.fixture(scope="session")
def _proxy(moto_url: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_url) as proxy:
        yield proxy


@pytest.fixture
def proxy(_proxy: FaultProxy) -> Iterator[FaultProxy]:
    """A fault proxy in front of moto, with no faults queued and its counts at zero."""
    _proxy.clear()
    yield _proxy
    _proxy.clear()


@pytest.fixture(scope="session")
def _rangesrv(obj_files: "dict[str, Any]") -> Iterator[RangeServer]:
    with RangeServer(str(obj_files["folder"])) as server:
        server.root = obj_files["folder"]
        yield server


@pytest.fixture
def rangesrv(_rangesrv: RangeServer) -> Iterator[RangeServer]:
    """The byte-range HTTP server of the test files (``/data.h5``, ``/shard-0.h5``...), counts at zero, no faults."""
    _rangesrv.clear_faults()
    _rangesrv.clear_counts()
    yield _rangesrv
    _rangesrv.clear_faults()
