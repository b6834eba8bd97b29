"""``Producer``: send, send_batch and send_async (docs/contract.md §4), queue selection and the
retries of async sends."""

from __future__ import annotations

import concurrent.futures
import datetime
import heapq
import itertools
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from common.client.accumulator import AsyncItem
from common.client.base import ClientBase
from common.client.cluster import (
    MAX_BACKOFF_S,
    NO_MASTER_PAUSE_S,
    REDISCOVER_CODES,
    ROUTE_TTL_MS,
    Cluster,
)
from common.client.in_process import InProcess
from common.client.presence import DEFAULT_HEARTBEAT_MS, Presence, new_client_id
from common.client.results import (
    ClientTimeoutError,
    NoMasterError,
    SendResult,
    pack_bodies,
    send_results,
)
from common.client.routes import one_group_of, queues_in, unknown_group
from common.client.routing import MessageQueue, RouteTable, queue_for_key
from common.client.transport import DEFAULT_SPIN_US, DEFAULT_TIMEOUT_MS
from common.core.errors import BrokerError, ResponseCode, SendStatus
from common.core.futures import LightFuture
from common.core.keys import ClientKeys
from common.core.message import (
    DEFAULT_COMPRESS_LEVEL,
    DEFAULT_COMPRESS_OVER_BYTES,
    PROPERTY_DELAY,
    PROPERTY_SHARDING_KEY,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
    Message,
    compress_body,
    java_hash,
)
from common.core.timer import TIMER_DELAY_MS, TIMER_DELIVER_MS, RecallHandle, requested
from common.format.protocol import MAX_GROUP_LENGTH, META_ITEMS, TOPIC_PATTERN, RequestCode


def shard_queue(shard_key: str, queue_nums: int) -> int:
    """The queue of a sharding key: RocketMQ's ``SelectMessageQueueByHash`` (the key's Java
    ``hashCode``, made non-negative, modulo the queue count), so a Java producer of the same
    topic sends the key to the same queue. A topic that gains queues moves keys, as in Kafka."""
    return abs(java_hash(shard_key)) % queue_nums


def _with_timer(properties: dict[str, str] | None, deliver_at: datetime.datetime | int | None,
                delay: datetime.timedelta | int | None, delay_level: int) -> dict[str, str]:
    """The properties of a timer message (RocketMQ 5's, and a unique key of the client's, so
    that a retried send and its first attempt are recalled together)."""
    if deliver_at is not None and delay is not None:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "give deliver_at or delay, not both", False)
    if delay_level:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                          "give delay_level or a timer (deliver_at, delay), not both", False)
    props = dict(properties or {})
    if deliver_at is not None:
        if isinstance(deliver_at, datetime.datetime):
            at_ms = round(deliver_at.timestamp() * 1000)
        elif isinstance(deliver_at, int) and not isinstance(deliver_at, bool):
            at_ms = deliver_at
        else:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                              f"deliver_at must be a datetime or epoch ms, not {deliver_at!r}",
                              False)
        if at_ms < 0:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, f"deliver_at {at_ms} is negative",
                              False)
        props[TIMER_DELIVER_MS] = str(at_ms)
    else:
        if isinstance(delay, datetime.timedelta):
            delay_ms = round(delay.total_seconds() * 1000)
        elif isinstance(delay, int) and not isinstance(delay, bool):
            delay_ms = delay
        else:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                              f"delay must be a timedelta or ms, not {delay!r}", False)
        if delay_ms < 0:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, f"delay {delay_ms} ms is negative",
                              False)
        props[TIMER_DELAY_MS] = str(delay_ms)
    props.setdefault(PROPERTY_UNIQ_KEY, uuid.uuid4().hex.upper())
    return props


def _with_shard_key(properties: dict[str, str] | None, shard_key: str | None,
                    queue_id: int | None) -> dict[str, str] | None:
    """The properties with ``__SHARDINGKEY`` (RocketMQ 5's name) when a key is given."""
    if shard_key is None:
        return properties
    if queue_id is not None:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                          "give queue_id or shard_key, not both", False)
    if not shard_key:
        raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "empty shard_key", False)
    return {**(properties or {}), PROPERTY_SHARDING_KEY: shard_key}


