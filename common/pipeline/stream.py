"""``spark.readStream.format("replog").option("servers", ...)``: tail a cluster's broker groups.

The stream offset is one CommitLog physical offset per broker group: with one group, as JSON
``{"commitLogOffset": N, "brokerName": g}``; over several, ``{"groups": {g: N, ...}}``. A
micro-batch ``(start, end]`` delivers, in each group, every record whose CommitLog offset is in
``[start_g, end_g)``; a group new to the stream (added to the cluster since) is read from its
log's start. Offsets need not fall on record boundaries: a record belongs to the batch its
start offset falls in, so consecutive batches partition the log exactly, and replaying a batch
from a checkpoint reads exactly the same records (no loss, no repeats).

``latestOffset`` never passes the group's *safe end*: what the master has flushed and dispatched
to its ConsumeQueues, no further than its confirmed offset (``confirmPhyOffset``: in controller
mode what every SyncStateSet member holds) and, when it has in-sync slaves, what at least one of
them has acknowledged; records below it survive a failover and are visible to pulls. Each batch has one
input partition per (group, topic, queue); a partition finds its first queue offset at or
after ``start`` by binary search over pulls and pulls until it passes ``end``, through
``common.client.Consumer``, which follows the group's master across a failover.
``maxBytesPerTrigger`` is shared among the groups (what one does not need goes to the others).

Options:

| option              | meaning                                                            |
|---------------------|--------------------------------------------------------------------|
| servers             | client addresses of brokers of the cluster (required): any one     |
|                     | names every group (CLUSTER_INFO)                                   |
| topics              | comma-separated topics to read (required)                          |
| startingOffset      | ``earliest`` (default), ``latest`` or a CommitLog offset (one group)|
| startingTimestamp   | ms since the epoch: start at the first record stored then or later |
| maxBytesPerTrigger  | at most this many CommitLog bytes per micro-batch                  |
| pullBatchSize       | messages per pull (default 256)                                    |
| timeoutMs           | client request timeout (default 10000)                             |
| failOnDataLoss      | ``true`` (default): fail when records of a batch were deleted      |
| key, serverKey      | CURVE (brokers with ``aclEnable``, docs/security.md): this reader's |
|                     | ``.key_secret`` and the brokers' ``.key``; the account needs SUB on |
|                     | the topics and on the group ``DEFAULT_CONSUMER`` (or its default)  |
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from common.core.errors import BrokerError, PullStatus, ResponseCode
from common.core.message import MessageExt, body_str, tags_code

from .schema import arrow_schema, check_schema

OFFSET_KEY = "commitLogOffset"
BROKER_KEY = "brokerName"
GROUPS_KEY = "groups"
DEFAULT_PULL_BATCH = 256
DEFAULT_TIMEOUT_MS = 10_000
DISPATCH_WAIT_S = 30.0
STATUS_TIMEOUT_MS = 1000
MASTER_ROLES = ("SYNC_MASTER", "ASYNC_MASTER")


def _lower(options: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    servers: tuple[str, ...]
    topics: tuple[str, ...]
    starting: str = "earliest"
    max_bytes: int | None = None
    pull_batch: int = DEFAULT_PULL_BATCH
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    fail_on_data_loss: bool = True
    starting_ts: int | None = None
    key: str | None = None  # CURVE: this reader's .key_secret
    server_key: str | None = None  # CURVE: the brokers' public .key

    def curve(self) -> dict[str, Any]:
        """The clients' ``key``/``server_key`` arguments."""
        return {"key": self.key, "server_key": self.server_key}

    @classmethod
    def parse(cls, options: dict[str, str]) -> StreamOptions:
        o = _lower(options)
        servers = tuple(s.strip() for s in o.get("servers", "").split(",") if s.strip())
        topics = tuple(t.strip() for t in o.get("topics", "").split(",") if t.strip())
        if not servers:
            raise ValueError('the replog stream needs .option("servers", "host:port,...")')
        if not topics:
            raise ValueError('the replog stream needs .option("topics", "t1,t2")')
        starting = o.get("startingoffset", "earliest").strip().lower()
        if starting not in ("earliest", "latest") and not starting.isdigit():
            raise ValueError(f"startingOffset must be earliest, latest or an offset: {starting!r}")
        starting_ts = None
        if o.get("startingtimestamp", "").strip():
            text = o["startingtimestamp"].strip()
            if not text.isdigit():
                raise ValueError(f"startingTimestamp must be ms since the epoch: {text!r}")
            if "startingoffset" in o:
                raise ValueError("give startingOffset or startingTimestamp, not both")
            starting_ts = int(text)
        max_bytes = int(o["maxbytespertrigger"]) if o.get("maxbytespertrigger") else None
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError("maxBytesPerTrigger must be positive")
        key, server_key = o.get("key") or None, o.get("serverkey") or None
        if (key is None) != (server_key is None):
            raise ValueError("CURVE needs both options key (this reader's .key_secret) and "
                             "serverKey (the brokers' .key)")
        return cls(
            servers, topics, starting, max_bytes,
            int(o.get("pullbatchsize", DEFAULT_PULL_BATCH)),
            int(o.get("timeoutms", DEFAULT_TIMEOUT_MS)),
            o.get("failondataloss", "true").strip().lower() != "false",
            starting_ts, key, server_key,
        )


