"""``df.write.format("replog")`` and ``writeStream.format("replog")``: send rows to a cluster.

Each Spark task sends its rows in order with one ``common.client.Producer``, ``batchSize``
rows per SEND_BATCH request, each request waiting for its answer before the next leaves; a
refused send (``BrokerError``) or, unless ``acceptStatuses`` says otherwise, any status other
than SEND_OK fails the task. All rows of a task go to one queue, so a consumer of that queue
sees them in the task's order: the ``queueId`` (and ``brokerName``) column or option when
given, else the queue ``partitionId % queueCount`` of the topic's queues over every broker
group ((group, id) in RocketMQ's order, as a producer routes), so the tasks spread over all
groups. Delivery is at-least-once: a retried task sends its rows again.

``transactional`` ("true"): one transaction per partition. The task sends each row as a half
message (RocketMQ's transactional message: stored, not delivered; one request per row, so
slower) and, once all are stored, commits them all, so a failed attempt delivers none of its
rows and its retry delivers them once. A task that fails in the writer rolls back the halves
it sent; one that Spark ends (an upstream error, a killed executor) leaves them open: the
broker's check-back asks the group (``transactionGroup``, default ``replog-spark``), whose
tasks answer COMMIT only for their own halves once they decided to commit, UNKNOWN for any
other, so those are never delivered, and after ``transactionCheckMax`` checks the broker
keeps them in ``TRANS_CHECK_MAX_TIME_TOPIC``. A task whose executor dies in the middle of its
commits delivers the rows committed before (its retry delivers all its rows: those twice).

Columns (others are ignored, so a DataFrame read from replog can be written back):

| column      | type                       |                                           |
|-------------|----------------------------|-------------------------------------------|
| body        | binary or string (UTF-8)   | required; where it is null, ``bodyBase64``|
| bodyBase64  | string                     | optional: the body of a row whose body is |
|             |                            | null (a non-UTF-8 body read from replog)  |
| topic       | string                     | or the ``topic`` option                   |
| tags, keys  | string                     | optional                                  |
| properties  | map<string,string>         | optional user properties                  |
| queueId     | int                        | optional                                  |
| brokerName  | string                     | optional: the group of ``queueId`` (needed|
|             |                            | when several groups hold the topic)       |

Options: ``servers`` (required), ``topic``, ``queueId``, ``brokerName``, ``batchSize`` (64),
``transactional`` (false), ``transactionGroup`` (replog-spark),
``timeoutMs``
(10000), ``acceptStatuses`` (comma-separated SendStatus names, default ``SEND_OK``),
``compressOverBytes`` (4096: bodies of that size and more are stored deflated, as a
RocketMQ producer stores them; 0 never), ``key`` and ``serverKey`` (CURVE, for brokers with
``aclEnable``: this writer's ``.key_secret`` and the brokers' ``.key``; docs/security.md).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructType,
)

from common.core.errors import BrokerError, ResponseCode, SendStatus
from common.core.message import DEFAULT_COMPRESS_OVER_BYTES, Message

DEFAULT_BATCH = 64
DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_TRANSACTION_GROUP = "replog-spark"
_OPTIONAL = {
    "topic": (StringType(),),
    "tags": (StringType(),),
    "keys": (StringType(),),
    "properties": (MapType(StringType(), StringType()),),
    "queueId": (IntegerType(),),
    "brokerName": (StringType(),),
    "body": (BinaryType(), StringType()),
    "bodyBase64": (StringType(),),
}


@dataclasses.dataclass(frozen=True)
class SinkOptions:
    servers: tuple[str, ...]
    topic: str | None
    queue_id: int | None
    batch_size: int
    timeout_ms: int
    accept: frozenset[SendStatus]
    compress_over_bytes: int | None = DEFAULT_COMPRESS_OVER_BYTES  # None: never compress
    key: str | None = None  # CURVE: this writer's .key_secret
    server_key: str | None = None  # CURVE: the brokers' public .key
    broker_name: str | None = None  # the group of ``queue_id``
    transaction_group: str | None = None  # transactional: the producer group of the halves

    @classmethod
    def parse(cls, options: dict[str, str], schema: StructType) -> SinkOptions:
        o = {k.lower(): v for k, v in options.items()}
        servers = tuple(s.strip() for s in o.get("servers", "").split(",") if s.strip())
        if not servers:
            raise ValueError('the replog sink needs .option("servers", "host:port,...")')
        names = {f.name: f.dataType for f in schema.fields}
        if "body" not in names:
            raise ValueError("the replog sink needs a body column (binary or string)")
        for name, allowed in _OPTIONAL.items():
            if name in names and names[name] not in allowed:
                kinds = " or ".join(t.simpleString() for t in allowed)
                raise ValueError(f"column {name} must be {kinds}, not {names[name].simpleString()}")
        topic = o.get("topic") or None
        if topic is None and "topic" not in names:
            raise ValueError('the replog sink needs a topic column or .option("topic", ...)')
        accept = frozenset(SendStatus[s.strip()] for s in o.get("acceptstatuses", "SEND_OK").split(","))
        batch = int(o.get("batchsize", DEFAULT_BATCH))
        if batch <= 0:
            raise ValueError("batchSize must be positive")
        queue = o.get("queueid")
        compress = int(o.get("compressoverbytes", DEFAULT_COMPRESS_OVER_BYTES))
        if compress < 0:
            raise ValueError("compressOverBytes must be >= 0 (0: never compress)")
        key, server_key = o.get("key") or None, o.get("serverkey") or None
        if (key is None) != (server_key is None):
            raise ValueError("CURVE needs both options key (this writer's .key_secret) and "
                             "serverKey (the brokers' .key)")
        broker = o.get("brokername") or None
        if broker is not None and queue is None:
            raise ValueError("the brokerName option names the group of the queueId option")
        transactional = o.get("transactional", "false").lower()
        if transactional not in ("true", "false"):
            raise ValueError("transactional is true or false")
        group = (o.get("transactiongroup") or DEFAULT_TRANSACTION_GROUP) \
            if transactional == "true" else None
        return cls(servers, topic, int(queue) if queue else None, batch,
                   int(o.get("timeoutms", DEFAULT_TIMEOUT_MS)), accept, compress or None,
                   key, server_key, broker, group)


@dataclasses.dataclass
class SentMessage(WriterCommitMessage):
    """What one task sent: its partition, the message count and CommitLog offsets."""

    partition_id: int
    count: int
    first_offset: int = -1
    last_offset: int = -1


def _message(row: Any, default_topic: str | None) -> Message:
    fields = row.asDict()
    body = fields["body"]
    if body is None and fields.get("bodyBase64") is not None:
        try:  # a body replog read as null text (not UTF-8): its base64 is the body
            body = base64.b64decode(fields["bodyBase64"], validate=True)
        except ValueError as e:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                              f"a row's bodyBase64 is not base64: {e}", False) from None
    if body is None:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "a row has a null body", False)
    body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    topic = fields.get("topic") or default_topic
    if not topic:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "a row has no topic", False)
    props = {k: v for k, v in (fields.get("properties") or {}).items() if v is not None}
    return Message(topic, body, fields.get("tags"), fields.get("keys"), props)


class _Sender:
    """Sends messages of one task in order, one SEND_BATCH per run of (topic, queue)."""

    def __init__(self, opts: SinkOptions, partition_id: int):
        from common.client import Producer, TransactionProducer

        self.opts = opts
        self.partition_id = partition_id
        client: dict[str, Any] = {"timeout_ms": opts.timeout_ms, "key": opts.key,
                                  "compress_over_bytes": opts.compress_over_bytes,
                                  "server_key": opts.server_key}
        self.transaction: TransactionProducer | None = None
        self.decided: dict[str, Any] = {}  # transaction id -> this task's decision
        self.halves: list[Any] = []
        if opts.transaction_group is not None:
            self.transaction = TransactionProducer(list(opts.servers), opts.transaction_group,
                                                   self._check, **client)
            self.producer = self.transaction.producer
        else:
            self.producer = Producer(list(opts.servers), **client)
        self.pending: list[Message] = []
        self.key: tuple[str, int, str | None] | None = None
        self.sent = SentMessage(partition_id, 0)
        self._queues: dict[str, tuple[int, str | None]] = {}

    def queue_for(self, topic: str, row_queue: int | None,
                  row_broker: str | None = None) -> tuple[int, str | None]:
        """(queue id, group) of a row: its columns, else the options, else the task's queue
        ``partitionId % queueCount`` over every group holding the topic."""
        if row_queue is not None:
            return row_queue, row_broker or self.opts.broker_name
        if self.opts.queue_id is not None:
            return self.opts.queue_id, self.opts.broker_name
        if topic not in self._queues:
            queues = self.producer.queues(topic)
            if queues:
                mq = queues[self.partition_id % len(queues)]
                self._queues[topic] = (mq.queue_id, mq.broker_name)
            else:
                self._queues[topic] = (0, None)
        return self._queues[topic]

    def _check(self, half: Any) -> Any:
        from common.core.message import PROPERTY_UNIQ_KEY
        from common.core.transaction import TransactionState

        return self.decided.get(half.properties.get(PROPERTY_UNIQ_KEY, ""),
                                TransactionState.UNKNOWN)

    def add(self, msg: Message, row_queue: int | None, row_broker: str | None = None) -> None:
        if self.transaction is not None:
            self._add_half(msg, row_queue, row_broker)
            return
        key = (msg.topic, *self.queue_for(msg.topic, row_queue, row_broker))
        if key != self.key or len(self.pending) >= self.opts.batch_size:
            self.flush()
            self.key = key
        self.pending.append(msg)

    def flush(self) -> None:
        if not self.pending or self.key is None:
            return
        topic, queue_id, broker = self.key
        results = self.producer.send_batch(topic, self.pending, queue_id=queue_id,
                                           broker_name=broker)
        for r in results:
            if r.status not in self.opts.accept:
                raise BrokerError(ResponseCode.SYSTEM_ERROR,
                                  f"send to {r.broker_name}:{topic}/{queue_id} returned "
                                  f"{r.status.value} "
                                  f"(accepted: {', '.join(sorted(s.value for s in self.opts.accept))})",
                                  False)
        if self.sent.first_offset < 0:
            self.sent.first_offset = results[0].commit_log_offset
        self.sent.last_offset = results[-1].commit_log_offset
        self.sent.count += len(results)
        self.pending = []

    def _add_half(self, msg: Message, row_queue: int | None, row_broker: str | None) -> None:
        assert self.transaction is not None
        queue_id, broker = self.queue_for(msg.topic, row_queue, row_broker)
        half = self.transaction.send_half(msg.topic, msg.body, msg.tags, msg.keys,
                                          msg.properties, queue_id=queue_id, broker_name=broker)
        if half.send.status not in self.opts.accept:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"a half message to {half.send.broker_name}:{msg.topic}/{queue_id} "
                              f"returned {half.send.status.value}", False)
        self.halves.append(half)

    def end(self, commit: bool) -> None:
        """Commit (the task's rows all stored) or roll back (it failed) every half sent."""
        from common.core.transaction import TransactionState

        if self.transaction is None:
            return
        state = TransactionState.COMMIT if commit else TransactionState.ROLLBACK
        for half in self.halves:
            self.decided[half.message_id] = state  # what a check-back now hears (by UNIQ_KEY)
        failed: BrokerError | None = None
        for half in self.halves:
            try:
                self.transaction.end(half, state)
            except BrokerError as e:  # left to the check-back, answered as decided above
                failed = failed or e
        if commit and self.halves:
            self.sent = SentMessage(self.partition_id, len(self.halves),
                                    self.halves[0].send.commit_log_offset,
                                    self.halves[-1].send.commit_log_offset)
        if failed is not None and commit:
            raise failed

    def close(self) -> None:
        if self.transaction is not None:
            self.transaction.close()
        else:
            self.producer.close()


def send_rows(opts: SinkOptions, rows: Iterator[Any]) -> SentMessage:
    """Send one task's rows; raises (failing the task) on the first refused send."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    sender = _Sender(opts, ctx.partitionId() if ctx is not None else 0)
    try:
        try:
            for row in rows:
                queue = row["queueId"] if "queueId" in row.__fields__ else None
                broker = row["brokerName"] if "brokerName" in row.__fields__ else None
                sender.add(_message(row, opts.topic), queue, broker or None)
            sender.flush()
        except BaseException:
            sender.end(commit=False)  # transactional: none of this attempt's rows
            raise
        sender.end(commit=True)
        return sender.sent
    finally:
        sender.close()


class ReplogWriter(DataSourceWriter):
    """Batch sink: every task sends its rows; the driver has nothing left to do."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool):
        if overwrite:
            raise ValueError("a replog topic can only be appended to (use mode('append'))")
        self.opts = SinkOptions.parse(options, schema)

    def write(self, iterator: Iterator[Any]) -> SentMessage:
        return send_rows(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """The messages are already stored (at-least-once)."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Sent messages cannot be taken back; the failed task's error reaches the user."""


class ReplogStreamWriter(DataSourceStreamWriter):
    """Streaming sink: each micro-batch's tasks send their rows (at-least-once)."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool):
        self.opts = SinkOptions.parse(options, schema)

    def write(self, iterator: Iterator[Any]) -> SentMessage:
        return send_rows(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The messages are already stored."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Sent messages cannot be taken back; Spark reruns the batch (at-least-once)."""
