"""A signal handler's exception in a read of the user's own process (NOTE [a handler's exception] in ``_sys.signals``):
it reaches the user as it was raised, never wrapped as the read's failure nor swallowed by a fall-back; a real decode
failure is still wrapped, with its context.

Deterministic: the handler runs inside the decode step because that step sends the signal itself (Python runs the
handler before the next instruction of the sending frame)."""

from __future__ import annotations

import functools
import inspect
import os
import signal
import sys
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from multitables import Queue, QueueClosed, Reader, ReaderError, Streamer
from multitables._io import h5py_engine, node, tables_engine
from multitables._io.blockread import read_block
from multitables._io.node import inspect_node
from multitables._io.chunks.codecs import libraries
from multitables._io.chunks.codecs.base import ChunkDecodeError, OutCodec
from multitables._io.chunks.codecs.bitshuffle import Bitshuffle
from multitables._io.chunks.codecs.blosc import Blosc
from multitables._io.chunks.codecs.blosc2 import Blosc2
from multitables._io.chunks.codecs.bzip2 import Bzip2
from multitables._io.chunks.codecs.deflate import Deflate
from multitables._plan import readers
from multitables._plan.blocks import BlockPlan
from multitables._shm.ring import Ring
from multitables._stream.backends import SplitBackend
from multitables._sys.signals import raised_by_handler

from test_failures import corrupt_chunk


class Checkpoint(Exception):
    """What the user's handler raises: a scheduler's warning, turned into leaving the loop."""


def _raise(kind: type, signum: int, frame: Any) -> None:
    raise kind(f"signal {signum}")


@pytest.fixture
def handler() -> Iterator[Callable[[type], None]]:
    """``handler(kind)``: SIGUSR1's handler raises ``kind`` (Checkpoint at first); the old handler is put back."""
    old = signal.signal(signal.SIGUSR1, functools.partial(_raise, Checkpoint))
    yield lambda kind: signal.signal(signal.SIGUSR1, functools.partial(_raise, kind)) and None
    signal.signal(signal.SIGUSR1, old)


