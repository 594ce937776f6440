"""Every access mode over objects: S3 (moto's server on 127.0.0.1, a fault proxy in front of it) and HTTP (a byte-range
server): exact rows, sets by pattern, batches with resume, the torch adapter, random access, an object changed under a
stream, retries, clear refusals before any reader starts, no secret anywhere, spawned readers, the local cache."""

from __future__ import annotations

import json
import logging
import pickle
import re

import numpy as np
import pytest

import multitables
from multitables.errors import FileChangedError, NodeTypeError, NotHDF5Error
from objfixtures import BUCKET, SECRET, TOKEN, s3_options

pytestmark = pytest.mark.usefixtures("aws_env")
DATA = f"s3://{BUCKET}/data.h5"


def read_queue(stream: multitables.Streamer, path: str, **kwargs) -> "tuple[np.ndarray, str]":
    """Every row of ``path`` through a queue, in order, remainder included; and the engine that read them."""
    with stream.get_queue(path, ordered=True, remainder=True, **kwargs) as queue:
        blocks = []
        for guard in queue.iter():
            with guard as block:
                blocks.append(block.copy())
        return np.concatenate(blocks), queue.engine


@pytest.fixture(params=["s3", "http"])
def where(request, moto_url, rangesrv) -> "tuple[str, dict]":
    """The test file's URL and storage options: in the S3 bucket, or on the HTTP server."""
    if request.param == "s3":
        return DATA, s3_options(moto_url)
    return f"{rangesrv.url}/data.h5", {"backoff_base": 0.01}


def test_every_mode_reads_exact_rows(where, obj_files, no_leaks) -> None:
    url, options = where
    x, t = obj_files["x"], obj_files["t"]
    stream = multitables.Streamer(url, storage_options=options)
    got, engine = read_queue(stream, "/x", n_procs=2, block_size=1536)
    assert engine == "chunks" and np.array_equal(got, x)
    assert np.array_equal(np.array(list(stream.get_generator("/y", n_procs=1))), obj_files["y"])
    assert np.array_equal(np.array(list(stream.get_generator("/t", n_procs=0, field="b"))), t["b"])
    got, engine = read_queue(stream, "/b", n_procs=1)  # blosc: auto takes the chunk engine for an object
    assert engine == "chunks" and np.array_equal(got, x)
    got, engine = read_queue(multitables.Streamer(url, engine="h5py", storage_options=options), "/x", n_procs=1)
    assert engine == "h5py" and np.array_equal(got, x)  # through a file object over the ranges
    assert np.array_equal(stream.get_remainder("/x", 3000), x[18_000:])


def test_a_set_named_by_an_s3_pattern(moto_url, obj_files, no_leaks) -> None:
    stream = multitables.Streamer(f"s3://{BUCKET}/shards/shard-*.h5", storage_options=s3_options(moto_url))
    assert stream.filename == tuple(f"s3://{BUCKET}/shards/shard-{i}.h5" for i in range(3))
    got, engine = read_queue(stream, "/x", n_procs=2, block_size=1024)
    assert engine == "chunks" and np.array_equal(got, obj_files["x"])
    for pattern in ("shards/shard-?.h5", "shards/shard-[0-2].h5"):  # every glob character the docs name
        named = multitables.Streamer(f"s3://{BUCKET}/{pattern}", storage_options=s3_options(moto_url)).filename
        assert named == stream.filename


def test_batches_over_s3_shards_shuffle_shard_mix_and_resume(moto_url, obj_files, no_leaks) -> None:
    options = s3_options(moto_url, token=TOKEN)
    stream = multitables.Streamer(f"s3://{BUCKET}/shards/shard-*.h5", storage_options=options)
    kwargs = dict(batch_size=1000, shuffle=True, seed=3, world_size=2, n_procs=1, block_size=512)
    ys = []
    for rank in (0, 1):
        for x, y in stream.get_batches(["/x", "/y"], rank=rank, **kwargs):
            assert np.array_equal(x, obj_files["x"][y])  # aligned
            ys.append(y)
    assert sorted(np.concatenate(ys).tolist()) == sorted(obj_files["y"].tolist())
    batches = stream.get_batches(["/x", "/y"], rank=0, **kwargs)
    it = iter(batches)
    seen = [next(it)[1].copy() for _ in range(3)]
    state = json.loads(json.dumps(batches.state_dict()))
    rest = [y.copy() for _x, y in it]
    for secret in (SECRET, TOKEN):
        assert secret not in json.dumps(state)
    again = multitables.Streamer(f"s3://{BUCKET}/shards/shard-*.h5", storage_options=options)
    resumed = again.get_batches(["/x", "/y"], rank=0, **kwargs)
    resumed.load_state_dict(state)
    assert [y.tolist() for _x, y in resumed] == [y.tolist() for y in rest] and len(seen) == 3
    mixed = multitables.mix_batches([stream.get_batches("/y", batch_size=500, n_procs=0),
                                     multitables.Streamer(DATA, storage_options=options).get_batches("/y", batch_size=500, n_procs=0)],
                                    [0.5, 0.5], seed=1, steps=6)
    assert [len(b) for b in mixed] == [500] * 6


