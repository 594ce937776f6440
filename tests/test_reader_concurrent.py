"""A Reader used concurrently: awaited from asyncio, shared by threads, closed from elsewhere; exact rows, no hang."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multitables
from multitables.reader import Reader

from _guards import hang_guard

#: Guards against a hang only: every wait in these tests ends within it, or the test fails.
LIMIT = 20.0
N_ROWS = 3000


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """An array of ``N_ROWS`` rows of 3 int32 in chunks of 64 rows, zlib; returns (path, data)."""
    path = tmp_path_factory.mktemp("concurrent") / "rows.h5"
    data = np.arange(N_ROWS * 3, dtype="<i4").reshape(N_ROWS, 3)
    with tables.open_file(path, "w") as f:
        f.create_carray("/", "data", obj=data, filters=tables.Filters(3, "zlib"), chunkshape=(64, 3))
    return path, data


def free_stages(pool: multitables.StagePool) -> int:
    return pool._free.qsize()


@pytest.fixture
def stopped_reader() -> Iterator[Any]:
    """``pause(reader)``: SIGSTOP its one reader process (its reads wait) until the test ends or ``resume()``."""
    paused: list[int] = []

    class Pause:
        def __call__(self, reader: Reader) -> None:
            (pid,) = reader.reader_pids
            os.kill(pid, signal.SIGSTOP)
            paused.append(pid)

        def resume(self) -> None:
            while paused:
                try:
                    os.kill(paused.pop(), signal.SIGCONT)
                except ProcessLookupError:  # stop() ended it
                    pass

    pause = Pause()
    try:
        yield pause
    finally:
        pause.resume()


# -- asyncio ------------------------------------------------------------------


@pytest.mark.parametrize("n_procs", [0, 2])
def test_a_thousand_gathered_awaits_on_eight_stages_give_exact_rows_and_free_every_stage(
    rows_file: tuple, n_procs: int, no_leaks: None
) -> None:
    path, data = rows_file
    rng = np.random.default_rng(n_procs)
    keys: list[Any] = [slice(int(a), int(a) + int(n)) for a, n in zip(rng.integers(0, N_ROWS - 64, 500), rng.integers(0, 65, 500))]
    keys += [np.sort(rng.choice(N_ROWS, int(n), replace=False)) for n in rng.integers(1, 64, 500)]

    async def main() -> None:
        with Reader(path, n_procs=n_procs) as reader:
            ds = reader.get_dataset("/data")
            pool = ds.create_stage_pool(64, 8)

            async def one(key: Any) -> Any:
                future = await reader.request_async(ds[key], pool, timeout=LIMIT)
                return await future

            got = await asyncio.wait_for(asyncio.gather(*(one(k) for k in keys)), LIMIT)
            for key, rows in zip(keys, got):
                np.testing.assert_array_equal(rows, data[key])
            assert free_stages(pool) == 8 and not pool._waiting and not reader._core.held

    with hang_guard(2 * LIMIT, "1,000 gathered awaits"):
        asyncio.run(main())


def test_an_await_lets_the_loop_run_while_its_reader_reads(rows_file: tuple, stopped_reader: Any, no_leaks: None) -> None:
    """The reader is stopped by SIGSTOP: the loop's other task goes on while the await waits, and the data comes once
    the reader goes on."""
    path, data = rows_file

    async def main() -> None:
        with Reader(path, n_procs=1) as reader:
            ds = reader.get_dataset("/data")
            stage = ds.create_stage(100)
            stopped_reader(reader)
            future = reader.request(ds[10:110], stage)
            awaited = asyncio.ensure_future(future)
            ticks = 0
            while ticks < 20:  # would never run with a blocking wait in the loop
                await asyncio.sleep(0.005)
                ticks += 1
            assert not awaited.done()
            stopped_reader.resume()
            np.testing.assert_array_equal(await asyncio.wait_for(awaited, LIMIT), data[10:110])

    with hang_guard(LIMIT, "an await while the reader is stopped"):
        asyncio.run(main())


def test_an_await_cancelled_or_timed_out_gives_its_stage_back_once_the_read_is_done(
    rows_file: tuple, stopped_reader: Any, no_leaks: None
) -> None:
    """Given back at once, the stage would take the next request while the waiter thread still waited on it."""
    path, data = rows_file

    async def main() -> None:
        with Reader(path, n_procs=1) as reader:
            ds = reader.get_dataset("/data")
            pool = ds.create_stage_pool(100, 2)
            stopped_reader(reader)
            first = await reader.request_async(ds[:100], pool)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(first, 0.05)
            second = asyncio.ensure_future(reader.request_async(ds[100:200], pool))
            task = asyncio.ensure_future(await second)
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert free_stages(pool) == 0  # both still being read
            with pytest.raises(TimeoutError, match="no stage of the pool came free within 0.1 s"):
                await reader.request_async(ds[:10], pool, timeout=0.1)
            third = asyncio.ensure_future(reader.request_async(ds[200:300], pool, timeout=LIMIT))
            await asyncio.sleep(0.05)
            assert not third.done()
            stopped_reader.resume()  # the reads end: their stages come back, and the waiting request takes one
            np.testing.assert_array_equal(await (await asyncio.wait_for(third, LIMIT)), data[200:300])
            # The cancelled awaits' stages come back from their waiter threads once their reads end: not at once.
            deadline = time.monotonic() + LIMIT
            while free_stages(pool) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert free_stages(pool) == 2 and not reader._core.held

    with hang_guard(LIMIT, "cancelled awaits"):
        asyncio.run(main())


def test_many_awaits_cancelled_at_random_leave_every_stage_free(rows_file: tuple, no_leaks: None) -> None:
    path, data = rows_file
    rng = np.random.default_rng(5)

    async def main() -> None:
        with Reader(path, n_procs=2) as reader:
            ds = reader.get_dataset("/data")
            pool = ds.create_stage_pool(300, 4)

            async def one(a: int) -> None:
                future = await reader.request_async(ds[a:a + 300], pool, timeout=LIMIT)
                await asyncio.sleep(0)  # a task cancelled here leaves its future to the garbage collector
                np.testing.assert_array_equal(await future, data[a:a + 300])

            tasks = [asyncio.ensure_future(one(int(a))) for a in rng.integers(0, N_ROWS - 300, 200)]
            for _ in range(20):
                await asyncio.sleep(float(rng.uniform(0, 0.003)))
                for i in rng.choice(len(tasks), 5):
                    tasks[i].cancel()
            done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), LIMIT)
            assert all(r is None or isinstance(r, asyncio.CancelledError) for r in done), done
            assert any(isinstance(r, asyncio.CancelledError) for r in done) and any(r is None for r in done)
            # A task cancelled after its future was made keeps the future (and so its stage) alive through the
            # CancelledError's traceback, which the task and ``done`` hold: drop them (7 of 30 runs hung without).
            del done
            tasks.clear()
            while free_stages(pool) < 4:  # the last cancelled reads end, within the hang guard
                await asyncio.sleep(0.01)
            assert not pool._waiting
            np.testing.assert_array_equal(await (await reader.request_async(ds[5:9], pool)), data[5:9])

    with hang_guard(2 * LIMIT, "awaits cancelled at random"):
        asyncio.run(main())


@pytest.mark.parametrize("how", ["close", "stop"])
def test_closing_the_reader_while_awaits_are_pending_delivers_or_says_so(
    rows_file: tuple, how: str, stopped_reader: Any, no_leaks: None
) -> None:
    """``close()``: the futures made deliver, the tasks still waiting for a stage are told the Reader is closed;
    ``stop()``: every pending await is told it was stopped. Nothing hangs."""
    path, data = rows_file

    async def main() -> None:
        reader = Reader(path, n_procs=1)
        ds = reader.get_dataset("/data")
        pool = ds.create_stage_pool(100, 3)
        stopped_reader(reader)

        async def one(a: int) -> Any:
            future = await reader.request_async(ds[a:a + 100], pool, timeout=LIMIT)
            return await future

        tasks = [asyncio.ensure_future(one(a)) for a in range(0, 1000, 100)]
        while len(pool._waiting) < 7:
            await asyncio.sleep(0.005)
        if how == "close":
            reader.close()
        else:
            reader.stop()
        stopped_reader.resume()
        got = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), LIMIT)
        closed = [r for r in got if isinstance(r, multitables.StreamClosedError)]
        if how == "close":
            for a, rows in zip(range(0, 300, 100), got[:3]):
                np.testing.assert_array_equal(rows, data[a:a + 100])
            assert len(closed) == 7 and all("is closed" in str(e) for e in closed), got
        else:
            assert len(closed) == 10, got
            assert all("closed" in str(e) or "stopped" in str(e) for e in closed)
        reader.close(wait=True)

    with hang_guard(LIMIT, f"{how}() under pending awaits"):
        asyncio.run(main())


# -- threads ------------------------------------------------------------------


@st.composite
def row_keys(draw: st.DrawFn) -> Any:
    """A slice (with a step, negative too) or an index list of up to 64 rows, in any order, repeats allowed."""
    if draw(st.booleans()):
        start = draw(st.integers(0, N_ROWS - 1))
        step = draw(st.sampled_from([1, 1, 2, 3, -1]))
        n = draw(st.integers(0, 64))
        return slice(start, max(start + step * n, -1) if step < 0 else min(start + step * n, N_ROWS), step)
    return draw(st.lists(st.integers(-N_ROWS, N_ROWS - 1), min_size=1, max_size=64))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    keys=st.lists(st.lists(row_keys(), min_size=1, max_size=12), min_size=8, max_size=8),
    n_procs=st.sampled_from([0, 2]),
    close_after=st.integers(0, 60),
    how=st.sampled_from(["close", "close_wait", "stop"]),
)
def test_eight_threads_share_a_reader_closed_from_another_thread(
    rows_file: tuple, keys: list[list[Any]], n_procs: int, close_after: int, how: str, no_leaks: None
) -> None:
    """8 threads make requests on one Reader and one pool while a ninth closes it after ``close_after`` requests:
    every row got is exact, every other request raises StreamClosedError, and every thread ends."""
    path, data = rows_file
    reader = Reader(path, n_procs=n_procs)
    ds = reader.get_dataset("/data")
    pool = ds.create_stage_pool(64, 4)
    made = threading.Semaphore(0)
    outcomes: list[list[str]] = [[] for _ in keys]
    failures: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for key in keys[k] * 3:
                try:
                    future = reader.request(ds[key], pool, timeout=LIMIT)
                except multitables.StreamClosedError as exc:
                    outcomes[k].append(str(exc))
                    continue
                finally:
                    made.release()
                try:
                    rows = future.get(timeout=LIMIT)
                except multitables.StreamClosedError as exc:
                    outcomes[k].append(str(exc))
                    continue
                np.testing.assert_array_equal(rows, data[key])
                outcomes[k].append("rows")
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(len(keys))]
    with hang_guard(3 * LIMIT, "8 threads and a close"):
        for t in threads:
            t.start()
        for _ in range(min(close_after, sum(len(k) * 3 for k in keys))):
            assert made.acquire(timeout=LIMIT)
        if how == "stop":
            reader.stop()
        else:
            reader.close(wait=how == "close_wait")
        for t in threads:
            t.join(LIMIT)
        assert not [t for t in threads if t.is_alive()]
        reader.close(wait=True)
    assert not failures, failures
    said = {o for got in outcomes for o in got} - {"rows"}
    closed, stopped = f"the Reader of {str(path)!r} is closed", f"the Reader of {str(path)!r} was stopped"
    assert all(s == closed or (how == "stop" and s.startswith(stopped)) for s in said), said


@pytest.mark.parametrize("n_procs", [0, 1])
@pytest.mark.parametrize("into", ["stage", "pool"])
def test_a_request_racing_a_close_in_another_thread_is_told_the_reader_is_closed(
    rows_file: tuple, n_procs: int, into: str, no_leaks: None
) -> None:
    """Closed by another thread after ``request`` looked at the Reader, and before it took the stage, the request
    said "the stage is closed" (or "the stage pool is closed"): stages the caller never closed."""
    path, _ = rows_file
    with Reader(path, n_procs=n_procs) as reader:
        ds = reader.get_dataset("/data")
        stage = ds.create_stage(10) if into == "stage" else ds.create_stage_pool(10, 2)
        fits = stage._check_fits

        def closed_meanwhile(request: Any) -> None:
            fits(request)
            reader.close()  # another thread's, landing between the look at the Reader and the take of the stage

        stage._check_fits = closed_meanwhile  # type: ignore[method-assign]
        with pytest.raises(multitables.StreamClosedError, match=rf"^the Reader of {re.escape(repr(str(path)))} is closed$"):
            reader.request(ds[:10], stage, timeout=LIMIT)


@pytest.mark.parametrize("n_procs", [0, 1])
def test_a_stop_from_another_thread_while_a_request_is_written_frees_its_stage_after(
    rows_file: tuple, n_procs: int, no_leaks: None
) -> None:
    """stop() from another thread while ``request`` writes into its stage (the stage claimed, not yet held by a
    future) and the readers' inboxes freed them beneath the write: a crash, a ``TypeError`` or an ``IndexError``.
    The request ends, then they are freed, and the future says the Reader was stopped (or has its rows)."""
    path, _ = rows_file
    reader = Reader(path, n_procs=n_procs)
    ds = reader.get_dataset("/data")
    stage = ds.create_stage(10)
    core = reader._core
    detach = core.detach_dropped
    stopper = threading.Thread(target=reader.stop, daemon=True)

    def stopped_meanwhile() -> None:  # called by request() under the Reader's lock, before it writes the stage
        detach()
        if not stopper.is_alive() and stopper.ident is None:
            stopper.start()
            stopper.join(0.5)  # done at once where stop() frees stages under a request's write

    core.detach_dropped = stopped_meanwhile  # type: ignore[method-assign]
    with hang_guard(LIMIT, "a stop under a request"):
        future = reader.request(ds[:10], stage)
        try:  # with n_procs=0 the request is read before it returns, and its data may come before the stop
            np.testing.assert_array_equal(future.get(timeout=LIMIT), rows_file[1][:10])
        except multitables.StreamClosedError as exc:
            assert "was stopped" in str(exc)
        stopper.join(LIMIT)
    assert not stopper.is_alive()


def test_a_stop_from_another_thread_is_not_told_as_a_reader_death(rows_file: tuple, stopped_reader: Any) -> None:
    """Readers that exited because stop() told them to were taken for dead by a get that looked at them before the
    stop was over: "Reader 0 ... died unexpectedly with exit code 0" instead of "was stopped"."""
    path, _ = rows_file
    reader = Reader(path, n_procs=1)
    ds = reader.get_dataset("/data")
    stage = ds.create_stage(10)
    serve = reader._core.pool
    tell, go_on = serve._tell_stop, threading.Event()

    def told() -> None:  # the stop, held a while once the readers are told, and exit
        tell()
        stopped_reader.resume()  # a reader stopped by SIGSTOP sees the stop before its inbox's work
        go_on.wait(LIMIT)

    serve._tell_stop = told
    stopped_reader(reader)  # the data does not come: get() waits, and looks at the readers every tick
    future = reader.request(ds[:10], stage)
    stopper = threading.Thread(target=reader.stop, daemon=True)
    with hang_guard(LIMIT, "a stop under a get"):
        stopper.start()
        time.sleep(1.0)  # the reader exits meanwhile
        with pytest.raises(multitables.StreamClosedError, match="was stopped"):
            future.get(timeout=LIMIT)
        go_on.set()
        stopper.join(LIMIT)
    assert not stopper.is_alive()
    del serve._tell_stop


_LENT_THEN_FREED = r"""
import sys, numpy as np, multitables
path, n_procs, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
reader = multitables.Reader(path, n_procs=n_procs)
ds = reader.get_dataset("/data")
stage = ds.create_stage(1000)
with reader.request(ds[:1000], stage).get_unsafe() as rows:
    reader.stop() if how == "stop" else stage.close()
    print(int(rows.sum()), int(rows[-1, -1]))
