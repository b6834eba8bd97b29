"""``LightFuture``: the Future API of concurrent.futures without a lock per future.

The races that matter (a callback registered while the future settles, a waiter blocking
while it settles) are run many thousand times with a tiny GIL switch interval, so that thread
switches land between every pair of steps; a lost wake-up shows up as a timeout, a lost or
doubled callback as a wrong count.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sys
import threading
from collections.abc import Iterator

import pytest

from common.core.futures import LightFuture

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


@pytest.fixture
def busy_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def test_it_is_a_running_future_that_cannot_be_cancelled() -> None:
    f: LightFuture[int] = LightFuture()
    assert isinstance(f, concurrent.futures.Future)
    assert f.running() and not f.done() and not f.cancelled()
    assert f.cancel() is False  # handed over: like an executor's running future
    f.set_result(7)
    assert f.done() and not f.running()
    assert f.result() == 7 and f.result(0) == 7
    assert f.exception() is None
    assert "finished" in repr(f)


def test_it_settles_once() -> None:
    f: LightFuture[int] = LightFuture()
    f.set_result(1)
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(2)
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_exception(ValueError("late"))
    assert f.result() == 1


def test_an_exception_is_raised_by_result_and_returned_by_exception() -> None:
    f: LightFuture[int] = LightFuture()
    err = ValueError("refused")
    f.set_exception(err)
    assert f.done()
    assert f.exception() is err
    with pytest.raises(ValueError, match="refused"):
        f.result()
    with pytest.raises(ValueError):
        f.result(0.01)


def test_result_blocks_until_set_and_times_out_otherwise() -> None:
    f: LightFuture[str] = LightFuture()
    with pytest.raises(concurrent.futures.TimeoutError):
        f.result(0.02)
    with pytest.raises(concurrent.futures.TimeoutError):
        f.exception(0.02)
    threading.Timer(0.05, f.set_result, ("late",)).start()
    assert f.result(5) == "late"


def test_callbacks_run_once_each_before_and_after_settling(caplog: pytest.LogCaptureFixture) -> None:
    f: LightFuture[int] = LightFuture()
    seen: list[str] = []
    f.add_done_callback(lambda fut: seen.append(f"before {fut.result()}"))

    def broken(_fut: concurrent.futures.Future[int]) -> None:
        raise RuntimeError("callback bug")

    f.add_done_callback(broken)
    f.add_done_callback(lambda fut: seen.append("after the broken one"))
    with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
        f.set_result(3)
    assert seen == ["before 3", "after the broken one"]
    assert "callback bug" in caplog.text  # logged, as the base class does, not raised
    f.add_done_callback(lambda fut: seen.append("registered late"))
    assert seen[-1] == "registered late" and len(seen) == 3


def test_wait_and_as_completed_see_light_futures() -> None:
    done_early: LightFuture[int] = LightFuture()
    done_early.set_result(0)
    later = [LightFuture[int]() for _ in range(5)]
    for i, f in enumerate(later):
        threading.Timer(0.01 * (i + 1), f.set_result, (i + 1,)).start()
    first = concurrent.futures.wait([done_early, *later], timeout=5,
                                    return_when=concurrent.futures.FIRST_COMPLETED)
    assert done_early in first.done
    every = concurrent.futures.wait([done_early, *later], timeout=5)
    assert not every.not_done
    failing: LightFuture[int] = LightFuture()
    threading.Timer(0.01, failing.set_exception, (ValueError("x"),)).start()
    results = [f.exception() for f in concurrent.futures.as_completed([failing], timeout=5)]
    assert isinstance(results[0], ValueError)


def test_asyncio_can_await_it() -> None:
    f: LightFuture[str] = LightFuture()

    async def main() -> str:
        asyncio.get_running_loop().call_later(0.01, f.set_result, "awaited")
        return await asyncio.wrap_future(f)

    assert asyncio.run(main()) == "awaited"


def test_callbacks_racing_the_setter_run_exactly_once(busy_switching: None) -> None:
    rounds = 3000
    calls = [0] * rounds
    lock = threading.Lock()

    def count(i: int) -> None:
        with lock:
            calls[i] += 1

    futures = [LightFuture[int]() for _ in range(rounds)]
    start = threading.Barrier(2)

    def setter() -> None:
        start.wait()
        for f in futures:
            f.set_result(1)

    t = threading.Thread(target=setter)
    t.start()
    start.wait()
    for i, f in enumerate(futures):
        f.add_done_callback(lambda _f, i=i: count(i))
        f.add_done_callback(lambda _f, i=i: count(i))
    t.join(30)
    assert calls == [2] * rounds


def test_a_waiter_racing_the_setter_is_always_woken(busy_switching: None) -> None:
    rounds = 2000
    futures = [LightFuture[int]() for _ in range(rounds)]
    start = threading.Barrier(2)

    def setter() -> None:
        start.wait()
        for i, f in enumerate(futures):
            f.set_result(i)

    t = threading.Thread(target=setter)
    t.start()
    start.wait()
    got = [f.result(10) for f in futures]  # a lost wake-up would wait the whole 10 s
    t.join(30)
    assert got == list(range(rounds))


# ---- the two interleavings, forced ------------------------------------------------------------


@pytest.mark.parametrize("settle", ["before the cell is in the list", "after"])
def test_a_callback_registered_while_the_future_settles_runs_exactly_once(settle: str) -> None:
    """The setter runs between add_done_callback's state check and its re-check: it finds
    the list without the new cell (then the registering thread calls it) or with it (then the
    setter calls it and the registering thread must not)."""
    f: LightFuture[int] = LightFuture()
    calls: list[int] = []

    class SettleDuringAppend(list[object]):
        def append(self, cell: object) -> None:
            if settle != "after":
                f.set_result(5)
            super().append(cell)
            if settle == "after":
                f.set_result(5)

    f._done_callbacks = SettleDuringAppend()
    f.add_done_callback(lambda fut: calls.append(fut.result()))
    assert calls == [5]


def test_a_waiter_arriving_while_the_future_settles_is_woken() -> None:
    """A waiter runs between the setter's look for a Condition (none yet) and its return."""
    f: LightFuture[int] = LightFuture()
    outcome: list[object] = []

    def waiter() -> None:
        try:
            outcome.append(f.result(2))
        except concurrent.futures.TimeoutError as e:
            outcome.append(e)

    class WaiterArrivesDuringLook(dict[str, object]):
        def get(self, key: str, default: object = None) -> object:
            found = super().get(key, default)
            if key == "_cond":
                t = threading.Thread(target=waiter)
                t.start()
                t.join(0.5)  # it either returns at once or blocks on the Condition
            return found

    f.__dict__ = WaiterArrivesDuringLook(f.__dict__)
    f.set_result(9)
    deadline = threading.Event()
    for _ in range(300):
        if outcome:
            break
        deadline.wait(0.01)
    assert outcome == [9]
