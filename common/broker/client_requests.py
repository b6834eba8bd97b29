"""Requests the broker sends to clients, on the connections they opened (RocketMQ's broker ->
client RPCs: a transaction check-back, GET_CONSUMER_RUNNING_INFO).

A client's connection is a ROUTER identity the request server saw (a producer's heartbeat
tells the broker which one is which: ``common/broker/producer_groups.py``). ``ask`` may be
called from any thread: the request goes to the I/O thread through the mailbox, which sends
it on that identity with an opaque of the broker's own; the client's answer comes back on the
same connection as a response frame (a 5-element header, ``common.format.protocol.
is_response``) and settles the Future, matched by opaque *and* identity (a client cannot
answer what was asked of another). No answer by ``timeout_ms``: the Future fails with a
retriable BrokerError; the loop ending fails them all.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common.core.errors import BrokerError, ResponseCode
from common.format.protocol import (
    Limits,
    ProtocolError,
    RequestCode,
    Response,
    decode_response,
    encode_request,
)

MAX_ASKS_IN_FLIGHT = 10_000  # past this an ask fails at once (a client that never answers)


@dataclasses.dataclass(frozen=True)
class Ask:
    """One request for a client, on its way to the I/O thread."""

    identity: bytes
    code: RequestCode
    fields: Mapping[str, Any]
    bodies: Sequence[bytes]
    timeout_ms: int
    future: concurrent.futures.Future[Response]


@dataclasses.dataclass
class _Waiting:
    identity: bytes
    code: RequestCode
    timeout_ms: int
    future: concurrent.futures.Future[Response]


class ClientRequests:
    """The broker's requests to clients in flight (the I/O thread's, but for ``ask``)."""

    def __init__(self, post: Callable[[Any], None], limits: Limits):
        self._post = post  # the request server's mailbox
        self._limits = limits
        self._opaques = itertools.count(1)
        self._waiting: dict[int, _Waiting] = {}
        # (deadline, opaque), a heap never replaced: the loop reads it to skip ``expire``
        self.deadlines: list[tuple[float, int]] = []
        self.asked = 0
        self.answered = 0
        self.timed_out = 0
        self.stray_answers = 0  # an answer nobody waits for (late, or not this client's)
        self.closed = False

    # ---- any thread ---------------------------------------------------------------------------
    def ask(self, identity: bytes, code: RequestCode, fields: Mapping[str, Any] | None = None,
            bodies: Sequence[bytes] = (), timeout_ms: int = 3000
            ) -> concurrent.futures.Future[Response]:
        future: concurrent.futures.Future[Response] = concurrent.futures.Future()
        self._post(Ask(identity, code, dict(fields or {}), tuple(bodies), timeout_ms, future))
        if self.closed:  # the loop ended: the mailbox may have dropped it
            _fail(future, BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                                      "the broker's request server stopped", True))
        return future

    # ---- the I/O thread ----------------------------------------------------------------------
    def start(self, ask: Ask, send: Callable[[bytes, list[bytes]], None], now: float) -> None:
        if ask.future.done() or not ask.future.set_running_or_notify_cancel():
            return
        if len(self._waiting) >= MAX_ASKS_IN_FLIGHT:
            ask.future.set_exception(BrokerError(
                ResponseCode.SYSTEM_BUSY, f"{len(self._waiting)} requests to clients in flight",
                True))
            return
        opaque = next(self._opaques)
        self._waiting[opaque] = _Waiting(ask.identity, ask.code, ask.timeout_ms, ask.future)
        heapq.heappush(self.deadlines, (now + ask.timeout_ms / 1000.0, opaque))
        self.asked += 1
        send(ask.identity, encode_request(ask.code, opaque, ask.fields, ask.bodies))

    def answer(self, identity: bytes, frames: list[bytes]) -> ProtocolError | None:
        """A response frame a client sent: settles what it answers, if anything.

        A frame that does not decode as a response (a request whose header a bit flip turned
        into a response's, say) is handed back as the error to answer it with; a well-formed
        answer nobody waits for (late, or from another connection) is counted and dropped, as
        RocketMQ's ``processResponseCommand`` does with a response it cannot match."""
        try:
            resp = decode_response(frames, self._limits)
        except ProtocolError as e:
            self.stray_answers += 1
            return e
        waiting = self._waiting.get(resp.opaque)
        if waiting is None or waiting.identity != identity:
            self.stray_answers += 1
            return None
        del self._waiting[resp.opaque]
        self.answered += 1
        waiting.future.set_result(resp)
        return None

    def expire(self, now: float) -> None:
        while self.deadlines and self.deadlines[0][0] <= now:
            _, opaque = heapq.heappop(self.deadlines)
            waiting = self._waiting.pop(opaque, None)
            if waiting is not None:
                self.timed_out += 1
                waiting.future.set_exception(BrokerError(
                    ResponseCode.SYSTEM_BUSY, f"the client did not answer "
                    f"{waiting.code.name} within {waiting.timeout_ms} ms", True))
        if not self._waiting:
            self.deadlines.clear()

    def fail_all(self, reason: str, unsent: Sequence[Any] = ()) -> None:
        """The loop ends: every request in flight, and ``unsent`` (mailbox items nobody took:
        the Asks among them), fails with ``reason``."""
        self.closed = True
        waiting, self._waiting = list(self._waiting.values()), {}
        self.deadlines.clear()
        err = BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE, reason, True)
        for w in waiting:
            _fail(w.future, err)
        for item in unsent:
            if isinstance(item, Ask):
                _fail(item.future, err)

    def figures(self) -> dict[str, int]:
        return {"asked": self.asked, "answered": self.answered, "timedOut": self.timed_out,
                "strayAnswers": self.stray_answers, "inFlight": len(self._waiting)}


def _fail(future: concurrent.futures.Future[Response], err: BrokerError) -> None:
    try:
        future.set_exception(err)
    except concurrent.futures.InvalidStateError:
        pass  # settled already (the other thread of a close race)
