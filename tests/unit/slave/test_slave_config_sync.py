"""slave/config_sync.py and common/format/tables.py: a slave takes its master's tables, whole or not
at all, and a stopped sync applies nothing more."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from common.broker.subscription_groups import SubscriptionGroupTable
from common.broker.tables import ConsumerOffsetTable, TopicTable
from common.core.errors import BrokerError, ResponseCode
from common.format.protocol import RequestCode, Response
from common.format.tables import delay_offsets_bytes, replace_delay_offsets
from slave import config_sync
from slave.config_sync import DOCUMENTS, ConfigSync

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

TOPICS = {"topicConfigTable": {"orders": {"topicName": "orders", "writeQueueNums": 6,
                                          "readQueueNums": 6, "perm": 6}},
          "dataVersion": {"timestamp": 1, "counter": 3}}
OFFSETS = {"offsetTable": {"orders@billing": {"0": 12, "5": 3}}}
DELAYS = {"offsetTable": {"1": 4, "3": 1}}
GROUPS = {"subscriptionGroupTable": {"billing": {"groupName": "billing", "retryMaxTimes": 3,
                                                 "consumeMessageOrderly": True}},
          "dataVersion": {"timestamp": 1, "counter": 2}}


class FakeTransport:
    """Answers each call from ``docs`` (code -> bytes, a BrokerError, or None: never answers)."""

    def __init__(self, docs: dict[RequestCode, Any]):
        self.docs = docs
        self.calls: list[tuple[str, RequestCode]] = []
        self.closed = False
        self.pending: list[concurrent.futures.Future[Response]] = []

    def call(self, address: str, code: RequestCode, fields: dict[str, Any],
             timeout_ms: int) -> concurrent.futures.Future[Response]:
        self.calls.append((address, code))
        fut: concurrent.futures.Future[Response] = concurrent.futures.Future()
        answer = self.docs[code]
        if isinstance(answer, BrokerError):
            fut.set_exception(answer)
        elif isinstance(answer, bytes):
            fut.set_result(Response(ResponseCode.SUCCESS, 1, "", {}, [answer]))
        else:
            self.pending.append(fut)
        return fut

    def close(self) -> None:
        self.closed = True


def docs(**over: Any) -> dict[RequestCode, Any]:
    base = {RequestCode.GET_ALL_TOPIC_CONFIG: json.dumps(TOPICS).encode(),
            RequestCode.GET_ALL_CONSUMER_OFFSET: json.dumps(OFFSETS).encode(),
            RequestCode.GET_ALL_DELAY_OFFSET: json.dumps(DELAYS).encode(),
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: json.dumps(GROUPS).encode()}
    return {**base, **{getattr(RequestCode, k): v for k, v in over.items()}}


class Tables:
    def __init__(self, root: Path):
        self.topics = TopicTable(root)
        self.offsets = ConsumerOffsetTable(root)
        self.groups = SubscriptionGroupTable(root)
        self.delay_path = root / "delayOffset.json"
        self.applied: list[RequestCode] = []

    def apply(self, code: RequestCode, raw: bytes, source: str) -> bool:
        self.applied.append(code)
        if code == RequestCode.GET_ALL_TOPIC_CONFIG:
            return self.topics.replace(raw, source)
        if code == RequestCode.GET_ALL_CONSUMER_OFFSET:
            return self.offsets.replace(raw, source)
        if code == RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG:
            return self.groups.replace(raw, source)
        return replace_delay_offsets(self.delay_path, raw, source)


def test_a_round_copies_every_table(tmp_path: Path) -> None:
    t = Tables(tmp_path)
    t.offsets.commit("old", "gone", 0, 99)  # the master's table replaces the slave's whole
    sync = ConfigSync(1000, lambda: "10.0.0.1:10911", t.apply)
    transport = FakeTransport(docs())
    assert sync.sync_once(transport)
    assert [c for _, c in transport.calls] == list(DOCUMENTS)
    assert {a for a, _ in transport.calls} == {"10.0.0.1:10911"}
    assert t.topics.queue_nums("orders") == 6
    assert t.offsets.fetch("billing", "orders", 0) == 12
    assert t.offsets.fetch("old", "gone", 0) == -1
    assert json.loads((tmp_path / "topics.json").read_text())["topicConfigTable"]["orders"][
        "writeQueueNums"] == 6
    assert t.offsets.persist() and "orders@billing" in (tmp_path / "consumerOffset.json").read_text()
    assert json.loads(t.delay_path.read_text()) == DELAYS
    billing = t.groups.get("billing")
    assert billing is not None and billing.retry_max_times == 3 and billing.consume_message_orderly
    assert "billing" in (tmp_path / "subscriptionGroup.json").read_text()
    assert sync.stats.changes == 4
    assert sync.sync_once(transport) and sync.stats.changes == 4  # the same again: no change
    assert sync.status()["rounds"] == 2 and sync.status()["lastError"] == ""


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (b"{not json", "not valid JSON"),
        (b'["a list"]', "must be a JSON object"),
        (json.dumps({"offsetTable": {"t@g": {"0": "12"}}}).encode(), "must be an integer"),
        (json.dumps({"offsetTable": {"t@g": {"zero": 1}}}).encode(), "not a non-negative integer"),
        (json.dumps({"offsetTable": {"t@g": {"0": -5}}}).encode(), "must be an integer in [-1"),
        (json.dumps({"offsetTable": {"t@g": [1, 2]}}).encode(), "must be a JSON object"),
    ],
)
def test_a_malformed_document_changes_nothing(tmp_path: Path, bad: bytes, error: str) -> None:
    t = Tables(tmp_path)
    t.offsets.commit("billing", "orders", 0, 7)
    sync = ConfigSync(1000, lambda: "m:1", t.apply)
    assert not sync.sync_once(FakeTransport(docs(GET_ALL_CONSUMER_OFFSET=bad)))
    assert t.offsets.fetch("billing", "orders", 0) == 7  # untouched
    assert error in sync.stats.last_error and "GET_ALL_CONSUMER_OFFSET from m:1" in (
        sync.stats.last_error)
    assert sync.stats.failures == 1 and sync.stats.rounds == 0
    assert RequestCode.GET_ALL_DELAY_OFFSET not in t.applied  # the round stopped there


def test_a_refusal_counts_as_a_failure_and_no_master_yet_waits(tmp_path: Path) -> None:
    t = Tables(tmp_path)
    address = [""]
    sync = ConfigSync(1000, lambda: address[0], t.apply)
    transport = FakeTransport(docs())
    assert not sync.sync_once(transport)  # no HELLO_REPLY yet: nothing asked, nothing counted
    assert transport.calls == [] and t.applied == [] and sync.stats.failures == 0
    address[0] = "m:1"
    refused = BrokerError(ResponseCode.SYSTEM_BUSY, "busy")
    assert not sync.sync_once(FakeTransport(docs(GET_ALL_TOPIC_CONFIG=refused)))
    assert "SYSTEM_BUSY" in sync.stats.last_error and sync.stats.failures == 1
    assert sync.sync_once(FakeTransport(docs()))  # and it recovers
    assert sync.stats.rounds == 1


def test_stop_returns_at_once_while_a_request_waits_and_nothing_applies_after(
    tmp_path: Path,
) -> None:
    t = Tables(tmp_path)
    transport = FakeTransport(docs(GET_ALL_CONSUMER_OFFSET=None))  # the master never answers
    sync = ConfigSync(50, lambda: "m:1", t.apply, transport_factory=lambda: transport)
    sync.start()
    deadline = time.monotonic() + 10
    while not transport.pending:  # the thread waits on the offsets request now
        assert time.monotonic() < deadline
        time.sleep(0.005)
    started = time.monotonic()
    sync.stop()
    # the request is never answered: a stop that waited for it would wait out its join
    assert time.monotonic() - started < config_sync.JOIN_TIMEOUT_S / 2
    assert sync._thread is not None and not sync._thread.is_alive()
    assert transport.closed
    applied = list(t.applied)
    transport.pending[0].set_result(
        Response(ResponseCode.SUCCESS, 1, "", {}, [json.dumps(OFFSETS).encode()]))
    assert t.applied == applied == [RequestCode.GET_ALL_TOPIC_CONFIG]
    assert t.offsets.fetch("billing", "orders", 0) == -1


def test_interval_zero_runs_no_thread(tmp_path: Path) -> None:
    sync = ConfigSync(0, lambda: "m:1", Tables(tmp_path).apply)
    before = threading.active_count()
    sync.start()
    assert sync._thread is None and threading.active_count() == before
    sync.stop()


def test_files_of_the_wrong_shape_refuse_to_load_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "consumerOffset.json").write_text('{"offsetTable": []}')
    with pytest.raises(ValueError, match=r"consumerOffset.json: offsetTable must be a JSON object"):
        ConsumerOffsetTable(tmp_path)
    (tmp_path / "topics.json").write_text(
        '{"topicConfigTable": {"t": {"writeQueueNums": "8"}}}')
    with pytest.raises(ValueError, match=r"topics.json: topic 't' writeQueueNums must be"):
        TopicTable(tmp_path)
    assert (tmp_path / "topics.json").read_text().startswith('{"topicConfigTable"')  # untouched


def test_topics_seen_in_the_store_stay_and_an_equal_table_is_not_rewritten(
    tmp_path: Path,
) -> None:
    table = TopicTable(tmp_path)
    raw = json.dumps(TOPICS).encode()
    seen = {"SCHEDULE_TOPIC_XXXX": 2, "orders": 2}
    assert table.replace(raw, "m", seen=seen)
    assert table.topics() == {"orders": 6, "SCHEDULE_TOPIC_XXXX": 2}
    written = (tmp_path / "topics.json").stat().st_mtime_ns
    assert not table.replace(raw, "m", seen=seen)  # every round after: no write
    assert (tmp_path / "topics.json").stat().st_mtime_ns == written


def test_delay_offsets_round_trip(tmp_path: Path) -> None:
    raw = delay_offsets_bytes({3: 1, 1: 4})
    assert replace_delay_offsets(tmp_path / "d.json", raw, "test")
    assert not replace_delay_offsets(tmp_path / "d.json", raw, "test")
    assert json.loads((tmp_path / "d.json").read_text()) == DELAYS
    with pytest.raises(ValueError, match="delay level"):
        replace_delay_offsets(tmp_path / "d.json", b'{"offsetTable": {"x": 1}}', "test")
