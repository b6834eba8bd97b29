"""Timer messages through a broker on a real store, over real sockets: ``Producer.send``'s
``deliver_at`` and ``delay``, the recall handle and ``Producer.recall`` (RocketMQ 5's
RecallMessage), what a producer may not set, ``replog send --delay``, ``replog recall`` and
``replog timer status``."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.brokers import addr, free_port, wait_for

from common.broker.broker import Broker
from common.cli.bootstrap import make_role
from common.cli.main import main
from common.client import Consumer, Producer
from common.core.config import load_config
from common.core.errors import BrokerError, ResponseCode, SendStatus
from common.core.message import PROPERTY_UNIQ_KEY, Message
from common.core.timer import TIMER_DEQUEUE_MS, TIMER_TICK, RecallHandle
from common.store.message_store import MessageStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(90)]

PRECISION_MS = 100


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    cfg = load_config(None, (), env={}, listenPort=free_port(), haListenPort=free_port(),
                      storePathRootDir=str(tmp_path / "b"), mappedFileSizeCommitLog=1024 * 1024,
                      timerPrecisionMs=PRECISION_MS, timerFlushIntervalMs=100,
                      mappedFileSizeTimerLog=52 * 1000, brokerName="tb")
    b = Broker(cfg, MessageStore(cfg), make_role)
    b.start()
    yield b
    b.shutdown()


def read_all(broker: Broker, topic: str, queue_id: int = 0) -> list[Any]:
    with Consumer([addr(broker)], group="g") as c:
        return list(c.pull(topic, queue_id, 0, 64).messages)


def test_a_delayed_send_arrives_after_its_delay_never_before(broker: Broker) -> None:
    with Producer([addr(broker)]) as p:
        sent_at = time.time()
        r = p.send("tq", b"later", queue_id=0, delay=datetime.timedelta(milliseconds=700))
        assert r.status == SendStatus.SEND_OK and r.recall_handle
        handle = RecallHandle.decode(r.recall_handle)
        assert (handle.topic, handle.broker_name) == ("tq", "tb")
        assert abs(handle.deliver_ms - (sent_at * 1000 + 700)) < 500
        got = wait_for(lambda: read_all(broker, "tq"), "the delivery")
    assert [m.body for m in got] == [b"later"]
    delivered = got[0]
    assert int(delivered.properties[TIMER_DEQUEUE_MS]) >= handle.deliver_ms  # never early
    assert delivered.properties[PROPERTY_UNIQ_KEY] == handle.uniq_key
    assert TIMER_TICK in delivered.properties


def test_deliver_at_takes_a_datetime_or_epoch_ms(broker: Broker) -> None:
    with Producer([addr(broker)]) as p:
        at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(milliseconds=400)
        a = p.send("ta", b"dt", queue_id=0, deliver_at=at)
        b = p.send("ta", b"ms", queue_id=0, deliver_at=int(time.time() * 1000) + 400)
        assert RecallHandle.decode(a.recall_handle).deliver_ms == round(at.timestamp() * 1000)
        assert b.recall_handle
        got = wait_for(lambda: len(read_all(broker, "ta")) == 2 and read_all(broker, "ta"),
                       "both deliveries")
    assert sorted(m.body for m in got) == [b"dt", b"ms"]


def test_a_recalled_message_is_never_delivered_and_its_neighbour_is(broker: Broker) -> None:
    with Producer([addr(broker)]) as p:
        gone = p.send("tr", b"recalled", queue_id=0, delay=1500)
        kept = p.send("tr", b"kept", queue_id=0, delay=1500)
        assert p.recall("tr", gone.recall_handle) == RecallHandle.decode(gone.recall_handle).uniq_key
        wait_for(lambda: read_all(broker, "tr"), "the kept one")
        time.sleep(3 * PRECISION_MS / 1000)  # the tick is delivered whole: nothing follows
        assert [m.body for m in read_all(broker, "tr")] == [b"kept"]
        assert broker.store.timer_status()["recalled"] == 1
        with pytest.raises(BrokerError) as late:  # due already: refused, saying so
            p.recall("tr", kept.recall_handle)
        assert late.value.code == ResponseCode.MESSAGE_ILLEGAL
        assert "delivered already" in late.value.remark


def test_a_recall_is_refused_for_a_bad_or_foreign_handle(broker: Broker) -> None:
    with Producer([addr(broker)]) as p:
        r = p.send("tf", b"x", queue_id=0, delay=60_000)
        with pytest.raises(BrokerError) as bad:  # refused by the client, nothing sent
            p.recall("tf", "!!not base64!!")
        assert "not base64url" in bad.value.remark
        foreign = RecallHandle("tf", "other-group", 1 << 50, "K").encode()
        for handle, topic, words in [(foreign, "tf", "of broker group other-group"),
                                     (r.recall_handle, "other", "of topic tf"),
                                     ("djEgb25seSB0aHJlZQ", "tf", "not a v1 handle")]:
            with pytest.raises(BrokerError) as e:  # the broker's answers
                p._routed("tf", None, None, None,
                          lambda c, a, _m, h=handle, t=topic: _ask_recall(c, a, h, t))
            assert e.value.code == ResponseCode.MESSAGE_ILLEGAL and words in e.value.remark
    wait_for(lambda: broker.store.timer_status()["pending"] == 1, "one pending, none recalled")


def _ask_recall(cluster: Any, address: str, handle: str, topic: str = "tf") -> None:
    from common.format.protocol import RequestCode

    resp = cluster.request(address, RequestCode.RECALL_MESSAGE,
                           {"topic": topic, "recallHandle": handle})
    raise BrokerError(resp.code, resp.remark)


def test_a_producer_may_not_set_the_brokers_timer_properties(broker: Broker) -> None:
    with Producer([addr(broker)]) as p:
        p.send("tp", b"warm", queue_id=0)
        for name in ("__TIMER_TICK", "TIMER_DEL_UNIQKEY", "TIMER_OUT_MS"):
            with pytest.raises(BrokerError) as e:
                p.send("tp", b"x", queue_id=0, properties={name: "1"})
            assert e.value.code == ResponseCode.MESSAGE_ILLEGAL and name in e.value.remark
        with pytest.raises(BrokerError) as batch:
            p._routed("tp", 0, None, None, lambda c, a, _m: _raw_batch(c, a))
        assert "timer" in batch.value.remark
        with pytest.raises(BrokerError):  # refused before anything is sent
            p.send_batch("tp", [Message("tp", b"x", properties={"TIMER_DELAY_MS": "5"})])
        with pytest.raises(BrokerError):
            p.send("tp", b"x", delay=5, deliver_at=5)
        with pytest.raises(BrokerError):
            p.send("tp", b"x", delay=5, delay_level=2)
    assert read_all(broker, "tp") and [m.body for m in read_all(broker, "tp")] == [b"warm"]


def _raw_batch(cluster: Any, address: str) -> None:
    from common.format.protocol import RequestCode

    resp = cluster.request(address, RequestCode.SEND_BATCH, {
        "topic": "tp", "queueId": 0, "sizes": [1],
        "meta": [[None, None, {"TIMER_DELAY_MS": "10"}, 0]]}, [b"x"])
    raise BrokerError(resp.code, resp.remark)


def test_the_timer_through_the_command_line(broker: Broker,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    server = addr(broker)
    assert main(["send", "-s", server, "-t", "tc", "-b", "one", "--queue", "0", "--delay", "5m",
                 "--json"]) == 0
    sent = json.loads(capsys.readouterr().out)
    assert sent["recallHandle"]
    assert main(["timer", "status", "-s", server, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    wait_for(lambda: broker.store.timer_status()["pendingWithin"]["1h"] == 1,
             "the message on the wheel, counted (the flush thread counts every second)")
    assert main(["timer", "status", "-s", server, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["enabled"] and row["pending"] == 1 and row["pendingWithin"]["1m"] == 0
    assert row["pendingWithin"]["1h"] == 1 and row["role"] == "ASYNC_MASTER"
    assert main(["recall", "-s", server, "-t", "tc", sent["recallHandle"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recalled"] is True
    assert main(["timer", "status", "-s", server]) == 0  # the human table
    assert "timer" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["send", "-s", server, "-t", "tc", "-b", "x", "--delay", "soon"])
