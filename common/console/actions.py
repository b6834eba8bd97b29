"""What the console's pages ask of the cluster beyond the collector's figures: the topics,
a message found by id or key, and the changes (make or grow a topic, send a test message).
Each is one of replog's client calls, with the inputs checked first; a refusal is an
``ActionError`` carrying the HTTP status the page gets, and changes nothing."""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from typing import Any

from common.client import Admin, Producer
from common.core.errors import BrokerError
from common.core.message import MessageExt
from common.format.protocol import TOPIC_PATTERN

MAX_QUEUES = 1024
MAX_TEST_BODY = 16 * 1024
MAX_FOUND = 32


class ActionError(Exception):
    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.status = status


class Actions:
    def __init__(self, admin: Admin, producer_options: dict[str, Any] | None = None):
        self.admin = admin
        self._producer_options = producer_options or {}
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.close()
                self._producer = None

    def _producer_for_tests(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = Producer(self.admin.servers, **self._producer_options)
            return self._producer

    # ---- reads ----------------------------------------------------------------------------------
    def topics(self) -> dict[str, Any]:
        """Every topic: its queues per broker group and its attributes."""
        try:
            layout = self.admin.topic_layout()
            attributes = self.admin.topic_attributes()
        except BrokerError as e:
            raise ActionError(f"the topics could not be read: {e.remark}",
                              HTTPStatus.BAD_GATEWAY) from None
        return {"topics": [{"topic": t, "groups": groups, "queues": sum(groups.values()),
                            "attributes": attributes.get(t, {})}
                           for t, groups in sorted(layout.items())]}

    def find(self, query: dict[str, str]) -> dict[str, Any]:
        """``msgId``, or ``topic`` and ``key``: the messages found, with their properties and
        their body as text, JSON or hex."""
        try:
            if query.get("msgId"):
                found = self.admin.query_by_msg_id(query["msgId"].strip())
                messages = [found] if found is not None else []
            elif query.get("topic") and query.get("key"):
                messages = self.admin.query_by_key(query["topic"], query["key"], MAX_FOUND)
            else:
                raise ActionError("give msgId, or topic and key")
        except BrokerError as e:
            raise ActionError(f"the look-up failed: {e.remark}", HTTPStatus.BAD_GATEWAY) \
                from None
        except ValueError as e:  # a msgId that is not one
            raise ActionError(str(e)) from None
        return {"messages": [message_doc(m) for m in messages]}

    # ---- changes --------------------------------------------------------------------------------
    def create_topic(self, body: dict[str, Any]) -> dict[str, Any]:
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
