"""A signal handler's exception at each place it can land while a block passes from the library to the caller's loop
(NOTE [a handler's exception] in ``_sys.signals``, NOTE [a slot in hand] in ``_stream.queue``): between two blocks
of the generator and at its end, in a guard's ``with`` and its release (NOTE [a slot given back]). Wherever it lands,
the caller gets the very exception its handler raised; a generator it left going goes on from the row it stood at (one
it ended is ended, as Python's generators are); a queue goes on with every block and every slot; and once closed,
nothing is left: no reader, no segment, no semaphore, no fd, no thread. In the finalizers the library runs (a spare
buffer's, a swmr source's entry), where Python drops the exception, nothing is left half-done: no lock held, no open
kept; nor a handler left replaced by a span of held signals.

Real readers (``n_procs=2``) and reads in this process (``n_procs=0``); ``test_signals`` covers ``Queue.get`` itself.
"""

from __future__ import annotations

import _signal
import dis
import functools
import gc
import inspect
import signal
import sys
import threading
import time
import weakref
import _weakrefset
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import psutil
import pytest

from multitables import Queue, QueueClosed, Streamer
from multitables._io.handles import HeldOpen
from multitables._sys import spares
from multitables._sys.signals import signals_deferred

from _guards import hang_guard
from conftest import SETTLE_TIMEOUT, open_fds, own_segments

if TYPE_CHECKING:
    import types


class Checkpoint(Exception):
    """What the user's handler raises: a scheduler's warning, turned into leaving the loop. Its ``id`` goes to the
    list given last."""

    def __init__(self, message: str, made: list) -> None:
        super().__init__(message)
        made[-1] = id(self)


#: The instructions after whose call Python runs a pending handler before the result is stored (3.10 after every
#: call; 3.11 on after a call of C, and where the call goes through C): the callee's return is a landing there.
CALLS = frozenset({"CALL", "PRECALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX"})


@functools.lru_cache(maxsize=None)
def _instruction(code: "types.CodeType", offset: int) -> str:
    """The name of the instruction of ``code`` that holds byte ``offset`` (an inline cache is its call's)."""
    name = ""
    for instruction in dis.get_instructions(code):
        if instruction.offset > offset:
            break
        name = instruction.opname
    return name


class SignalAtEachCheck:
    """A profile hook (``sys.setprofile``) that sends this process SIGUSR1 at the ``landing``-th place since
    :meth:`arm` where Python runs a pending handler, in any frame but the caller's loop ``loop``; its handler runs
    there at once (``signal.raise_signal``), as at that check. The places: a Python function's start; a C function's
    return; a Python function's return to a call instruction, its result not yet stored (Python 3.10 checks there).
    None at a return Python makes in C without a check: a ``with``'s ``__enter__``, a ``for``'s ``__next__``, a
    property, a generator's yield (it runs in the frame it goes to). Stops back in ``loop``, at a call of ``until``,
    or once it sent. Not in a finaliser unless ``finalizers`` (Python drops the exception there: see
    :func:`_in_finalizer`)."""

    def __init__(self, loop: "types.CodeType", until: "types.CodeType | None" = None, finalizers: bool = False,
                 distinct: bool = False) -> None:
        self.loop, self.until, self.finalizers, self.distinct = loop, until, finalizers, distinct
        self.seen: "set[tuple[Any, ...]]" = set()
        self.landing = self.events = 0
        self.landed = False
        self.where = ""

    def arm(self) -> None:
        self.events, self.landed, self.where = 0, False, ""
        self.handler, self.spanned = signal.getsignal(signal.SIGUSR1), False
        self.seen.clear()
        sys.setprofile(self)

    def __call__(self, frame: "types.FrameType", event: str, arg: object) -> None:
        code = frame.f_code
        if code is _ARM or not self.finalizers and _in_finalizer(frame) or code is self.loop and self.until is not None:
            return
        if code is self.loop or event == "call" and code is self.until:
            sys.setprofile(None)  # back in the loop, or at the next get: the loop has the block
            return
        if event == "c_call":
            return
        if event == "return":
            caller = frame.f_back
            if code.co_flags & inspect.CO_GENERATOR or caller is None:
                return
            if _instruction(caller.f_code, caller.f_lasti) not in CALLS:
                return
        # Held (``signals_deferred``: its handler is not the test's), a signal runs at the span's end wherever it came:
        # one landing a span (a reader pool's close is hundreds of places).
        deferred = _signal.getsignal(signal.SIGUSR1) is not self.handler
        if deferred and self.spanned:
            return
        self.spanned = deferred
        if self.distinct:  # a place once: the same instruction, called from the same one (a loop's turns alike)
            caller = frame.f_back
            place = (code, frame.f_lasti, event, caller and caller.f_code, caller and caller.f_lasti)
            if place in self.seen:
                return
            self.seen.add(place)
        if self.events == self.landing:
            sys.setprofile(None)
            self.landed = True
            name = getattr(arg, "__qualname__", "") if event == "c_return" else ""
            self.where = f"{event} {name} in {code.co_name} ({Path(code.co_filename).name}:{frame.f_lineno})"
            signal.raise_signal(signal.SIGUSR1)  # its handler runs now: the Checkpoint leaves this hook's caller
        self.events += 1


