"""``Admin``: status, promotion, topics, config documents and message look-ups."""

from __future__ import annotations

import contextlib
import hashlib
import time
from typing import Any

from common.client.base import ClientBase
from common.client.cluster import Cluster
from common.client.routes import parse_cluster_info, unknown_group
from common.client.routing import RouteTable
from common.core.errors import BrokerError, ResponseCode
from common.core.message import PROPERTY_REAL_TOPIC, MessageExt
from common.core.transaction import PRODUCER_GROUP, TRANSACTION_ID, TransactionState
from common.format.protocol import (
    LOG_CHECKSUM_MAX_BYTES,
    ProtocolError,
    RequestCode,
    decode_record,
)
from common.format.tables import (
    DEFAULT_RETRY_MAX_TIMES,
    GroupConfig,
    loads,
    parse_groups,
    parse_offsets,
    parse_topic_attributes,
    parse_topics,
)

__all__ = ["Admin", "parse_cluster_info"]


class Admin(ClientBase):
    """Status, promotion, topics and message look-ups against one broker, a group, or every
    group of the cluster."""

    def cluster_info(self, address: str | None = None) -> dict[str, Any]:
        """Every broker group of the cluster with its master, slaves, topics and their perms
        (any broker answers: in controller mode from ZooKeeper, otherwise its own group)."""
        resp = self._cluster.request(address or self.servers[0], RequestCode.CLUSTER_INFO)
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        return parse_cluster_info(resp)

    def route_table(self, fresh: bool = False) -> RouteTable:
        """The cluster's route table as this client keeps it (waits up to ``timeout_ms``
        while no broker gives one; asked again now with ``fresh``)."""
        if fresh:
            return self._routes.refresh()
        return self._routes.wait_table(self._closed, self.timeout_ms)

    def broker_names(self) -> list[str]:
        """The cluster's broker groups, as the route table names them."""
        return self._routes.wait_table(self._closed, self.timeout_ms).group_names

    def _groups(self, broker_names: list[str] | None = None) -> list[tuple[str, Cluster]]:
        """(group, its master discovery) for every group of the cluster, or those named."""
        table = self._routes.wait_table(self._closed, self.timeout_ms)
        names = table.group_names
        if broker_names is not None:
            for name in broker_names:
                if name not in table.groups:
                    table = self._routes.recheck(name)
                    if name not in table.groups:
                        raise unknown_group(name, table)
            names = sorted(set(broker_names))
        return [(name, self._routes.cluster(name, table)) for name in names]

    def status(self, address: str | None = None,
               timeout_ms: int | None = None) -> dict[str, Any]:
        """One broker's status snapshot (docs/contract.md §3 fields and more); ``timeout_ms``
        (default: the client's) bounds this one call."""
        return self._cluster.status(address or self.servers[0], timeout_ms)

    def promote(self, address: str | None = None, role: str = "SYNC_MASTER") -> dict[str, Any]:
        """Turn the slave at ``address`` into its group's master; returns its new status."""
        resp = self._cluster.request(
            address or self.servers[0], RequestCode.PROMOTE, {"role": role}
        )
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        self._cluster.forget()
        return dict(resp.fields)

    def config_document(self, code: RequestCode, address: str | None = None) -> bytes:
        """A broker's table as its file holds it (JSON bytes): ``RequestCode.
        GET_ALL_TOPIC_CONFIG`` (topics.json), ``GET_ALL_CONSUMER_OFFSET`` (consumerOffset.json)
        or ``GET_ALL_DELAY_OFFSET`` (delayOffset.json); what a slave copies from its master."""
        return self._config_document(self._cluster, code, address or self.servers[0])

    def _config_document(self, cluster: Cluster, code: RequestCode, address: str) -> bytes:
        resp = cluster.request(address, code, {})
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        if len(resp.bodies) != 1:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"{code.name}: {len(resp.bodies)} body frames, expected 1")
        return bytes(resp.bodies[0])

    def create_topic(self, topic: str, queue_nums: int,
                     broker_names: list[str] | None = None,
                     attributes: dict[str, str] | None = None) -> int:
        """Make ``topic`` with ``queue_nums`` queues on the master of every broker group of the
        cluster (or of the groups named), or grow it to that many (RocketMQ's updateTopic on
        each broker of the cluster); returns how many it had before where it had the fewest
        (0: it is new somewhere). A topic never shrinks: fewer queues than a group has is
        refused (BAD_REQUEST) by that group. ``attributes``: RocketMQ 5's topic attributes
        (``{"message.type": "FIFO"}``: every message needs a message group), replacing the
        topic's. ``create_topic_on_groups`` says group by group."""
        return min(self.create_topic_on_groups(topic, queue_nums, broker_names,
                                               attributes).values())

    def create_topic_on_groups(self, topic: str, queue_nums: int,
                               broker_names: list[str] | None = None,
                               attributes: dict[str, str] | None = None) -> dict[str, int]:
        """``create_topic``, returning group -> the queue count it had before. Each master
        publishes its topics to ZooKeeper at once, so the cluster's route names the topic
        right after (clients take it at their next route refresh)."""
        groups = self._groups(broker_names)
        self._wait_masters([name for name, _ in groups])
        before: dict[str, int] = {}
        fields: dict[str, Any] = {"topic": topic, "queueNums": queue_nums}
        if attributes is not None:
            fields["attributes"] = dict(attributes)
        for name, cluster in groups:

            def attempt(address: str, cluster: Cluster = cluster, name: str = name) -> int:
                resp = cluster.request(address, RequestCode.CREATE_TOPIC, fields)
                if not resp.ok:
                    raise BrokerError(resp.code, f"{name}: {resp.remark}")
                return int(resp.fields.get("before", 0))

            before[name] = self._with_retries(attempt, cluster=cluster)
        self._routes.invalidate()
        return before

    def _wait_masters(self, names: list[str]) -> None:
        """Wait (up to the client's timeout) until every group named has a master in the
        routes: a topic made while one has none would exist on fewer groups than asked, and
        a send keyed to the missing group's queues would find none."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        while True:
            table = self._routes.table()
            missing = [n for n in names if n not in table.groups or not table.groups[n].master]
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                                  f"groups {missing} have no master now: the change would "
                                  "reach fewer groups than asked; nothing was changed (try "
                                  "again once they elect one)", False)
            self._closed.wait(0.2)
            with contextlib.suppress(BrokerError):  # no route answer: looked at again
                self._routes.refresh()

    def acl_info(self, address: str | None = None) -> dict[str, Any]:
        """The ACL a broker has in force (GET_BROKER_CLUSTER_ACL_INFO, admin accounts only):
        version, sha256, reload error, accounts without their keys (docs/security.md)."""
        resp = self._cluster.request(address or self.servers[0],
                                     RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {})
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        return dict(resp.fields)

    def topics(self) -> dict[str, int]:
        """Every topic of the cluster with its queue count over all groups (one group: its
        master's topics.json; RocketMQ's topicList, Kafka's listTopics). Topics are made on
        first use unless the masters' ``autoCreateTopicEnable`` is off. ``topic_layout``
        gives each group's count."""
        return {topic: sum(groups.values()) for topic, groups in self.topic_layout().items()}

    def topic_layout(self) -> dict[str, dict[str, int]]:
        """topic -> group -> queue count, read from every group's master."""
        out: dict[str, dict[str, int]] = {}
        for name, cluster in self._groups():

            def attempt(address: str, cluster: Cluster = cluster) -> dict[str, int]:
                raw = self._config_document(cluster, RequestCode.GET_ALL_TOPIC_CONFIG, address)
                try:
                    queues, _ = parse_topics(loads(raw, "topics.json"),
                                             f"topics.json of {address}")
                except ValueError as e:
                    raise BrokerError(ResponseCode.SYSTEM_ERROR, str(e)) from None
                return queues

            for topic, nums in self._with_retries(attempt, cluster=cluster).items():
                out.setdefault(topic, {})[name] = nums
        return out

    def create_group(self, group: str, *, orderly: bool = False,
                     retry_max_times: int = DEFAULT_RETRY_MAX_TIMES, consume_enable: bool = True,
                     broker_names: list[str] | None = None) -> dict[str, bool]:
        """Make or change a consumer group's config on the master of every broker group (or of
        those named): RocketMQ's updateSubGroup. ``orderly``: its POPs hand out each queue in
        order (consumeMessageOrderly, the group's FIFO attribute); ``retry_max_times``: a
        message is handed out again that many times before the group's DLQ, unless the
        consumer names its own; ``consume_enable`` False: its PULLs and POPs are refused.
        Returns broker group -> True if the group was new there."""
        fields = {"groupName": group, "consumeMessageOrderly": int(orderly),
                  "retryMaxTimes": retry_max_times, "consumeEnable": int(consume_enable)}
        return {name: bool(created["created"]) for name, created in
                self._on_masters(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, fields,
                                 broker_names).items()}

    def delete_group(self, group: str, clean_offset: bool = False,
                     broker_names: list[str] | None = None) -> dict[str, dict[str, int]]:
        """Forget a consumer group's config on every master (or those named), and with
        ``clean_offset`` its committed offsets; broker group -> ``deleted`` (0/1) and
        ``offsetsRemoved``."""
        fields = {"groupName": group, "cleanOffset": int(clean_offset)}
        return self._on_masters(RequestCode.DELETE_SUBSCRIPTIONGROUP, fields, broker_names)

    def group_configs(self) -> dict[str, dict[str, GroupConfig]]:
        """broker group -> consumer group -> its config, as each master's
        subscriptionGroup.json holds it (groups made on first use are there too)."""
        out: dict[str, dict[str, GroupConfig]] = {}
        for name, cluster in self._groups():

            def attempt(address: str, cluster: Cluster = cluster) -> dict[str, GroupConfig]:
                raw = self._config_document(
                    cluster, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, address)
                source = f"subscriptionGroup.json of {address}"
                try:
                    groups, _ = parse_groups(loads(raw, source), source)
                except ValueError as e:
                    raise BrokerError(ResponseCode.SYSTEM_ERROR, str(e)) from None
                return groups

            out[name] = self._with_retries(attempt, cluster=cluster)
        return out

    def _on_masters(self, code: RequestCode, fields: dict[str, Any],
                    broker_names: list[str] | None) -> dict[str, dict[str, Any]]:
        groups = self._groups(broker_names)
        self._wait_masters([name for name, _ in groups])
        out: dict[str, dict[str, Any]] = {}
        for name, cluster in groups:

            def attempt(address: str, cluster: Cluster = cluster,
                        name: str = name) -> dict[str, Any]:
                resp = cluster.request(address, code, fields)
                if not resp.ok:
                    raise BrokerError(resp.code, f"{name}: {resp.remark}")
                return dict(resp.fields)

            out[name] = self._with_retries(attempt, cluster=cluster)
        return out

    def topic_attributes(self) -> dict[str, dict[str, str]]:
        """topic -> its attributes (RocketMQ 5's ``message.type``, ...), as the masters'
        topics.json hold them (the first master that names the topic)."""
        out: dict[str, dict[str, str]] = {}
        for _, cluster in self._groups():

            def attempt(address: str, cluster: Cluster = cluster) -> dict[str, dict[str, str]]:
                raw = self._config_document(cluster, RequestCode.GET_ALL_TOPIC_CONFIG, address)
                source = f"topics.json of {address}"
                try:
                    return parse_topic_attributes(loads(raw, source), source)
                except ValueError as e:
                    raise BrokerError(ResponseCode.SYSTEM_ERROR, str(e)) from None

            for topic, attrs in self._with_retries(attempt, cluster=cluster).items():
                out.setdefault(topic, attrs)
        return out

    def master_address(self, broker_name: str | None = None) -> str:
        """The client address of the group's master (the broker of the highest epoch that
        answers as master); NoMasterError when none does. Over several groups, name one."""
        if broker_name is None:
            return self._cluster.master()
        ((_, cluster),) = self._groups([broker_name])
        return cluster.master()

    def group_offsets(self) -> dict[str, dict[str, dict[int, int]]]:
        """Every consumer group's committed offsets on the group's master: group -> topic ->
        queue -> the next offset to consume (its consumerOffset.json; RocketMQ's
        GET_ALL_CONSUMER_OFFSET, Kafka's listConsumerGroupOffsets for every group). Over
        several broker groups: ``group_offsets_by_broker``."""
        return self._group_offsets(self._cluster)

    def group_offsets_by_broker(self) -> dict[str, dict[str, dict[str, dict[int, int]]]]:
        """broker group -> ``group_offsets`` of its master, for every group of the cluster."""
        return {name: self._group_offsets(cluster) for name, cluster in self._groups()}

    def consumer_members(self, group: str) -> list[str]:
        """The consumer group's live members (client ids) over every broker group's master
        (GET_CONSUMER_CONNECTION_LIST; a master that does not answer is skipped)."""
        members: set[str] = set()
        for _name, cluster in self._groups():
            try:
                resp = cluster.request(cluster.master(), RequestCode.GET_CONSUMER_CONNECTION_LIST,
                                       {"group": group})
            except BrokerError:
                continue
            if resp.ok:
                members.update(resp.fields.get("members") or [])
        return sorted(members)

    def status_of_masters(self) -> dict[str, dict[str, Any]]:
        """broker group -> its master's status, for every group that has a master now."""
        out = {}
        for name, cluster in self._groups():
            try:
                out[name] = cluster.status(cluster.master())
            except BrokerError:
                continue
        return out

    def _group_offsets(self, cluster: Cluster) -> dict[str, dict[str, dict[int, int]]]:
        def attempt(address: str) -> dict[str, dict[str, dict[int, int]]]:
            raw = self._config_document(cluster, RequestCode.GET_ALL_CONSUMER_OFFSET, address)
            source = f"consumerOffset.json of {address}"
            try:
                table = parse_offsets(loads(raw, source), source)
            except ValueError as e:
                raise BrokerError(ResponseCode.SYSTEM_ERROR, str(e)) from None
            out: dict[str, dict[str, dict[int, int]]] = {}
            for key, queues in table.items():
                topic, _, group = key.rpartition("@")  # RocketMQ's "topic@group"
                out.setdefault(group, {})[topic] = dict(queues)
            return out

        return self._with_retries(attempt, cluster=cluster)  # type: ignore[no-any-return]

    def query_by_key(
        self, topic: str, key: str, max_nums: int = 32, address: str | None = None
    ) -> list[MessageExt]:
        return self._query(
            RequestCode.QUERY_BY_KEY, {"topic": topic, "key": key, "maxNums": max_nums}, address
        )

    def query_by_msg_id(self, msg_id: str, address: str | None = None) -> MessageExt | None:
        """The message ``msg_id`` names, asked of ``address``, or else of the given servers in
        turn until one holds it. A msgId names the broker that stored the message (its
        STOREHOST): every replica of that broker's group answers with it, any other broker
        answers not found. A record that is not the one named (a broker that looked at the
        offset alone) counts as not found. None when no broker holds it; the last error when
        some broker could not be asked and none held it."""
        wanted = msg_id.upper()
        error: BrokerError | None = None
        for target in [address] if address else list(self.servers):
            try:
                found = self._query(RequestCode.QUERY_BY_MSG_ID, {"msgId": msg_id}, target)
            except BrokerError as e:
                if e.code == ResponseCode.BAD_REQUEST:
                    raise  # a malformed msgId: no broker would take it
                error = e
                continue
            for message in found:
                if message.msg_id == wanted:
                    return message
        if error is not None:
            raise error
        return None

    def clear_election_fault(self, address: str) -> str:
        """Controller mode: let the broker at ``address``, which failed to take over as
        master, stand in elections again; returns the fault it had ("" if none)."""
        resp = self._cluster.request(address, RequestCode.CLEAR_ELECTION_FAULT, {})
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        return str(resp.fields.get("cleared", ""))

    def producer_connections(self, group: str, address: str | None = None,
                             running_info: bool = False) -> list[dict[str, Any]]:
        """The live producers of ``group`` as the broker at ``address`` (default: the master)
        knows them from their heartbeats: clientId, address, lastHeartbeatAgoMs; with
        ``running_info``, each one's own figures as it answered the broker (``runningInfo``;
        ``{"error": ...}`` for one that did not answer within 3 s)."""
        target = address or self._cluster.master()
        timeout = self.timeout_ms + (3000 if running_info else 0)
        resp = self._cluster.request(target, RequestCode.GET_PRODUCER_CONNECTION_LIST,
                                     {"group": group, "runningInfo": int(running_info)},
                                     timeout_ms=timeout)
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        return [dict(p) for p in resp.fields.get("producers", [])]

    def given_up_transactions(self, from_offset: int = 0, max_nums: int = 32,
                              address: str | None = None) -> tuple[list[MessageExt], int, int]:
        """The halves the check-back of the broker at ``address`` (default: the master) gave
        up after ``transactionCheckMax`` checks, from queue offset ``from_offset`` of
        ``TRANS_CHECK_MAX_TIME_TOPIC``: (halves, the next offset, the queue's max offset).
        Each is still open: ``end_given_up`` decides it."""
        target = address or self._cluster.master()
        resp = self._cluster.request(target, RequestCode.QUERY_GIVEN_UP_TRANSACTIONS,
                                     {"fromOffset": from_offset, "maxNums": max_nums})
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        try:
            halves = [decode_record(raw) for raw in resp.bodies]
        except ProtocolError as e:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"corrupt record in answer: {e}") from None
        return halves, int(resp.fields["nextOffset"]), int(resp.fields["maxOffset"])

    def end_given_up(self, half: MessageExt, commit: bool,
                     address: str | None = None) -> dict[str, Any]:
        """Commit or roll back a transaction the check-back gave up (``half`` as
        ``given_up_transactions`` listed it), once: the answer's fields (``repeated`` if it was
        so decided already); BrokerError MESSAGE_ILLEGAL if it was decided the other way."""
        target = address or self._cluster.master()
        fields = {"topic": half.properties.get(PROPERTY_REAL_TOPIC, ""),
                  "producerGroup": half.properties.get(PRODUCER_GROUP, ""),
                  "commitLogOffset": half.commit_log_offset,
                  "tranStateTableOffset": half.queue_offset,
                  "commitOrRollback": (TransactionState.COMMIT if commit
                                       else TransactionState.ROLLBACK).sys_flag,
                  "msgId": half.msg_id,
                  "transactionId": half.properties.get(TRANSACTION_ID, "")}
        resp = self._cluster.request(target, RequestCode.END_TRANSACTION, fields)
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        return dict(resp.fields)

    def log_checksum(self, address: str, from_offset: int, to_offset: int) -> str:
        """The checksum of the CommitLog bytes ``[from_offset, to_offset)`` as the broker at
        ``address`` holds them, computed by that broker (no file is read here): the sha256 hex
        digest of those bytes when the range is at most ``LOG_CHECKSUM_MAX_BYTES`` long; a
        longer range is asked in pieces of that size from ``from_offset``, and the answer is
        the sha256 of the pieces' digests (32 bytes each, in order). Equal ranges of equal
        bytes give equal answers on every broker, so replicas compare without sharing files.
        BrokerError ``OFFSET_OUT_OF_RANGE`` when the broker does not hold the whole range."""
        if not 0 <= from_offset <= to_offset:
            raise BrokerError(ResponseCode.BAD_REQUEST,
                              f"[{from_offset}, {to_offset}) is not a CommitLog range", False)
        pieces: list[bytes] = []
        pos = from_offset
        while True:
            end = min(to_offset, pos + LOG_CHECKSUM_MAX_BYTES)
            resp = self._cluster.request(address, RequestCode.LOG_CHECKSUM,
                                         {"fromOffset": pos, "toOffset": end})
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            digest = resp.fields.get("sha256")
            if not isinstance(digest, str) or len(digest) != 64:
                raise BrokerError(ResponseCode.SYSTEM_ERROR,
                                  f"LOG_CHECKSUM answer without a sha256: {resp.fields!r}")
            pieces.append(bytes.fromhex(digest))
            pos = end
            if pos >= to_offset:
                break
        if len(pieces) == 1:
            return pieces[0].hex()
        return hashlib.sha256(b"".join(pieces)).hexdigest()

    def query_by_offset(self, phy_offset: int, address: str | None = None) -> MessageExt | None:
        found = self._query(RequestCode.QUERY_BY_OFFSET, {"phyOffset": phy_offset}, address)
        return found[0] if found else None

    def _query(
        self, code: RequestCode, fields: dict[str, Any], address: str | None
    ) -> list[MessageExt]:
        resp = self._cluster.request(address or self.servers[0], code, fields)
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return []
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        try:
            return [decode_record(raw) for raw in resp.bodies]
        except ProtocolError as e:
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"corrupt record in answer: {e}") from None