def group_status(servers: tuple[str, ...], timeout_ms: int,
                 curve: dict[str, Any] | None = None) -> dict[str, Any]:
    """Status of the group's master: the highest epoch among brokers answering as master.
    All brokers are asked at once, so a dead one costs one short timeout, not one each.
    ``curve``: the clients' key/server_key (StreamOptions.curve)."""
    from common.client import Admin

    timeout = min(timeout_ms, STATUS_TIMEOUT_MS)
    with Admin(list(servers), timeout_ms=timeout, retries=0, **(curve or {})) as admin, \
            concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
        answers = list(pool.map(lambda address: _status_or_none(admin, address), servers))
    masters = [a for a in answers if a is not None and a.get("role") in MASTER_ROLES]
    if not masters:
        raise BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                          f"no master answers among {', '.join(servers)}", True)
    return max(masters, key=lambda a: int(a.get("epoch", 0)))


def _status_or_none(admin: Any, address: str) -> dict[str, Any] | None:
    try:
        return dict(admin.status(address))
    except BrokerError:
        return None


def safe_end(status: dict[str, Any]) -> int:
    """The highest CommitLog offset a stream may read up to (see the module docstring)."""
    end = min(int(status["flushedPhyOffset"]), int(status["dispatchedPhyOffset"]))
    if "confirmPhyOffset" in status:  # controller mode: what every SyncStateSet member holds
        end = min(end, int(status["confirmPhyOffset"]))
    acks = [int(s["ackOffset"]) for s in status.get("slaves") or [] if s.get("inSync")]
    if acks:
        end = min(end, max(acks))
    return end


@dataclasses.dataclass
class QueueRange(InputPartition):
    """Records of one (topic, queue) of one broker group with CommitLog offsets (that group's)
    in ``[start, end)``; ``servers``: where to ask about the group."""

    topic: str
    queue_id: int
    start: int
    end: int
    broker_name: str = ""
    servers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        InputPartition.__init__(self, (self.topic, self.queue_id, self.start, self.end,
                                       self.broker_name))


class ReplogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of CommitLog offset ranges, one range per broker group, read through the
    broker's pull API."""

    def __init__(self, options: dict[str, str], schema: StructType):
        self.opts = StreamOptions.parse(options)
        self.columns = check_schema(schema)
        self._target: dict[str, int] | None = None

    def _groups(self) -> dict[str, tuple[str, ...]]:
        return cluster_groups(self.opts)

    def _safe_ends(self) -> dict[str, int]:
        return {name: safe_end(group_status(servers, self.opts.timeout_ms, self.opts.curve()))
                for name, servers in self._groups().items()}

    def initialOffset(self) -> dict[str, Any]:
        groups = self._groups()
        if self.opts.starting_ts is not None:
            return encode_offsets({name: offset_at_time(self.opts, self.opts.starting_ts,
                                                        name, servers)
                                   for name, servers in groups.items()})
        starting = self.opts.starting
        if starting.isdigit():
            if len(groups) > 1:
                raise ValueError(f"startingOffset {starting} is one CommitLog's offset, and "
                                 f"the cluster has groups {', '.join(sorted(groups))}: use "
                                 "earliest, latest or startingTimestamp")
            return encode_offsets({name: int(starting) for name in groups})
        offsets = {}
        for name, servers in groups.items():
            status = group_status(servers, self.opts.timeout_ms, self.opts.curve())
            offsets[name] = int(status["minPhyOffset"]) if starting == "earliest" \
                else safe_end(status)
        return encode_offsets(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_bytes is not None:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._safe_ends()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        ends = self._safe_ends() if self._target is None else dict(self._target)
        begin = decode_offsets(start, list(ends))
        for name in begin:
            ends.setdefault(name, begin[name])  # a group gone from the route: nothing more
        wanted = {name: max(0, end - begin.get(name, 0)) for name, end in ends.items()}
        if isinstance(limit, ReadMaxBytes):
            wanted = share_bytes(wanted, limit.max_bytes)
        return encode_offsets({name: begin.get(name, 0) + n for name, n in wanted.items()})

    def reportLatestOffset(self) -> dict[str, Any]:
        return encode_offsets(self._safe_ends())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        groups = self._groups()
        stops = decode_offsets(end, list(groups))
        begins = decode_offsets(start, list(groups))
        from common.client import Consumer

        out: list[InputPartition] = []
        with Consumer(list(self.opts.servers), timeout_ms=self.opts.timeout_ms,
                      **self.opts.curve()) as consumer:
            table = consumer.route_table(fresh=True)
            for name, stop in sorted(stops.items()):
                begin = begins.get(name, 0)  # a group new to the stream: from its start
                if stop <= begin:
                    continue
                route = table.groups.get(name)
                servers = groups.get(name) or (tuple(route.addresses) if route is not None
                                               else self.opts.servers)
                for topic in self.opts.topics:
                    for q in group_queues(consumer, table, topic, name):
                        out.append(QueueRange(topic, q, begin, stop, name, servers))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, QueueRange)
        return read_queue_range(self.opts, partition, self.columns)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the brokers keep no per-stream state."""

    def stop(self) -> None:
        """No connections outlive a call."""


def cluster_groups(opts: StreamOptions) -> dict[str, tuple[str, ...]]:
    """Broker group -> the servers to ask about it: with one group, the servers given (as
    always); over several, the addresses the route table names for each."""
    from common.client import Consumer

    with Consumer(list(opts.servers), timeout_ms=opts.timeout_ms, **opts.curve()) as consumer:
        table = consumer.route_table(fresh=True)
    if len(table.groups) <= 1:
        return {name: opts.servers for name in table.groups}
    return {name: tuple(g.addresses) or opts.servers for name, g in table.groups.items()}


def group_queues(consumer: Any, table: Any, topic: str, name: str) -> list[int]:
    """Queue ids of ``topic`` in group ``name`` (none when the group does not hold it)."""
    if len(table.groups) <= 1:
        return list(range(queue_count(consumer, topic)))
    return [mq.queue_id for mq in table.queues(topic) if mq.broker_name == name]


def encode_offsets(offsets: dict[str, int]) -> dict[str, Any]:
    """The stream's offset: one group ``{"commitLogOffset": N, "brokerName": g}``; several
    ``{"groups": {g: N, ...}}`` (one CommitLog offset per group)."""
    if len(offsets) == 1:
        ((name, offset),) = offsets.items()
        return {OFFSET_KEY: offset, BROKER_KEY: name}
    return {GROUPS_KEY: dict(sorted(offsets.items()))}


def decode_offsets(doc: dict[str, Any], groups: list[str]) -> dict[str, int]:
    """``encode_offsets``'s document -> group -> offset. An offset written before the stream
    named groups (``{"commitLogOffset": N}``) is the one group's while the cluster has one."""
    if GROUPS_KEY in doc:
        return {str(name): int(offset) for name, offset in doc[GROUPS_KEY].items()}
    name = doc.get(BROKER_KEY)
    if name is None:
        if len(groups) != 1:
            raise ValueError(f"the stream's offset {doc} names no broker group and the cluster "
                             f"has {len(groups)} ({', '.join(sorted(groups))}): restart the "
                             "stream from a new checkpoint")
        name = groups[0]
    return {str(name): int(doc[OFFSET_KEY])}