#: Seconds a pass of landings may take before it fails as hung (each takes under 20 s on two loaded cores).
HANG_S = 240

_ARM = SignalAtEachCheck.arm.__code__
_FINALIZER = weakref.finalize.__call__.__code__
#: Where the weak containers' callbacks are, which a key or value dying calls (a file handle's entry: ``_io.handles``).
_WEAK_CONTAINERS = {weakref.__file__, _weakrefset.__file__}


def _in_finalizer(frame: "types.FrameType | None") -> bool:
    """Whether ``frame`` runs under a ``weakref.finalize`` or a weak container's callback, called as an object died (a
    buffer's last row dropped: NOTE [spare buffers] in ``_sys.spares``): Python drops an exception raised there
    ("Exception ignored"), so no signal is sent there (a limit of this test: the library runs such code)."""
    while frame is not None:
        code = frame.f_code
        if code is _FINALIZER or code.co_name in ("remove", "_remove") and code.co_filename in _WEAK_CONTAINERS:
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def raised() -> Iterator[list]:
    """SIGUSR1's handler raises a Checkpoint, whose ``id`` it appends here (not the exception: its traceback would
    keep the stream's objects); the garbage collector held off (a collection runs finalizers anywhere, where Python
    drops a handler's exception); the old handler put back."""
    exceptions: list = []

    def checkpoint(signum: int, frame: Any) -> None:
        exceptions.append(None)
        raise Checkpoint(f"signal {signum}", exceptions)  # no local: it would keep its traceback, and the stream

    old = signal.signal(signal.SIGUSR1, checkpoint)
    gc.collect()
    gc.disable()
    try:
        yield exceptions
    finally:
        sys.setprofile(None)
        gc.enable()
        signal.signal(signal.SIGUSR1, old)


@pytest.fixture
def blocks(make_array: Callable[..., Path], blocks_as_asked: None) -> "tuple[Path, np.ndarray]":
    """A file of 512 rows in chunks of 64 (8 blocks of 64 rows, each read on its own), and its rows."""
    data = np.arange(512 * 4, dtype="<f4").reshape(512, 4)
    return make_array(data, chunkshape=(64, 4)), data


def _semaphores() -> int:
    """The POSIX semaphores mapped in this process (a semaphore's name is unlinked at once; its mapping stays)."""
    with open("/proc/self/maps") as maps:
        return sum("/dev/shm/sem." in line for line in maps)


def _state() -> dict[str, Any]:
    children = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                children.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return {"children": children, "segments": own_segments(), "fds": open_fds(), "semaphores": _semaphores(),
            "threads": {t.ident for t in threading.enumerate()}}