def signalling(fn: Callable[..., Any], times: int = 1, after: int = 0) -> Callable[..., Any]:
    """``fn``, whose ``times`` calls after the first ``after`` send SIGUSR1 to this process first: its handler runs in
    that call."""
    calls = [0]

    def call(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if after < calls[0] <= after + times:
            os.kill(os.getpid(), signal.SIGUSR1)
        return fn(*args, **kwargs)

    return call


def _caught(fn: Callable[[], Any]) -> BaseException:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("nothing raised")


def test_a_handlers_exception_is_known_in_any_form_of_handler(handler: Callable[[type], None]) -> None:
    class Handler:
        def __call__(self, signum: int, frame: Any) -> None:
            raise Checkpoint

        def method(self, signum: int, frame: Any) -> None:
            self(signum, frame)  # raised a frame below the handler's

    for form in (Handler(), Handler().method, functools.partial(_raise, Checkpoint), lambda s, f: _raise(Checkpoint, s, f)):
        signal.signal(signal.SIGUSR1, form)
        assert raised_by_handler(_caught(signalling(lambda: None)))
    assert not raised_by_handler(_caught(lambda: _raise(Checkpoint, 0, None)))  # the same code, not run as a handler
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    exc = _caught(lambda: _raise(Checkpoint, 0, None))
    assert not raised_by_handler(exc)
    seen: list[bool] = []
    thread = threading.Thread(target=lambda: seen.append(raised_by_handler(exc)))  # handlers run in the main thread only
    thread.start()
    thread.join()
    assert seen == [False]


def _cases() -> Iterator[Any]:
    """Each codec that wraps its library's errors, the attribute holding that library's call, and bytes it rejects."""
    header = bytes([2, 1, 1, 4]) + (64).to_bytes(4, "little") + bytes(24)  # a blosc header of 64 bytes, then garbage
    bitshuffle = Bitshuffle((0, 0, 4, 0, 2), 4)
    yield pytest.param(lambda: Deflate(), "_decode", b"\x78\x9c garbage", id="deflate")
    yield pytest.param(lambda: Bzip2(), "_fn", b"BZh9 garbage", id="bzip2")
    yield pytest.param(lambda: Blosc(), "_fn", header, id="blosc")
    yield pytest.param(lambda: OutCodec("zstd", libraries.imagecodecs_function("zstd_decode")), "_fn", b"garbage", id="out")
    yield pytest.param(lambda: Bitshuffle((0, 0, 4, 0, 2), 4), "_lib" if bitshuffle._lib is not None else "_block_codec",
                       (64).to_bytes(8, "big") + (64).to_bytes(4, "big") + bytes([0, 0, 0, 40]) + bytes(40), id="bitshuffle")
    yield pytest.param(lambda: Blosc2(), "_blosc2", b"garbage" * 8, id="blosc2")


@pytest.mark.parametrize("make, attr, bad", list(_cases()))
def test_a_codec_lets_a_handlers_exception_through_and_wraps_its_own(
    handler: Callable[[type], None], make: Callable[[], Any], attr: str, bad: bytes
) -> None:
    codec = make()
    out = np.zeros(64, np.uint8)
    with pytest.raises(ChunkDecodeError, match=codec.name):
        codec.decode(bad, 64, out)
    library = getattr(codec, attr)
    if attr == "_blosc2":  # a module: its first call
        setattr(codec, attr, SimpleNamespace(schunk_from_cframe=signalling(library.schunk_from_cframe)))
    else:
        setattr(codec, attr, signalling(library))
    with pytest.raises(Checkpoint) as info:
        codec.decode(bad, 64, out)
    assert type(info.value) is Checkpoint and info.value.__context__ is None


class Rows:
    """A source of rows ``i``; the reads longer than ``cut`` rows send SIGUSR1 first."""

    def __init__(self, cut: int) -> None:
        self.cut = cut

    def prefetch(self, start: int, stop: int) -> None: ...

    def fetch(self, spans: "list[tuple[int, int]]") -> None: ...

    def read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if stop - start > self.cut:
            os.kill(os.getpid(), signal.SIGUSR1)
        out[:] = np.arange(start, stop)


def test_a_read_of_several_blocks_is_not_read_again_after_a_handlers_exception(handler: Callable[[type], None]) -> None:
    # A read that fails is read again one caller's block at a time (NOTE [read plan]): not one the user's handler
    # interrupted, whose exception those reads would have dropped.
    with pytest.raises(Checkpoint):
        read_block(Rows(256), BlockPlan(4096, 2048), 0, np.empty(2048, int), 0, cut=256)


@pytest.fixture
def data() -> np.ndarray:
    return np.arange(4000 * 3, dtype="<f4").reshape(4000, 3)


@pytest.fixture
def deflated(make_array: Callable[..., Path], data: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``data`` in zlib chunks of 500 rows; the first deflate decode (imagecodecs') sends SIGUSR1."""
    ic = libraries.imagecodecs()
    monkeypatch.setattr(ic, "deflate_decode", signalling(ic.deflate_decode))
    return make_array(data, complib="zlib", chunkshape=(500, 3))


def read_here(path: Path, engine: str) -> None:
    """Every block of ``/data`` in ``path``, read in this process (``n_procs=0``)."""
    with Streamer(path, engine=engine).get_queue("/data", n_procs=0, block_size=1000) as q:
        for guard in q.iter():
            guard.release()


def test_a_stream_read_here_raises_the_handlers_exception_as_it_is(
    no_leaks: None, handler: Callable[[type], None], deflated: Path, tmp_path: Path
) -> None:
    with pytest.raises(Checkpoint) as info:
        read_here(deflated, "chunks")
    assert type(info.value) is Checkpoint
    broken = tmp_path / "broken.h5"  # and a chunk that does not decode is the read's error, in context
    assert corrupt_chunk(deflated, broken, 3) == (1500, 2000)
    with pytest.raises(ReaderError) as failed:
        read_here(broken, "chunks")
    assert isinstance(failed.value, ChunkDecodeError) and failed.value.rows == (1000, 2000)
    assert isinstance(failed.value.__cause__, ChunkDecodeError) and "chunk at (1500, 0)" in str(failed.value)


def test_a_request_read_here_raises_the_handlers_exception_and_the_reader_goes_on(
    no_leaks: None, handler: Callable[[type], None], deflated: Path, data: np.ndarray, tmp_path: Path
) -> None:
    path = deflated
    with Reader(path, n_procs=0) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(100)
        with pytest.raises(Checkpoint) as info:
            reader.request(ds[10:110], stage)
        assert type(info.value) is Checkpoint
        np.testing.assert_array_equal(reader.request(ds[10:110], stage).get(), data[10:110])  # the stage was given back
    broken = tmp_path / "broken.h5"
    corrupt_chunk(path, broken, 0)
    with Reader(broken, n_procs=0) as reader:
        ds = reader.get_dataset("/data")
        future = reader.request(ds[10:110], ds.create_stage(100))
        with pytest.raises(ReaderError) as failed:
            future.get()
    assert isinstance(failed.value, ChunkDecodeError) and failed.value.rows == (10, 110)


def test_hdf5_does_not_read_again_a_chunk_the_handler_interrupted(
    no_leaks: None, handler: Callable[[type], None], make_array: Callable[..., Path], data: np.ndarray,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NOTE [blosc chunks as stored]: a chunk the codec fails on is read by HDF5 instead; a RuntimeError of the user's
    # handler was dropped there, as a codec's error.
    handler(RuntimeError)
    path = make_array(data, complib="blosc", chunkshape=(500, 3))
    monkeypatch.setattr(h5py_engine, "STORED_CHUNK_MIN_BYTES", 0)
    codec = h5py_engine._blosc()
    monkeypatch.setattr(codec, "_fn", signalling(codec._fn))
    with pytest.raises(RuntimeError, match="signal") as info:
        read_here(path, "h5py")
    assert type(info.value) is RuntimeError


@pytest.fixture
def wide(make_array: Callable[..., Path]) -> "tuple[Path, np.ndarray]":
    """A file of 20,000 rows of 1 KiB in zlib chunks of 1,024 rows (blocks of 4,096 rows: 1 MiB, which the generator
    reads as they are asked), and its rows."""
    data = np.arange(20_000 * 256, dtype="<f4").reshape(20_000, 256)
    return make_array(data, complib="zlib", chunkshape=(1024, 256)), data


def resumed(items: Iterator[Any], keep: Callable[[Any], np.ndarray]) -> "tuple[np.ndarray, int]":
    """What ``items`` gives (``keep`` of each), going on after each Checkpoint as a caller that saved and goes on
    does; and how many Checkpoints came."""
    got, caught = [], 0
    while True:
        try:
            item = next(items)
        except Checkpoint:
            caught += 1
            continue
        except StopIteration:
            return np.concatenate(got), caught
        got.append(keep(item))


def _block(guard: Any) -> np.ndarray:
    with guard as block:
        return block.copy()


def _row(row: np.ndarray) -> np.ndarray:
    return row[None].copy()


@pytest.mark.parametrize("kind", ["get", "iter", "generator"])
def test_a_stream_read_here_goes_on_from_the_block_a_handler_interrupted(
    no_leaks: None, handler: Callable[[type], None], wide: "tuple[Path, np.ndarray]", kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The handler raises in block 2's first decode (a block is 4 chunks), and again when that block is read again: it
    # comes next, whole, no row skipped.
    path, data = wide
    ic = libraries.imagecodecs()
    monkeypatch.setattr(ic, "deflate_decode", signalling(ic.deflate_decode, times=2, after=8))
    stream = Streamer(path, engine="chunks")
    if kind != "generator":
        with stream.get_queue("/data", n_procs=0, block_size=4096, remainder=True) as q:
            # get: a C iterator over q.get, which an exception does not end (the queue's iterator is the other kind)
            got, caught = resumed(iter(q.get, QueueClosed) if kind == "get" else iter(q), _block)
    else:
        with stream.get_generator("/data", n_procs=0, block_size=4096) as rows:
            got, caught = resumed(rows, _row)
    assert caught == 2
    np.testing.assert_array_equal(got, data)


@pytest.mark.parametrize("kind", ["iter", "generator"])
def test_a_stream_from_readers_goes_on_after_a_handler_interrupted_its_wait(
    no_leaks: None, handler: Callable[[type], None], wide: "tuple[Path, np.ndarray]", kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The handler raises as the consumer asks the ring for a block: nothing is taken, and the stream goes on.
    path, data = wide
    monkeypatch.setattr(Ring, "take", signalling(Ring.take, times=2, after=2))
    stream = Streamer(path, engine="chunks")
    if kind == "iter":
        with stream.get_queue("/data", n_procs=2, block_size=4096, ordered=True, remainder=True) as q:
            got, caught = resumed(iter(q), _block)
    else:
        with stream.get_generator("/data", n_procs=2, block_size=4096, ordered=True) as rows:
            got, caught = resumed(rows, _row)
    assert caught == 2
    np.testing.assert_array_equal(got, data)


class _Wrapped:
    """``real``, but for the attributes given."""

    def __init__(self, real: Any, **given: Any) -> None:
        self._real = real
        self.__dict__.update(given)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _described(path: Path, get_type: Callable[[Any], Callable[[], Any]]) -> Any:
    """``node._describe`` of ``/data`` in ``path``, its dataset's HDF5 type looked up by ``get_type(real lookup)``."""
    import h5py

    with h5py.File(path, "r") as f:
        ds = f["/data"]
        return node._describe(str(path), "/data", None, _Wrapped(ds, id=_Wrapped(ds.id, get_type=get_type(ds.id.get_type))))


def test_a_handlers_exception_in_the_type_lookups_is_no_verdict_on_the_node(
    handler: Callable[[type], None], data: np.ndarray, make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_array(data)
    handler(ValueError)  # h5py's "no numpy type": PyTables was asked instead, and the handler's error dropped
    with pytest.raises(ValueError, match="signal"):
        _described(path, signalling)
    handler(Checkpoint)  # PyTables' lookup, for a type h5py has none for: it was "cannot be read" (a NodeTypeError)

    def no_numpy_type() -> None:
        raise TypeError("no numpy type")

    monkeypatch.setattr(node, "_tables_dtype", signalling(node._tables_dtype))
    with pytest.raises(Checkpoint):
        _described(path, lambda _: no_numpy_type)
    assert _described(path, lambda _: no_numpy_type).dtype == data.dtype  # PyTables' answer, once no handler ran


def test_a_handlers_exception_in_a_pytables_probe_here_is_no_verdict_on_pytables(
    handler: Callable[[type], None], data: np.ndarray, make_array: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe runs here where no process may be forked (a daemonic one): its exception was "PyTables fails on it".
    path = make_array(data)
    monkeypatch.setattr(tables_engine.TablesSource, "read_element", signalling(tables_engine.TablesSource.read_element))
    found = inspect_node(path, "/data")
    with pytest.raises(Checkpoint):
        tables_engine._first_row_problem(found, {})
    assert tables_engine._first_row_problem(found, {}) is None


def test_a_handlers_exception_as_get_gives_its_turn_back_leaves_no_next_get_waiting(
    no_leaks: None, wide: "tuple[Path, np.ndarray]",
) -> None:
    # The exception comes as get()'s finally enters the queue's condition, after the take: the turn it held is not
    # given back. The next get() of the same thread takes it (it waited for itself for ever before).
    path, _ = wide

    class Checkpoint(Exception):
        pass

    class Interrupted(threading.Condition):
        armed = False

        def __enter__(self) -> bool:
            if Interrupted.armed and sys._getframe(1).f_code.co_name == "get":  # its finally (its turn: _wait_turn)
                Interrupted.armed = False
                raise Checkpoint
            return super().__enter__()

    with Streamer(path, engine="chunks").get_queue("/data", n_procs=0, block_size=4096) as q:
        q._changed = Interrupted(q._changed._lock)  # type: ignore[attr-defined]
        with q.get() as block:  # type: ignore[union-attr]
            assert len(block)
        Interrupted.armed = True
        with pytest.raises(Checkpoint):
            q.get()
        assert q._taker is threading.current_thread()  # type: ignore[attr-defined]  # the turn, not given back
        # If the next get() waited for that turn, a close from another thread would end its wait: QueueClosed.
        timer = threading.Timer(10, q.close)
        timer.start()
        try:
            guard = q.get()
        finally:
            timer.cancel()
        assert guard is not QueueClosed, "the next get() waited for the turn its own thread was given"
        guard.release()  # type: ignore[union-attr]


class SignalInGet:
    """A profile hook (``sys.setprofile``) that sends this process SIGUSR1 at the ``landing``-th call or return of one
    ``Queue.get``: its own call, and the calls and returns of every function it calls, and after each C function it
    calls returns; then stops. None where no handler runs: before a C function is called (the instructions from the
    check after the last call to it are stores and loads), at a generator's yield (in the frame it goes to), and at
    the ``get``'s own return, which holds the guard on the stack (one there runs at the caller's next check, the
    caller's to handle). :meth:`arm` before the ``get``; ``landed`` says whether it landed in it, or whole ``get``s
    went by first."""

    get = Queue.get.__code__

    def __init__(self) -> None:
        self.landing = self.events = 0
        self.inside = self.landed = False

    def arm(self) -> None:
        self.events, self.inside, self.landed = 0, False, False
        sys.setprofile(self)

    def __call__(self, frame: "types.FrameType", event: str, arg: object) -> None:
        if not self.inside and not (event == "call" and frame.f_code is self.get):
            return  # not in the get yet (the caller's own calls)
        self.inside = True
        if event == "return" and frame.f_code is self.get:
            sys.setprofile(None)
            return
        if event == "c_call" or event == "return" and frame.f_code.co_flags & inspect.CO_GENERATOR:
            return  # before a C call (it runs after the one before), at a yield (in the frame it goes to)
        if self.events == self.landing:
            sys.setprofile(None)
            self.landed = True
            signal.raise_signal(signal.SIGUSR1)  # its handler runs here, as at a check between two instructions
        self.events += 1


@pytest.fixture
def many_blocks(make_array: Callable[..., Path]) -> "tuple[Path, np.ndarray]":
    """A file of 8,192 rows of 16 bytes in chunks of 64 rows (128 blocks of 64 rows), and its rows."""
    data = np.arange(8192 * 4, dtype="<f4").reshape(8192, 4)
    return make_array(data, chunkshape=(64, 4)), data


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("ordered", [True, False])
def test_a_handlers_exception_anywhere_in_a_get_from_readers_loses_no_block(
    no_leaks: None, many_blocks: "tuple[Path, np.ndarray]", ordered: bool, split: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A handler raises at each call and return of a get() in turn (every other get), caught by a loop that goes on
    # iterating: every row comes once, in order where ordered. A block taken from the ring, or its guard made, before
    # the exception is the next get's (NOTE [a slot in hand] in ``_stream.queue``).
    import gc

    path, data = many_blocks
    if not split:  # each block of 64 rows read on its own, not 16 at a time (NOTE [read plan])
        monkeypatch.setattr(readers, "TOGETHER_BYTES", 1)
    hook = SignalInGet()
    stream = Streamer(path, engine="chunks")
    old = signal.signal(signal.SIGUSR1, functools.partial(_raise, Checkpoint))
    gc.collect()
    gc.disable()  # a collection runs finalizers anywhere, where Python drops a handler's exception
    try:
        swept, missed = False, 0
        while not swept:  # passes until gets go by whole with the hook armed: every call of them had its signal
            with stream.get_queue("/data", n_procs=2, block_size=64, ordered=ordered) as q:
                assert q.n_procs == 2 and isinstance(q._backend, SplitBackend) == split  # type: ignore[attr-defined]
                got: "list[np.ndarray]" = []
                blocks, hook.events = iter(q), 0
                # A block lost, its readers alive and waiting for a slot: killed, so the get fails rather than hangs
                # (a close from this thread would wait for the get's turn).
                stuck = threading.Timer(60, lambda: [os.kill(pid, signal.SIGKILL) for pid in q.reader_pids])
                stuck.start()
                while not swept:
                    try:
                        for guard in blocks:
                            with guard as block:
                                got.append(block.copy())
                            if hook.events and not hook.landed:  # a get shorter than landing, or all were
                                missed, hook.events = missed + 1, 0
                                swept = missed == 20
                                if swept:
                                    break
                            if len(got) % 2 == 0:  # the next get, then one untouched, with the slots all filled
                                time.sleep(0.002)
                                hook.arm()
                    except Checkpoint:
                        assert hook.landed
                        hook.landing, missed = hook.landing + 1, 0
                        continue
                    break
                stuck.cancel()
                if swept:
                    break
            rows = np.concatenate(got) if ordered else np.concatenate(sorted(got, key=lambda b: b[0, 0]))
            np.testing.assert_array_equal(rows, data, err_msg=f"signal at call/return {hook.landing - 1} of a get")
    finally:
        sys.setprofile(None)
        gc.enable()
        signal.signal(signal.SIGUSR1, old)
    assert hook.landing > 20


class _Stop(Exception):
    """A signal handler's own exception."""


@pytest.mark.parametrize("after_the_span_s", [0.0, 0.3])
def test_a_signal_held_over_a_clean_up_run_as_a_finalizer_is_raised_in_the_callers_code_after_it(
    monkeypatch: pytest.MonkeyPatch, after_the_span_s: float
) -> None:
    """NOTE [a signal sent again]: held over the span of a clean-up that a finalizer runs, the signal's handler runs
    once the finalizer has returned, in the caller's code, however long the finalizer goes on after the span (sent
    again after a fixed 10 ms, it ran inside a finalizer that took longer, where Python dropped its exception)."""
    import weakref

    from multitables._sys import signals

    # The clean-up below stands for the library's (the frames the signal waits out are the library's own, found by
    # their module's name); sent only once they are gone, never at a deadline this test outlasts.
    ours = getattr(signals, "_CLEAN_UP_MODULES", frozenset())
    monkeypatch.setattr(signals, "_CLEAN_UP_MODULES", ours | {"clean_up_standin"}, raising=False)
    monkeypatch.setattr(signals, "REDELIVER_S", 600.0, raising=False)
    raised_in: list[str] = []

    def handler(signum: int, frame: Any) -> None:
        raised_in.append(frame.f_code.co_name)
        raise _Stop

    def clean_up() -> None:
        with signals.signals_deferred(later=True):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)  # held: its handler runs later
            time.sleep(0.01)
        time.sleep(after_the_span_s)  # the finalizer goes on after the span

    clean_up = types.FunctionType(clean_up.__code__, {**globals(), "__name__": "clean_up_standin"}, "clean_up", None,
                                  clean_up.__closure__)

    class Owner:
        pass

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        owner = Owner()
        weakref.finalize(owner, clean_up)
        with pytest.raises(_Stop):
            del owner  # the finalizer runs here
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the caller's own code
                time.sleep(0.001)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert raised_in == [sys._getframe().f_code.co_name]  # in this loop, not in the finalizer
