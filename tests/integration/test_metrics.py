"""The Prometheus endpoint of real broker processes: status figures, slaves, consumer lag."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest
from broker_harness import BrokerProcess, brokers, free_port
from prometheus_client.parser import text_string_to_metric_families
from replication_harness import wait_for

from common.client import Consumer, Producer
from common.client.group_consumer import GroupConsumer
from common.core.errors import SendStatus

pytestmark = pytest.mark.integration


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, from one scrape of /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.timeout(120)
def test_metrics_export_status_slaves_and_consumer_lag(tmp_path: Path) -> None:
    mp, sp = free_port(), free_port()
    master = BrokerProcess(tmp_path / "m", listenPort=mp, metricsPort=mp + 2,
                           brokerName="bm", defaultTopicQueueNums=2)
    slave = BrokerProcess(tmp_path / "s", listenPort=sp, metricsPort=sp + 2, brokerName="bm",
                          brokerRole="SLAVE", brokerId=1, haMasterAddress=f"127.0.0.1:{mp + 1}")
    with brokers(master, slave):
        with Producer([master.address]) as p:
            sent = [p.send("lagged", b"m%d" % i, queue_id=i % 2) for i in range(10)]
        first_stored = _now_ms()
        assert all(r.status == SendStatus.SEND_OK for r in sent)
        with Consumer([master.address], group="billing") as c:
            c.commit_offset("lagged", 0, 2)  # 3 of queue 0's 5 left
            c.commit_offset("lagged", 1, 5)  # queue 1 consumed
        with Consumer([master.address], group="done") as c:
            c.commit_offset("lagged", 0, 5)
        # the oldest unconsumed message is at least 100 ms old (a wait on the clock)
        wait_for(lambda: _now_ms() - first_stored >= 100, 5, "100 ms to pass")

        status = master.status()
        m = scrape(mp + 2)
        broker = (("broker", "bm"), ("id", "0"))
        assert m[("replog_max_phy_offset", broker)] == status["maxPhyOffset"]
        assert m[("replog_min_phy_offset", broker)] == 0
        assert m[("replog_consumer_lag", (("group", "billing"), ("topic", "lagged")))] == 3
        assert m[("replog_consumer_lag", (("group", "done"), ("topic", "lagged")))] == 0
        delay = m[("replog_consumer_delay_seconds", (("group", "billing"), ("topic", "lagged")))]
        assert 0.1 <= delay < 60
        assert m[("replog_consumer_delay_seconds", (("group", "done"), ("topic", "lagged")))] == 0
        with GroupConsumer([master.address], "live", ["lagged"]):
            m = scrape(mp + 2)
            assert m[("replog_consumer_group_members", (("group", "live"),))] == 1
        with Consumer([master.address], group="billing") as c:  # gives one up: a dead letter
            (msg,) = c.pull("lagged", 0, 0, 1).messages
            assert c.send_back(msg, delay_level=-1).topic == "%DLQ%billing"
        wait_for(lambda: scrape(mp + 2).get(("replog_dead_letters", (("group", "billing"),))) == 1,
                 10, "the dead letter in the metrics")
        status = master.status()  # the dead letter moved the log's end

        # the slave's ack reaches the master's per-slave gauges; the slave exports its own
        def slave_acked() -> bool:
            samples = scrape(mp + 2)
            acks = [v for (name, _), v in samples.items() if name == "replog_slave_ack_offset"]
            return acks == [status["maxPhyOffset"]]

        wait_for(slave_acked, 20, "the master's metrics to show the slave's ack")
        s = scrape(sp + 2)
        assert s[("replog_max_phy_offset", (("broker", "bm"), ("id", "1")))] == (
            status["maxPhyOffset"]
        )
