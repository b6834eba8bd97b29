"""``LightFuture``: a ``concurrent.futures.Future`` without a lock per future.

The base class builds a ``threading.Condition`` (an RLock and its bookkeeping) in ``__init__``
and takes it in ``set_result``, ``result``, ``done`` and ``add_done_callback``: about 2 us of
every ``send_async`` on this VM, paid even when nobody ever waits. A send handed to the producer
has one writer (the client's I/O or retry thread) and is usually read once, so this subclass:

* starts RUNNING: a send already handed over cannot be cancelled (``cancel()`` returns False,
  as it does for a running future of an executor, and as Kafka's producer futures do);
* creates the Condition only when a thread must block on it (``result``/``exception`` before
  the outcome is known, ``concurrent.futures.wait``/``as_completed``, ``repr``);
* settles without it: ``set_result`` stores the outcome, then the state, then looks for a
  Condition and notifies under it only if one exists. A waiter creates the Condition *before*
  it reads the state, and the setter writes the state *before* it looks, so one of them always
  sees the other (Dekker's order; the GIL makes each step atomic);
* runs done-callbacks exactly once without a lock: each is registered in a one-slot cell and
  whichever thread pops the cell (the setter walking the list, or ``add_done_callback`` seeing
  the future finished after registering) calls it.

It stays a ``concurrent.futures.Future``: ``isinstance`` holds, ``wait``, ``as_completed`` and
``asyncio.wrap_future`` work, and a second ``set_result``/``set_exception`` raises
``InvalidStateError``. The lock-free steps rely on the GIL (CPython 3.11).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from concurrent.futures._base import FINISHED, RUNNING
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("concurrent.futures")  # where the base class logs callback errors


class LightFuture(concurrent.futures.Future[T]):
    def __init__(self) -> None:  # the base __init__ would build the Condition
        self._state = RUNNING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []  # one-slot cells: [fn], emptied by who calls fn
        self._open = True  # popped by the one set_result/set_exception that wins

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        fields = self.__dict__
        cond = fields.get("_cond")
        if cond is None:
            cond = fields.setdefault("_cond", threading.Condition())  # atomic: one wins
        return cond  # type: ignore[no-any-return]

    # -- the writer ---------------------------------------------------------------------------
    # set_result is the hot one (every send_async settles through it): claim, store, settle and
    # the callbacks inline, a Python call each fewer a message than through helpers
    def set_result(self, result: T) -> None:
        fields = self.__dict__
        if fields.pop("_open", None) is None:
            raise concurrent.futures.InvalidStateError(f"{self!r} is already done")
        self._result = result
        self._state = FINISHED
        if fields.get("_cond") is not None:  # someone blocks (or has blocked): wake them
            self._notify(exception=False)
        for cell in self._done_callbacks:  # sees cells appended while it walks
            try:
                fn = cell.pop()
            except IndexError:
                continue  # add_done_callback saw the future finished and called it
            try:
                fn(self)
            except Exception:
                log.exception("exception calling callback for %r", self)

    def set_exception(self, exception: BaseException | None) -> None:
        if self.__dict__.pop("_open", None) is None:
            raise concurrent.futures.InvalidStateError(f"{self!r} is already done")
        self._exception = exception
        self._state = FINISHED
        if self.__dict__.get("_cond") is not None:
            self._notify(exception=True)
        self._invoke_callbacks()

    def _notify(self, exception: bool) -> None:
        with self.__dict__["_cond"]:
            for waiter in self._waiters:
                if exception:
                    waiter.add_exception(self)
                else:
                    waiter.add_result(self)
            self.__dict__["_cond"].notify_all()

    def _invoke_callbacks(self) -> None:
        for cell in self._done_callbacks:  # sees cells appended while it walks
            try:
                fn = cell.pop()
            except IndexError:
                continue  # add_done_callback saw the future finished and called it
            self._call(fn)

    # -- readers ------------------------------------------------------------------------------
    def done(self) -> bool:
        return self._state == FINISHED

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[T]], object]) -> None:
        if self._state != FINISHED:
            cell = [fn]
            self._done_callbacks.append(cell)
            if self._state != FINISHED:
                return  # the setter will call it
            try:
                fn = cell.pop()
            except IndexError:
                return  # the setter got to it first
        self._call(fn)

    def result(self, timeout: float | None = None) -> T:
        if self._state == FINISHED and self._exception is None:
            return self._result  # type: ignore[no-any-return]
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        return super().exception(timeout)

    def _call(self, fn: Callable[[concurrent.futures.Future[T]], object]) -> None:
        try:
            fn(self)
        except Exception:
            log.exception("exception calling callback for %r", self)
