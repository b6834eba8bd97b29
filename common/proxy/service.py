"""The RPCs of ``apache.rocketmq.v2.MessagingService``, each translated into replog's requests
by replog's clients (``convert.py`` maps the messages and answers).

Served: QueryRoute (every broker group's queues of the topic, with the endpoint the client
asked and the queues' permissions and message types), Heartbeat, SendMessage (normal, FIFO by
message group, delayed by delivery timestamp, transactional halves), RecallMessage,
EndTransaction, Telemetry (the settings exchange, and the broker's transaction checks handed
to a client as RecoverOrphanedTransactionCommand), NotifyClientTermination, QueryAssignment,
ReceiveMessage (POP, long polling), AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue. Every other RPC
answers NOT_IMPLEMENTED with a message naming it, never a hang (a streaming one: one response
carrying that status). Blocking client calls run on the event loop's bounded executor, never
on the loop; sends go through ``Producer.send_async`` and hold no thread.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from common.client import Admin, Producer, SimpleConsumer
from common.client.results import SendResult
from common.client.simple_consumer import pop_fields
from common.client.transaction import HalfSent, TransactionProducer
from common.core.errors import BrokerError, ResponseCode, SendStatus
from common.core.keys import ClientKeys
from common.core.message import PROPERTY_REAL_TOPIC
from common.core.pop import HANDLE_VERSION, ReceiptHandle
from common.core.transaction import TRANSACTION_ID, TransactionState
from common.format.acl import PUB, SUB
from common.format.protocol import ProtocolError, Request, RequestCode, Response, decode_record
from common.format.tables import GroupConfig
from common.proxy import convert
from common.proxy.auth import GrpcAuth, Need
from common.proxy.local import LocalBroker, LocalConsume, LocalSend

log = logging.getLogger("replog.proxy")

ATTRIBUTES_TTL_S = 5.0  # topics' message types are read from the masters at most this often
DEFAULT_INVISIBLE_MS = 30_000  # a receive that names no invisible duration (RocketMQ's proxy's)
MAX_LONG_POLLING_MS = 30_000  # the longest a receive waits (the brokers' longPollingMaxMs)
LONG_POLLING_MS = 20_000  # what the settings tell a push consumer to wait per receive
RECEIVE_SLICE_MS = 1_000  # a receive's long poll, one blocking call at a time
GROUPS_TTL_S = 5.0  # consumer groups' configs are read from the masters at most this often
# consumer groups whose POP view is kept (least recently used forgotten first): a view is a few
# Python objects on the one shared client, so a caller naming new groups costs no thread
GROUP_VIEWS = 1024
# the producer group of the halves a front end sends (any front end of the cluster answers
# the broker's check of any of them, by asking a client of the half's topic)
TRANSACTION_GROUP = "replog_proxy_tx"
UNSERVED = ("UpdateOffset", "GetOffset", "QueryOffset", "SyncLiteSubscription")
UNSERVED_STREAMS = {"PullMessage": rpc.PullMessageResponse}


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    """One proxy's RPCs over one replog cluster (``servers``: any of its brokers)."""

    def __init__(self, servers: list[str], max_body_size: int, timeout_ms: int = 5000,
                 auth: GrpcAuth | None = None, curve: ClientKeys | None = None,
                 local: LocalBroker | None = None):
        self.servers = servers
        self.max_body_size = max_body_size
        self.timeout_ms = timeout_ms
        self.auth = auth  # aclEnable: every call signed and checked (auth.py)
        self.curve = curve  # aclEnable: the key the front end reaches the brokers with
        # in the broker: its blocking calls to that broker go in-process (local.py)
        self._in_process = {} if local is None else dict.fromkeys(local.addresses, local.calls)
        self.producer = Producer(servers, timeout_ms=timeout_ms, curve=curve,
                                 in_process=self._in_process)
        # in the broker (grpcServerPort): plain sends to it, and its POPs and acks, in-process
        # on the event loop (local.py)
        self.local = None if local is None else LocalSend(local, self.producer)
        self.local_consume = None if local is None else LocalConsume(local, timeout_ms)
        self.admin = Admin(servers, timeout_ms=timeout_ms, curve=curve)
        # the POP client of every consumer group: one transport, a view per group (for_group)
        self._pop_client = SimpleConsumer(servers, "", timeout_ms=timeout_ms, curve=curve,
                                          in_process=self._in_process)
        self._consumers: collections.OrderedDict[str, SimpleConsumer] = \
            collections.OrderedDict()  # consumer group -> its view, most recent last
        self._consumers_lock = threading.Lock()
        self._groups: dict[str, GroupConfig] = {}
        self._groups_at = float("-inf")
        # transactions: halves sent as TRANSACTION_GROUP; the broker's checks of them are
        # handed to a client publishing the half's topic (RecoverOrphanedTransactionCommand on
        # its telemetry stream), which ends the transaction by EndTransaction
        self.tx = TransactionProducer(servers, TRANSACTION_GROUP,
                                      lambda _half: TransactionState.UNKNOWN,
                                      timeout_ms=timeout_ms, curve=curve)
        self.tx.producer._transport.serve(RequestCode.CHECK_TRANSACTION_STATE, self._check_back)
        self._streams: dict[int, _Stream] = {}
        self._stream_ids = itertools.count()
        self._streams_lock = threading.Lock()
        self.checks_forwarded = 0
        self.checks_unanswered = 0
        self.stopping = threading.Event()  # set before the calls under way are waited out
        self._attrs: dict[str, dict[str, str]] = {}
        self._attrs_at = float("-inf")
        self._attrs_lock = threading.Lock()

    def close(self) -> None:
        """Close the clients: only once no call uses them (a ZeroMQ socket closed under a
        thread that is using it aborts the process: the server waits its calls out first)."""
        self.tx.close()
        self.producer.close()
        self.admin.close()
        with self._consumers_lock:
            self._consumers.clear()  # views: nothing of their own to close
        self._pop_client.close()

    def _consumer(self, group: str) -> SimpleConsumer:
        """The group's POP client: a view on the one shared client (no thread of its own);
        at most GROUP_VIEWS are kept, a view forgotten is made again when asked."""
        with self._consumers_lock:
            consumer = self._consumers.get(group)
            if consumer is None:
                consumer = self._consumers[group] = self._pop_client.for_group(group)
                if len(self._consumers) > GROUP_VIEWS:
                    self._consumers.popitem(last=False)
            else:
                self._consumers.move_to_end(group)
            return consumer

    def _refused(self, context: Any, needs: list[Need]) -> pb.Status | None:
        """With aclEnable: the status refusing the call (not signed by an account, or the
        account lacks one of ``needs``), or None; without: None."""
        return None if self.auth is None else self.auth.check(context, needs)

    # ---- routes -----------------------------------------------------------------------------
    async def QueryRoute(self, request: rpc.QueryRouteRequest,
                         context: Any) -> rpc.QueryRouteResponse:
        topic = request.topic.name
        if refused := self._refused(context, [("topic", topic, PUB | SUB)]):
            return rpc.QueryRouteResponse(status=refused)
        try:
            table, message_type = await asyncio.to_thread(self._route, topic)
        except BrokerError as e:
            return rpc.QueryRouteResponse(status=convert.error_status(e))
        queues = table.queues(topic)
        if not queues:
            return rpc.QueryRouteResponse(status=convert.status(
                pb.TOPIC_NOT_FOUND, f"no broker group of the cluster holds topic {topic}"))
        accepted = convert.accepted_types(message_type)
        return rpc.QueryRouteResponse(status=convert.status(pb.OK), message_queues=[
            pb.MessageQueue(topic=request.topic, id=mq.queue_id,
                            permission=convert.permission(table.perm(topic, mq.broker_name)),
                            broker=pb.Broker(name=mq.broker_name, id=0,
                                             endpoints=request.endpoints),
                            accept_message_types=accepted)
            for mq in queues])

    def _route(self, topic: str) -> tuple[Any, str]:
        table = self.admin.route_table()
        if not table.queues(topic):
            table = self.admin.route_table(fresh=True)  # made since the table was read?
        return table, self._attributes(topic).get("message.type", "")

    def _group(self, group: str) -> GroupConfig:
        """The consumer group's config (subscriptionGroup.json; the defaults for a group not
        made yet: its first POP makes it)."""
        with self._attrs_lock:  # a group made or changed is seen within GROUPS_TTL_S
            if time.monotonic() - self._groups_at > GROUPS_TTL_S:
                self._groups = {name: config for by_group in self.admin.group_configs().values()
                                for name, config in by_group.items()}
                self._groups_at = time.monotonic()
            return self._groups.get(group) or GroupConfig(group)

    async def QueryAssignment(self, request: rpc.QueryAssignmentRequest,
                              context: Any) -> rpc.QueryAssignmentResponse:
        """A push consumer's queues: one per broker group holding the topic (id -1: every
        queue there; POP needs no rebalance), at the endpoint the client asked."""
        topic = request.topic.name
        if refused := self._refused(context, [("topic", topic, SUB),
                                              ("group", request.group.name, SUB)]):
            return rpc.QueryAssignmentResponse(status=refused)
        try:
            table, message_type = await asyncio.to_thread(self._route, topic)
        except BrokerError as e:
            return rpc.QueryAssignmentResponse(status=convert.error_status(e))
        groups = sorted({mq.broker_name for mq in table.queues(topic)})
        if not groups:
            return rpc.QueryAssignmentResponse(status=convert.status(
                pb.TOPIC_NOT_FOUND, f"no broker group of the cluster holds topic {topic}"))
        accepted = convert.accepted_types(message_type)
        return rpc.QueryAssignmentResponse(status=convert.status(pb.OK), assignments=[
            pb.Assignment(message_queue=pb.MessageQueue(
                topic=request.topic, id=-1,
                permission=convert.permission(table.perm(topic, name)),
                broker=pb.Broker(name=name, id=0, endpoints=request.endpoints),
                accept_message_types=accepted))
            for name in groups])

    def _attributes(self, topic: str) -> dict[str, str]:
        """The topic's attributes, read again every ATTRIBUTES_TTL_S, or after a second for a
        topic that had none (most have none: they are not read again at every route)."""
        with self._attrs_lock:
            age = time.monotonic() - self._attrs_at
            if age > ATTRIBUTES_TTL_S or (topic not in self._attrs and age > 1.0):
                self._attrs = self.admin.topic_attributes()
                self._attrs_at = time.monotonic()
            return self._attrs.get(topic, {})

    # ---- clients ------------------------------------------------------------------------------
    async def Heartbeat(self, request: rpc.HeartbeatRequest,
                        context: Any) -> rpc.HeartbeatResponse:
        if refused := self._refused(context, _group_need(request.group.name)):
            return rpc.HeartbeatResponse(status=refused)
        return rpc.HeartbeatResponse(status=convert.status(pb.OK))

    async def NotifyClientTermination(
            self, request: rpc.NotifyClientTerminationRequest,
            context: Any) -> rpc.NotifyClientTerminationResponse:
        if refused := self._refused(context, _group_need(request.group.name)):
            return rpc.NotifyClientTerminationResponse(status=refused)
        return rpc.NotifyClientTerminationResponse(status=convert.status(pb.OK))

    async def Telemetry(self, request_iterator: AsyncIterator[rpc.TelemetryCommand],
                        context: Any) -> AsyncIterator[rpc.TelemetryCommand]:
        """The settings exchange: each settings the client sends is answered with the
        proxy's (its own, with the largest body replog stores and message types checked); with
        aclEnable a call not signed by an account ends at once, and settings asking for what
        the account may not are answered with the refusal."""
        if refused := self._refused(context, []):
            yield rpc.TelemetryCommand(status=refused)
            return
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), set())
        with self._streams_lock:
            stream_id = next(self._stream_ids)
            self._streams[stream_id] = stream

        async def read() -> None:
            try:
                async for command in request_iterator:
                    if not command.HasField("settings"):
                        continue
                    if refused := self._refused(context, _settings_needs(command.settings)):
                        await stream.out.put(rpc.TelemetryCommand(status=refused))
                    else:
                        await stream.out.put(await self._settings_reply(command.settings,
                                                                        stream))
            finally:
                await stream.out.put(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await stream.out.get()) is not None:
                yield item
        finally:
            reader.cancel()
            with self._streams_lock:
                self._streams.pop(stream_id, None)

    async def _settings_reply(self, given: pb.Settings,
                              stream: _Stream) -> rpc.TelemetryCommand:
        settings = pb.Settings()
        settings.CopyFrom(given)
        if settings.HasField("publishing"):
            settings.publishing.max_body_size = self.max_body_size
            settings.publishing.validate_message_type = True
            stream.topics = {t.name for t in settings.publishing.topics}
        if settings.HasField("subscription"):
            try:
                config = await asyncio.to_thread(self._group, settings.subscription.group.name)
            except BrokerError as e:
                return rpc.TelemetryCommand(status=convert.error_status(e))
            self._consumer_settings(settings, config)
        return rpc.TelemetryCommand(status=convert.status(pb.OK), settings=settings)

    @staticmethod
    def _consumer_settings(settings: pb.Settings, config: GroupConfig) -> None:
        """What RocketMQ's proxy tells a consumer: FIFO when its group is
        consumeMessageOrderly, its deliveries before the DLQ (retryMaxTimes + 1), a batch and
        a long-polling time per receive."""
        sub = settings.subscription
        sub.fifo = config.consume_message_orderly
        sub.receive_batch_size = 32
        sub.long_polling_timeout.seconds = LONG_POLLING_MS // 1000
        policy = settings.backoff_policy
        policy.max_attempts = config.retry_max_times + 1
        policy.exponential_backoff.initial.seconds = 1
        policy.exponential_backoff.max.seconds = 60
        policy.exponential_backoff.multiplier = 2.0

    # ---- sends ----------------------------------------------------------------------------------
    async def SendMessage(self, request: rpc.SendMessageRequest,
                          context: Any) -> rpc.SendMessageResponse:
        messages = request.messages
        if not messages:
            return rpc.SendMessageResponse(status=convert.status(
                pb.BAD_REQUEST, "no message to send"))
        if self.auth is not None and (refused := self._refused(context, [
                ("topic", t, PUB) for t in sorted({m.topic.name for m in messages})])):
            return rpc.SendMessageResponse(status=refused)
        if len(messages) == 1:  # what the official producers send
            entries = [await self._send_one(messages[0])]
        else:
            entries = [await self._send_one(msg) for msg in messages]
        first_bad = next((e.status for e in entries if e.status.code != pb.OK), None)
        return rpc.SendMessageResponse(status=first_bad or convert.status(pb.OK),
                                       entries=entries)

    async def _send_one(self, msg: pb.Message) -> rpc.SendResultEntry:
        """A message to replog's Producer: ``send_async`` (sends under way to one queue
        travel together, and no thread waits), ``send`` for a delayed one."""
        try:
            out = convert.outgoing(msg)
        except ValueError as e:
            return rpc.SendResultEntry(status=convert.status(pb.BAD_REQUEST, str(e)))
        if len(out.body) > self.max_body_size:
            return rpc.SendResultEntry(status=convert.status(
                pb.MESSAGE_BODY_TOO_LARGE, f"body of {len(out.body)} bytes: at most "
                f"{self.max_body_size}"))
        if out.message_type == pb.TRANSACTION:
            return await self._send_half(out)
        args = out.send_args()
        try:
            if self.local is not None and out.shard_key is None and out.deliver_at_ms is None:
                result = await self.local.send(out.topic, out.body, out.tags, args["keys"],
                                               out.properties)
                if result is not None:
                    return _sent(out, result)
            if out.deliver_at_ms is None:
                del args["deliver_at"]
                result = await asyncio.wrap_future(
                    self.producer.send_async(out.topic, out.body, **args))
            else:
                result = await asyncio.to_thread(self.producer.send, out.topic, out.body,
                                                 **args)
        except BrokerError as e:
            return rpc.SendResultEntry(status=convert.error_status(e),
                                       message_id=out.message_id)
        return _sent(out, result)

    async def RecallMessage(self, request: rpc.RecallMessageRequest,
                            context: Any) -> rpc.RecallMessageResponse:
        """Cancel a delayed message not due yet, by the recall handle its send returned."""
        if refused := self._refused(context, [("topic", request.topic.name, PUB)]):
            return rpc.RecallMessageResponse(status=refused)
        try:
            key = await asyncio.to_thread(self.producer.recall, request.topic.name,
                                          request.recall_handle)
        except BrokerError as e:
            return rpc.RecallMessageResponse(status=convert.error_status(e))
        return rpc.RecallMessageResponse(status=convert.status(pb.OK), message_id=key)

    # ---- transactions -----------------------------------------------------------------------------
    async def _send_half(self, out: convert.Outgoing) -> rpc.SendResultEntry:
        try:
            half = await asyncio.to_thread(self.tx.send_half, out.topic, out.body, out.tags,
                                           out.keys or None, out.properties)
        except BrokerError as e:
            return rpc.SendResultEntry(status=convert.error_status(e),
                                       message_id=out.message_id)
        sent = half.send
        return rpc.SendResultEntry(
            status=convert.status(convert.SEND_CODES[sent.status], sent.status.value),
            message_id=out.message_id or half.message_id, offset=sent.queue_offset,
            transaction_id=convert.transaction_id(
                sent.broker_name, half.topic, sent.commit_log_offset, sent.queue_offset,
                sent.msg_id, half.transaction_id))

    async def EndTransaction(self, request: rpc.EndTransactionRequest,
                             context: Any) -> rpc.EndTransactionResponse:
        """COMMIT or ROLLBACK a half by the transaction id its send (or its check) gave."""
        try:
            broker, topic, clo, qo, msg_id, token = convert.parse_transaction_id(
                request.transaction_id)
        except ValueError as e:
            if refused := self._refused(context, [("topic", request.topic.name, PUB)]):
                return rpc.EndTransactionResponse(status=refused)
            return rpc.EndTransactionResponse(status=convert.status(pb.INVALID_TRANSACTION_ID,
                                                                    str(e)))
        if refused := self._refused(context, [("topic", topic, PUB)]):
            return rpc.EndTransactionResponse(status=refused)
        state = {pb.COMMIT: TransactionState.COMMIT,
                 pb.ROLLBACK: TransactionState.ROLLBACK}.get(request.resolution)
        if state is None:
            return rpc.EndTransactionResponse(status=convert.status(
                pb.BAD_REQUEST, "a resolution is COMMIT or ROLLBACK"))
        half = HalfSent(topic, token, SendResult(SendStatus.SEND_OK, msg_id, 0, qo, clo, topic,
                                                broker))
        try:
            await asyncio.to_thread(self.tx.end, half, state,
                                    request.source == pb.SOURCE_SERVER_CHECK)
        except BrokerError as e:
            return rpc.EndTransactionResponse(status=convert.error_status(e))
        return rpc.EndTransactionResponse(status=convert.status(pb.OK))

    def _check_back(self, address: str, req: Request) -> Response:
        """The broker asks what became of a half (on the transaction producer's requests
        thread): handed to a client that publishes its topic, which answers by
        EndTransaction; answered UNKNOWN here (the broker asks again later if no end came)."""
        unknown = Response(ResponseCode.SUCCESS, req.opaque, "",
                           {"state": TransactionState.UNKNOWN.value}, [])
        try:
            half = decode_record(req.bodies[0]) if req.bodies else None
        except ProtocolError:
            half = None
        topic = half.properties.get(PROPERTY_REAL_TOPIC, "") if half is not None else ""
        if half is None or not topic:
            return unknown
        with self._streams_lock:
            streams = [s for s in self._streams.values() if topic in s.topics]
        if not streams:
            self.checks_unanswered += 1
            return unknown
        stream = streams[next(self._stream_ids) % len(streams)]
        broker = self.tx.producer._routes.group_of_address(address)
        command = rpc.TelemetryCommand(
            status=convert.status(pb.OK),
            recover_orphaned_transaction_command=rpc.RecoverOrphanedTransactionCommand(
                message=convert.message_of(half, topic, pb.TRANSACTION),
                transaction_id=convert.transaction_id(
                    broker, topic, half.commit_log_offset, half.queue_offset, half.msg_id,
                    half.properties.get(TRANSACTION_ID, ""))))
        stream.loop.call_soon_threadsafe(stream.out.put_nowait, command)
        self.checks_forwarded += 1
        return unknown

    # ---- consumers (POP) -------------------------------------------------------------------------
    async def ReceiveMessage(self, request: rpc.ReceiveMessageRequest,
                              context: Any) -> AsyncIterator[rpc.ReceiveMessageResponse]:
        """POP from the broker group the request's queue names (every queue of the topic there),
        waiting up to its long-polling timeout: the messages, then their delivery time and the
        status (MESSAGE_NOT_FOUND when none came), as RocketMQ's proxy streams them."""
        group, mq = request.group.name, request.message_queue
        if refused := self._refused(context, [("topic", mq.topic.name, SUB),
                                              ("group", group, SUB)]):
            yield rpc.ReceiveMessageResponse(status=refused)
            return
        invisible = (convert.ms(request.invisible_duration)
                     if request.HasField("invisible_duration") else DEFAULT_INVISIBLE_MS)
        wait = (min(convert.ms(request.long_polling_timeout), MAX_LONG_POLLING_MS)
                if request.HasField("long_polling_timeout") else 0)
        expression = request.filter_expression
        tags = sql = None
        if expression.type == pb.SQL:
            sql = expression.expression
        elif expression.expression not in ("", "*"):
            tags = expression.expression
        max_nums = max(1, min(request.batch_size or 32, 32))
        deadline = time.monotonic() + wait / 1000
        try:
            got: list[rpc.ReceiveMessageResponse] | None = None
            local = self.local_consume
            if local is not None and local.serves(mq.broker.name):
                got = await self._pop_here(local, group, mq.topic.name, max_nums, invisible,
                                           deadline, tags, sql)
            if got is None:  # not this broker's, or it refused (a slave now): by the client
                got = await self._pop(group, mq.topic.name, max_nums, invisible, deadline,
                                      tags, sql, mq.broker.name or None)
        except BrokerError as e:
            yield rpc.ReceiveMessageResponse(status=convert.error_status(e))
            return
        if not got:
            yield rpc.ReceiveMessageResponse(status=convert.status(pb.MESSAGE_NOT_FOUND,
                                                                   "no new message"))
            return
        yield rpc.ReceiveMessageResponse(delivery_timestamp=convert.timestamp(int(time.time() * 1000)))
        for one in got:
            yield one
        yield rpc.ReceiveMessageResponse(status=convert.status(pb.OK))

    async def _pop(self, group: str, topic: str, max_nums: int, invisible: int, deadline: float,
                   tags: str | None, sql: str | None,
                   broker_name: str | None) -> list[rpc.ReceiveMessageResponse]:
        """By the group's SimpleConsumer on an executor thread, a slice at a time (a stopping
        front end waits out one slice)."""
        consumer = self._consumer(group)
        while True:
            slice_ms = max(0, min(RECEIVE_SLICE_MS, int((deadline - time.monotonic()) * 1000)))
            got = await asyncio.to_thread(consumer.receive_answer, topic, max_nums, invisible,
                                          slice_ms, tags=tags, sql=sql, broker_name=broker_name)
            if got is not None:
                return convert.received(got)  # the records' bytes to gRPC messages, in C
            if time.monotonic() >= deadline or self.stopping.is_set():
                return []

    async def _pop_here(self, local: LocalConsume, group: str, topic: str, max_nums: int,
                        invisible: int, deadline: float, tags: str | None,
                        sql: str | None) -> list[rpc.ReceiveMessageResponse] | None:
        """POP from the broker the front end runs in, awaited on the event loop a slice at a
        time, the answer read as ``SimpleConsumer.receive`` reads it; None when the broker
        refused it as a client may retry elsewhere (not a master now, stopping)."""
        fields = pop_fields(group, topic, max_nums, invisible, tags=tags, sql=sql)
        while True:
            slice_ms = max(0, min(RECEIVE_SLICE_MS, int((deadline - time.monotonic()) * 1000)))
            try:
                resp = await local.pop({**fields, "pollTime": slice_ms})
            except BrokerError as e:
                if e.retriable:
                    return None
                raise
            if resp.code == ResponseCode.SUCCESS:
                return convert.received(resp)
            if resp.code not in (ResponseCode.PULL_NOT_FOUND,
                                 ResponseCode.PULL_RETRY_IMMEDIATELY):
                if BrokerError(resp.code, resp.remark).retriable:
                    return None
                raise BrokerError(resp.code, resp.remark)
            if time.monotonic() >= deadline or self.stopping.is_set():
                return []

    async def AckMessage(self, request: rpc.AckMessageRequest,
                          context: Any) -> rpc.AckMessageResponse:
        """Each entry acked by its receipt handle; a handle not the message's newest (it was handed
        out again) or never handed out: INVALID_RECEIPT_HANDLE for that entry."""
        handles = [e.receipt_handle for e in request.entries]
        if refused := self._refused(context, _handle_needs(request.group.name,
                                                           request.topic.name, handles)):
            return rpc.AckMessageResponse(status=refused)
        failed: dict[str, str | BrokerError] | None = None
        local = self.local_consume
        if local is not None:  # this broker's handles of the topic, while it is its master
            mine = f"{HANDLE_VERSION} {local.broker.broker_name} {request.topic.name} "
            if handles and local.broker.is_master() and all(h.startswith(mine) for h in handles):
                try:
                    failed = {h: str(why) for h, why in await local.batch_ack(
                        request.group.name, request.topic.name, handles)}
                except BrokerError as e:
                    if not e.retriable:
                        failed = {h: e for h in handles}
        if failed is None:
            consumer = self._consumer(request.group.name)
            try:
                failed = dict(await asyncio.to_thread(consumer.ack_batch, handles))
            except BrokerError as e:  # a handle that is not one, or no master: every entry
                failed = {h: e for h in handles}
        resp = rpc.AckMessageResponse()
        add = resp.entries.add  # each entry made in place (a receive's 32 acks in one request)
        for entry in request.entries:
            handle = entry.receipt_handle
            done = add(message_id=entry.message_id, receipt_handle=handle)
            why = failed.get(handle)
            if why is None:
                done.status.code, done.status.message = pb.OK, "OK"
            elif isinstance(why, BrokerError):
                done.status.CopyFrom(convert.handle_status(why))
            else:
                done.status.CopyFrom(convert.status(pb.INVALID_RECEIPT_HANDLE, str(why)))
        resp.status.CopyFrom(convert.overall(resp.entries))
        return resp


    async def ForwardMessageToDeadLetterQueue(
            self, request: rpc.ForwardMessageToDeadLetterQueueRequest,
            context: Any) -> rpc.ForwardMessageToDeadLetterQueueResponse:
        """A consumer gives a message up (a FIFO push consumer after its attempts): stored in
        ``%DLQ%<group>`` (a send-back straight to the DLQ, as RocketMQ's proxy does), then
        acked by its receipt handle. At least once: an ack that fails after the copy leaves
        the message to come back, and be given up again."""
        if refused := self._refused(context, _handle_needs(
                request.group.name, request.topic.name, [request.receipt_handle])):
            return rpc.ForwardMessageToDeadLetterQueueResponse(status=refused)
        consumer = self._consumer(request.group.name)
        try:
            await asyncio.to_thread(self._forward, consumer, request.receipt_handle)
        except ValueError as e:
            return rpc.ForwardMessageToDeadLetterQueueResponse(status=convert.status(
                pb.INVALID_RECEIPT_HANDLE, str(e)))
        except BrokerError as e:
            return rpc.ForwardMessageToDeadLetterQueueResponse(
                status=convert.handle_status(e))
        return rpc.ForwardMessageToDeadLetterQueueResponse(status=convert.status(pb.OK))

    @staticmethod
    def _forward(consumer: SimpleConsumer, receipt_handle: str) -> None:
        handle = ReceiptHandle.decode(receipt_handle)
        found = consumer.pull(handle.topic, handle.queue_id, handle.offset, 1,
                              broker_name=handle.broker_name).messages
        if not found or found[0].queue_offset != handle.offset:
            raise ValueError(f"the message of {receipt_handle!r} is no longer stored")
        consumer.send_back(found[0], delay_level=-1)
        consumer.ack(receipt_handle)

    async def ChangeInvisibleDuration(self, request: rpc.ChangeInvisibleDurationRequest,
                                        context: Any) -> rpc.ChangeInvisibleDurationResponse:
        if refused := self._refused(context, _handle_needs(
                request.group.name, request.topic.name, [request.receipt_handle])):
            return rpc.ChangeInvisibleDurationResponse(status=refused)
        consumer = self._consumer(request.group.name)
        try:
            handle = await asyncio.to_thread(consumer.change_invisible_duration,
                                             request.receipt_handle,
                                             convert.ms(request.invisible_duration))
        except BrokerError as e:
            return rpc.ChangeInvisibleDurationResponse(status=convert.handle_status(e))
        return rpc.ChangeInvisibleDurationResponse(status=convert.status(pb.OK),
                                                   receipt_handle=handle)


