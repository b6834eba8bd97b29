"""``Consumer``: pulls (long polling), queue offsets by time, consumer offsets, send-back."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from common.client.base import ClientBase
from common.client.cluster import Cluster
from common.client.in_process import InProcess
from common.client.results import (
    NoMasterError,
    PullResult,
    SendResult,
    pull_result,
    send_results,
)
from common.client.routes import one_group_of, unknown_group
from common.client.routing import MessageQueue, RouteTable
from common.client.transport import DEFAULT_SPIN_US, DEFAULT_TIMEOUT_MS
from common.core.errors import BrokerError, ResponseCode
from common.core.keys import ClientKeys
from common.core.message import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    MessageExt,
    subscribed_tags,
)
from common.format.protocol import RequestCode

READ_PREFERENCES = (None, "master", "slave")


class Consumer(ClientBase):
    """Pulls from the consume queues of a cluster's broker groups; commits and fetches
    consumer offsets.

    A queue is its group and its id. With one broker group every call works as it always has
    (``broker_name`` may be left out). With several, each call goes to the group that owns
    the queue (its master, or a slave as ``read_from`` says), and ``broker_name`` names the
    group unless only one group holds the topic (else BAD_REQUEST, naming the groups)."""

    def __init__(
        self,
        servers: str | Iterable[str],
        group: str = "DEFAULT_CONSUMER",
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retries: int = 2,
        read_from: str | None = None,
        spin_us: int = DEFAULT_SPIN_US,
        key: str | os.PathLike[str] | None = None,
        server_key: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        curve: ClientKeys | None = None,
        in_process: Mapping[str, InProcess] | None = None,
        plain_calls: bool | None = None,
    ):
        """``read_from``: where pulls and offset reads go. None or "master": the master, and a
        slave of the group while no master answers (RocketMQ 4.x consumers do so during a
        failover); "slave": the slaves in turn, the master when none answers; an address:
        that broker only. Offset commits always go to the master; one made while no master
        answers is kept here and sent with the next one that reaches a master (``close``
        tries too), so a failover loses none of them.
        ``key``, ``server_key``, ``curve``: CURVE (``ClientBase``, docs/security.md).
        ``in_process``: brokers of this process, by address (``common/client/in_process.py``).
        ``plain_calls``: as ``Producer``'s."""
        super().__init__(servers, timeout_ms, retries, key=key, server_key=server_key,
                         curve=curve, spin_us=spin_us, in_process=in_process,
                         plain_calls=plain_calls)
        self.group = group
        self.read_from = read_from
        # (topic, queue_id[, group]) -> (offset, client id): the group is there over several
        self._unsent_commits: dict[tuple[Any, ...], tuple[int, str | None]] = {}
        self._commits_lock = threading.Lock()

    # ---- which group ------------------------------------------------------------------------
    def _target(self, topic: str, broker_name: str | None, what: str = "a queue id",
                wait: bool = True) -> tuple[Cluster, str, bool]:
        """(the group's master discovery, its name, several groups?) for a call on ``topic``.
        One group: the client's own discovery. Several: the group named, or the one group
        holding the topic. ``wait`` False: NoMasterError at once while no broker gives a
        route table."""
        table = (self._routes.wait_table(self._closed, self.timeout_ms) if wait
                 else self._routes.table())
        if len(table.groups) <= 1:
            (name,) = table.groups
            if broker_name is not None and broker_name != name:
                raise unknown_group(broker_name, table)
            return self._cluster, name, False
        if broker_name is None:
            try:
                broker_name = one_group_of(topic, table, what)
            except BrokerError as e:
                if e.code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
                table = self._routes.recheck(topic)  # made since the table was asked?
                broker_name = one_group_of(topic, table, what)
        elif broker_name not in table.groups:
            table = self._routes.recheck(broker_name)
            if broker_name not in table.groups:
                raise unknown_group(broker_name, table)
        return self._routes.cluster(broker_name, table), broker_name, True

    def _fixed_target(self, topic: str, broker_name: str | None) -> tuple[Cluster, str, bool]:
        """``read_from`` an address: that broker whatever the route says (no master needed,
        nor a route: the group is named from the route when it can be)."""
        name = broker_name or self._routes.group_of_address(str(self.read_from))
        return self._cluster, name, False

    def _read_target(self, topic: str, broker_name: str | None) -> tuple[Cluster, str, bool]:
        if self.read_from not in READ_PREFERENCES:
            return self._fixed_target(topic, broker_name)
        return self._target(topic, broker_name)

    def route_table(self, fresh: bool = False) -> RouteTable:
        """The cluster's route table as this client keeps it (asked again now with ``fresh``;
        waits up to ``timeout_ms`` while no broker gives one)."""
        if fresh:
            try:
                return self._routes.refresh()
            except NoMasterError:
                pass
        return self._routes.wait_table(self._closed, self.timeout_ms)

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's queues over the cluster, (group, id) in RocketMQ's order, as the route
        names them (one group: its master's count)."""
        table = self._routes.wait_table(self._closed, self.timeout_ms)
        if len(table.groups) <= 1:
            (name,) = table.groups
            return [MessageQueue(name, q) for q in range(self.queue_nums(topic))]
        queues = table.queues(topic) or self._routes.recheck(topic).queues(topic)
        if not queues:
            one_group_of(topic, table, "")  # TOPIC_NOT_EXIST, naming the groups
        return list(queues)

    def pull(
        self,
        topic: str,
        queue_id: int = 0,
        offset: int = 0,
        max_nums: int = 32,
        suspend_ms: int = 0,
        tags: str | None = None,
        broker_name: str | None = None,
        sql: str | None = None,
    ) -> PullResult:
        """Read from a consume queue; ``suspend_ms`` > 0 long-polls at the end of the queue.
        ``broker_name``: the queue's group (needed when several groups hold the topic).
        ``tags`` (``"A || B"``) or ``sql`` (a SQL92 expression over the message's properties,
        RocketMQ's ``MessageSelector.bySql``; the broker needs ``enablePropertyFilter``): only
        the messages that match come back, the others are skipped on the broker (a pull that
        met none answers NO_MATCHED_MSG with the offset to go on from)."""
        if tags and sql is not None:
            raise ValueError("subscribe by tags or by sql, not both")
        fields: dict[str, Any] = {
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxNums": max_nums,
            "group": self.group,
            "suspendMs": suspend_ms,
        }
        if tags:
            fields["tags"] = tags
        if sql is not None:
            fields["expressionType"] = "SQL92"
            fields["subscription"] = sql

        cluster, name, _ = self._read_target(topic, broker_name)

        def attempt(address: str) -> PullResult:
            resp = cluster.request(
                address,
                RequestCode.PULL,
                fields,
                timeout_ms=self.timeout_ms + suspend_ms,
            )
            return pull_result(resp, name)

        result: PullResult = self._read(attempt, cluster)
        wanted = subscribed_tags(tags)
        if wanted is not None and any(m.tags not in wanted for m in result.messages):
            # a broker that filtered by hash code only (another tag with the same hash)
            result = dataclasses.replace(
                result, messages=[m for m in result.messages if m.tags in wanted])
        return result

    def _read(self, attempt: Any, cluster: Cluster | None = None) -> Any:
        return self._with_retries(attempt, read_from=self.read_from, read=True,
                                  cluster=cluster)

    def min_offset(self, topic: str, queue_id: int, broker_name: str | None = None) -> int:
        """The oldest queue offset still held (RocketMQ ``minOffset``, Kafka
        ``beginning_offsets``); 0 for a queue that does not exist."""
        return self._queue_offset(RequestCode.GET_MIN_OFFSET, topic, queue_id, broker_name)

    def max_offset(self, topic: str, queue_id: int, broker_name: str | None = None) -> int:
        """Where the queue's next message will go (RocketMQ ``maxOffset``, Kafka
        ``end_offsets``); 0 for a queue that does not exist."""
        return self._queue_offset(RequestCode.GET_MAX_OFFSET, topic, queue_id, broker_name)

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int,
                      broker_name: str | None = None) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms`` (ms
        since the epoch; RocketMQ ``searchOffset``, Kafka ``offsets_for_times``): the max offset
        when every message is older, so pulling from it waits for new ones."""
        return self._queue_offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic, queue_id,
                                  broker_name, timestamp=timestamp_ms)

    def queue_nums(self, topic: str, fresh: bool = True, broker_name: str | None = None) -> int:
        """How many queues the topic has in its group, asked of the master each time
        (``fresh`` or not); BrokerError TOPIC_NOT_EXIST when it has no such topic. Over several
        groups, the count of the group named (or the one group holding the topic); ``queues``
        lists every group's. (A producer's view, ``Producer.queue_nums``, is cached and counts
        the queues a first send would auto-create: a consumer's view counts only queues that
        exist.)"""
        cluster, _, _ = self._target(topic, broker_name, "a queue count")

        def attempt(address: str) -> int:
            resp = cluster.request(address, RequestCode.TOPIC_ROUTE, {"topic": topic})
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return int(resp.fields["queueNums"])

        return self._with_retries(attempt, cluster=cluster)  # type: ignore[no-any-return]

    def _queue_offset(self, code: RequestCode, topic: str, queue_id: int,
                      broker_name: str | None, **extra: int) -> int:
        fields: dict[str, Any] = {"topic": topic, "queueId": queue_id, **extra}
        cluster, _, _ = self._read_target(topic, broker_name)

        def attempt(address: str) -> int:
            resp = cluster.request(address, code, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return int(resp.fields["offset"])

        return self._read(attempt, cluster)  # type: ignore[no-any-return]

    def heartbeat(self, client_id: str, session_timeout_ms: int = 10_000, leave: bool = False
                  ) -> list[str]:
        """Tell the group's master that ``client_id`` of this group is alive for the next
        ``session_timeout_ms`` (or, with ``leave``, gone); returns the group's live members,
        sorted (``GroupConsumer``). One broker group; over several, ``heartbeat_groups``."""
        return self._heartbeat(self._cluster, client_id, session_timeout_ms, leave, True)

    def heartbeat_groups(self, client_id: str, session_timeout_ms: int = 10_000,
                         leave: bool = False) -> dict[str, list[str] | None]:
        """``heartbeat`` to the master of every broker group of the cluster: broker group ->
        the consumer group's live members as that master knows them (None: that broker group
        has no master now). Each master fences commits of its queues by its own list."""
        table = self._routes.wait_table(self._closed, self.timeout_ms)
        out: dict[str, list[str] | None] = {}
        for name in table.group_names:
            cluster = self._routes.cluster(name, table)
            try:
                out[name] = self._heartbeat(cluster, client_id, session_timeout_ms, leave,
                                            len(table.groups) <= 1)
            except NoMasterError:
                if len(table.groups) <= 1:
                    raise
                out[name] = None
        return out

    def _heartbeat(self, cluster: Cluster, client_id: str, session_timeout_ms: int,
                   leave: bool, wait_for_master: bool) -> list[str]:
        fields = {"group": self.group, "clientId": client_id,
                  "sessionTimeoutMs": session_timeout_ms, "leave": int(leave)}

        def attempt(address: str) -> list[str]:
            resp = cluster.request(address, RequestCode.CONSUMER_HEARTBEAT, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return [str(m) for m in resp.fields.get("members", [])]

        return self._with_retries(attempt, cluster=cluster,  # type: ignore[no-any-return]
                                  wait_for_master=wait_for_master)

    def commit_offset(self, topic: str, queue_id: int, offset: int,
                      client_id: str | None = None, broker_name: str | None = None) -> None:
        """Commit the group's next offset for the queue, to the master of its broker group;
        with ``client_id`` (a group member) the master refuses it (CONSUMER_NOT_ONLINE) unless
        the member owns the queue."""
        key: tuple[Any, ...]
        try:
            _, name, multi = self._target(topic, broker_name, wait=False)
            key = (topic, queue_id, name) if multi else (topic, queue_id)
        except NoMasterError:  # no broker gives a route now: kept as it is given
            key = (topic, queue_id, broker_name) if broker_name else (topic, queue_id)
        group = key[2] if len(key) > 2 else None
        if self._unsent_commits and not self._flush(group):
            with self._commits_lock:  # still no master: keep this one too, newest wins
                self._unsent_commits[key] = (offset, client_id)
            return
        try:
            self._commit_now(key, offset, client_id)
        except NoMasterError:
            with self._commits_lock:
                self._unsent_commits[key] = (offset, client_id)

    def _commit_now(self, key: tuple[Any, ...], offset: int, client_id: str | None) -> None:
        topic, queue_id = key[0], key[1]
        cluster, _, _ = self._target(topic, key[2] if len(key) > 2 else None, wait=False)
        fields: dict[str, Any] = {"group": self.group, "topic": topic, "queueId": queue_id,
                                  "queueOffset": offset}
        if client_id:
            fields["clientId"] = client_id

        def attempt(address: str) -> None:
            resp = cluster.request(address, RequestCode.COMMIT_OFFSET, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)

        self._with_retries(attempt, wait_for_master=False, cluster=cluster)

    def send_back(self, msg: MessageExt, delay_level: int = 0,
                  max_reconsume_times: int | None = None) -> SendResult:
        """RocketMQ's ``sendMessageBack``: this group failed ``msg``, so the master stores a copy
        in the group's retry topic ``%RETRY%<group>``, due after ``delay_level`` (0: the
        broker's choice, level 3 + the times it came back already), or in its dead-letter topic
        ``%DLQ%<group>`` once it came back ``max_reconsume_times`` times (None: the group's
        ``retryMaxTimes``, 16 unless ``replog groups --create`` set it; or at once with
        ``delay_level`` -1). The result names the copy (``topic`` is the retry or DLQ topic).

        Only a ``SEND_OK`` result means the copy is as safe as a sent message (a SYNC_MASTER's
        slave holds it): commit past ``msg`` after that, not before. A retried request may store
        two copies (at least once)."""
        if not -1 <= delay_level <= 64:
            raise BrokerError(ResponseCode.MESSAGE_ILLEGAL,
                              f"delay_level {delay_level} is not -1..64", False)
        fields: dict[str, Any] = {
            "group": self.group, "offset": msg.commit_log_offset, "originTopic": msg.topic,
            "delayLevel": delay_level,
        }
        if max_reconsume_times is not None:
            fields["maxReconsumeTimes"] = max_reconsume_times
        origin = msg.properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or msg.msg_id
        if origin:
            fields["originMsgId"] = origin
        # to the master of the group the message came from (RocketMQ sends it back to the
        # broker it was pulled from): the copy goes to that group's retry topic
        cluster, name, _ = self._target(msg.topic, msg.broker_name or None)

        def attempt(address: str) -> SendResult:
            resp = cluster.request(address, RequestCode.CONSUMER_SEND_MSG_BACK, fields)
            topic = resp.fields.get("topic")
            return send_results(topic if isinstance(topic, str) else "", resp, name)[0]

        return self._with_retries(attempt, cluster=cluster)  # type: ignore[no-any-return]

    def fetch_offset(self, topic: str, queue_id: int, broker_name: str | None = None) -> int:
        """The group's committed offset for the queue, or -1 when none was committed."""
        fields = {"group": self.group, "topic": topic, "queueId": queue_id}
        cluster, name, multi = self._read_target(topic, broker_name)
        key: tuple[Any, ...] = (topic, queue_id, name) if multi else (topic, queue_id)
        with self._commits_lock:
            unsent = self._unsent_commits.get(key)
        if unsent is not None:
            return unsent[0]  # committed here while no master answered: that is the newest

        def attempt(address: str) -> int:
            resp = cluster.request(address, RequestCode.FETCH_OFFSET, fields)
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return int(resp.fields.get("queueOffset", -1))

        return self._read(attempt, cluster)  # type: ignore[no-any-return]

    @property
    def unsent_commits(self) -> dict[tuple[Any, ...], int]:
        """Offsets committed while no master answered, not yet sent: (topic, queue) -> offset;
        over several broker groups the key is (topic, queue, group)."""
        with self._commits_lock:
            return {k: v[0] for k, v in self._unsent_commits.items()}

    def flush_commits(self) -> bool:
        """Send the offsets kept while no master answered; True when none is left (a group
        still without a master keeps its own; the others' go)."""
        return self._flush(None)

    def _flush(self, group: str | None) -> bool:
        """``flush_commits`` for the kept offsets of one broker group (None: all)."""
        with self._commits_lock:
            unsent = {k: v for k, v in self._unsent_commits.items()
                      if group is None or (k[2] if len(k) > 2 else None) == group}
        left = False
        for key, (offset, client_id) in unsent.items():
            try:
                self._commit_now(key, offset, client_id)
            except NoMasterError:
                left = True
                continue
            with self._commits_lock:
                if self._unsent_commits.get(key) == (offset, client_id):
                    del self._unsent_commits[key]
        return not left

    def close(self) -> None:
        if self._unsent_commits and not self._closed.is_set():
            try:
                self.flush_commits()
            except BrokerError:
                pass  # reported by unsent_commits; nothing else to do at close
        super().close()