def test_the_torch_adapter_over_s3(moto_url, obj_files, no_leaks) -> None:
    torch = pytest.importorskip("torch")
    import multitables.torch as mtt

    stream = multitables.Streamer(DATA, storage_options=s3_options(moto_url))
    ys = [y for _x, y in mtt.get_batches(stream, ["/x", "/y"], 4096, n_procs=1, shuffle=True, seed=2)]
    assert isinstance(ys[0], torch.Tensor)
    assert sorted(torch.cat(ys).tolist()) == sorted(obj_files["y"].tolist())


def test_a_reader_over_s3(moto_url, obj_files, no_leaks) -> None:
    x, t = obj_files["x"], obj_files["t"]
    with multitables.Reader(DATA, n_procs=2, storage_options=s3_options(moto_url)) as reader:
        ds = reader.get_dataset("/x")
        keys = np.array([19_999, 3, 512, 513, 7_000, 0])
        with ds.create_stage(len(keys)) as stage:
            assert np.array_equal(reader.request(ds[np.sort(keys)], stage).get(), x[np.sort(keys)])
        table = reader.get_dataset("/t")
        with table.create_stage(64) as stage:
            assert np.array_equal(reader.request(table["a"][30:35], stage).get(), t["a"][30:35])
        with pytest.raises(ValueError, match="PyTables reads local files only"):
            table.where("a > 3")
    with multitables.Reader(f"s3://{BUCKET}/shards/shard-*.h5", n_procs=1, storage_options=s3_options(moto_url)) as reader:
        ds = reader.get_dataset("/x")
        with ds.create_stage(3) as stage:
            assert np.array_equal(reader.request(ds[6_999:7_002], stage).get(), x[6_999:7_002])


def test_a_set_that_names_an_object_twice_reads_it_twice_as_a_local_file(proxy, rangesrv, obj_files, no_leaks) -> None:
    """A set may name a file twice: its rows come twice, for a local file and an object alike. Its objects are looked
    at together, one look per name in the set: the second look at a repeated object was dropped unclosed, and the
    connections to its server were kept open for it ever after (moto's own server closes each; the proxy in front of
    it and the HTTP server keep them alive)."""
    x, folder = obj_files["x"], obj_files["folder"]
    want = np.concatenate([x[:7_000], x[7_000:12_000], x[:7_000]])
    s3, http = f"s3://{BUCKET}/shards/shard-", f"{rangesrv.url}/shard-"
    for where, options in ((f"{folder}/shard-", None), (s3, s3_options(proxy.url)), (http, {"backoff_base": 0.01})):
        names = [f"{where}0.h5", f"{where}1.h5", f"{where}0.h5"]
        got, _engine = read_queue(multitables.Streamer(names, storage_options=options), "/x", n_procs=1, block_size=2048)
        assert np.array_equal(got, want)
        keys = [6_999, 7_000, 12_000, 18_999]  # either side of each file's end
        with multitables.Reader(names, n_procs=1, storage_options=options) as reader:
            ds = reader.get_dataset("/x")
            with ds.create_stage(len(keys)) as stage:
                assert np.array_equal(reader.request(ds[keys], stage).get(), want[keys])