def _message_meta(msg: Message, sys_flag: int = 0) -> list[Any] | None:
    """A SEND_BATCH meta entry ``[tags, keys, properties, flag(, sysFlag)]``, None if empty;
    ``sys_flag`` is the message's as sent (``Producer._deflate``)."""
    props = {k: v for k, v in msg.properties.items()}
    if msg.delay_level > 0:
        props["DELAY"] = str(msg.delay_level)
    keys = msg.keys if isinstance(msg.keys, str) or msg.keys is None else " ".join(msg.keys)
    if msg.tags is None and keys is None and not props and not msg.flag and not sys_flag:
        return None
    meta = [msg.tags, keys, props or None, msg.flag]
    return [*meta, sys_flag] if sys_flag else meta


def _degraded(result: SendResult | list[SendResult]) -> bool:
    first = result[0] if isinstance(result, list) else result
    return first.status is not SendStatus.SEND_OK


class _Retries:
    """send_async messages waiting out their backoff before they are sent again: one thread
    and a heap of due times. Every message that is due goes in the same pass, so the hundreds
    of messages of the batches in flight when a connection drops are retried together after
    one backoff (one discovery finds the master for all of them), not one backoff after the
    other. ``close`` fails what is still waiting."""

    def __init__(
        self,
        retry: Callable[[AsyncItem, BrokerError], None],
        fail: Callable[[AsyncItem, BrokerError], None],
    ):
        self._retry = retry
        self._fail = fail
        self._heap: list[tuple[float, int, AsyncItem, BrokerError]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="replog-producer-retry", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._heap)

    def add(self, due: float, item: AsyncItem, err: BrokerError) -> bool:
        """Retry ``item`` at ``due`` (monotonic); False once closed (then the caller fails it)."""
        with self._cond:
            if self._closed:
                return False
            heapq.heappush(self._heap, (due, next(self._seq), item, err))
            self._cond.notify()
            return True

    def close(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)
        with self._cond:
            left, self._heap = self._heap, []
        for _, _, item, err in left:
            self._fail(item, err)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
                if self._closed:
                    return
                due = []
                while self._heap and self._heap[0][0] <= now:
                    _, _, item, err = heapq.heappop(self._heap)
                    due.append((item, err))
            for item, err in due:
                self._retry(item, err)