@dataclasses.dataclass
class _Stream:
    """A client's telemetry stream: what is to be written on it, and the topics it
    publishes (its settings say)."""

    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[rpc.TelemetryCommand | None]
    topics: set[str]


def _group_need(group: str) -> list[Need]:
    return [("group", group, SUB)] if group else []


def _settings_needs(settings: pb.Settings) -> list[Need]:
    """A client's settings: PUB on each topic it publishes, SUB on each it subscribes and on
    its group."""
    needs: list[Need] = []
    if settings.HasField("publishing"):
        needs += [("topic", t.name, PUB) for t in settings.publishing.topics]
    if settings.HasField("subscription"):
        sub = settings.subscription
        needs += [("topic", s.topic.name, SUB) for s in sub.subscriptions]
        needs += [("group", sub.group.name, SUB)]
    return needs


def _handle_needs(group: str, topic: str, handles: list[str]) -> list[Need]:
    """What an ack, change or forward takes: SUB on the group, on the topic the request
    names and on each receipt handle's own (a handle that does not decode is refused by the
    call itself)."""
    topics = {topic} if topic else set()
    for text in handles:
        try:
            topics.add(ReceiptHandle.decode(text).topic)
        except ValueError:
            continue
    return [("group", group, SUB), *(("topic", t, SUB) for t in sorted(topics))]


