"""The master role: accepts writes (send, send batch, topic creation) and starts the HA service.

A put's BORNHOST is its producer's address as the request server saw the connection
(``Request.born_host``: IP and port of the TCP peer, RocketMQ's channel remote address). A put
goes (on the server's I/O thread)::

    topic check (auto-create with defaultTopicQueueNums, persisted in config/topics.json)
    -> store.put_nowait / put_batch_nowait   append now, under the store's put lock
    -> pending.flushed                        FLUSH_DISK_TIMEOUT under SYNC_FLUSH, else done
    -> replica_waits.admit(put, end, flushed) SYNC_MASTER only (master/group_transfer.py): a
                                              status now, or the put is held as a
                                              ``common.broker.replies.Deferred`` that the I/O thread
                                              answers when acks cover it (FLUSH_SLAVE_TIMEOUT,
                                              SLAVE_NOT_AVAILABLE); the flush wait runs alongside
    -> Response (SUCCESS or the status code, with the offsets: ``queueId``, ``queueOffset`` and
       ``commitLogOffset`` of the first record, ``storeHost`` (the first 16 hex digits of every
       msgId: store IP and port) and, for more than one record, ``offsets`` (each record's
       CommitLog offset). The client builds each msgId as ``storeHost + "%016X" % offset``,
       RocketMQ's offsetMsgId, so the broker formats no per-message strings.)

Hooks for replication (master/ha_service.py, master/group_transfer.py): ``replica_waits`` and
an ``ha_service`` with ``start()``, ``stop()`` and ``slaves() -> list[dict]`` (address, ackOffset,
lagBytes, inSync). A SYNC_MASTER without replica waits cannot get any slave's ack, so its
stored puts answer SLAVE_NOT_AVAILABLE (the message is stored, RocketMQ's meaning).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from common.broker.replies import Reply, reply
from common.broker.tables import MESSAGE_TYPE, MESSAGE_TYPES, TopicTable, TopicTableFull
from common.core import timer as timer_messages
from common.core import transaction as transactions
from common.core.config import BrokerConfig
from common.core.errors import PutStatus, ResponseCode
from common.core.logs import log_event
from common.core.message import (
    PROPERTY_DELAY,
    PROPERTY_SHARDING_KEY,
    SYSFLAG_TRANSACTION_PREPARED,
    Message,
    encode_msg_id,
)
from common.core.subscription import Subscription
from common.core.transaction import TransactionState
from common.format import boundary
from common.format.protocol import SCHEMAS, Request, RequestCode, Response
from common.store.api import WriteStore
from common.store.flush import FLUSHED
from common.store.schedule import born_host_of
from common.store.timer import recall
from master import pop, put_path, send_back
from master.group_transfer import GroupTransfer, ReplicaPut
from master.transaction_check import TransactionCheck

log = logging.getLogger("replog.master")

# store PutStatus -> response code (RocketMQ SendMessageProcessor)
PUT_CODES: dict[PutStatus, ResponseCode] = {
    PutStatus.PUT_OK: ResponseCode.SUCCESS,
    PutStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutStatus.CREATE_MAPPED_FILE_FAILED: ResponseCode.SYSTEM_ERROR,
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.OS_PAGE_CACHE_BUSY: ResponseCode.SYSTEM_BUSY,
    PutStatus.UNKNOWN_ERROR: ResponseCode.SYSTEM_ERROR,
    PutStatus.WHEEL_TIMER_FLOW_CONTROL: ResponseCode.SYSTEM_BUSY,
    PutStatus.WHEEL_TIMER_MSG_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.WHEEL_TIMER_NOT_ENABLE: ResponseCode.MESSAGE_ILLEGAL,
}


class HaService(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...

    def slaves(self) -> list[dict[str, Any]]: ...  # address, ackOffset, lagBytes, inSync

    def slave_acks(self) -> dict[int, int]: ...  # slave id -> acked offset

    def sync_state_set(self) -> dict[str, Any]: ...  # controller mode: the members that count


class MasterRole:
    """SYNC_MASTER or ASYNC_MASTER."""

    def __init__(
        self,
        cfg: BrokerConfig,
        store: WriteStore,
        topics: TopicTable,
        role_name: str = "ASYNC_MASTER",
        replica_waits: GroupTransfer | None = None,
        ha_service: HaService | None = None,
        write_gate: Callable[[], str] | None = None,
        transaction_check: TransactionCheck | None = None,
    ):
        if role_name not in ("SYNC_MASTER", "ASYNC_MASTER"):
            raise ValueError(f"not a master role: {role_name}")
        self.cfg = cfg
        self.store = store
        self.topics = topics
        self._name = role_name
        self.replica_waits = replica_waits
        self.ha_service = ha_service
        # controller mode: "" while this master may take writes, else why not (a fresh lease,
        # still the elected master, no switchover under way: common/broker/controller.py);
        # None without a controller (nothing to ask per write)
        self._write_gate = write_gate
        self.fenced_writes = 0
        self.replication_stopped = True  # a master replicates into nothing
        self.transaction_check = transaction_check  # the check-back (master/transaction_check.py)
        self.pop_revive = pop.PopRevive(self, write_gate)  # POP's DLQ moves (master/pop.py)
        # the plain SENDs of a burst in one C call (master/put_path.py): a master's with
        # ASYNC_FLUSH, on the store's CommitLog, where the extension is built (a SYNC_MASTER's
        # runs held by its replica waits, as the Python path holds its puts)
        commit_log = getattr(store, "commit_log", None)
        sync = role_name == "SYNC_MASTER"
        self.put_path = put_path.PutPath(
            store, topics, _SPECIAL_PROPERTIES, write_gate,
            store_host_text(commit_log.store_ip, commit_log.store_port),
            replica_waits if sync else None, _answer_of,
        ) if (put_path.enabled() and commit_log is not None and cfg.flushDiskType != "SYNC_FLUSH"
              and (not sync or replica_waits is not None)) else None

    @property
    def name(self) -> str:
        return self._name

    def start(self) -> None:
        if self.ha_service is not None:
            self.ha_service.start()
        if self.transaction_check is not None:
            self.transaction_check.start()
        self.pop_revive.start()

    def stop(self) -> None:
        self.pop_revive.stop()
        if self.transaction_check is not None:
            self.transaction_check.stop()
        if self.ha_service is not None:
            self.ha_service.stop()

    def status_fields(self) -> dict[str, Any]:
        slaves = self.ha_service.slaves() if self.ha_service is not None else []
        fields: dict[str, Any] = {"masterAddress": self.cfg.client_address, "slaves": slaves,
                                  "fencedWrites": self.fenced_writes}
        if self.transaction_check is not None:
            fields["transactionCheck"] = self.transaction_check.status()
        if self.ha_service is not None:
            fields["syncStateSet"] = self.ha_service.sync_state_set()
        return fields

    def slave_acks(self) -> dict[int, int]:
        return self.ha_service.slave_acks() if self.ha_service is not None else {}

    def replicating(self) -> bool:
        return False  # a master is replicated from

    def require_epoch(self, epoch: int) -> None:
        """A master follows no one: nothing to require."""

    # -- writes (the server's I/O thread; common/broker/processors/produce.py) ------------------
    def refusal(self, req: Request) -> Response | None:
        """Why this master refuses a write now (controller mode: a lease that is not fresh, a
        lost election, a switchover under way), or None: it takes it."""
        gate = self._write_gate
        if gate is not None:
            fenced = gate()
            if fenced:
                self.fenced_writes += 1
                return reply(req, ResponseCode.SERVICE_NOT_AVAILABLE, fenced)
        return None

    def send(self, req: Request) -> Reply:
        refusal = self._check_queue(req)
        if refusal is not None:
            return refusal
        f = req.fields
        props = dict(f.get("properties") or {})
        delay = f["delayLevel"]
        extra = None
        if delay or f["sysFlag"] & SYSFLAG_TRANSACTION_PREPARED \
                or not _SPECIAL_PROPERTIES.isdisjoint(props):
            checked = self._special_send(req, props)
            if isinstance(checked, Response):
                return checked
            delay, extra = checked
        if PROPERTY_SHARDING_KEY not in props and self.topics.message_type(f["topic"]) == "FIFO":
            return _no_message_group(req, f["topic"])
        msg = Message(
            f["topic"],
            req.bodies[0],
            f.get("tags"),
            f.get("keys"),
            props,
            f["flag"],
            delay,
            sys_flag=f["sysFlag"],
        )
        pending = self.store.put_nowait(msg, f["queueId"], born_host=req.born_host,
                                        born_timestamp=f.get("bornTimestamp")
                                        or int(time.time() * 1000))
        return self._after_append(req, pending, extra)

    def _special_send(self, req: Request,
                      props: dict[str, str]) -> tuple[int, dict[str, str] | None] | Response:
        """A SEND with a delay, a transaction or a timer (or a property only the broker sets):
        its delay level and the answer's extra fields, or its refusal."""
        f = req.fields
        delay = f["delayLevel"] or _delay_property(props)
        if delay is None:
            return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                         f"property {PROPERTY_DELAY}={props[PROPERTY_DELAY]!r} is not a "
                         "delay level (an integer 0-64)")
        if f["sysFlag"] & SYSFLAG_TRANSACTION_PREPARED and not transactions.is_half(props):
            return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                         f"sysFlag TRANSACTION_PREPARED without {transactions.TRAN_MSG}=true: a "
                         "half message carries both")
        reserved = boundary.broker_only(props)
        if reserved is not None:
            return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                         f"property {reserved} is set by the broker, not by a producer")
        extra = None
        if transactions.is_half(props):  # the id its END must name: the broker's, not guessed
            tx_id = props[transactions.TRANSACTION_ID] = transactions.new_transaction_id()
            extra = {"transactionId": tx_id}
        if recall.is_timer_send(props, delay):
            stamped = recall.stamp(props, int(time.time() * 1000))
            if stamped is not None:
                handle = recall.RecallHandle(f["topic"], self.cfg.brokerName, *stamped)
                extra = {"recallHandle": handle.encode()}
        return delay, extra

    def recall(self, req: Request) -> Reply:
        """RECALL_MESSAGE: a delete marker for the timer message the handle names (see
        ``common/store/timer/recall.py``), answered like a SEND once stored (and replicated)."""
        f = req.fields
        try:
            handle = recall.RecallHandle.decode(f["recallHandle"])
        except ValueError as e:
            return reply(req, ResponseCode.MESSAGE_ILLEGAL, f"recall refused: {e}")
        why = boundary.text_refusal(handle.uniq_key)
        if why is not None:  # it goes into the marker's TIMER_DEL_UNIQKEY
            return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                         f"recall refused: the handle's message key {why}")
        if handle.topic != f["topic"]:
            return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                         f"recall refused: the handle is of topic {handle.topic}, not "
                         f"{f['topic']}")
        if handle.broker_name != self.cfg.brokerName:
            return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                         f"recall refused: the handle is of broker group {handle.broker_name}, "
                         f"this is {self.cfg.brokerName}")
        if handle.deliver_ms <= int(time.time() * 1000):
            return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                         f"recall refused: the message was due at {handle.deliver_ms}: it is "
                         "delivered already, or being delivered")
        pending = self.store.put_nowait(recall.delete_marker(handle), 0,
                                        born_host=req.born_host,
                                        born_timestamp=int(time.time() * 1000))
        return self._after_append(req, pending, {"msgId": handle.uniq_key})

    def end_transaction(self, req: Request) -> Reply:
        """END_TRANSACTION: commit or roll back the half at ``commitLogOffset``, once
        (``common/store/transaction/service.py``); answered like a SEND of its last record
        (SYNC_MASTER: once the SyncStateSet holds it). A final state is final: the other end
        is refused, the same one answered again without a write."""
        f = req.fields
        state = TransactionState.of_sys_flag(f["commitOrRollback"])
        if state is TransactionState.UNKNOWN:  # RocketMQ's NOT_TYPE: nothing to do yet
            return reply(req, fields={"state": state.value})
        tx = self.store.transactions
        half = tx.half_at(f["commitLogOffset"])
        if half is None:
            return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                         f"end refused: no half message starts at commitLogOffset "
                         f"{f['commitLogOffset']}")
        tx_id = half.properties.get(transactions.TRANSACTION_ID, "")
        why = boundary.end_refusal(half.properties, f["producerGroup"], f["topic"],
                          f.get("transactionId") or "")
        if why is not None:
            return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                         f"end refused: the half message at {f['commitLogOffset']} does not "
                         f"match: {why}")
        result = tx.end(half, state, req.born_host)
        if result.conflict is not None:
            return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                         f"end refused: transaction {tx_id} was decided already "
                         f"({result.conflict.value}); a final state is final",
                         {"state": result.conflict.value})
        if result.pending is None:  # decided so before: nothing more to write
            return reply(req, fields={"state": state.value, "repeated": 1})
        return self._after_append(req, result.pending, {"state": state.value})

    def send_batch(self, req: Request) -> Reply:
        refusal = self._check_queue(req)
        if refusal is not None:
            return refusal
        f = req.fields
        meta = f.get("meta")
        if self.topics.message_type(f["topic"]) == "FIFO" and (
                meta is None or any(not m or not m[2] or PROPERTY_SHARDING_KEY not in m[2]
                                    for m in meta)):
            return _no_message_group(req, f["topic"])
        if meta is not None:
            for m in meta:
                props = m[2]
                if not props:
                    continue
                if PROPERTY_DELAY in props or timer_messages.requested(props) \
                        or transactions.is_half(props):
                    return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                                 "a batch cannot hold delayed, timer or transactional messages "
                                 "(RocketMQ refuses them too): send them one by one")
                reserved = boundary.broker_only(props)
                if reserved is not None:
                    return reply(req, ResponseCode.MESSAGE_ILLEGAL,
                                 f"property {reserved} is set by the broker, not by a producer")
        msgs = _batch_messages(f["topic"], req.bodies, meta)
        pending = self.store.put_batch_nowait(
            f["topic"], f["queueId"], msgs, born_host=req.born_host,
            born_timestamp=f.get("bornTimestamp") or int(time.time() * 1000))
        return self._after_append(req, pending)

    def create_topic(self, req: Request) -> Response:
        return self._create_topic(req)

    def send_back(self, req: Request, max_reconsume_times: int) -> Reply:
        return self._send_back(req, max_reconsume_times)

    # ---- POP (master/pop.py) -------------------------------------------------------------
    def pop_message(self, req: Request, sub: Subscription, queues: list[int],
                    start: Callable[[int], int], order: bool,
                    max_reconsume_times: int) -> Reply:
        return pop.pop_message(self, req, sub, queues, start, order, max_reconsume_times)

    def ack_message(self, req: Request) -> Reply:
        return pop.ack_message(self, req)

    def batch_ack(self, req: Request) -> Reply:
        return pop.batch_ack(self, req)

    def change_invisible(self, req: Request) -> Reply:
        return pop.change_invisible(self, req)

    def when_durable(self, pending: Any, answer: Callable[[PutStatus], Response]) -> Reply:
        """``answer(status)`` once the appended ``pending`` is as durable as a SEND waits
        for (flushed under SYNC_FLUSH; SYNC_MASTER: replicated, or the status says not)."""
        flushed: concurrent.futures.Future[PutStatus] = pending.flushed
        waits = self.replica_waits
        if self._name == "SYNC_MASTER" and waits is not None:
            held = _Held(waits, answer)
            status = waits.admit(held, pending.result.end_phy_offset, flushed)
            return held if status is None else answer(status)
        if flushed.done():
            return answer(self._flushed_status(_status_of(flushed)))
        out: concurrent.futures.Future[Response] = concurrent.futures.Future()
        flushed.add_done_callback(
            lambda f: out.set_result(answer(self._flushed_status(_status_of(f)))))
        return out

    def _flushed_status(self, status: PutStatus) -> PutStatus:
        if status == PutStatus.PUT_OK and self._name == "SYNC_MASTER":
            return PutStatus.SLAVE_NOT_AVAILABLE  # no replication service: no slave acks
        return status

    def put_answer(self, req: Request, status: PutStatus, fields: dict[str, Any]) -> Response:
        return _put_reply(req, status, fields)

    def refused_put(self, req: Request, pending: Any) -> Response:
        result = pending.result
        why = f": {result.remark}" if result.remark else ""
        return reply(req, PUT_CODES.get(result.status, ResponseCode.SYSTEM_ERROR),
                     f"put refused: {result.status.value}{why}")

    def ensure_topic(self, topic: str) -> None:
        """A topic the broker writes to on its own (a DLQ): one queue, made on first use."""
        if self.topics.queue_nums(topic) == 0:
            self.topics.create(topic, 1)

    def _create_topic(self, req: Request) -> Response:
        """CREATE_TOPIC (RocketMQ's updateTopic): make a topic, or give one more queues. Fewer
        queues are refused, as Kafka refuses fewer partitions: producers and consumers would
        stop seeing the queues cut off, and the messages in them."""
        topic, nums = req.fields["topic"], req.fields["queueNums"]
        attributes = req.fields.get("attributes")
        if attributes is not None:
            unknown = sorted(set(attributes) - {MESSAGE_TYPE})
            if unknown:
                return reply(req, ResponseCode.BAD_REQUEST, f"topic attribute {unknown[0]}: "
                             f"the attributes known are {MESSAGE_TYPE}", {"field": "attributes"})
            if attributes.get(MESSAGE_TYPE, "NORMAL") not in MESSAGE_TYPES:
                return reply(req, ResponseCode.BAD_REQUEST, f"{MESSAGE_TYPE} "
                             f"{attributes[MESSAGE_TYPE]!r}: one of {', '.join(MESSAGE_TYPES)}",
                             {"field": "attributes"})
        have = self.topics.queue_nums(topic)
        if nums < have:
            return reply(req, ResponseCode.BAD_REQUEST,
                         f"topic {topic} has {have} queues: a topic cannot shrink to {nums} "
                         "(the messages in the queues cut off would be unreachable)")
        if nums != have or (attributes is not None
                            and attributes != self.topics.attributes(topic)):
            try:
                self.topics.create(topic, nums, attributes)
            except TopicTableFull as e:
                return reply(req, ResponseCode.BAD_REQUEST, str(e))
            log_event(log, "topic_created" if have == 0 else "topic_grown", topic=topic,
                      queues=nums, before=have, attributes=attributes or {})
        return reply(req, fields={"queueNums": nums, "before": have,
                                  "attributes": self.topics.attributes(topic)})

    def _send_back(self, req: Request, max_reconsume_times: int) -> Reply:
        """CONSUMER_SEND_MSG_BACK: store the consumer's failed message again, into its group's
        retry topic (delayed) or DLQ (``master/send_back.py``); answered as a SEND of the copy."""
        f = req.fields
        offset = f["offset"]
        try:
            stored = self.store.find_message(offset)
            back = send_back.plan(stored, f["group"], f["originTopic"], f["delayLevel"],
                                  max_reconsume_times, len(self.store.delay_levels_ms),
                                  f.get("originMsgId") or "")
        except (LookupError, send_back.SendBackRefused) as e:
            return reply(req, ResponseCode.MESSAGE_ILLEGAL, f"send-back refused: {e}")
        topic = back.message.topic
        if self.topics.queue_nums(topic) == 0:  # RocketMQ creates both on first use, one queue
            try:
                self.topics.create(topic, 1)
            except TopicTableFull as e:
                return reply(req, ResponseCode.MESSAGE_ILLEGAL, f"send-back refused: {e}")
        log_event(log, "dead_letter" if back.dead else "send_back", group=f["group"],
                  offset=offset, topic=topic, reconsume=back.message.reconsume_times,
                  delay=back.message.delay_level)
        return self._after_append(req, self.store.put_nowait(
            back.message, 0, born_host_of(stored), stored.born_timestamp), {"topic": topic})

    def _check_queue(self, req: Request) -> Response | None:
        topic = req.fields["topic"]
        nums = self.topics.queue_nums(topic)
        if nums == 0:
            if not self.cfg.autoCreateTopicEnable:
                return reply(
                    req,
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"topic {topic} does not exist and autoCreateTopicEnable is off",
                )
            nums = self.cfg.defaultTopicQueueNums
            try:
                self.topics.create(topic, nums)
            except TopicTableFull as e:
                return reply(req, ResponseCode.TOPIC_NOT_EXIST, str(e))
        queue_id = req.fields["queueId"]
        if queue_id >= nums:
            return reply(
                req,
                ResponseCode.MESSAGE_ILLEGAL,
                f"queueId {queue_id} is illegal: topic {topic} has {nums} queues",
            )
        return None

    def _after_append(self, req: Request, pending: Any,
                      extra: dict[str, Any] | None = None) -> Reply:
        result = pending.result
        if result.status != PutStatus.PUT_OK:
            code = PUT_CODES.get(result.status, ResponseCode.SYSTEM_ERROR)
            why = f": {result.remark}" if result.remark else ""
            return reply(req, code, f"put refused: {result.status.value}{why}")
        fields = {
            "queueId": result.queue_id,
            "queueOffset": result.queue_offset,
            "commitLogOffset": result.phy_offset,
            "storeHost": store_host_text(result.store_ip, result.store_port),
        }
        if len(result.record_offsets) > 1:
            fields["offsets"] = list(result.record_offsets)
        if extra:
            fields.update(extra)
        flushed: concurrent.futures.Future[PutStatus] = pending.flushed
        end = result.phy_offset + result.wrote_bytes
        waits = self.replica_waits
        if self._name == "SYNC_MASTER" and waits is not None:
            put = _SyncPut(waits, req, fields)
            status = waits.admit(put, end, flushed)
            return put if status is None else _put_reply(req, status, fields)
        if flushed is FLUSHED:  # ASYNC_FLUSH: nothing to wait for
            return self._after_flush(req, PutStatus.PUT_OK, fields)
        if flushed.done():
            return self._after_flush(req, _status_of(flushed), fields)
        out: concurrent.futures.Future[Response] = concurrent.futures.Future()
        flushed.add_done_callback(
            lambda f: out.set_result(self._after_flush(req, _status_of(f), fields))
        )
        return out

    def _after_flush(self, req: Request, status: PutStatus, fields: dict[str, Any]) -> Response:
        """ASYNC_MASTER, or a SYNC_MASTER with no replica waits (no slave can acknowledge)."""
        if status != PutStatus.PUT_OK or self._name == "ASYNC_MASTER":
            return _put_reply(req, status, fields)
        return _put_reply(
            req,
            PutStatus.SLAVE_NOT_AVAILABLE,
            fields,
            "no replication service: no slave can acknowledge",
        )