class Producer(ClientBase):
    """Sends messages to the masters of a cluster's broker groups (docs/contract.md §4).

    With one broker group a queue is its id, as it always was. With several (the route table,
    ``common/client/routes.py``) a topic's queues are (group, id) pairs over every group
    holding it, in RocketMQ's order: a keyed send hashes over that whole list (stable while the
    route is unchanged), a keyless one goes round the queues of groups that have a master and
    passes over a group that just failed (RocketMQ's latency fault tolerance), and an explicit
    ``queue_id`` needs ``broker_name`` unless one group holds the topic."""

    def __init__(
        self,
        servers: str | Iterable[str],
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retries: int = 2,
        batch_size: int = 64,
        linger_ms: float = 0.0,
        max_batches_in_flight: int = 2,
        max_pending: int = 65_536,
        max_message_size: int = 4 * 1024 * 1024,
        spin_us: int = DEFAULT_SPIN_US,
        route_ttl_ms: int = ROUTE_TTL_MS,
        compress_over_bytes: int | None = DEFAULT_COMPRESS_OVER_BYTES,
        compress_level: int = DEFAULT_COMPRESS_LEVEL,
        key: str | os.PathLike[str] | None = None,
        server_key: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        curve: ClientKeys | None = None,
        group: str | None = None,
        client_id: str | None = None,
        heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
        in_process: Mapping[str, InProcess] | None = None,
        plain_calls: bool | None = None,
    ):
        """``group``: the producer group this producer belongs to. With one, it heartbeats
        every group's master (``heartbeat_ms``) so a broker can send it requests (a
        transaction check-back, its running figures: ``common/client/presence.py``);
        ``client_id`` names it there (host@pid@random by default).
        ``compress_over_bytes``: a body of at least this many bytes is sent and stored
        zlib-deflated with the COMPRESSED sysflag, when that makes it smaller (RocketMQ's
        ``compressMsgBodyOverHowmuch``, 4 KiB, and ``zipCompressLevel``, 5); consumers get
        it back inflated. None turns it off. ``max_message_size`` bounds the body as given.
        ``key``, ``server_key``, ``curve``: CURVE (``ClientBase``, docs/security.md).
        ``in_process``: brokers of this process, by address (``common/client/in_process.py``).
        ``plain_calls``: blocking calls over plain sockets speaking ZMTP (the default without
        CURVE keys, ``common/client/plain_call.py``) or False for libzmq DEALERs."""
        if not 0 <= compress_level <= 9:
            raise ValueError(f"compress_level {compress_level} is not 0..9")
        if group is not None and not (0 < len(group) <= MAX_GROUP_LENGTH
                                      and TOPIC_PATTERN.match(group)):
            raise ValueError(f"group {group!r} is not a valid producer group name")
        if heartbeat_ms < 100:
            raise ValueError(f"heartbeat_ms {heartbeat_ms} is below 100")
        if compress_over_bytes is not None and compress_over_bytes < 1:
            raise ValueError(f"compress_over_bytes {compress_over_bytes} must be >= 1 or None")
        super().__init__(
            servers,
            timeout_ms,
            retries,
            route_ttl_ms,
            key=key,
            server_key=server_key,
            curve=curve,
            spin_us=spin_us,
            plain_calls=plain_calls,
            batch_size=batch_size,
            linger_ms=linger_ms,
            max_batches_in_flight=max_batches_in_flight,
            max_in_flight=max_pending,
            batch_timeout_ms=timeout_ms,
            in_process=in_process,
        )
        self.max_message_size = max_message_size
        self.compress_over_bytes = compress_over_bytes
        self.compress_level = compress_level
        self._rr = itertools.count()
        self._batch_size = max(1, batch_size)
        self._sticky: dict[str, tuple[int, int]] = {}  # topic -> (queue, sends left on it)
        self._sticky_mq: dict[str, tuple[MessageQueue, int]] = {}  # the same, several groups
        self._sticky_lock = threading.Lock()
        # topics no route names yet (auto-created on first send): their queues per group as the
        # masters' TOPIC_ROUTE answers say, until the route names them or this expires
        self._provisional: dict[str, tuple[list[MessageQueue], float]] = {}
        self._retries = _Retries(self._retry_item, self._fail_item)
        self.group = group
        self.client_id = client_id or new_client_id()
        self._presence: Presence | None = None
        if group is not None:
            self._presence = Presence(self._transport, self._routes, group, self.client_id,
                                      heartbeat_ms, timeout_ms, self._running_figures)

    def close(self) -> None:
        if self._presence is not None:
            self._presence.close()  # while the transport can still say it leaves
        super().close()
        self._retries.close()

    def _running_figures(self) -> dict[str, Any]:
        """What this producer tells a broker that asks (GET_CLIENT_RUNNING_INFO)."""
        return {"sendAsyncPending": self._transport.batches.pending,
                "retriesWaiting": self._retries.waiting}

    def send(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: str | list[str] | None = None,
        properties: dict[str, str] | None = None,
        queue_id: int | None = None,
        delay_level: int = 0,
        flag: int = 0,
        shard_key: str | None = None,
        broker_name: str | None = None,
        deliver_at: datetime.datetime | int | None = None,
        delay: datetime.timedelta | int | None = None,
    ) -> SendResult:
        """One message; ``shard_key`` picks its queue (every message of a key to one queue, in
        order: RocketMQ's SelectMessageQueueByHash, Kafka's keyed partitioning), ``queue_id``
        names one, neither spreads them round robin. ``broker_name`` keeps the send to one
        broker group (and names the group of ``queue_id`` when several hold the topic).

        A timer message: ``deliver_at`` (a datetime, naive ones in local time, or epoch ms) or
        ``delay`` (a timedelta or ms, counted from when the broker receives it) holds it until
        then (never earlier; later by at most the broker's ``timerPrecisionMs`` and its load);
        its result's ``recall_handle`` cancels it with ``recall`` until it is due."""
        over = self.compress_over_bytes
        if (shard_key is None and deliver_at is None and delay is None and tags is None
                and keys is None and not properties and not flag and not delay_level
                and type(body) is bytes and topic and len(body) <= self.max_message_size
                and (over is None or len(body) < over)):
            fields: dict[str, Any] = {"topic": topic}  # send_request's, for a plain message
        else:
            properties = _with_shard_key(properties, shard_key, queue_id)
            if deliver_at is not None or delay is not None:
                properties = _with_timer(properties, deliver_at, delay, delay_level)
            fields, body = self.send_request(topic, body, tags, keys, properties, flag,
                                             delay_level)

        def attempt(cluster: Cluster, address: str, mq: MessageQueue) -> SendResult:
            resp = cluster.request(
                address, RequestCode.SEND, {**fields, "queueId": mq.queue_id}, [body]
            )
            return send_results(topic, resp, mq.broker_name)[0]

        return self._routed(topic, queue_id, shard_key, broker_name,  # type: ignore[no-any-return]
                            attempt)

    def send_request(self, topic: str, body: bytes, tags: str | None = None,
                     keys: str | list[str] | None = None,
                     properties: dict[str, str] | None = None, flag: int = 0,
                     delay_level: int = 0) -> tuple[dict[str, Any], bytes]:
        """One message's SEND request, checked (``BrokerError`` MESSAGE_ILLEGAL) and compressed
        as ``send`` sends it: its fields without ``queueId``, and its body as sent."""
        msg = Message(topic, body, tags, keys, dict(properties or {}), flag, delay_level)
        self._check(msg)
        body, sys_flag = self._deflate(msg)
        fields: dict[str, Any] = {"topic": topic}
        meta = _message_meta(msg, sys_flag)
        if meta is not None:
            fields.update(zip(META_ITEMS, meta, strict=False))
            fields = {k: v for k, v in fields.items() if v is not None}
        if msg.delay_level:  # also in the DELAY property, RocketMQ's carrier, as brokers read it
            fields["delayLevel"] = msg.delay_level
        return fields, body

    def recall(self, topic: str, recall_handle: str) -> str:
        """Cancel a timer message that is not due yet, by the ``recall_handle`` its send
        returned; returns its message key. Refused (BrokerError MESSAGE_ILLEGAL) once it is due:
        it is delivered then, or about to be. A recall within one tick of the delivery time may
        come too late to stop it (RocketMQ's RecallMessage has the same window)."""
        try:
            handle = RecallHandle.decode(recall_handle)
        except ValueError as e:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, str(e), False) from None
        fields = {"topic": topic, "recallHandle": recall_handle}

        def attempt(cluster: Cluster, address: str, _mq: MessageQueue) -> str:
            resp = cluster.request(address, RequestCode.RECALL_MESSAGE, fields)
            if resp.code != ResponseCode.SUCCESS:
                raise BrokerError(resp.code, resp.remark)
            return str(resp.fields.get("msgId", handle.uniq_key))

        return self._routed(topic, None, None, handle.broker_name,  # type: ignore[no-any-return]
                            attempt)

    def send_batch(
        self, topic: str, bodies: Sequence[bytes | Message], queue_id: int | None = None,
        broker_name: str | None = None,
    ) -> list[SendResult]:
        """All messages in one request: one append, dense queue offsets, one acknowledgement
        (one queue, so one broker group: ``broker_name`` may name it)."""
        if not bodies:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "empty batch", False)
        fields: dict[str, Any] = {"topic": topic}
        if all(type(b) is bytes for b in bodies):  # plain bodies: no Message, no meta each
            plain = list(cast("Sequence[bytes]", bodies))
            self._check_body(topic, b"")
            longest = max(map(len, plain))
            if longest > self.max_message_size:
                self._check_body(topic, next(b for b in plain if len(b) == longest))
            over = self.compress_over_bytes
            if over is not None and longest >= over:
                packed = self._pack_messages(topic, plain, fields)
            else:
                packed = pack_bodies(fields, plain)
        else:
            packed = self._pack_messages(topic, bodies, fields)

        def attempt(cluster: Cluster, address: str, mq: MessageQueue) -> list[SendResult]:
            resp = cluster.request(
                address, RequestCode.SEND_BATCH, {**fields, "queueId": mq.queue_id}, packed
            )
            return send_results(topic, resp, mq.broker_name)

        return self._routed(topic, queue_id, None, broker_name,  # type: ignore[no-any-return]
                            attempt)

    def _pack_messages(
        self, topic: str, bodies: Sequence[bytes | Message], fields: dict[str, Any]
    ) -> list[bytes]:
        msgs = [b if isinstance(b, Message) else Message(topic, b) for b in bodies]
        for m in msgs:
            self._check(m)
            if m.topic != topic:
                raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "a batch holds one topic", False)
            if m.delay_level > 0 or PROPERTY_DELAY in m.properties or requested(m.properties):
                raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                                  "a batch cannot hold delayed or timer messages (send them one "
                                  "by one)", False)
        deflated = [self._deflate(m) for m in msgs]
        metas = [_message_meta(m, sys_flag) for m, (_, sys_flag) in zip(msgs, deflated, strict=True)]
        if any(m is not None for m in metas):
            fields["meta"] = metas
        return pack_bodies(fields, [body for body, _ in deflated])

    def send_async(
        self,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: str | list[str] | None = None,
        properties: dict[str, str] | None = None,
        queue_id: int | None = None,
        shard_key: str | None = None,
        broker_name: str | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Queue a send; concurrent sends to one queue are coalesced into batch requests.
        ``shard_key`` and ``queue_id`` pick the queue as for ``send``. Messages with a
        ``shard_key`` are stored in the order this method was called for them, retries
        included (at most one batch of their queue in flight; a retried one keeps its place,
        ``common/client/transport.py``); keyless ones may be reordered by a retry."""
        if shard_key is not None:
            properties = _with_shard_key(properties, shard_key, queue_id)
            try:
                key_mq = self._choose(self._routes.table(), topic, None, shard_key, broker_name)
            except BrokerError as e:  # no master or no such topic: reported like a send's
                failed: concurrent.futures.Future[SendResult] = LightFuture()
                failed.set_exception(e)
                return failed
            queue_id, broker_name = key_mq.queue_id, key_mq.broker_name
        over = self.compress_over_bytes
        if (tags is None and keys is None and not properties
                and (over is None or len(body) < over)):
            meta = None
            if type(body) is not bytes or not topic or len(body) > self.max_message_size:
                self._check_body(topic, body)  # what is wrong (inline when nothing is)
        else:
            msg = Message(topic, body, tags, keys, dict(properties or {}))
            self._check(msg)
            if PROPERTY_DELAY in msg.properties or requested(msg.properties):
                raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,  # it would travel in a batch
                                  "send_async cannot delay a message: use send(delay_level=..., "
                                  "deliver_at=..., delay=...)", False)
            body, sys_flag = self._deflate(msg)
            meta = _message_meta(msg, sys_flag)
        future: concurrent.futures.Future[SendResult] = LightFuture()
        item = AsyncItem("", topic, 0, bytes(body), meta, future, 0.0, queue_id, 0,
                         self._on_item_error, time.monotonic() + self.timeout_ms / 1000.0)
        item.fixed_broker = broker_name
        item.broker_name = broker_name or ""
        try:
            self._transport.batches.reserve(self.timeout_ms)
        except BrokerError as e:
            future.set_exception(e)
            return future
        if shard_key is not None:  # its order counts from now, the call's
            item.ordered = True
            item.seq = self._transport.batches.next_seq()
            assert queue_id is not None  # the key's queue, picked above
            item.queue_id = queue_id  # its lane, also while no master is known (hold_out)
        try:
            self._route(item)
        except BrokerError as e:  # no master found: retried like a failed batch, if retriable
            if item.ordered:
                self._transport.batches.hold_out(item)  # what is sent after it waits for it
            self._on_item_error(item, e)
            return future
        self._transport.submit(item)  # to its lane (Accumulator.requeue, one call less)
        return future

    # -- internals ------------------------------------------------------------------------------
    def _deflate(self, msg: Message) -> tuple[bytes, int]:
        """(body, sysflag) to send: the body deflated and COMPRESSED set when it is at least
        ``compress_over_bytes`` long and deflating makes it smaller; else as given, with the
        message's own sysflag (COMPRESSED there: the caller deflated the body itself)."""
        over = self.compress_over_bytes
        if over is None or len(msg.body) < over or msg.sys_flag & SYSFLAG_COMPRESSED:
            return msg.body, msg.sys_flag
        packed = compress_body(bytes(msg.body), self.compress_level)
        if packed is None:
            return msg.body, msg.sys_flag
        return packed, msg.sys_flag | SYSFLAG_COMPRESSED

    def _check(self, msg: Message) -> None:
        self._check_body(msg.topic, msg.body)

    def _check_body(self, topic: str, body: bytes) -> None:
        """Client-side refusals, raised before anything is sent."""
        if not isinstance(body, bytes | bytearray | memoryview):
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "body must be bytes", False)
        if len(body) > self.max_message_size:
            raise BrokerError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"body is {len(body)} bytes, maxMessageSize is {self.max_message_size}",
                False,
            )
        if not topic:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL, "empty topic", False)

    def queue_nums(self, topic: str, fresh: bool = False) -> int:
        """How many queues ``topic`` has over the cluster (the length of ``queues``): cached
        for ``route_ttl_ms``, asked now with ``fresh``. With one broker group, its master's
        count, counting the queues a first send would auto-create."""
        table = self._routes.refresh() if fresh else self._routes.table()
        if len(table.groups) <= 1:
            return self._cluster.queue_nums(topic, fresh)
        return len(self._send_queues(table, topic))

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's queues over the cluster, (group, id) in RocketMQ's order: what keyed
        sends hash over."""
        table = self._routes.table()
        if len(table.groups) <= 1:
            name = next(iter(table.groups))
            return [MessageQueue(name, q) for q in range(self._cluster.queue_nums(topic))]
        return list(self._send_queues(table, topic))

    def _routed(self, topic: str, queue_id: int | None, shard_key: str | None,
                broker_name: str | None,
                attempt: Callable[[Cluster, str, MessageQueue], Any]) -> Any:
        """Run ``attempt(group's discovery, its master, queue)``; retry retriable errors.

        One broker group: exactly ``ClientBase._with_retries`` (wait for a master up to
        ``timeout_ms``, re-discover after a doubtful answer). Several: a keyless send that
        finds its group without a master, or failing, marks the group for the selector and
        goes to another group at once; a keyed or explicit one waits for its group's master
        up to ``timeout_ms`` and then fails naming the group."""
        give_up = time.monotonic() + self.timeout_ms / 1000.0  # for finding a master
        keyless = queue_id is None and shard_key is None and broker_name is None
        n = 0
        while True:
            cluster: Cluster | None = None
            address = None
            mq: MessageQueue | None = None
            multi = False
            try:
                table = self._routes.table()
                multi = len(table.groups) > 1
                mq = self._choose(table, topic, queue_id, shard_key, broker_name)
                cluster = self._routes.cluster(mq.broker_name, table)
                address = cluster.master()
                result = attempt(cluster, address, mq)
                if multi and keyless and _degraded(result):
                    # stored, but the group's slaves did not confirm it: keyless sends go to
                    # the other groups for a while (RocketMQ retries another broker then)
                    self._routes.selector.failed(mq.broker_name)
                return result
            except NoMasterError as e:
                if multi and mq is not None:
                    if keyless:
                        self._routes.selector.failed(mq.broker_name)
                        if self._another_group_up(table, topic, mq.broker_name):
                            continue  # RocketMQ's latency fault tolerance: another group now
                    e = NoMasterError(e.servers, mq.broker_name)
                # each discovery waits up to DISCOVERY_TIMEOUT_MS for an answer: no spin here
                if self._closed.wait(NO_MASTER_PAUSE_S) or time.monotonic() >= give_up:
                    raise e from None
            except BrokerError as e:
                if cluster is not None and (isinstance(e, ClientTimeoutError)
                                            or e.code in REDISCOVER_CODES):
                    cluster.forget(address)
                if multi and mq is not None:
                    if keyless and e.retriable:
                        self._routes.selector.failed(mq.broker_name)
                    if e.code == ResponseCode.TOPIC_NOT_EXIST:
                        self._routes.invalidate()
                if not e.retriable or n == self.retries or self._closed.is_set():
                    if mq is not None and not e.broker_name:
                        e.broker_name = mq.broker_name  # where it went (an attribute: the
                    if address is not None and e.address is None:  # message is the broker's)
                        e.address = address
                    raise
                self._closed.wait(min(MAX_BACKOFF_S, 0.05 * 2**n))
                n += 1

    def _another_group_up(self, table: RouteTable, topic: str, failed: str) -> bool:
        down = self._routes.selector.down()
        return any(mq.broker_name != failed and mq.broker_name not in down
                   for mq in table.writable(topic))

    def _choose(self, table: RouteTable, topic: str, queue_id: int | None,
                shard_key: str | None, broker_name: str | None) -> MessageQueue:
        """The queue of a send: (group, id)."""
        if len(table.groups) <= 1:  # one group: its queue ids, as before there were several
            (name,) = table.groups
            if broker_name is not None and broker_name != name:
                raise unknown_group(broker_name, table)
            return MessageQueue(name, self._queue(topic, queue_id, shard_key))
        if broker_name is not None and broker_name not in table.groups:
            table = self._routes.recheck(broker_name)
            if broker_name not in table.groups:
                raise unknown_group(broker_name, table)
        if queue_id is not None:
            if broker_name is not None:
                return MessageQueue(broker_name, queue_id)
            if topic not in table.topics:  # made since the table was asked?
                table = self._routes.recheck(topic)
            return MessageQueue(one_group_of(topic, table, f"queue_id={queue_id}"), queue_id)
        if broker_name is not None:
            queues = queues_in(table.queues(topic), broker_name) or [
                MessageQueue(broker_name, q) for q in range(
                    self._routes.cluster(broker_name, table).queue_nums(topic))]
            if shard_key is not None:
                return queue_for_key(queues, shard_key)
            return queues[next(self._rr) % len(queues)]
        queues = self._send_queues(table, topic)
        if shard_key is not None:
            return queue_for_key(queues, shard_key)
        if queues is table.queues(topic):
            queues = table.writable(topic) or queues
        return self._routes.selector.pick(queues)

    def _send_queues(self, table: RouteTable, topic: str) -> list[MessageQueue]:
        """The topic's queues over the cluster. A topic no route names yet is asked of every
        group's master (TOPIC_ROUTE: the queues a first send auto-creates there, as RocketMQ's
        producers use TBW102's route), kept ``route_ttl_ms`` or until the route names it."""
        queues = table.queues(topic)
        if queues:
            return queues
        now = time.monotonic()
        known = self._provisional.get(topic)
        if known is not None and now < known[1]:
            return known[0]
        self._routes.invalidate()  # created since the table was asked? the next use re-asks
        found: list[MessageQueue] = []
        refused: BrokerError | None = None
        for name in table.group_names:
            if not table.groups[name].master:
                continue
            try:
                nums = self._routes.cluster(name, table).queue_nums(topic)
            except BrokerError as e:
                refused = refused or e
                continue
            found += [MessageQueue(name, q) for q in range(nums)]
        if not found:
            raise refused or NoMasterError(self._routes.seed.known_servers())
        if len(self._provisional) > 4096:
            self._provisional.clear()
        self._provisional[topic] = (found, now + self._routes.ttl_s)
        return found

    def _queue(self, topic: str, queue_id: int | None, shard_key: str | None = None) -> int:
        if queue_id is not None:
            return queue_id
        if shard_key is not None:
            return shard_queue(shard_key, self._cluster.queue_nums(topic))
        return next(self._rr) % self._cluster.queue_nums(topic)

    def _sticky_queue(self, topic: str) -> int:
        """Kafka's sticky partitioner: keyless async sends stay on one queue for a batch's
        worth of messages, so that concurrent sends coalesce into full batches, then move on
        round-robin (load still spreads over every queue)."""
        with self._sticky_lock:
            queue_id, left = self._sticky.get(topic, (-1, 0))
            if left <= 0:
                queue_id = next(self._rr) % self._cluster.queue_nums(topic)
                left = self._batch_size
            self._sticky[topic] = (queue_id, left - 1)
            return queue_id

    def _sticky_group_queue(self, table: RouteTable, topic: str) -> MessageQueue:
        """The sticky partitioner over several groups: a batch's worth on one queue, then the
        selector's next (which passes over a group that failed)."""
        with self._sticky_lock:
            mq, left = self._sticky_mq.get(topic, (None, 0))
        if mq is None or left <= 0 or not self._routes.selector.available(mq.broker_name):
            mq, left = self._choose(table, topic, None, None, None), self._batch_size
        with self._sticky_lock:
            self._sticky_mq[topic] = (mq, left - 1)
        return mq

    def _route(self, item: AsyncItem) -> None:
        """Pick the master and the queue for a message (may discover: not on the I/O thread)."""
        table = self._routes.table()
        if len(table.groups) <= 1:
            (name,) = table.groups
            if item.fixed_broker is not None and item.fixed_broker != name:
                raise unknown_group(item.fixed_broker, table)
            item.address = self._cluster.master()
            if item.fixed_queue is not None:
                item.queue_id = item.fixed_queue
            else:
                item.queue_id = self._sticky_queue(item.topic)
            item.broker_name = name
            item.enqueued = time.monotonic()
            return
        keyless = item.fixed_queue is None and item.fixed_broker is None
        for _ in range(len(table.groups)):
            if keyless:
                mq = self._sticky_group_queue(table, item.topic)
            else:
                mq = self._choose(table, item.topic, item.fixed_queue, None, item.fixed_broker)
            try:
                item.address = self._routes.cluster(mq.broker_name, table).master()
            except NoMasterError as e:
                if not keyless:
                    raise NoMasterError(e.servers, mq.broker_name) from None
                self._routes.selector.failed(mq.broker_name)  # another group, now
                if not self._another_group_up(table, item.topic, mq.broker_name):
                    raise NoMasterError(e.servers, mq.broker_name) from None
                continue
            item.queue_id, item.broker_name = mq.queue_id, mq.broker_name
            item.enqueued = time.monotonic()
            return
        raise NoMasterError(self._routes.seed.known_servers())

    def _on_item_error(self, item: AsyncItem, err: BrokerError) -> None:
        """A batch holding ``item`` failed (I/O thread) or no master was found for it (the
        sending thread): retry it on the retry thread, or fail it. Never blocks (the I/O
        thread calls it: nothing here asks the network)."""
        now = time.monotonic()
        keyless = item.fixed_queue is None and item.fixed_broker is None
        if keyless and item.broker_name and err.retriable and self._routes.multi_known():
            self._routes.selector.failed(item.broker_name)  # keyless: another group next
        if isinstance(err, NoMasterError):  # waiting for a master uses no retry (give_up)
            if now + NO_MASTER_PAUSE_S >= item.give_up or self._closed.is_set():
                self._fail_item(item, err)
            elif not self._retries.add(now + NO_MASTER_PAUSE_S, item, err):
                self._fail_item(item, err)  # the producer is closing
            return
        if isinstance(err, ClientTimeoutError) or err.code in REDISCOVER_CODES:
            self._routes.known_cluster(item.broker_name).forget(item.address)
        if not err.retriable or item.attempt >= self.retries or self._closed.is_set():
            self._fail_item(item, err)
            return
        item.attempt += 1
        backoff = min(MAX_BACKOFF_S, 0.05 * 2 ** (item.attempt - 1))
        if not self._retries.add(now + backoff, item, err):
            self._fail_item(item, err)  # the producer is closing

    def _retry_item(self, item: AsyncItem, err: BrokerError) -> None:
        """Retry thread: the item's backoff is over; find the master again and send it."""
        try:
            self._route(item)
            self._transport.batches.requeue(item)
        except BrokerError as e:
            self._on_item_error(item, e)

    def _fail_item(self, item: AsyncItem, err: BrokerError) -> None:
        item.future.set_exception(err)
        self._transport.batches.release_one(item)
