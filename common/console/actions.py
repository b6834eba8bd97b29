"""What the console's pages ask of the cluster beyond the collector's figures: the topics, the
consumer groups (lag per queue, dead letters), a message found by id or key with its delivery
state per group, the ACL in force; and the changes (make or grow a topic, send a test message,
reset a group's offsets to a time, resend its dead letters, switch a group's master over).
Each is one of replog's client calls, with the inputs checked first; a refusal is an
``ActionError`` carrying the HTTP status the page gets, and changes nothing. Reads a page
repeats (topics, groups) are kept ``cache_s``: many open pages cost the brokers one read."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from common.client import Admin, Consumer, Producer, dead_letters
from common.client.group_progress import describe_groups, reset_to_time
from common.core.errors import BrokerError
from common.core.message import MessageExt
from common.format.protocol import TOPIC_PATTERN

CONSOLE_GROUP = "replog-console"  # the group the console's offset reads go as (no commits)

MAX_QUEUES = 1024
MAX_TEST_BODY = 16 * 1024
MAX_FOUND = 32


class ActionError(Exception):
    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


class Actions:
    def __init__(self, admin: Admin, client_options: dict[str, Any] | None = None,
                 cache_s: float = 2.0):
        self.admin = admin
        self._options = client_options or {}
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()
        self.cache_s = cache_s
        self._cache: dict[str, tuple[float, Any]] = {}
        self._cache_lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            for client in (self._producer, self._consumer):
                if client is not None:
                    client.close()
            self._producer = self._consumer = None

    def _cached(self, key: str, read: Callable[[], Any]) -> Any:
        with self._cache_lock:  # one read at a time: the pages that ask meanwhile share it
            at, value = self._cache.get(key, (float("-inf"), None))
            if time.monotonic() - at < self.cache_s:
                return value
            value = read()
            self._cache[key] = (time.monotonic(), value)
            return value

    def forget(self) -> None:
        """After a change: the next read asks the cluster."""
        with self._cache_lock:
            self._cache.clear()

    def _reader(self) -> Consumer:
        with self._lock:
            if self._consumer is None:
                self._consumer = Consumer(self.admin.servers, group=CONSOLE_GROUP,
                                          **self._options)
            return self._consumer

    def _producer_for_tests(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = Producer(self.admin.servers, **self._options)
            return self._producer

    # ---- reads ----------------------------------------------------------------------------------
    def topics(self) -> dict[str, Any]:
        """Every topic: its queues per broker group and its attributes."""
        def read() -> dict[str, Any]:
            layout = self.admin.topic_layout()
            attributes = self.admin.topic_attributes()
            return {"topics": [{"topic": t, "groups": groups, "queues": sum(groups.values()),
                                "attributes": attributes.get(t, {})}
                               for t, groups in sorted(layout.items())]}
        try:
            return dict(self._cached("topics", read))
        except BrokerError as e:
            raise ActionError(f"the topics could not be read: {e.remark}",
                              HTTPStatus.BAD_GATEWAY) from None

    def topic(self, query: dict[str, str]) -> dict[str, Any]:
        """One topic: each queue's group, master and offsets (min, max), and its routes' perm."""
        topic = _topic(query.get("topic"))
        reader = self._reader()
        try:
            table = self.admin.route_table()
            queues: list[dict[str, Any]] = []
            for mq in reader.queues(topic):
                name = mq.broker_name if len(table.groups) > 1 else None
                queues.append({"brokerName": mq.broker_name, "queueId": mq.queue_id,
                               "minOffset": reader.min_offset(topic, mq.queue_id, name),
                               "maxOffset": reader.max_offset(topic, mq.queue_id, name)})
        except BrokerError as e:
            raise ActionError(f"{topic}: {e.remark}", HTTPStatus.BAD_GATEWAY) from None
        masters: dict[str, str] = {}
        for name in sorted({str(q["brokerName"]) for q in queues}):
            try:
                masters[name] = self.admin.master_address(name)
            except BrokerError:
                masters[name] = ""
        return {"topic": topic, "queues": queues, "masters": masters,
                "messages": sum(q["maxOffset"] - q["minOffset"] for q in queues)}

    def groups(self) -> dict[str, Any]:
        """Every consumer group: members, lag per topic and queue, dead letters, POP, config."""
        try:
            return dict(self._cached("groups", lambda: {
                "groups": describe_groups(self.admin, self._reader())}))
        except BrokerError as e:
            raise ActionError(f"the groups could not be read: {e.remark}",
                              HTTPStatus.BAD_GATEWAY) from None

    def dead_letters(self, query: dict[str, str]) -> dict[str, Any]:
        """The group's dead letters not resent yet (at most MAX_FOUND)."""
        group = _name(query.get("group"), "group")
        with Consumer(self.admin.servers, group=group, **self._options) as consumer:
            try:
                letters = dead_letters.read_all(consumer, MAX_FOUND)
            except BrokerError as e:
                raise ActionError(f"the DLQ of {group} could not be read: {e.remark}",
                                  HTTPStatus.BAD_GATEWAY) from None
        return {"group": group, "letters": [
            {**message_doc(m), "dlqOffset": m.queue_offset}
            for part in letters for m in part.messages]}

    def acl(self) -> dict[str, Any]:
        """The ACL the first broker has in force (admin on the broker's side: the console's
        key must be an admin account's), its refusal counters by port, operation and reason,
        and its last refusal lines."""
        try:
            info = self.admin.acl_info()
        except BrokerError as e:
            raise ActionError(f"the ACL could not be read: {e.remark}",
                              HTTPStatus.BAD_GATEWAY) from None
        return info

    def find(self, query: dict[str, str]) -> dict[str, Any]:
        """``msgId``; ``topic`` and ``key``; or ``topic``, ``fromMs`` and ``toMs`` (the first
        ``MAX_FOUND`` stored in that range, over every queue): the messages found, with their
        properties, their body as text, JSON or hex, and their delivery state per group."""
        try:
            if query.get("topic") and query.get("fromMs"):
                messages = self._in_range(_topic(query["topic"]), _ms(query.get("fromMs")),
                                          _ms(query.get("toMs") or str(2**62)))
            elif query.get("msgId"):
                found = self.admin.query_by_msg_id(query["msgId"].strip())
                messages = [found] if found is not None else []
            elif query.get("topic") and query.get("key"):
                messages = self.admin.query_by_key(query["topic"], query["key"], MAX_FOUND)
            else:
                raise ActionError("give msgId; topic and key; or topic, fromMs and toMs")
        except BrokerError as e:
            raise ActionError(f"the look-up failed: {e.remark}", HTTPStatus.BAD_GATEWAY) \
                from None
        except ValueError as e:  # a msgId that is not one
            raise ActionError(str(e)) from None
        return {"messages": [{**message_doc(m), "delivery": self._delivery(m)}
                             for m in messages]}

    def _in_range(self, topic: str, from_ms: int, to_ms: int) -> list[MessageExt]:
        reader = self._reader()
        multi = len(self.admin.route_table().groups) > 1
        found: list[MessageExt] = []
        for mq in reader.queues(topic):
            name = mq.broker_name if multi else None
            start = reader.search_offset(topic, mq.queue_id, from_ms, broker_name=name)
            end = reader.max_offset(topic, mq.queue_id, broker_name=name)
            while start < end and len(found) < MAX_FOUND:
                got = reader.pull(topic, mq.queue_id, start, min(32, MAX_FOUND),
                                  broker_name=name).messages
                if not got:
                    break
                for m in got:
                    if m.store_timestamp >= to_ms:
                        start = end
                        break
                    if m.store_timestamp >= from_ms:
                        found.append(m)
                else:
                    start = got[-1].queue_offset + 1
        found.sort(key=lambda m: m.store_timestamp)
        return found[:MAX_FOUND]

    def _delivery(self, m: MessageExt) -> list[dict[str, Any]]:
        """Per consumer group that has an offset on the message's queue: consumed (its
        committed offset is past the message) or not yet."""
        try:
            offsets = self.admin.group_offsets_by_broker().get(m.broker_name) \
                if m.broker_name else self.admin.group_offsets()
        except BrokerError:
            return []
        out = []
        for group, topics in sorted((offsets or {}).items()):
            committed = (topics.get(m.topic) or {}).get(m.queue_id)
            if committed is not None:
                out.append({"group": group, "committedOffset": committed,
                            "state": "consumed" if committed > m.queue_offset
                            else "not consumed yet"})
        return out

    # ---- changes --------------------------------------------------------------------------------
    def create_topic(self, body: dict[str, Any]) -> dict[str, Any]:
        self.forget()
        topic = _topic(body.get("topic"))
        queues = body.get("queues", 4)
        if not isinstance(queues, int) or isinstance(queues, bool) or \
                not 1 <= queues <= MAX_QUEUES:
            raise ActionError(f"queues must be 1..{MAX_QUEUES}")
        try:
            before = self.admin.create_topic_on_groups(topic, queues)
        except BrokerError as e:
            raise ActionError(f"{topic}: {e.remark}", HTTPStatus.CONFLICT) from None
        return {"topic": topic, "queues": queues, "before": before}

    def send(self, body: dict[str, Any]) -> dict[str, Any]:
        topic = _topic(body.get("topic"))
        text = body.get("body", "")
        if not isinstance(text, str) or len(text.encode()) > MAX_TEST_BODY:
            raise ActionError(f"body must be text of at most {MAX_TEST_BODY} bytes")
        tags = body.get("tags") or None
        keys = body.get("keys") or None
        if tags is not None and not isinstance(tags, str) or \
                keys is not None and not isinstance(keys, str):
            raise ActionError("tags and keys must be text")
        try:
            result = self._producer_for_tests().send(topic, text.encode(), tags=tags, keys=keys)
        except BrokerError as e:
            raise ActionError(f"the send failed: {e.remark}", HTTPStatus.BAD_GATEWAY) from None
        return {"status": result.status.value, "msgId": result.msg_id,
                "brokerName": result.broker_name, "queueId": result.queue_id,
                "queueOffset": result.queue_offset}


    def reset_offsets(self, body: dict[str, Any]) -> dict[str, Any]:
        """The group's offsets on the topic moved to ``timestampMs`` (RocketMQ's
        resetOffsetByTime)."""
        group = _name(body.get("group"), "group")
        topic = _topic(body.get("topic"))
        at = body.get("timestampMs")
        if not isinstance(at, int) or isinstance(at, bool) or at < 0:
            raise ActionError("timestampMs must be a time in ms since the epoch")
        with Consumer(self.admin.servers, group=group, **self._options) as consumer:
            try:
                rows = reset_to_time(consumer, topic, at)
            except BrokerError as e:
                raise ActionError(f"the reset failed: {e.remark}", HTTPStatus.BAD_GATEWAY) \
                    from None
        self.forget()
        return {"group": group, "topic": topic, "timestampMs": at, "queues": rows}

    def resend_dead_letters(self, body: dict[str, Any]) -> dict[str, Any]:
        """Each dead letter of the group sent to its retry topic again (``replog dlq
        --resend``): resent once, however often this is asked."""
        group = _name(body.get("group"), "group")
        resent = 0
        with Consumer(self.admin.servers, group=group, **self._options) as consumer:
            try:
                for letters in dead_letters.read_all(consumer, MAX_FOUND):
                    resent += len(dead_letters.redrive(self._producer_for_tests(), consumer,
                                                       letters))
            except BrokerError as e:
                raise ActionError(f"the resend stopped after {resent}: {e.remark}",
                                  HTTPStatus.BAD_GATEWAY) from None
        self.forget()
        return {"group": group, "resent": resent}

    def switchover(self, body: dict[str, Any]) -> dict[str, Any]:
        """Make the member at ``address`` its group's master (controller mode: a planned
        switchover; without the controller: the promotion of a slave). ``confirm`` must name
        the member's group: the page asks the operator to type it."""
        address, confirm = body.get("address"), body.get("confirm")
        groups = {m["address"]: g["brokerName"]
                  for g in (body.get("_cluster") or {}).get("groups", [])
                  for m in g.get("members", [])}
        if not isinstance(address, str) or address not in groups:
            raise ActionError(f"{address!r} is not a member of the cluster")
        if confirm != groups[address]:
            raise ActionError(f"to switch over, confirm with the group's name "
                              f"({groups[address]})")
        try:
            status = self.admin.promote(address)
        except BrokerError as e:
            raise ActionError(f"the switchover to {address} failed: {e.remark}",
                              HTTPStatus.CONFLICT) from None
        self.forget()
        return {"address": address, "group": groups[address], "role": status.get("role"),
                "epoch": status.get("epoch")}


