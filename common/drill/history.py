"""The drill history and its messages (docs/drills.md "The harness").

* ``History``: JSON lines ``{t, proc, op: put|get|fault, type: invoke|ok|fail|info, msg_id,
  queue, offset, status}`` (plus ``handler`` = the broker that stored a put, from its msgId, and
  ``phy`` = its CommitLog offset). ``t`` is seconds since the run began (monotonic).
* Bodies: ``<msg_id>|<crc32 hex>|<payload>``; ``msg_id`` = producer id + sequence; the CRC covers
  the id and the payload, so a read proves it got exactly what was sent.
* Put status mapping: SEND_OK -> ok; FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE,
  FLUSH_DISK_TIMEOUT, client timeout, connection lost, anything unknown -> info; an explicit
  refusal before the append (SERVICE_NOT_AVAILABLE, MESSAGE_ILLEGAL, TOPIC_NOT_EXIST,
  BAD_REQUEST) -> fail.
"""

from __future__ import annotations

import json
import random
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from common.client import ClientTimeoutError
from common.core.errors import BrokerError, ResponseCode, SendStatus
from common.core.message import decode_msg_id

TOPIC = "drill"
QUEUES = 4
CLIENT_TIMEOUT_MS = 3000  # > slaveTimeout, so FLUSH_SLAVE_TIMEOUT reaches the producer
FAIL_CODES = frozenset(
    {
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.MESSAGE_ILLEGAL,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.BAD_REQUEST,
    }
)


class History:
    """Thread-safe JSON-lines history, also kept in memory for the checker."""

    def __init__(self, path: Path):
        self.path = path
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.events: list[dict[str, Any]] = []

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def add(self, proc: str, op: str, type_: str, **fields: Any) -> dict[str, Any]:
        event = {"t": self.now(), "proc": proc, "op": op, "type": type_, **fields}
        with self._lock:
            self.events.append(event)
            if not self._file.closed:
                self._file.write(json.dumps(event, sort_keys=True) + "\n")
        return event

    def fault(self, what: str, **fields: Any) -> dict[str, Any]:
        return self.add("nemesis", "fault", "info", status=what, **fields)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


def make_body(msg_id: str, size: int, rng: random.Random) -> bytes:
    payload = rng.randbytes(max(0, size))
    crc = zlib.crc32(msg_id.encode() + payload)
    return f"{msg_id}|{crc:08x}|".encode() + payload


def parse_body(body: bytes) -> tuple[str, bool]:
    """(msg_id, crc ok); ('?', False) for a body that is not a drill body."""
    try:
        head, crc_text, payload = body.split(b"|", 2)
        msg_id = head.decode()
        return msg_id, zlib.crc32(head + payload) == int(crc_text, 16)
    except ValueError:
        return "?", False


def handler_of(msg_id: str) -> str:
    """``ip:port`` of the broker that stored a message (from RocketMQ's msgId)."""
    try:
        ip, port, _ = decode_msg_id(msg_id)
    except ValueError:
        return "?"
    return f"{ip}:{port}"


def classify(outcome: Any) -> tuple[str, str, dict[str, Any]]:
    """A send's result or exception -> (history type, status, extra fields)."""
    if isinstance(outcome, BaseException):
        if isinstance(outcome, ClientTimeoutError):
            return "info", "CLIENT_TIMEOUT", {"address": outcome.address}
        if isinstance(outcome, BrokerError):
            kind = "fail" if outcome.code in FAIL_CODES else "info"
            return kind, outcome.code.name, {"remark": outcome.remark[:200]}
        return "info", type(outcome).__name__, {"remark": str(outcome)[:200]}
    kind = "ok" if outcome.status == SendStatus.SEND_OK else "info"
    extra = {
        "queue": outcome.queue_id,
        "offset": outcome.queue_offset,
        "phy": outcome.commit_log_offset,
        "handler": handler_of(outcome.msg_id),
    }
    if outcome.broker_name:
        extra["group"] = outcome.broker_name
    return kind, outcome.status.value, extra
