"""``Admin``: status, promotion, topics, config documents and message look-ups."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from common.client.cluster import ClientBase
from common.core.errors import BrokerError, ResponseCode
from common.core.message import MessageExt
from common.format.protocol import (
    LOG_CHECKSUM_MAX_BYTES,
    ProtocolError,
    RequestCode,
    decode_record,
)
from common.format.tables import loads, parse_offsets, parse_topics


def parse_cluster_info(resp: Any) -> dict[str, Any]:
    """CLUSTER_INFO's answer: one JSON document in the body frame."""
    try:
        doc = json.loads(bytes(resp.bodies[0]).decode("utf-8"))
    except (IndexError, UnicodeDecodeError, ValueError) as e:
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"malformed cluster info: {e}",
                          False) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("groups"), list):
        raise BrokerError(ResponseCode.SYSTEM_ERROR, "malformed cluster info: no groups", False)
    return doc


class Admin(ClientBase):
    """Status, promotion, topics and message look-ups against one broker or the group."""

    def cluster_info(self, address: str | None = None) -> dict[str, Any]:
        """Every broker group of the cluster with its master, slaves and topics (any broker
        answers: in controller mode from ZooKeeper, otherwise its own group)."""
        resp = self._cluster.request(address or self.servers[0], RequestCode.CLUSTER_INFO)
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        return parse_cluster_info(resp)

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
        resp = self._cluster.request(address or self.servers[0], code, {})
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        if len(resp.bodies) != 1:
            raise BrokerError(ResponseCode.SYSTEM_ERROR,
                              f"{code.name}: {len(resp.bodies)} body frames, expected 1")
        return bytes(resp.bodies[0])

    def create_topic(self, topic: str, queue_nums: int) -> int:
        """Make ``topic`` with ``queue_nums`` queues on the group's master, or grow it to that
        many (RocketMQ's updateTopic); returns how many it had before (0: it is new). A topic
        never shrinks: fewer queues than it has is refused (BAD_REQUEST)."""

        def attempt(address: str) -> int:
            resp = self._cluster.request(
                address, RequestCode.CREATE_TOPIC, {"topic": topic, "queueNums": queue_nums}
            )
            if not resp.ok:
                raise BrokerError(resp.code, resp.remark)
            return int(resp.fields.get("before", 0))

        return self._with_retries(attempt)  # type: ignore[no-any-return]

    def acl_info(self, address: str | None = None) -> dict[str, Any]:
        """The ACL a broker has in force (GET_BROKER_CLUSTER_ACL_INFO, admin accounts only):
        version, sha256, reload error, accounts without their keys (docs/security.md)."""
        resp = self._cluster.request(address or self.servers[0],
                                     RequestCode.GET_BROKER_CLUSTER_ACL_INFO, {})
        if not resp.ok:
            raise BrokerError(resp.code, resp.remark)
        return dict(resp.fields)

    def topics(self) -> dict[str, int]:
        """Every topic the group's master has, with its queue count (its topics.json; RocketMQ's
        topicList, Kafka's listTopics). Topics are made on first use unless the master's
        ``autoCreateTopicEnable`` is off."""

        def attempt(address: str) -> dict[str, int]:
            raw = self.config_document(RequestCode.GET_ALL_TOPIC_CONFIG, address)
            try:
                queues, _ = parse_topics(loads(raw, "topics.json"), f"topics.json of {address}")
            except ValueError as e:
                raise BrokerError(ResponseCode.SYSTEM_ERROR, str(e)) from None
            return queues

        return self._with_retries(attempt)  # type: ignore[no-any-return]

    def master_address(self) -> str:
        """The client address of the group's master (the broker of the highest epoch that
        answers as master); NoMasterError when none does."""
        return self._cluster.master()

    def group_offsets(self) -> dict[str, dict[str, dict[int, int]]]:
        """Every consumer group's committed offsets on the group's master: group -> topic ->
        queue -> the next offset to consume (its consumerOffset.json; RocketMQ's
        GET_ALL_CONSUMER_OFFSET, Kafka's listConsumerGroupOffsets for every group)."""

        def attempt(address: str) -> dict[str, dict[str, dict[int, int]]]:
            raw = self.config_document(RequestCode.GET_ALL_CONSUMER_OFFSET, address)
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

        return self._with_retries(attempt)  # type: ignore[no-any-return]

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