def _left(before: dict[str, Any]) -> dict[str, Any]:
    """What a closed stream left since ``before`` (after a grace period): empty when nothing."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        # A handler's exception's traceback can hold a frame that holds the closed queue in a cycle (its 7
        # semaphores kept until a collection: once in a full run, at the return of _rows_alive with readers).
        gc.collect()
        after = _state()
        left = {key: after[key] - before[key] for key in before if after[key] != before[key]}
        left = {key: value for key, value in left.items() if value and not (isinstance(value, int) and value < 0)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.mark.parametrize("n_procs, keep, at", [
    pytest.param(n_procs, keep, at, id=f"{n_procs}-{'kept' if keep else 'copied'}-{'between-blocks' if at < 512 else 'at-the-end'}")
    for n_procs in (0, 2) for keep in (False, True) for at in (3 * 64, 512)
])
def test_a_handlers_exception_anywhere_between_two_blocks_of_the_generator(
    blocks: "tuple[Path, np.ndarray]", raised: list, n_procs: int, keep: bool, at: int
) -> None:
    # From the last row of block 2 to the first of block 3, or from the last row to the end of the loop. The loop
    # keeps copies (the readers' slots are lent to it) or the rows themselves (then the blocks are copied).
    path, data = blocks
    stream = Streamer(path, engine="chunks")

    def walk(rows: Iterator[np.ndarray], got: list) -> None:
        for row in rows:
            got.append(row if keep else row.copy())
            if len(got) == at:
                hook.arm()

    hook = SignalAtEachCheck(walk.__code__, distinct=at == 512)
    assert len(list(stream.get_generator("/data", n_procs=n_procs, block_size=64))) == 512  # a fork server started
    with hang_guard(HANG_S, "a pass of landings over the generator"):
        while True:
            before, got = _state(), []
            rows = stream.get_generator("/data", n_procs=n_procs, block_size=64, ordered=True)
            came = False
            try:
                walk(rows, got)
                # Held over the end (its clean-up), the signal is sent again from a thread once the main thread has
                # left the end (NOTE [a signal sent again]): its exception comes in this code, wherever it stands.
                if hook.landed:
                    time.sleep(SETTLE_TIMEOUT)
            except Checkpoint as exc:
                assert hook.landed and id(exc) == raised[-1], hook.where
                came = True
            finally:
                sys.setprofile(None)
            assert came == hook.landed, f"{hook.where}: the handler's exception was dropped"
            if not hook.landed:
                np.testing.assert_array_equal(got, data)
                break
            rest = list(rows)  # left going, it goes on from where it stood; ended, it gives none
            np.testing.assert_array_equal(got + rest if rest else got, data if rest else data[: len(got)],
                                          err_msg=hook.where)
            rows.close()
            assert _left(before) == {}, hook.where
            hook.landing += 1
    assert hook.landing > 20


class _Loop:
    """A loop over a queue's guards, each block copied in its ``with``; after a Checkpoint, the guard it held is
    still the caller's: its block is taken if it was not, and it is released."""

    def __init__(self, queue: Queue) -> None:
        self.queue, self.got, self.guard, self.done = queue, [], None, None
        self.hook: "SignalAtEachCheck | None" = None

    def run(self) -> None:
        for self.guard in self.queue:
            if len(self.got) == 3 and self.hook is not None:
                self.hook.arm()  # from block 3's with to the next get
            with self.guard as block:
                self.got.append(block.copy())
                self.done = self.guard

    def recover(self) -> None:
        guard = self.guard
        if guard is not None and guard is not self.done:
            with guard as block:  # a guard the exception left unentered: its block still comes
                self.got.append(block.copy())
        guard.release()  # type: ignore[union-attr]

    def hold_every_slot(self) -> None:
        """Take ``read_ahead`` guards at once (none lost), released by another thread (no lock left held)."""
        held: list = []
        stuck = threading.Timer(20, self.queue.close)  # a get that waits for ever: QueueClosed
        stuck.start()
        try:
            for _ in range(self.queue.read_ahead):
                guard = self.queue.get()
                assert guard is not QueueClosed, "a slot was lost: a get waited for it"
                with guard as block:  # type: ignore[union-attr]
                    self.got.append(block.copy())
                held.append(guard)
        finally:
            stuck.cancel()
        releaser = threading.Thread(target=lambda: [guard.release() for guard in held])
        releaser.start()
        releaser.join(20)
        assert not releaser.is_alive(), "a release from another thread waited for a lock left held"


