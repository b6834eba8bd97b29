"""The RPCs of ``apache.rocketmq.v2.MessagingService``, each translated into replog's requests
by replog's clients (``convert.py`` maps the messages and answers).

Served now: QueryRoute (every broker group's queues of the topic, with the endpoint the client
asked and the queues' permissions and message types), Heartbeat, SendMessage (normal, FIFO by
message group, delayed by delivery timestamp), Telemetry (the settings exchange: the client's
settings are answered with the proxy's), NotifyClientTermination. Every other RPC answers
NOT_IMPLEMENTED with a message naming it, never a hang (a streaming one: one response
carrying that status). The client calls are blocking; they run on the event loop's executor
(bounded), never on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from common.client import Admin, Producer
from common.core.errors import BrokerError
from common.proxy import convert

log = logging.getLogger("replog.proxy")

ATTRIBUTES_TTL_S = 5.0  # topics' message types are read from the masters at most this often
UNSERVED = ("QueryAssignment", "AckMessage", "ForwardMessageToDeadLetterQueue", "UpdateOffset",
            "GetOffset", "QueryOffset", "EndTransaction", "ChangeInvisibleDuration",
            "RecallMessage", "SyncLiteSubscription")
UNSERVED_STREAMS = {"ReceiveMessage": rpc.ReceiveMessageResponse,
                    "PullMessage": rpc.PullMessageResponse}


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    """One proxy's RPCs over one replog cluster (``servers``: any of its brokers)."""

    def __init__(self, servers: list[str], max_body_size: int, timeout_ms: int = 5000):
        self.servers = servers
        self.max_body_size = max_body_size
        self.producer = Producer(servers, timeout_ms=timeout_ms)
        self.admin = Admin(servers, timeout_ms=timeout_ms)
        self._attrs: dict[str, dict[str, str]] = {}
        self._attrs_at = float("-inf")
        self._attrs_lock = threading.Lock()

    def close(self) -> None:
        self.producer.close()
        self.admin.close()

    # ---- routes -----------------------------------------------------------------------------
    async def QueryRoute(self, request: rpc.QueryRouteRequest,
                         context: Any) -> rpc.QueryRouteResponse:
        topic = request.topic.name
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

    def _attributes(self, topic: str) -> dict[str, str]:
        with self._attrs_lock:
            if time.monotonic() - self._attrs_at > ATTRIBUTES_TTL_S or topic not in self._attrs:
                self._attrs = self.admin.topic_attributes()
                self._attrs_at = time.monotonic()
            return self._attrs.get(topic, {})

    # ---- clients ------------------------------------------------------------------------------
    async def Heartbeat(self, request: rpc.HeartbeatRequest,
                        context: Any) -> rpc.HeartbeatResponse:
        return rpc.HeartbeatResponse(status=convert.status(pb.OK))

    async def NotifyClientTermination(
            self, request: rpc.NotifyClientTerminationRequest,
            context: Any) -> rpc.NotifyClientTerminationResponse:
        return rpc.NotifyClientTerminationResponse(status=convert.status(pb.OK))

    async def Telemetry(self, request_iterator: AsyncIterator[rpc.TelemetryCommand],
                        context: Any) -> AsyncIterator[rpc.TelemetryCommand]:
        """The settings exchange: each settings the client sends is answered with the
        proxy's (its own, with the largest body replog stores and message types checked)."""
        async for command in request_iterator:
            if command.HasField("settings"):
                settings = pb.Settings()
                settings.CopyFrom(command.settings)
                if settings.HasField("publishing"):
                    settings.publishing.max_body_size = self.max_body_size
                    settings.publishing.validate_message_type = True
                yield rpc.TelemetryCommand(status=convert.status(pb.OK), settings=settings)

    # ---- sends ----------------------------------------------------------------------------------
    async def SendMessage(self, request: rpc.SendMessageRequest,
                          context: Any) -> rpc.SendMessageResponse:
        if not request.messages:
            return rpc.SendMessageResponse(status=convert.status(
                pb.BAD_REQUEST, "no message to send"))
        entries = [await asyncio.to_thread(self._send_one, msg) for msg in request.messages]
        first_bad = next((e.status for e in entries if e.status.code != pb.OK), None)
        return rpc.SendMessageResponse(status=first_bad or convert.status(pb.OK),
                                       entries=entries)

    def _send_one(self, msg: pb.Message) -> rpc.SendResultEntry:
        try:
            out = convert.outgoing(msg)
        except ValueError as e:
            return rpc.SendResultEntry(status=convert.status(pb.BAD_REQUEST, str(e)))
        if out.message_type == pb.TRANSACTION:
            return rpc.SendResultEntry(status=convert.status(
                pb.NOT_IMPLEMENTED, "transactional messages over gRPC are not served yet "
                "(replog's own Producer sends them: docs/contract.md)"))
        if len(out.body) > self.max_body_size:
            return rpc.SendResultEntry(status=convert.status(
                pb.MESSAGE_BODY_TOO_LARGE, f"body of {len(out.body)} bytes: at most "
                f"{self.max_body_size}"))
        try:
            result = self.producer.send(out.topic, out.body, **out.send_args())
        except BrokerError as e:
            return rpc.SendResultEntry(status=convert.error_status(e),
                                       message_id=out.message_id)
        return rpc.SendResultEntry(
            status=convert.status(convert.SEND_CODES[result.status], result.status.value),
            message_id=out.message_id or result.msg_id, offset=result.queue_offset,
            recall_handle=result.recall_handle)


def _unserved(name: str) -> Callable[..., Any]:
    response = getattr(rpc, f"{name}Response")

    async def handler(self: MessagingService, request: Any, context: Any) -> Any:
        return response(status=convert.status(
            pb.NOT_IMPLEMENTED, f"{name} is not served by replog's gRPC front end yet"))

    handler.__name__ = name
    return handler


def _unserved_stream(name: str, response: Any) -> Callable[..., Any]:
    async def handler(self: MessagingService, request: Any,
                      context: Any) -> AsyncIterator[Any]:
        yield response(status=convert.status(
            pb.NOT_IMPLEMENTED, f"{name} is not served by replog's gRPC front end yet"))

    handler.__name__ = name
    return handler


for _name in UNSERVED:
    setattr(MessagingService, _name, _unserved(_name))
for _name, _response in UNSERVED_STREAMS.items():
    setattr(MessagingService, _name, _unserved_stream(_name, _response))
