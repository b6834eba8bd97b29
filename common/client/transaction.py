"""TransactionProducer: RocketMQ's transactional producer (docs/contract.md §4).

``send_in_transaction`` sends a *half* message (stored where no consumer reads it), runs the
caller's local transaction, and ends it: COMMIT (the message is delivered), ROLLBACK (it never
is) or UNKNOWN (left open). A transaction left open, or whose end was lost (the producer died
between, a broker failed over), is asked about later: the broker sends CHECK_TRANSACTION_STATE
to a live producer of the same group (each heartbeats its group's masters), whose ``checker``
answers from the half message. A final state is final: the broker refuses the other end.

Two steps, for a caller whose transaction outlives the call: ``send_half`` then ``end``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Self

from common.client.cluster import Cluster
from common.client.producer import Producer
from common.client.results import SendResult, send_results
from common.client.routing import MessageQueue
from common.core.errors import BrokerError, ResponseCode
from common.core.message import PROPERTY_UNIQ_KEY, MessageExt
from common.core.transaction import PRODUCER_GROUP, TRAN_MSG, TransactionState
from common.format.protocol import (
    ProtocolError,
    Request,
    RequestCode,
    Response,
    decode_record,
)

log = logging.getLogger("replog.client")

Checker = Callable[[MessageExt], TransactionState]


class HalfSent(NamedTuple):
    """A half message stored: what its end names."""

    topic: str
    transaction_id: str  # the broker's, from its answer to the half (an END must name it)
    send: SendResult  # its offsets are the half's (the broker's half topic, queue 0)
    message_id: str = ""  # the half's unique key (UNIQ_KEY): the id its consumers see


class TransactionResult(NamedTuple):
    state: TransactionState  # what the local transaction decided
    half: HalfSent
    end_error: BrokerError | None = None  # the end failed: the broker will check back


class TransactionProducer:
    def __init__(self, servers: str | Iterable[str], group: str, checker: Checker,
                 **producer_options: Any):
        """``group``: the producer group (every producer of it may be asked about any of its
        transactions); ``checker(half) -> TransactionState`` answers the broker's checks
        (it runs on the client's requests thread; an exception answers UNKNOWN).
        ``producer_options``: as ``Producer``'s."""
        self.group = group
        self.checker = checker
        self.producer = Producer(servers, group=group, **producer_options)
        self.producer._transport.serve(RequestCode.CHECK_TRANSACTION_STATE, self._check)
        self.checks = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.producer.close()

    # ---- a transaction --------------------------------------------------------------------
    def send_in_transaction(self, topic: str, body: bytes,
                            local_transaction: Callable[[HalfSent], TransactionState],
                            tags: str | None = None, keys: str | list[str] | None = None,
                            properties: dict[str, str] | None = None,
                            queue_id: int | None = None,
                            broker_name: str | None = None,
                            wait_end: bool = True) -> TransactionResult:
        """The half, the local transaction (an exception: UNKNOWN, left for the check), the
        end. Raises only if the half was not stored (then nothing happened). ``wait_end``
        False sends the end without waiting for its answer (RocketMQ's
        ``endTransactionOneway``): one round trip less; an end that is lost or refused then
        shows in the log only, and the broker's check-back decides the transaction."""
        half = self.send_half(topic, body, tags, keys, properties, queue_id, broker_name)
        try:
            state = local_transaction(half)
        except Exception:
            log.exception("event=local_transaction_failed transactionId=%s",
                          half.transaction_id)
            state = TransactionState.UNKNOWN
        if state is TransactionState.UNKNOWN:
            return TransactionResult(state, half)
        try:
            self.end(half, state, wait=wait_end)
        except BrokerError as e:
            return TransactionResult(state, half, e)
        return TransactionResult(state, half)

    def send_half(self, topic: str, body: bytes, tags: str | None = None,
                  keys: str | list[str] | None = None, properties: dict[str, str] | None = None,
                  queue_id: int | None = None, broker_name: str | None = None) -> HalfSent:
        props = dict(properties or {})
        props[TRAN_MSG] = "true"
        props[PRODUCER_GROUP] = self.group
        key = props.setdefault(PROPERTY_UNIQ_KEY, uuid.uuid4().hex.upper())
        fields, payload = self.producer.send_request(topic, body, tags, keys, props)

        def attempt(cluster: Cluster, address: str, mq: MessageQueue) -> HalfSent:
            resp = cluster.request(address, RequestCode.SEND, {**fields, "queueId": mq.queue_id},
                                   [payload])
            sent = send_results(topic, resp, mq.broker_name)[0]
            given = resp.fields.get("transactionId")
            return HalfSent(topic, given if isinstance(given, str) and given else key, sent, key)

        return self.producer._routed(topic, queue_id, None, broker_name,  # type: ignore[no-any-return]
                                     attempt)

    def end(self, half: HalfSent, state: TransactionState, from_check: bool = False,
            wait: bool = True) -> None:
        """Commit or roll back; BrokerError if the broker refused (MESSAGE_ILLEGAL: decided
        the other way already) or could not be reached (the check decides it then).
        ``wait`` False: sent to the master without waiting for the answer (see
        ``send_in_transaction``)."""
        if state is TransactionState.UNKNOWN:
            raise ValueError("an end is COMMIT or ROLLBACK")
        fields = {"topic": half.topic, "producerGroup": self.group,
                  "commitLogOffset": half.send.commit_log_offset,
                  "tranStateTableOffset": half.send.queue_offset,
                  "commitOrRollback": state.sys_flag, "fromTransactionCheck": int(from_check),
                  "msgId": half.send.msg_id, "transactionId": half.transaction_id}

        def attempt(cluster: Cluster, address: str, _mq: MessageQueue) -> None:
            if not wait:
                future = cluster.transport.call(address, RequestCode.END_TRANSACTION, fields,
                                                timeout_ms=cluster.timeout_ms)
                future.add_done_callback(lambda f: _log_lost_end(f, half.transaction_id))
                return
            resp = cluster.request(address, RequestCode.END_TRANSACTION, fields)
            if resp.code != ResponseCode.SUCCESS:
                raise BrokerError(resp.code, resp.remark)

        self.producer._routed(half.topic, None, None, half.send.broker_name or None, attempt)

    # ---- the broker's check ----------------------------------------------------------------
    def _check(self, _address: str, req: Request) -> Response:
        self.checks += 1
        try:
            half = decode_record(req.bodies[0]) if req.bodies else None
        except ProtocolError as e:
            return Response(ResponseCode.BAD_REQUEST, req.opaque, f"unreadable half: {e}", {},
                            [])
        state = TransactionState.UNKNOWN
        if half is not None:
            try:
                state = TransactionState(self.checker(half))
            except Exception:
                log.exception("event=transaction_checker_failed transactionId=%s",
                              req.fields.get("transactionId"))
        return Response(ResponseCode.SUCCESS, req.opaque, "", {"state": state.value}, [])


def _log_lost_end(future: Any, transaction_id: str) -> None:
    """An end sent without waiting: what became of it goes to the log (the check decides a
    transaction whose end was lost)."""
    try:
        resp = future.result()
    except BrokerError as e:
        log.warning("event=transaction_end_lost transactionId=%s error=%s", transaction_id, e)
        return
    if resp.code != ResponseCode.SUCCESS:
        log.warning("event=transaction_end_refused transactionId=%s code=%s remark=%r",
                    transaction_id, resp.code.name, resp.remark)