# With readers and on to the next get, it lands in the ring's give-back too: between its lock's acquire and the push,
# the push and the token (NOTE [a slot given back] in ``_stream.queue``).
@pytest.mark.parametrize("n_procs, until", [(0, None), (2, None), (0, Queue.get), (2, Queue.get)],
                         ids=["0-enter", "2-enter", "0-enter-to-next-get", "2-enter-to-next-get"])
def test_a_handlers_exception_anywhere_in_a_guards_with_loses_no_block_and_no_slot(
    blocks: "tuple[Path, np.ndarray]", raised: list, n_procs: int, until: Any
) -> None:
    # From the start of block 3's with to its body (enter), or on to the next get (the with's end, the release).
    path, data = blocks
    stream = Streamer(path, engine="chunks")
    hook = SignalAtEachCheck(_Loop.run.__code__, until=until and until.__code__)
    with stream.get_queue("/data", n_procs=n_procs, block_size=64) as queue:  # a fork server started
        assert sum(1 for _ in queue) == 8
    with hang_guard(HANG_S, "a pass of landings over a guard's with"):
        while True:
            before = _state()
            with stream.get_queue("/data", n_procs=n_procs, block_size=64, ordered=True, read_ahead=4) as queue:
                loop = _Loop(queue)
                loop.hook = hook
                try:
                    loop.run()
                except Checkpoint as exc:
                    assert hook.landed and id(exc) == raised[-1], hook.where
                    sys.setprofile(None)
                    loop.hook = None
                    loop.recover()
                    loop.hold_every_slot()
                    loop.run()
                else:
                    assert not hook.landed, f"{hook.where}: the handler's exception was dropped"
                finally:
                    sys.setprofile(None)
            np.testing.assert_array_equal(np.concatenate(loop.got), data, err_msg=hook.where)
            del loop, queue  # a closed queue's semaphores go with it
            assert _left(before) == {}, hook.where
            if not hook.landed:
                break
            hook.landing += 1
    assert hook.landing > 5


def _drop(held: list, hook: SignalAtEachCheck) -> None:
    """Drop the only reference to an object, the hook armed: its finaliser (or weak callback) runs in the ``clear``."""
    hook.arm()
    try:
        held.clear()
    finally:
        _dropped()


def _dropped() -> None:
    """Where the hook of :func:`_drop` stops."""


def test_a_handlers_exception_in_a_spare_buffers_finaliser_leaves_no_lock_held(
    raised: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE [spare buffers]: the mapping of a buffer nobody references is kept by a finaliser, under the spares' lock;
    # Python drops the exception there, and a lock it left held would hang the next buffer asked for.
    dropped: list = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(type(unraisable.exc_value)))
    monkeypatch.setattr(spares, "_SPARES", [])
    hook = SignalAtEachCheck(_dropped.__code__, finalizers=True)
    while True:
        dropped.clear()
        try:
            _drop([spares.spare_bytes(1 << 16)], hook)
        except Checkpoint:  # as the clear returned, after the finaliser
            assert dropped == [], hook.where
        else:
            assert dropped == ([Checkpoint] if hook.landed else []), hook.where
        taken = threading.Thread(target=spares.spare_bytes, args=(1 << 16,), daemon=True)
        taken.start()
        taken.join(20)
        assert not taken.is_alive() and not spares._LOCK.locked(), f"{hook.where}: the spares' lock was left held"
        if not hook.landed:
            break
        hook.landing += 1
    assert hook.landing > 5


class _Source:
    """A rows source's open of its dataset, as :class:`HeldOpen` knows it."""

    def __init__(self, dataset_id: object) -> None:
        self.dataset_id = dataset_id

    def close(self) -> None:
        pass


