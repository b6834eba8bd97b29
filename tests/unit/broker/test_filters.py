"""Filters on the broker (issue 40, item 3): a tag and a SQL92 subscription receive exactly the
messages that match, pulled over real sockets from a broker on a real store; what does not
match never crosses the network (the bytes of the answers are counted); SQL92 waits for
``enablePropertyFilter``, and an expression that cannot be read is refused, the broker serving
on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import zmq
from helpers.brokers import addr
from helpers.zmq_sockets import bounded_socket

from common.broker.broker import Broker
from common.client import Consumer, Producer
from common.core.errors import BrokerError, PullStatus, ResponseCode
from common.core.message import Message, MessageExt, tags_code
from common.format import protocol
from common.format.protocol import RequestCode, decode_response, encode_request
from common.store.message_store import FILTER_SCAN_ENTRIES

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def pull_all(broker: Broker, topic: str, **subscription: Any) -> list[MessageExt]:
    """Every message of queue 0 the subscription lets through, pulled to the end."""
    got: list[MessageExt] = []
    offset = 0
    with Consumer([addr(broker)], group="g", retries=0) as c:
        while True:
            result = c.pull(topic, 0, offset, 32, **subscription)
            if result.status not in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG):
                return got
            got.extend(result.messages)
            offset = result.next_begin_offset


def test_a_tag_subscription_receives_exactly_its_tags(make_broker: Callable[..., Broker]
                                                     ) -> None:
    """``Aa`` and ``BB`` share a hash code (Java's ``String.hashCode``): the ConsumeQueue
    alone cannot tell them apart, the broker checks the tag itself."""
    assert tags_code("Aa") == tags_code("BB")
    broker = make_broker(real_store=True)
    tags = ["Aa", "BB", "C", None, "Aa", "D"] * 20
    with Producer([addr(broker)]) as p:
        p.send_batch("t", [Message("t", b"%d" % i, tags=t) for i, t in enumerate(tags)],
                     queue_id=0)
    got = pull_all(broker, "t", tags="Aa || D")
    assert [m.body for m in got] == [b"%d" % i for i, t in enumerate(tags) if t in ("Aa", "D")]
    assert len(pull_all(broker, "t", tags="*")) == len(tags)


def test_a_sql92_subscription_receives_exactly_what_it_selects(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(real_store=True, enablePropertyFilter=True)
    rows = [{"a": str(i), "region": "eu" if i % 3 else "us"} for i in range(60)]
    rows += [{"region": "eu"}, {"a": "x", "region": "eu"}]  # no a; an a that is no number
    with Producer([addr(broker)]) as p:
        p.send_batch("s", [Message("s", b"%d" % i, tags="T" if i % 2 else "U", properties=r)
                           for i, r in enumerate(rows)], queue_id=0)

    def expect(test: Callable[[int, dict[str, str]], bool]) -> list[bytes]:
        return [b"%d" % i for i, r in enumerate(rows) if test(i, r)]

    def num(r: dict[str, str]) -> float:
        """``a`` as a number; NaN when missing or not a number (every comparison false)."""
        return float(r["a"]) if r.get("a", "").isdigit() else float("nan")

    cases: list[tuple[str, Callable[[int, dict[str, str]], bool]]] = [
        ("a > 5 AND region = 'eu'", lambda i, r: num(r) > 5 and r["region"] == "eu"),
        ("a BETWEEN 10 AND 12 OR a IS NULL", lambda i, r: "a" not in r or 10 <= num(r) <= 12),
        ("TAGS IN ('T') AND a < 4", lambda i, r: i % 2 == 1 and num(r) < 4),
        ("region <> 'eu'", lambda i, r: r["region"] != "eu"),
        ("NOT (a >= 2)", lambda i, r: num(r) < 2),  # unknown (no a, a = 'x') is not NOT-ed
    ]
    for text, test in cases:
        got = pull_all(broker, "s", sql=text)
        assert [m.body for m in got] == expect(test), text


def test_sql92_waits_for_enable_property_filter_and_a_bad_expression_is_refused(
        make_broker: Callable[..., Broker]) -> None:
    off = make_broker(real_store=True)
    with Producer([addr(off)]) as p:
        p.send("s", b"x", properties={"a": "1"}, queue_id=0)
    with Consumer([addr(off)], group="g", retries=0) as c:
        with pytest.raises(BrokerError) as refused:
            c.pull("s", 0, 0, 32, sql="a = 1")
        assert refused.value.code == ResponseCode.SYSTEM_ERROR
        assert "enablePropertyFilter" in refused.value.remark
        assert [m.body for m in c.pull("s", 0, 0, 32, tags="*").messages] == [b"x"]
    on = make_broker(real_store=True, enablePropertyFilter=True)
    with Consumer([addr(on)], group="g", retries=0) as c:
        for bad, says in (("a > 'x'", "only numbers"), ("a AND", "cannot parse"),
                          ("", "empty"), ("(" * 1000 + "a = 1" + ")" * 1000, "deep"),
                          ("NOT " * 1000 + "a = 1", "deep")):
            with pytest.raises(BrokerError) as refused:
                c.pull("s", 0, 0, 32, sql=bad)
            assert refused.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, bad
            assert says in refused.value.remark
    resp, _ = wire_pull(addr(on), "s", 0, expressionType="XPATH", subscription="a")
    assert resp.code == ResponseCode.BAD_REQUEST and resp.fields["field"] == "expressionType"
    with Producer([addr(on)]) as p:  # still serving
        assert p.send("s", b"y", queue_id=0).queue_offset == 0


def wire_pull(address: str, topic: str, offset: int, **fields: Any) -> tuple[Any, int]:
    """One PULL on a raw socket: (the answer, bytes received)."""
    ctx = zmq.Context()
    sock = bounded_socket(ctx, zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    try:
        sock.connect(f"tcp://{address}")
        sock.send_multipart(encode_request(RequestCode.PULL, 1, {
            "topic": topic, "queueId": 0, "queueOffset": offset, "maxNums": 32,
            "group": "g", **fields}))
        frames = sock.recv_multipart()
        return decode_response(frames, protocol.Limits()), sum(len(f) for f in frames)
    finally:
        sock.close()
        ctx.term()


@pytest.mark.parametrize("subscription", [
    {"tags": "wanted"},
    {"expressionType": "SQL92", "subscription": "kind = 'wanted'"},
])
def test_a_pull_over_100k_messages_that_do_not_match_sends_none_of_them(
        make_broker: Callable[..., Broker], subscription: dict[str, str]) -> None:
    """100,000 messages of another tag (another ``kind``), then 3 that match: reading from 0
    to the end brings exactly the 3 over the wire; every other answer is a header only
    (NO_MATCHED_MSG and the offset to go on from), never a skipped record."""
    broker = make_broker(real_store=True, enablePropertyFilter=True)
    skipped, wanted = 100_000, 3
    with Producer([addr(broker)]) as p:
        other = Message("w", b"s" * 100, tags="other", properties={"kind": "other"})
        for _ in range(skipped // 1000):
            p.send_batch("w", [other] * 1000, queue_id=0)
        p.send_batch("w", [Message("w", b"w%d" % i, tags="wanted",
                                   properties={"kind": "wanted"}) for i in range(wanted)],
                     queue_id=0)
    offset, received, answers, bytes_in = 0, [], 0, 0
    while True:
        resp, size = wire_pull(addr(broker), "w", offset, **subscription)
        answers += 1
        bytes_in += size
        if resp.code == ResponseCode.PULL_NOT_FOUND:
            break
        assert resp.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY), resp
        received += [protocol.decode_record(b).body for b in resp.bodies]
        offset = resp.fields["nextBeginOffset"]
    assert received == [b"w0", b"w1", b"w2"]
    assert offset == skipped + wanted
    # each answer a header of ~100 bytes; one skipped record alone is ~200 bytes
    skipped_answers = answers - 2
    assert skipped_answers <= skipped // FILTER_SCAN_ENTRIES + 1
    assert bytes_in < answers * 200 + wanted * 300, (bytes_in, answers)