class _Held(ReplicaPut):
    """A write held on the I/O thread until its replica ack (and flush) are known, answered
    by ``answer`` (POP's requests)."""

    __slots__ = ("respond",)

    def __init__(self, owner: GroupTransfer, respond: Callable[[PutStatus], Response]) -> None:
        super().__init__(owner)
        self.respond = respond

    def reply(self, status: PutStatus) -> Response:
        return self.respond(status)


class _SyncPut(ReplicaPut):
    """A SYNC put held on the I/O thread until its replica ack (and flush) are known."""

    __slots__ = ("fields", "req")

    def __init__(self, owner: GroupTransfer, req: Request, fields: dict[str, Any]) -> None:
        super().__init__(owner)
        self.req = req
        self.fields = fields

    def reply(self, status: PutStatus) -> Response:
        return _put_reply(self.req, status, self.fields)


@functools.lru_cache(maxsize=64)
def store_host_text(store_ip: bytes, store_port: int) -> str:
    """The msgId prefix of a store host: 8 hex digits of IPv4, 8 of the port (uppercase)."""
    return encode_msg_id(store_ip, store_port, 0)[:16]


def _status_of(fut: concurrent.futures.Future[PutStatus]) -> PutStatus:
    try:
        return fut.result()
    except Exception:  # noqa: BLE001 - a failed wait is reported, the record is already stored
        return PutStatus.UNKNOWN_ERROR