class _Held(HeldOpen, _Source):
    """A source of a file read with ``swmr=True``."""


class _Open:
    """What a dataset's open is: an h5py ``DatasetID``, which keeps its file open (a descriptor) while it lives."""


def test_a_handlers_exception_in_the_weak_callback_of_a_dropped_swmr_source_keeps_no_open(
    raised: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE [swmr extent]: the library's opens of a file read with swmr=True are held for each source, weakly; a source
    # dropped unclosed goes by a weak container's callback, where Python drops the exception.
    dropped: list = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(type(unraisable.exc_value)))
    hook = SignalAtEachCheck(_dropped.__code__, finalizers=True)
    while True:
        dropped.clear()
        opened = _Open()
        gone = weakref.ref(opened)
        held = [_Held(opened)]
        del opened
        try:
            _drop(held, hook)
        except Checkpoint:  # as the clear returned, after the callback
            assert dropped == [], hook.where
        else:
            assert dropped == ([Checkpoint] if hook.landed else []), hook.where
        assert gone() is None, f"{hook.where}: the open of a source dropped is kept"
        if not hook.landed:
            break
        hook.landing += 1
    assert hook.landing > 3


def _held_over(hook: SignalAtEachCheck) -> None:
    """A span of held signals, the hook armed."""
    hook.arm()
    try:
        with signals_deferred():
            pass
    finally:
        _dropped()


def test_a_handlers_exception_as_signals_are_held_or_given_back_leaves_every_handler_as_it_was(raised: list) -> None:
    # The handlers are replaced at a span's start and put back at its end, each in turn: a handler run between two
    # (another signal's, as this one's is put back) must find none of them left replaced.
    def other(signum: int, frame: Any) -> None:
        pass

    old = signal.signal(signal.SIGUSR2, other)
    try:
        hook = SignalAtEachCheck(_dropped.__code__)
        while True:
            try:
                _held_over(hook)
            except Checkpoint:
                pass
            sys.setprofile(None)
            assert signal.getsignal(signal.SIGUSR2) is other, f"{hook.where}: SIGUSR2's handler was left replaced"
            assert signal.getsignal(signal.SIGUSR1) is hook.handler, f"{hook.where}: SIGUSR1's handler left replaced"
            if not hook.landed:
                break
            hook.landing += 1
        assert hook.landing > 5
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_a_handlers_exception_in_a_dropped_queues_finaliser_leaves_nothing(
    blocks: "tuple[Path, np.ndarray]", raised: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A queue dropped unclosed is ended by its finaliser, under held signals; a handler's exception before they are
    # held (Python drops it there) must not leave the readers, the ring or its semaphores.
    path, _ = blocks
    stream = Streamer(path, engine="chunks")
    dropped: list = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(type(unraisable.exc_value)))
    hook = SignalAtEachCheck(_dropped.__code__, finalizers=True, distinct=True)
    # Past the finaliser's first instruction: a landing as weakref.finalize's call starts, as it pops its entry or as
    # _end_early starts loses the finaliser whole (no code of ours has run: not mended here).
    hook.landing = 3
    with stream.get_queue("/data", n_procs=2, block_size=64):  # a fork server started
        pass
    with hang_guard(HANG_S, "a pass of landings over a dropped queue's finaliser"):
        while True:
            before = _state()
            held = [stream.get_queue("/data", n_procs=2, block_size=64)]
            try:
                _drop(held, hook)
                # A signal held over the end is sent again from a thread of its own (NOTE [a signal sent again]): its
                # exception comes here once that thread has sent it.
                deadline = time.monotonic() + SETTLE_TIMEOUT
                while time.monotonic() < deadline and any(t.name == "multitables-signal" for t in threading.enumerate()):
                    time.sleep(0.01)
                time.sleep(0.01)
            except Checkpoint:
                pass
            assert _left(before) == {}, hook.where
            if not hook.landed:
                break
            hook.landing += 1
    assert hook.landing > 5