def _ms(text: str | None) -> int:
    try:
        value = int(text or "")
    except ValueError:
        raise ActionError(f"{text!r} is not a time in ms since the epoch") from None
    if value < 0:
        raise ActionError("a time is >= 0")
    return value


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 255 or \
            not TOPIC_PATTERN.match(value):
        raise ActionError(f"{value!r} is not a {what} name")
    return value


def _topic(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 127 or \
            not TOPIC_PATTERN.match(value):
        raise ActionError(f"{value!r} is not a topic name (letters, digits, '%', '|', '_', "
                          "'-'; at most 127)")
    return value


def message_doc(m: MessageExt) -> dict[str, Any]:
    """A message for the page: where it is, its properties, and its body shown as JSON when it
    parses, as text when it is UTF-8, else as hex."""
    body = bytes(m.body)
    try:
        text = body.decode("utf-8")
        try:
            shown, kind = json.dumps(json.loads(text), indent=2), "json"
        except ValueError:
            shown, kind = text, "text"
    except UnicodeDecodeError:
        shown, kind = body.hex(" "), "hex"
    return {"msgId": m.msg_id, "topic": m.topic, "brokerName": m.broker_name,
            "queueId": m.queue_id, "queueOffset": m.queue_offset,
            "commitLogOffset": m.commit_log_offset, "bornTimestamp": m.born_timestamp,
            "storeTimestamp": m.store_timestamp, "bornHost": m.born_host,
            "storeHost": m.store_host, "reconsumeTimes": m.reconsume_times,
            "properties": dict(m.properties), "bodyKind": kind, "body": shown,
            "bodyBytes": len(body)}