def share_bytes(wanted: dict[str, int], budget: int) -> dict[str, int]:
    """``maxBytesPerTrigger`` over the groups: an equal share each, what a group does not
    need going to the others (water-filling); at least one byte to a group that has any."""
    out = dict.fromkeys(wanted, 0)
    left = budget
    hungry = sorted((n, name) for name, n in wanted.items() if n > 0)
    while hungry and left > 0:
        share = max(1, left // len(hungry))
        n, name = hungry[0]
        if n <= share:
            out[name] = n
            left -= n
            hungry.pop(0)
            continue
        for n, name in hungry:
            out[name] = min(n, share)
            left -= out[name]
            if left <= 0:
                break
        break
    return out


def queue_count(consumer: Any, topic: str) -> int:
    """Queues of ``topic`` (0 for a topic the group does not have)."""
    try:
        return consumer.queue_nums(topic)
    except BrokerError as e:
        if e.code == ResponseCode.TOPIC_NOT_EXIST:
            return 0
        raise


def offset_at_time(opts: StreamOptions, timestamp_ms: int, broker_name: str | None = None,
                   servers: tuple[str, ...] | None = None) -> int:
    """The CommitLog offset of the first record of ``opts.topics`` stored at or after
    ``timestamp_ms`` in group ``broker_name``: the least, over the topics' queues, of the
    record each queue's search by time finds; the safe end (as ``latest``) when no queue
    holds one.

    The safe end is read first, so a record stored during the searches is not skipped.
    Exact while store times grow along the CommitLog, as they do under one clock.
    """
    from common.client import Consumer

    start = safe_end(group_status(servers or opts.servers, opts.timeout_ms, opts.curve()))
    with Consumer(list(opts.servers), timeout_ms=opts.timeout_ms, **opts.curve()) as consumer:
        table = consumer.route_table()
        multi = len(table.groups) > 1
        name = broker_name if multi else None
        for topic in opts.topics:
            queues = (group_queues(consumer, table, topic, broker_name or "") if multi
                      else range(queue_count(consumer, topic)))
            for q in queues:
                found = consumer.pull(topic, q, consumer.search_offset(
                    topic, q, timestamp_ms, broker_name=name), 1, broker_name=name)
                if found.status == PullStatus.FOUND and found.messages:
                    start = min(start, found.messages[0].commit_log_offset)
    return start


def wait_dispatched(opts: StreamOptions, end: int,
                    servers: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The master's status once it has dispatched ``end`` (a new master may lag briefly)."""
    deadline = time.monotonic() + DISPATCH_WAIT_S
    while True:
        status = group_status(servers or opts.servers, opts.timeout_ms, opts.curve())
        if int(status["dispatchedPhyOffset"]) >= end:
            return status
        if time.monotonic() > deadline:
            raise BrokerError(ResponseCode.SYSTEM_BUSY,
                              f"master has not dispatched up to {end} after {DISPATCH_WAIT_S}s")
        time.sleep(0.05)


def first_queue_offset(consumer: Any, topic: str, queue_id: int, phy_offset: int,
                       broker_name: str | None = None) -> int:
    """The first queue offset whose record's CommitLog offset is >= ``phy_offset``
    (binary search; queue order is CommitLog order)."""
    probe = consumer.pull(topic, queue_id, 0, 1, broker_name=broker_name)
    lo, hi = probe.min_offset, probe.max_offset
    while lo < hi:
        mid = (lo + hi) // 2
        found = consumer.pull(topic, queue_id, mid, 1, broker_name=broker_name)
        if found.status != PullStatus.FOUND or not found.messages:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"{topic}/{queue_id}@{mid} vanished during the search")
        if found.messages[0].commit_log_offset >= phy_offset:
            hi = mid
        else:
            lo = mid + 1
    return lo


def read_queue_range(opts: StreamOptions, part: QueueRange, columns: tuple[str, ...]
                     ) -> Iterator[pa.RecordBatch]:
    """Pull the records of one queue with CommitLog offsets in ``[start, end)``."""
    from common.client import Consumer

    servers = part.servers or opts.servers
    status = wait_dispatched(opts, part.end, servers)
    if opts.fail_on_data_loss and int(status["minPhyOffset"]) > part.start:
        raise BrokerError(ResponseCode.SYSTEM_ERROR,
                          f"records from {part.start} to {status['minPhyOffset']} of "
                          f"{part.broker_name or 'the group'} were deleted before the stream "
                          "read them; set failOnDataLoss=false to skip them")
    with Consumer(list(servers), timeout_ms=opts.timeout_ms, **opts.curve()) as consumer:
        name = part.broker_name or None
        queue_offset = first_queue_offset(consumer, part.topic, part.queue_id, part.start, name)
        while True:
            pulled = consumer.pull(part.topic, part.queue_id, queue_offset, opts.pull_batch,
                                   broker_name=name)
            if pulled.status == PullStatus.NO_NEW_MSG or (
                    pulled.status == PullStatus.FOUND and not pulled.messages):
                return
            if pulled.status != PullStatus.FOUND:
                raise BrokerError(ResponseCode.SYSTEM_ERROR,
                                  f"pull {part.topic}/{part.queue_id}@{queue_offset}: "
                                  f"{pulled.status.value}")
            batch = [m for m in pulled.messages if part.start <= m.commit_log_offset < part.end]
            if batch:
                yield messages_to_batch(batch, columns)
            if pulled.messages[-1].commit_log_offset >= part.end:
                return
            queue_offset = pulled.next_begin_offset


def _value(m: MessageExt, name: str) -> Any:
    if name in ("bornTimestamp", "storeTimestamp"):
        return (m.born_timestamp if name == "bornTimestamp" else m.store_timestamp) * 1000
    if name == "properties":
        return list(m.properties.items())
    if name == "tagsCode":
        return tags_code(m.tags)
    if name == "body":
        return body_str(m.body)
    if name == "bodyBase64":
        return base64.b64encode(m.body).decode("ascii")
    return getattr(m, _ATTRS.get(name, name))


_ATTRS = {
    "queueId": "queue_id", "queueOffset": "queue_offset", "commitLogOffset": "commit_log_offset",
    "msgId": "msg_id", "bornHost": "born_host", "storeHost": "store_host", "sysFlag": "sys_flag",
    "bodyCrc": "body_crc", "storeSize": "store_size", "reconsumeTimes": "reconsume_times",
    "preparedTransactionOffset": "prepared_transaction_offset", "bodyBytes": "body",
    "brokerName": "broker_name",
}


def messages_to_batch(msgs: list[MessageExt], columns: tuple[str, ...]) -> pa.RecordBatch:
    """Client-decoded messages as a record batch with Spark's Arrow schema for ``columns``."""
    schema = arrow_schema(columns)
    arrays = []
    for field in schema:
        values = [_value(m, field.name) for m in msgs]
        if pa.types.is_timestamp(field.type):
            arrays.append(pa.array(values, type=pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
