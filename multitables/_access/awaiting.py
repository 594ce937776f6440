"""Requests from asyncio: ``await future`` and ``Reader.request_async`` (NOTE [awaited futures]).

NOTE [awaited futures]
    A future's readers wake it through its stage's channel, a semaphore the
    event loop cannot watch, so ``await future`` waits for it in a thread:
    the Reader's *waiter* threads (``ReaderCore.in_thread``: daemon threads,
    made at the first await and reused, ``_sys.background.DaemonThreads``).
    The thread runs :meth:`Future.wait` (the same wait as ``get``'s, readers'
    deaths and ``stop()`` included); the loop is woken by
    ``asyncio.wrap_future``'s ``call_soon_threadsafe`` and then takes the data
    with ``get(timeout=0)``, which no longer waits. A future already done (all
    of them with ``n_procs=0``) is taken at once, with no thread. A wait
    never queues behind another: there are as many threads as waits in
    flight, and so at most one per stage.

    Cancelled (a task cancelled, ``asyncio.wait_for``'s timeout), the await
    gives the stage back only once the thread's wait has ended: a stage given
    back at once would be taken by the next request while the thread still
    waited on its channel, and took that request's wake-ups and status.

    ``Reader.request_async`` on a :class:`StagePool` waits for a free stage
    in the loop, first come first served: the tasks wait in the pool's
    queue (``StagePool._waiting``), and only the first asks
    ``request(..., timeout=0)``, again whenever a stage is given back (the
    giver wakes it with ``call_soon_threadsafe``) and every :data:`TICK`
    (``request`` then looks at the readers, and a broken or stopped Reader
    raises); leaving, it wakes the next. So 1,000 tasks waiting on 8 stages
    cost the loop one look a TICK, not 1,000. The wake-up only shortens the
    wait: the look every TICK is what guarantees progress.

    Closed meanwhile: ``close()`` lets every pending await get its data;
    ``stop()`` (or the garbage collector) makes them raise
    :class:`StreamClosedError` as ``get`` does; the waiter threads end with
    the Reader's shutdown.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .._shm.ring import TICK
from .stages import StagePool, Waiting

if TYPE_CHECKING:
    from ..reader import Reader  # bound at run time: NOTE [annotations from above] in ``multitables/__init__.py``
    from .futures import Future
    from .request import Request
    from .stages import Stage


async def awaited(future: "Future") -> Any:
    """The data of ``future``, as :meth:`Future.get` gives it, waited for in a waiter thread (NOTE [awaited futures])."""
    import asyncio  # here, not at import: 20 ms and ssl, for users who never await (loaded by their loop already)

    if not future.done():  # in the loop: its first look, and a forked child's refusal
        waited = future._reader._live().in_thread(future.wait)
        if waited is not None:  # None: the Reader has shut down, and the future is done
            try:
                await asyncio.wrap_future(waited)
            except asyncio.CancelledError:
                # Given back once the thread no longer waits on the stage's channel (at once if it never began).
                waited.add_done_callback(lambda _: future.release())
                raise
    return future.get(timeout=0)


async def request_async(reader: "Reader", key: "Request", stage: "Stage | StagePool", timeout: "float | None") -> "Future":
    """``reader.request(key, stage)``, waiting in the loop for a free stage of a pool (NOTE [awaited futures])."""
    if not isinstance(stage, StagePool):
        return reader.request(key, stage)  # a stage is free or refused at once
    if not stage._waiting:  # else behind the tasks already waiting
        try:
            return reader.request(key, stage, timeout=0)
        except TimeoutError:
            pass
    import asyncio  # as in awaited()

    deadline = None if timeout is None else time.monotonic() + timeout
    me = Waiting(asyncio.get_running_loop())
    stage._waiting.append(me)
    try:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"no stage of the pool came free within {timeout} s: all {len(stage)} are held by futures whose "
                    f"data was not taken"
                )
            if stage._waiting[0] is not me:
                await me.sleep(left, _never)  # until the tasks ahead have their stages
                continue
            try:
                return reader.request(key, stage, timeout=0)  # also looks at the readers
            except TimeoutError:
                pass
            await me.sleep(TICK if left is None else min(TICK, left), lambda: not stage._free.empty())
    finally:
        first = stage._waiting[0] is me
        stage._waiting.remove(me)
        if first:
            stage._wake()  # the next is first now: it takes a free stage, or looks every TICK


def _never() -> bool:
    return False