"""


@pytest.mark.parametrize("n_procs", [0, 2])
@pytest.mark.parametrize("how", ["stop", "stage.close"])
def test_data_lent_by_get_unsafe_stays_readable_when_its_stage_is_freed_meanwhile(
    rows_file: tuple, n_procs: int, how: str, no_leaks: None
) -> None:
    """A stage freed under the data it lends (stop(), here or from another thread, or its close) was unmapped
    beneath the view: the next read of it crashed the process (SIGSEGV). Its bytes stay, as the segment's NOTE
    says of rows lent."""
    path, data = rows_file
    done = subprocess.run([sys.executable, "-c", _LENT_THEN_FREED, str(path), str(n_procs), how],
                          capture_output=True, text=True, timeout=LIMIT)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == [str(int(data[:1000].sum())), str(int(data[999, -1]))]


@pytest.mark.parametrize("n_procs", [0, 1])
@pytest.mark.parametrize("kind", ["query", "read"])
def test_a_stop_from_another_thread_after_a_wait_saw_the_data_is_told_as_a_stop(
    tmp_path: Path, n_procs: int, kind: str, no_leaks: None
) -> None:
    """stop() from another thread landing once a future's wait saw its data, before the data was taken: a query's
    future read the count of rows its reader wrote off the freed stage, a ``TypeError`` ('NoneType' object is not
    subscriptable), where a read's said "was stopped"."""
    path = tmp_path / "table.h5"
    with tables.open_file(path, "w") as f:
        table = f.create_table("/", "t", {"c": tables.Int32Col()})
        table.append([(int(x),) for x in range(50, 0, -1)])
        table.cols.c.create_csindex()  # read_sorted's
    reader = Reader(path, n_procs=n_procs)
    ds = reader.get_dataset("/t")
    future = reader.request(ds.read_sorted("c") if kind == "query" else ds[:10], ds.create_stage(50))
    wait = future._wait

    def stopped_after(timeout: Any) -> None:
        wait(timeout)
        reader.stop()  # another thread's, landing between the wait and the take of the data

    future._wait = stopped_after  # type: ignore[method-assign]
    with hang_guard(LIMIT, "a stop after a wait"), pytest.raises(multitables.StreamClosedError, match="was stopped"):
        future.get(timeout=LIMIT)
    reader.close(wait=True)
