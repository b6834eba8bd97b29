"""Local mode's sends: the gRPC front end in the broker (``grpcServerPort``) hands a plain
message to its own broker in-process (``common/broker/local_calls.py``), as RocketMQ's proxy in
Local mode calls the broker's send processor, instead of through a client socket to itself.

The request is the one ``Producer.send`` would send (``Producer.send_request``: the same
checks, compression and fields), served by the request server's one path, and its answer read
by the same ``send_results``. Only what this broker can take at once goes this way: a message
with no message group, no delivery time and no transaction, to a topic this broker has with
write permission, while it is a master. Anything else, and any retriable refusal (a master that
became a slave, a busy or stopping server), goes on through the front end's Producer, which
routes, retries and follows the master as for any client.

A receive's POP and its acks, when the request names this broker while it is a master, are
awaited on the event loop the same way (``LocalConsume``): no executor thread between the
front end and its broker. The front end's other blocking client calls to this broker (a
delayed send, a change of invisible time, a receive from another broker group that reached
this one) go in-process too, by the clients' ``in_process`` (``common/client/in_process.py``),
on the executor threads they already run on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from common.client import Producer
from common.client.in_process import InProcess
from common.client.results import ClientTimeoutError, SendResult, send_results
from common.core.errors import BrokerError, ResponseCode
from common.format.protocol import RequestCode, Response, encode_request
from common.format.tables import PERM_WRITE


@dataclasses.dataclass(frozen=True)
class LocalBroker:
    """The broker a front end runs in: its calls, the addresses its clients know it by, its
    group's name, the number of queues of a topic it takes writes on (0: none), and whether it
    is a master now (a hint: the broker's own checks decide)."""

    calls: InProcess
    addresses: tuple[str, ...]
    broker_name: str
    write_queues: Callable[[str], int]
    is_master: Callable[[], bool]


def write_queues(queue_nums: Callable[[str], int],
                 perm: Callable[[str], int]) -> Callable[[str], int]:
    """``LocalBroker.write_queues`` over a topic table's ``queue_nums`` and ``perm``."""
    return lambda topic: queue_nums(topic) if perm(topic) & PERM_WRITE else 0


class LocalSend:
    """Plain sends to the broker the front end runs in; ``send`` returns None for what must
    go through the Producer instead."""

    def __init__(self, broker: LocalBroker, producer: Producer):
        self.broker = broker
        self.producer = producer
        self._rr = itertools.count()
        # the sends of this turn of the event loop waiting to be served together (None: none)
        self._queued: list[tuple[dict[str, Any], bytes, asyncio.Future[Any]]] | None = None
        self.sent = 0  # answered here
        self.together = 0  # of them, served in a burst with others
        self.passed_on = 0  # handed back to the Producer (not this broker's, or refused)

    async def send(self, topic: str, body: bytes, tags: str | None, keys: list[str] | None,
                   properties: dict[str, str]) -> SendResult | None:
        """The message stored by this broker (its SendResult, or the BrokerError of a refusal
        that is not retriable), or None: the caller sends it through the Producer."""
        broker = self.broker
        queues = broker.write_queues(topic) if broker.is_master() else 0
        if queues <= 0:
            self.passed_on += 1
            return None
        fields, body = self.producer.send_request(topic, body, tags, keys, properties)
        fields["queueId"] = next(self._rr) % queues
        try:
            loop = asyncio.get_running_loop()
            if self._queued is not None or _others_ready(loop):
                outcome = await self._together(loop, fields, body)
            else:
                outcome = await call(broker.calls, RequestCode.SEND, fields, [body])
            result = send_results(topic, outcome, broker.broker_name)[0]
        except BrokerError as e:
            if e.retriable:  # not stored here: the Producer finds where it can be
                self.passed_on += 1
                return None
            raise
        self.sent += 1
        return result

    async def _together(self, loop: asyncio.AbstractEventLoop, fields: dict[str, Any],
                        body: bytes) -> Response:
        """Served with the other sends of this turn of the event loop, as one burst at its
        end (``_flush``): one put, one dispatch, one lock for them all."""
        answered: asyncio.Future[Response | BrokerError] = loop.create_future()
        if self._queued is None:
            self._queued = []
            loop.call_soon(self._flush, loop)
        self._queued.append((fields, body, answered))
        outcome = await answered
        if isinstance(outcome, BrokerError):
            raise outcome
        return outcome

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        queued, self._queued = self._queued or [], None
        here = threading.get_ident()

        def answer_to(fut: asyncio.Future[Any]) -> Callable[[Response | BrokerError], None]:
            def answer(outcome: Response | BrokerError) -> None:
                if threading.get_ident() == here:  # served in this callback
                    _settle(fut, outcome)
                    return
                try:  # the broker's I/O thread (a SYNC master's, once its slave has it)
                    loop.call_soon_threadsafe(_settle, fut, outcome)
                except RuntimeError:  # the front end stopped (its loop closed)
                    pass
            return answer

        calls = [(functools.partial(_send_frames, fields, body), answer_to(fut))
                 for fields, body, fut in queued]
        self.together += len(queued)
        try:
            self.broker.calls.call_many(calls)
        except Exception as e:  # noqa: BLE001 - a request that does not encode: each its error
            for _, _, fut in queued:
                if not fut.done():
                    fut.set_exception(e)


def _send_frames(fields: dict[str, Any], body: bytes, opaque: int) -> list[bytes]:
    return encode_request(RequestCode.SEND, opaque, fields, [body])


def _others_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether more callbacks wait in this turn of the event loop (other calls' steps, under
    load): then a send waits for the turn's end and is served with the others. The default
    loop's ready queue, read as a hint only: a loop without one serves each send at once."""
    return bool(getattr(loop, "_ready", None))


class LocalConsume:
    """POPs and acks of messages this broker holds, in-process: ``serves`` says whether a
    request naming ``broker_name`` is this broker's while it is a master (else the front end's
    SimpleConsumer routes it). The caller reads the answers as SimpleConsumer does; a
    retriable refusal (the broker became a slave, or stops) is the caller's to pass on to that
    SimpleConsumer, which finds the master."""

    def __init__(self, broker: LocalBroker, timeout_ms: int):
        self.broker = broker
        self.timeout_ms = timeout_ms
        self.pops = self.acks = 0  # served here

    def serves(self, broker_name: str) -> bool:
        return broker_name == self.broker.broker_name and self.broker.is_master()

    async def pop(self, fields: dict[str, Any]) -> Response:
        """A POP_MESSAGE (``fields`` as SimpleConsumer's, ``pollTime`` included): the broker's
        answer, whatever its code; BrokerError when none came (retriable)."""
        self.pops += 1
        return await call(self.broker.calls, RequestCode.POP_MESSAGE, fields, (),
                          self.timeout_ms + int(fields["pollTime"]))

    async def batch_ack(self, group: str, topic: str, handles: list[str]) -> list[list[str]]:
        """A BATCH_ACK_MESSAGE of ``handles`` (this broker's, of ``topic``): the (handle, why) of
        each that acked nothing; BrokerError when the broker refused them all."""
        self.acks += 1
        resp = await call(self.broker.calls, RequestCode.BATCH_ACK_MESSAGE,
                          {"topic": topic, "group": group}, [h.encode() for h in handles],
                          self.timeout_ms)
        if resp.code != ResponseCode.SUCCESS:
            raise BrokerError(resp.code, resp.remark)
        return list(resp.fields.get("failed") or [])


async def call(calls: InProcess, code: RequestCode, fields: dict[str, Any] | None,
               bodies: Sequence[bytes], timeout_ms: int | None = None) -> Response:
    """One request to this broker in-process, its answer awaited on the event loop: served on
    this thread when the broker's loop sleeps (no turn of the event loop), else answered on
    the broker's I/O thread. BrokerError when the server takes no more calls or stopped, or
    (retriable) when no answer came within ``timeout_ms``."""
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[Response | BrokerError] = loop.create_future()
    here = threading.get_ident()
    now: list[Response | BrokerError] = []  # answered on this thread inside call()
    inside = [True]

    def answer(outcome: Response | BrokerError) -> None:
        if inside[0] and threading.get_ident() == here:  # served here (the loop slept):
            now.append(outcome)  # taken below with no turn of the event loop
            return
        try:  # the broker's I/O thread
            loop.call_soon_threadsafe(_settle, answered, outcome)
        except RuntimeError:  # the front end stopped (its loop closed): nobody waits
            pass

    try:
        calls.call(lambda opaque: encode_request(code, opaque, fields, bodies), answer)
    finally:
        inside[0] = False
    if now:
        outcome = now[0]
    elif timeout_ms is None:
        outcome = await answered
    else:
        try:
            outcome = await asyncio.wait_for(answered, timeout_ms / 1000)
        except TimeoutError:
            raise ClientTimeoutError("this broker (in-process)", timeout_ms) from None
    if isinstance(outcome, BrokerError):
        raise outcome
    return outcome


def _settle(fut: asyncio.Future[Response | BrokerError], outcome: Response | BrokerError) -> None:
    if not fut.done():  # a call the client gave up on (its deadline) is cancelled
        fut.set_result(outcome)