def _unserved(name: str) -> Callable[..., Any]:
    response = getattr(rpc, f"{name}Response")

    async def handler(self: MessagingService, request: Any, context: Any) -> Any:
        if refused := self._refused(context, []):
            return response(status=refused)
        return response(status=convert.status(
            pb.NOT_IMPLEMENTED, f"{name} is not served by replog's gRPC front end yet"))

    handler.__name__ = name
    return handler


def _unserved_stream(name: str, response: Any) -> Callable[..., Any]:
    async def handler(self: MessagingService, request: Any,
                      context: Any) -> AsyncIterator[Any]:
        if refused := self._refused(context, []):
            yield response(status=refused)
            return
        yield response(status=convert.status(
            pb.NOT_IMPLEMENTED, f"{name} is not served by replog's gRPC front end yet"))

    handler.__name__ = name
    return handler


for _name in UNSERVED:
    setattr(MessagingService, _name, _unserved(_name))
for _name, _response in UNSERVED_STREAMS.items():
    setattr(MessagingService, _name, _unserved_stream(_name, _response))


def _sent(out: convert.Outgoing, result: SendResult) -> rpc.SendResultEntry:
    return rpc.SendResultEntry(
        status=convert.status(convert.SEND_CODES[result.status], result.status.value),
        message_id=out.message_id or result.msg_id, offset=result.queue_offset,
        recall_handle=result.recall_handle)
