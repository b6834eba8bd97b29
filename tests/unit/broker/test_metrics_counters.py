"""The metrics (issue 21, item 6): totals are counters, and a scrape racing a busy I/O thread
never raises."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import pytest
from helpers.brokers import addr
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from common.broker.broker import Broker
from common.broker.metrics import COUNTERS, StatusCollector
from common.client import Producer
from common.core.errors import SendStatus

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def exposition(broker: Broker) -> dict[str, tuple[str, list[tuple[str, float]]]]:
    """Family name -> (type, [(sample name, value)]) as a Prometheus server would parse it."""
    registry = CollectorRegistry()
    registry.register(StatusCollector(broker.snapshot))
    text = generate_latest(registry).decode()
    return {f.name: (f.type, [(s.name, s.value) for s in f.samples])
            for f in text_string_to_metric_families(text)}


def test_totals_are_counters_and_levels_are_gauges(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    with Producer([addr(broker)]) as p:
        for i in range(3):
            assert p.send("t", b"m%d" % i, queue_id=0).status == SendStatus.SEND_OK
    families = exposition(broker)
    kind, put = families["replog_put"]
    assert kind == "counter" and put == [("replog_put_total", 3.0)]
    kind, requests = families["replog_requests"]
    assert kind == "counter" and requests[0][0] == "replog_requests_total"
    assert requests[0][1] >= 3
    for name in ("replog_refused_busy", "replog_bad_requests", "replog_long_polls",
                 "replog_refused_writes"):
        assert families[name][0] == "counter", name
        assert families[name][1][0][0] == f"{name}_total"
    # levels stay gauges
    for name in ("replog_put_tps", "replog_inflight", "replog_max_phy_offset",
                 "replog_put_latency_p99_ms", "replog_flush_lag_bytes"):
        assert families[name][0] == "gauge", name
    # no family of the same figure as a gauge beside its counter (invalid exposition)
    assert "replog_requests_total" not in families and "replog_put_total" not in families
    assert {"putTotal", "requests", "store_puts", "store_deleted_segments"} <= COUNTERS


def test_transactions_are_counted(make_broker: Callable[..., Broker],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's decisions (STATUS ``transactions``) and the master's check-back
    (``transactions.check``) as counters (the fake store decides none: its figures are set)."""
    broker = make_broker()
    monkeypatch.setattr(broker.store.transactions, "status",
                        lambda: {"commits": 2, "rollbacks": 1})
    families = exposition(broker)
    assert families["replog_transaction_commits"] == (
        "counter", [("replog_transaction_commits_total", 2.0)])
    assert families["replog_transaction_rollbacks"] == (
        "counter", [("replog_transaction_rollbacks_total", 1.0)])
    assert families["replog_transaction_check_rounds"][0] == "counter"  # a master's check-back


def test_a_scrape_racing_a_busy_io_thread_never_raises(
        make_broker: Callable[..., Broker]) -> None:
    """The I/O thread appends to the rate buckets and the latency window while the metrics
    thread reads them; every add here starts a new second, so the bucket deque changes under
    any reader that iterates it in place."""
    broker = make_broker()
    stats = broker.server.stats
    stop = threading.Event()
    errors: list[str] = []
    scrapes = [0]

    def busy_io() -> None:
        second = 1_000_000.0
        while not stop.is_set():
            second += 1.0
            stats.put_msgs.add(1, now=second)
            stats.get_msgs.add(2, now=second)
            stats.put_latency.add(second % 17)

    def scraper() -> None:
        collector = StatusCollector(broker.snapshot)
        while not stop.is_set() and scrapes[0] < 2000:
            try:
                list(collector.collect())
                stats.put_msgs.rate(now=2_000_000.0)  # a window over the busy seconds
            except Exception as e:  # noqa: BLE001 - the test reports any
                errors.append(repr(e))
                return
            scrapes[0] += 1

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: shake the race out
    io = threading.Thread(target=busy_io, daemon=True)
    scrape = threading.Thread(target=scraper, daemon=True)
    try:
        io.start()
        scrape.start()
        scrape.join(30)
    finally:
        stop.set()
        io.join(10)
        scrape.join(10)
        sys.setswitchinterval(switch)
    assert not errors, errors[:3]
    assert scrapes[0] > 0
