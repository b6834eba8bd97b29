"""Requests from inside the broker's process to its own request server, with no socket
(RocketMQ's proxy in Local mode calls the broker's processors in-process): the gRPC front end
of ``grpcServerPort`` sends through here.

A call is a request's frames, exactly as a client would send them, served by the one path
every request takes (``RequestServer._serve``: decode and check, the system-topic and drain
gates, the in-flight bound, the processor, the reply gate of controller mode, a SYNC put's wait
for its slave). While the I/O thread sleeps in its poll, the caller's own thread serves it,
under the lock the loop holds for each of its turns (``RequestServer._serve_local``): no
hand-off to the I/O thread and back, which cost more than the request. Otherwise the I/O
thread takes it from the mailbox. Its answer comes back to ``deliver`` instead of the client
socket: every call of the process shares one routing identity ``IDENTITY``, 256 bytes long,
which no ZeroMQ peer can have (a routing id is 1-255 bytes), and the answer's opaque finds
its caller. No ACL check runs on a local call: the front end has checked its caller's
permissions itself (as it does before calling the brokers as its admin account in Cluster
mode).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

from common.core.errors import BrokerError, ResponseCode
from common.core.logs import log_event
from common.format.protocol import Limits, ProtocolError, Response, decode_response

IDENTITY = b"\x00replog-local" + b"\x00" * 243  # 256 bytes: never a ZeroMQ routing id
assert len(IDENTITY) == 256
log = logging.getLogger("replog.server")

OPAQUE_SPAN = 1 << 31  # the opaques of local calls wrap within int32, as a client's do

Answer = Callable[[Response | BrokerError], None]


class LocalCall(NamedTuple):
    """A mailbox item: a request's frames (its born host is ``LocalCalls.born_host``)."""

    frames: list[bytes]


class LocalCalls:
    """The process's calls to its own request server, matched to their answers by opaque."""

    def __init__(self, post: Callable[[object], None], limits: Limits,
                 born_host: tuple[str, int] = ("127.0.0.1", 0),
                 serve: Callable[[list[bytes]], bool] | None = None,
                 serve_many: Callable[[list[list[bytes]]], bool] | None = None):
        self._post = post  # the server's mailbox (raises BrokerError when full)
        # the server serving a call (or several, in order) on the caller's thread, if its loop
        # is asleep (True)
        self._serve = serve
        self._serve_many = serve_many
        self.inline = 0  # calls served on their caller's thread, since the start
        self._limits = limits.for_responses()
        self.born_host = born_host
        self._waiting: dict[int, Answer] = {}
        self._lock = threading.Lock()
        self._opaques = itertools.count(1)
        self._closed = False
        self.calls = 0  # taken, since the start

    def call(self, opaque_and_frames: Callable[[int], list[bytes]], answer: Answer) -> None:
        """Any thread: serve the request ``opaque_and_frames(opaque)`` encodes, and hand its
        answer (a Response, or a BrokerError when the server stopped first) to ``answer``,
        either on this thread before ``call`` returns (served here: the loop was asleep) or
        later on the server's I/O thread; ``answer`` must only hand it on, and take no lock
        the caller may hold. Raises BrokerError (SERVICE_NOT_AVAILABLE, SYSTEM_BUSY) when the
        server takes no more calls."""
        with self._lock:
            if self._closed:
                raise BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                                  "the broker's request server has stopped")
            opaque = next(self._opaques) % (OPAQUE_SPAN - 1) + 1
            self._waiting[opaque] = answer
            self.calls += 1
        try:
            frames = opaque_and_frames(opaque)
            if self._serve is not None and self._serve(frames):
                self.inline += 1  # a statistic: an unlocked += may lose a count, nothing else
                return
            self._post(LocalCall(frames))
        except BaseException:
            with self._lock:
                self._waiting.pop(opaque, None)
            raise

    def call_many(self, calls: Sequence[tuple[Callable[[int], list[bytes]], Answer]]) -> None:
        """Several calls at once, served in order as one burst (a run of plain SENDs is one
        native put): each as ``call``'s, its answer to its own ``answer``. A call the server
        takes no more (stopped, a full mailbox) is answered its BrokerError instead of
        raising: the ones before it may be served already."""
        with self._lock:
            if self._closed:
                error = BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                                    "the broker's request server has stopped")
                opaques: list[int] = []
            else:
                error = None
                opaques = [next(self._opaques) % (OPAQUE_SPAN - 1) + 1 for _ in calls]
                for opaque, (_, answer) in zip(opaques, calls, strict=True):
                    self._waiting[opaque] = answer
                self.calls += len(calls)
        if error is not None:
            for _, answer in calls:
                _hand_on(answer, error)
            return
        try:
            many = [make(opaque) for opaque, (make, _) in zip(opaques, calls, strict=True)]
        except BaseException:
            with self._lock:
                for opaque in opaques:
                    self._waiting.pop(opaque, None)
            raise
        if self._serve_many is not None and self._serve_many(many):
            self.inline += len(many)
            return
        for i, frames in enumerate(many):
            try:
                self._post(LocalCall(frames))
            except BrokerError as e:  # those after it are not posted either
                for opaque in opaques[i:]:
                    with self._lock:
                        refused = self._waiting.pop(opaque, None)
                    if refused is not None:
                        _hand_on(refused, e)
                return

    def deliver(self, frames: list[bytes]) -> None:
        """The I/O thread: the answer to a local call (sent to ``IDENTITY``)."""
        try:
            resp = decode_response(frames, self._limits)
        except ProtocolError as e:  # not an answer (nothing registers this identity as a
            # client to ask): its opaque is no one's, so it is dropped, loudly
            log_event(log, "local_answer_dropped", logging.ERROR, error=str(e))
            return
        with self._lock:
            answer = self._waiting.pop(resp.opaque, None)
        if answer is not None:
            _hand_on(answer, resp)

    def pending(self) -> int:
        with self._lock:
            return len(self._waiting)

    def close(self, reason: str) -> None:
        """The server stopped: no more calls, and every call still waiting is answered with
        SERVICE_NOT_AVAILABLE (retriable, as a client whose connection closed retries: its
        request never reached the loop, or its answer never left it)."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, {}
        for answer in waiting.values():
            _hand_on(answer, BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE, reason))


def _hand_on(answer: Answer, outcome: Response | BrokerError) -> None:
    """A caller's hand-off must not stop the I/O thread that runs it: its error is logged."""
    try:
        answer(outcome)
    except Exception as e:  # noqa: BLE001 - the caller's bug, not the server's
        log_event(log, "local_answer_failed", logging.ERROR, error=repr(e))