@pytest.mark.parametrize("engine", ["chunks", "h5py"])
def test_an_object_changed_mid_stream_is_a_file_changed_error(moto_url, s3, obj_files, engine, no_leaks) -> None:
    body = (obj_files["folder"] / "data.h5").read_bytes()
    key = f"changing-{engine}.h5"
    s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    stream = multitables.Streamer(f"s3://{BUCKET}/{key}", engine=engine, storage_options=s3_options(moto_url))
    with pytest.raises(FileChangedError, match=rf"s3://{BUCKET}/{key} changed while it was being read") as caught:
        with stream.get_queue("/x", n_procs=1, block_size=512, read_ahead=2, ordered=True) as queue:
            for k, guard in enumerate(queue.iter()):
                with guard as block:
                    assert np.array_equal(block, obj_files["x"][512 * k : 512 * (k + 1)])  # never a mixed row
                if k == 1:
                    s3.put_object(Bucket=BUCKET, Key=key, Body=body[:-10] + b"0123456789")
    assert isinstance(caught.value, multitables.ReaderError)


def test_retries_during_a_stream_keep_the_rows_exact(proxy, obj_files, no_leaks) -> None:
    stream = multitables.Streamer(DATA, storage_options=s3_options(proxy.url, part_size=128 << 10))
    proxy.inject("503", "reset", "429", "short", "500", ("stall", 0.2), "503")
    got, _engine = read_queue(stream, "/x", n_procs=2, block_size=2048)
    assert np.array_equal(got, obj_files["x"]) and proxy.pending == 0