def _put_reply(
    req: Request, status: PutStatus, fields: dict[str, Any], remark: str = ""
) -> Response:
    code = PUT_CODES.get(status, ResponseCode.SYSTEM_ERROR)
    if status.stored:
        return reply(
            req, code, remark or ("" if code == ResponseCode.SUCCESS else status.value), fields
        )
    return reply(req, code, remark or f"put failed after append: {status.value}")


MAX_DELAY_LEVEL = SCHEMAS[RequestCode.SEND]["delayLevel"].hi
# a SEND whose properties hold none of these (and with no delay level, no prepared sysflag)
# is a plain one: ``_special_send``'s checks (the broker-only properties' refusal among them)
# are skipped, one set look-up instead
_SPECIAL_PROPERTIES = frozenset((PROPERTY_DELAY, transactions.TRAN_MSG,
                                 *timer_messages.REQUESTED, *boundary.BROKER_ONLY_PROPERTIES))


class _Opaque(NamedTuple):
    opaque: int


def _answer_of(opaque: int, status: PutStatus, fields: dict[str, Any]) -> Response:
    """The answer to a put of the native path that ended with ``status`` (``_put_reply``)."""
    return _put_reply(_Opaque(opaque), status, fields)  # type: ignore[arg-type]


def _no_message_group(req: Request, topic: str) -> Response:
    return reply(req, ResponseCode.MESSAGE_ILLEGAL, f"topic {topic} is a FIFO topic "
                 f"({MESSAGE_TYPE}=FIFO): each message needs a message group "
                 f"({PROPERTY_SHARDING_KEY}, a producer's shard_key), which keeps its order")


def _delay_property(props: dict[str, str]) -> int | None:
    """The delay level a SEND carries in its DELAY property (RocketMQ's carrier: a 4.x client
    sets only that); 0 when absent, None when it is not a level."""
    text = props.get(PROPERTY_DELAY)
    if text is None:
        return 0
    try:
        level = int(text)
    except ValueError:
        return None
    return level if 0 <= level <= MAX_DELAY_LEVEL else None


def _batch_messages(
    topic: str, bodies: list[bytes], meta: list[Any] | None
) -> list[Message] | list[bytes]:
    if meta is None:
        return bodies  # bodies alone: the store prepares them without a Message each
    return [
        Message(topic, body, tags, keys, dict(props), flag, sys_flag=sys_flag)
        for body, (tags, keys, props, flag, sys_flag) in zip(bodies, meta, strict=True)
    ]