def test_bad_urls_missing_objects_and_credentials_fail_before_any_reader(moto_url, rangesrv, no_leaks) -> None:
    options = s3_options(moto_url)
    with pytest.raises(ValueError, match="names a bucket and an object"):
        multitables.Streamer(f"s3://{BUCKET}", storage_options=options)
    with pytest.raises(FileNotFoundError, match="No object matches"):
        multitables.Streamer(f"s3://{BUCKET}/shards/none-*.h5", storage_options=options)
    with pytest.raises(FileNotFoundError, match=f"s3://{BUCKET}/missing.h5: HTTP 404"):
        multitables.Streamer(f"s3://{BUCKET}/missing.h5", storage_options=options).get_queue("/x")
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        multitables.Streamer(f"{rangesrv.url}/missing.h5").get_generator("/x")
    with pytest.raises(NotHDF5Error, match="is not an HDF5 file"):
        multitables.Streamer(f"s3://{BUCKET}/not-hdf5.h5", storage_options=options).get_queue("/x")
    for empty in (f"s3://{BUCKET}/empty.h5", f"{rangesrv.url}/empty.h5"):  # a range of it is refused (416), unversioned
        with pytest.raises(NotHDF5Error, match="empty.h5' is not an HDF5 file"):
            multitables.Streamer(empty, storage_options=options if empty.startswith("s3") else None).get_queue("/x")
    whole = (rangesrv.root / "data.h5").read_bytes()
    (rangesrv.root / "cut.h5").write_bytes(whole[: len(whole) // 2])  # a download that did not finish
    try:
        with pytest.raises(OSError, match="cut.h5' is cut short"):
            multitables.Streamer(f"{rangesrv.url}/cut.h5").get_queue("/x")
    finally:
        (rangesrv.root / "cut.h5").unlink()
    with pytest.raises(ValueError, match="no AWS credentials found"):
        multitables.Streamer(DATA, storage_options={"endpoint_url": moto_url}).get_queue("/x")
    with pytest.raises(KeyError, match="no node '/nope'"):
        multitables.Streamer(DATA, storage_options=options).get_queue("/nope")
    with pytest.raises(NodeTypeError, match="PyTables reads local files only"):
        multitables.Streamer(DATA, engine="tables", storage_options=options).get_queue("/x")
    # PyTables open options select PyTables, which reads no URL: the error names what reads it, without them (the
    # engines that take no such option, whatever their own check of a URL says, are not what reads it with them).
    for front in (lambda: multitables.Streamer(f"{rangesrv.url}/data.h5", DRIVER="H5FD_CORE").get_queue("/x"),
                  lambda: multitables.Reader(f"{rangesrv.url}/data.h5", n_procs=1, DRIVER="H5FD_CORE").get_dataset("/x")):
        with pytest.raises(NodeTypeError, match=re.escape("engine='chunks' (or 'auto') reads it without the open options ['DRIVER']")):
            front()
    with pytest.raises(ValueError, match="cache='direct' reads local files"):
        multitables.Streamer(DATA, cache="direct", storage_options=options)
    with pytest.raises(FileNotFoundError):
        multitables.Reader(f"s3://{BUCKET}/missing.h5", storage_options=options)
    with pytest.raises(TypeError, match="unknown storage option"):
        multitables.Streamer(DATA, storage_options={"endpoint": moto_url, "secret_key": "x"})


def test_h5py_open_options_on_a_url_are_used_or_refused_naming_it(rangesrv, obj_files, no_leaks) -> None:
    """Through a file object h5py hands keywords it does not name to no driver: a typo (or PyTables' DRIVER=) changed
    nothing without a word, and swmr=True failed with h5py's bare OSError, naming no URL. Both are refused before any
    reader, naming the object; an option h5py takes is used."""
    url = f"{rangesrv.url}/data.h5"

    def request(**kw) -> None:
        with multitables.Reader(url, engine="h5py", n_procs=1, **kw) as reader:
            reader.get_dataset("/x")

    for front in (lambda **kw: multitables.Streamer(url, engine="h5py", **kw).get_queue("/x", n_procs=1), request):
        with pytest.raises(TypeError, match=re.escape(f"h5py takes no open options ['DRIVER', 'rdcc_nbyte'] for "
                                                      f"{url!r}: an object is read through a file object")):
            front(DRIVER="H5FD_CORE", rdcc_nbyte=0)
        with pytest.raises(OSError, match=re.escape(f"h5py refuses the open options ['swmr'] for {url!r}") + ".*SWMR"):
            front(swmr=True)
    got, engine = read_queue(multitables.Streamer(url, engine="h5py", rdcc_nbytes=1 << 20), "/x", n_procs=1)
    assert engine == "h5py" and np.array_equal(got, obj_files["x"])


def test_listings_name_themselves_and_refuse_keys_a_url_cannot_name(moto_url, s3, obj_files, no_leaks) -> None:
    options = s3_options(moto_url)
    with pytest.raises(multitables.ObjectStorageError, match=r"listing s3://nobucket/x\*: HTTP 404 NoSuchBucket: no such bucket"):
        multitables.Streamer("s3://nobucket/x*.h5", storage_options=options)
    body = (obj_files["folder"] / "data.h5").read_bytes()
    for key in ("qm/a.h5", "qm/b?c.h5"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    with pytest.raises(ValueError, match=r"keys an s3:// URL cannot name .*'qm/b\?c.h5'"):  # not a read of 'qm/b'
        multitables.Streamer(f"s3://{BUCKET}/qm/*.h5", storage_options=options)
    np.testing.assert_array_equal(read_queue(multitables.Streamer(f"s3://{BUCKET}/qm/a*.h5", storage_options=options),
                                             "/y")[0], obj_files["y"])


def test_a_presigned_urls_signature_is_in_no_repr(rangesrv, obj_files, no_leaks) -> None:
    stream = multitables.Streamer(f"{rangesrv.url}/data.h5?X-Amz-Credential=AKID0&X-Amz-Signature=SIG0123456789")
    for text in (repr(stream.options), str(stream.options), repr(stream)):
        assert "SIG0123456789" not in text and "AKID0" not in text
    assert "data.h5?..." in repr(stream.options)


def test_an_external_link_out_of_an_object_is_refused(rangesrv, obj_files, no_leaks) -> None:
    import h5py

    with h5py.File(obj_files["folder"] / "linked-out.h5", "w") as f:  # to a local file, which HDF5 would open
        f["x"] = h5py.ExternalLink(str(obj_files["folder"] / "data.h5"), "/x")
    with pytest.raises(NodeTypeError, match="'/x' in .*linked-out.h5' is an external link to .*data.h5'"):
        multitables.Streamer(f"{rangesrv.url}/linked-out.h5").get_queue("/x")


def test_no_secret_in_errors_reprs_pickles_state_or_logs(proxy, s3, obj_files, caplog, no_leaks) -> None:
    caplog.set_level(logging.DEBUG, logger="multitables")
    options = s3_options(proxy.url, token=TOKEN)
    stream = multitables.Streamer(DATA, storage_options=options)
    texts = [repr(stream.options), str(stream.options), repr(pickle.loads(pickle.dumps(stream)).options)]
    blobs = [pickle.dumps(stream)]
    proxy.inject("503", "503")
    got, _engine = read_queue(stream, "/y", n_procs=0)
    batches = stream.get_batches(["/x", "/y"], batch_size=4000, n_procs=0)
    assert len(list(batches)) == 5
    texts.append(json.dumps(batches.state_dict()))
    blobs.append(pickle.dumps(batches.state_dict()))
    batches.close()
    for bad in (f"s3://{BUCKET}/missing.h5", f"s3://{BUCKET}/not-hdf5.h5"):
        with pytest.raises(Exception) as caught:
            multitables.Streamer(bad, storage_options=options).get_queue("/x")
        texts += [str(caught.value), repr(caught.value)]
    body = (obj_files["folder"] / "data.h5").read_bytes()
    s3.put_object(Bucket=BUCKET, Key="secret-check.h5", Body=body)
    changing = multitables.Streamer(f"s3://{BUCKET}/secret-check.h5", storage_options=options)
    with pytest.raises(FileChangedError) as caught:
        with changing.get_queue("/x", n_procs=1, block_size=512, read_ahead=2) as queue:
            for k, guard in enumerate(queue.iter()):
                guard.release()
                if k == 0:
                    s3.put_object(Bucket=BUCKET, Key="secret-check.h5", Body=body[::-1])
    texts += [str(caught.value), repr(caught.value), getattr(caught.value, "traceback", "") or ""]
    texts += [record.getMessage() for record in caplog.records]
    assert any("attempt 2 of" in record.getMessage() for record in caplog.records)  # the retries were logged
    joined = "\n".join(texts)
    for secret in (SECRET, TOKEN):
        assert secret not in joined
        assert all(secret.encode() not in blob for blob in blobs)
    assert np.array_equal(got, obj_files["y"])


def test_spawned_readers_get_the_credentials_given_in_storage_options(moto_url, obj_files, no_leaks) -> None:
    stream = multitables.Streamer(DATA, start_method="spawn", storage_options=s3_options(moto_url, token=TOKEN))
    with stream.get_queue("/x", n_procs=2, block_size=4096, ordered=True) as queue:
        assert queue.n_procs == 2 and queue.engine == "chunks"
        blocks = []
        for guard in queue.iter():
            with guard as block:
                blocks.append(block.copy())
    assert np.array_equal(np.concatenate(blocks), obj_files["x"][: 4 * 4096])


def test_the_cache_leaves_the_second_epoch_without_a_request(rangesrv, obj_files, tmp_path, no_leaks) -> None:
    options = {"cache_dir": str(tmp_path / "cache"), "part_size": 256 << 10}
    stream = multitables.Streamer(f"{rangesrv.url}/data.h5", storage_options=options)
    batches = stream.get_batches(["/x", "/y"], batch_size=2000, shuffle=True, seed=4, n_procs=1)
    batches.set_epoch(0)
    first = [y.copy() for _x, y in batches]
    gets, sent = rangesrv.requests["GET"], rangesrv.bytes_sent
    assert gets > 0
    batches.set_epoch(1)
    second = [y.copy() for _x, y in batches]
    assert (rangesrv.requests["GET"], rangesrv.bytes_sent) == (gets, sent)  # epoch 2: every byte from the cache
    assert sorted(np.concatenate(second).tolist()) == sorted(np.concatenate(first).tolist())


def test_a_chunk_index_of_many_leaves_is_read_once_whatever_the_readers(rangesrv, obj_files, no_leaks) -> None:
    import collections

    import h5py

    from multitables._io.chunks.btree import NODE_READ

    # Chunks of 4 KiB stored as they are, some 6,000 in about a hundred leaves, each leaf tens of KiB from the next
    # (so each is a GET of its own); blocks of 128 chunks (GETs of 512 KiB).
    rows = np.arange(3_000_000, dtype="<f8")
    with h5py.File(obj_files["folder"] / "leaves.h5", "w") as f:
        f.create_dataset("x", data=rows, chunks=(512,))
    seen = len(rangesrv.headers_seen)
    stream = multitables.Streamer(f"{rangesrv.url}/leaves.h5")
    got, engine = read_queue(stream, "/x", n_procs=3, block_size=65536)
    assert engine == "chunks" and np.array_equal(got, rows)
    ranges = [h.get("Range", "") for h in list(rangesrv.headers_seen)[seen:]]
    spans = [tuple(int(v) for v in r[len("bytes="):].split("-")) for r in ranges if r.startswith("bytes=")]
    nodes = collections.Counter((a, b) for a, b in spans if b - a + 1 == NODE_READ)
    assert len(nodes) > 64  # more leaves than were read at open before (64)
    assert max(nodes.values()) == 1  # each read once, in the consumer, not by each reader as its rows reach it
