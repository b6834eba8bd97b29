"""The console's HTTP API (issue 42) against an in-process broker: the cluster page's data,
topics, a test message sent and found by id and by key; every change needs an admin session
and its CSRF token, and a refused change changes nothing."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers.brokers import addr

from common.broker.broker import Broker
from common.client import Admin
from common.console.actions import Actions
from common.console.collector import Collector
from common.console.server import Console

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

PASSWORD = "correct horse battery"


class Page:
    """A browser's view of the console: its cookie jar of one session cookie."""

    def __init__(self, console: Console | str):
        address = console.address if isinstance(console, Console) else console
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.cookie = ""
        self.csrf = ""

    def call(self, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            h = {"Content-Type": "application/json", **(headers or {})}
            if self.cookie:
                h["Cookie"] = self.cookie
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, data, h)
            resp = conn.getresponse()
            raw = resp.read()
            cookie = resp.getheader("Set-Cookie")
            if cookie:
                self.cookie = cookie.split(";", 1)[0]
            kind = resp.getheader("Content-Type") or ""
            return resp.status, json.loads(raw) if "json" in kind else raw
        finally:
            conn.close()

    def login(self, password: str = PASSWORD, account: str = "") -> int:
        status, doc = self.call("POST", "/api/login", {"password": password,
                                                       "account": account})
        if status == 200:
            self.csrf = doc["csrf"]
        return status

    def change(self, path: str, body: Any, **headers: str) -> tuple[int, Any]:
        return self.call("POST", path, body, {"X-CSRF-Token": self.csrf, **headers})


@pytest.fixture
def broker(make_broker: Callable[..., Broker]) -> Broker:
    return make_broker(real_store=True, brokerName="cons", defaultTopicQueueNums=2)


def start_console(broker: Broker, password: str | None) -> Console:
    admin = Admin([addr(broker)], timeout_ms=3000, retries=0)
    console = Console(Collector(admin, 0.5), Actions(admin), "127.0.0.1", 0, password)
    console.start()
    return console


@pytest.fixture
def console(broker: Broker) -> Iterator[Console]:
    c = start_console(broker, PASSWORD)
    yield c
    c.stop()
    c.actions.close()
    c.collector.admin.close()


def wait_for(cond: Callable[[], Any], what: str, timeout_s: float = 10) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def test_the_pages_are_served_from_the_package(console: Console) -> None:
    page = Page(console)
    status, html = page.call("GET", "/")
    assert status == 200 and b"<script src=\"/app.js\"" in html
    for path in ("/app.js", "/app.css"):
        assert page.call("GET", path)[0] == 200
    assert page.call("GET", "/api/nothing")[0] == 404


def test_the_cluster_page_shows_the_group_and_its_master(console: Console,
                                                         broker: Broker) -> None:
    page = Page(console)
    cluster = wait_for(lambda: (doc := page.call("GET", "/api/cluster")[1])["groups"] and
                       doc["groups"][0]["members"][0]["reachable"] and doc, "a whole round")
    [group] = cluster["groups"]
    assert group["brokerName"] == "cons" and group["master"] == addr(broker)
    [member] = group["members"]
    assert member["reachable"] and member["role"] in ("ASYNC_MASTER", "SYNC_MASTER")
    history = wait_for(lambda: page.call("GET", "/api/history")[1].get("cons"), "history")
    assert {"atMs", "putTps", "getTps", "lagBytes"} <= set(history[-1])


def test_a_change_needs_an_admin_session_and_its_csrf_token(console: Console,
                                                             broker: Broker) -> None:
    page = Page(console)
    body = {"topic": "made-here", "queues": 3}
    assert page.change("/api/topics", body)[0] == 403  # not logged in
    assert page.login("wrong password!") == 403
    assert page.login() == 200
    csrf, page.csrf = page.csrf, ""
    status, doc = page.change("/api/topics", body)  # the session cookie alone is not enough
    assert status == 403 and "CSRF" in doc["error"]
    page.csrf = csrf
    status, doc = page.change("/api/topics", body, Origin="http://evil.example")
    assert status == 403 and "another origin" in doc["error"]
    with Admin([addr(broker)]) as admin:
        assert "made-here" not in admin.topics()  # nothing refused changed anything
    status, doc = page.change("/api/topics", body)
    assert status == 200, doc
    topics = {t["topic"]: t for t in page.call("GET", "/api/topics")[1]["topics"]}
    assert topics["made-here"]["queues"] == 3
    assert page.change("/api/topics", {"topic": "bad name!", "queues": 1})[0] == 400
    assert page.change("/api/topics", {"topic": "x", "queues": 0})[0] == 400
    page.change("/api/logout", {})
    assert page.change("/api/topics", body)[0] == 403


def test_a_test_message_is_sent_and_found_by_id_and_by_key(console: Console) -> None:
    page = Page(console)
    assert page.login() == 200
    status, sent = page.change("/api/send", {"topic": "orders", "keys": "order-7",
                                             "body": '{"amount": 7}'})
    assert status == 200 and sent["status"] == "SEND_OK", sent
    status, found = page.call("GET", f"/api/messages?msgId={sent['msgId']}")
    [m] = found["messages"]
    assert m["bodyKind"] == "json" and json.loads(m["body"]) == {"amount": 7}
    assert m["properties"]["KEYS"] == "order-7" and m["queueOffset"] == sent["queueOffset"]
    by_key = wait_for(lambda: page.call("GET", "/api/messages?topic=orders&key=order-7")[1]
                      ["messages"], "the key indexed")
    assert [x["msgId"] for x in by_key] == [sent["msgId"]]
    assert page.call("GET", "/api/messages")[0] == 400


def test_a_console_without_a_password_is_read_only(broker: Broker) -> None:
    console = start_console(broker, None)
    try:
        page = Page(console)
        assert page.call("GET", "/api/session")[1] == {"writable": False, "admin": False,
                                                      "csrf": "", "login": "none", "who": ""}
        assert page.login() == 403
        status, doc = page.change("/api/topics", {"topic": "t", "queues": 1})
        assert status == 403 and "read-only" in doc["error"]
    finally:
        console.stop()
        console.actions.close()
        console.collector.admin.close()


def test_a_broker_that_stops_answering_is_shown_and_the_change_is_in_the_timeline(
        make_broker: Callable[..., Broker]) -> None:
    b = make_broker(real_store=True, brokerName="gone")
    console = start_console(b, None)
    try:
        page = Page(console)
        wait_for(lambda: page.call("GET", "/api/cluster")[1]["groups"], "a round")
        b.shutdown()
        doc = wait_for(lambda: (d := page.call("GET", "/api/cluster")[1])["error"] and d,
                       "the broker shown as not answering")
        assert "no broker answered" in doc["error"]
    finally:
        console.stop()
        console.actions.close()
        console.collector.admin.close()


def test_groups_lag_a_reset_to_a_time_and_dead_letters_resent(console: Console,
                                                              broker: Broker) -> None:
    from common.client import Consumer, Producer

    with Producer([addr(broker)]) as p:
        sent = [p.send("orders", b"order %d" % i, queue_id=0) for i in range(5)]
    with Consumer([addr(broker)], group="billing") as c:
        c.commit_offset("orders", 0, 5)
        first = c.pull("orders", 0, 0, 1).messages[0]
        c.send_back(first, delay_level=-1)  # straight to %DLQ%billing
    page = Page(console)
    assert page.login() == 200

    def billing() -> dict[str, Any]:
        groups = {g["group"]: g for g in page.call("GET", "/api/groups")[1]["groups"]}
        return groups.get("billing") or {}

    group = wait_for(lambda: billing().get("topics") and billing(), "billing's offsets")
    [orders] = [t for t in group["topics"] if t["topic"] == "orders"]
    assert orders["lag"] == 0 and orders["queues"][0]["committedOffset"] == 5
    # the message's delivery state: billing is past it
    found = page.call("GET", f"/api/messages?msgId={sent[2].msg_id}")[1]["messages"][0]
    assert {"group": "billing", "committedOffset": 5, "state": "consumed"} in found["delivery"]
    # reset to a time before the first message: everything is to be read again
    status, reset = page.change("/api/groups/reset", {"group": "billing", "topic": "orders",
                                                      "timestampMs": 0})
    assert status == 200, reset
    assert {"queueId": 0, "previousOffset": 5, "committedOffset": 0} in reset["queues"]
    assert wait_for(lambda: next(t for t in billing()["topics"] if t["topic"] == "orders")
                    ["lag"] == 5, "the lag after the reset")
    found = page.call("GET", f"/api/messages?msgId={sent[2].msg_id}")[1]["messages"][0]
    assert {"group": "billing", "committedOffset": 0,
            "state": "not consumed yet"} in found["delivery"]
    assert page.change("/api/groups/reset", {"group": "billing", "topic": "orders",
                                             "timestampMs": "yesterday"})[0] == 400
    # the dead letter: listed, resent once to the group's retry topic, then gone
    letters = page.call("GET", "/api/dlq?group=billing")[1]["letters"]
    assert [m["body"] for m in letters] == ["order 0"]
    status, resent = page.change("/api/dlq/resend", {"group": "billing"})
    assert status == 200 and resent == {"group": "billing", "resent": 1}
    assert page.call("GET", "/api/dlq?group=billing")[1]["letters"] == []
    assert page.change("/api/dlq/resend", {"group": "billing"})[1]["resent"] == 0


def test_the_security_page_without_acl_and_a_switchover_that_is_not_confirmed(
        console: Console, broker: Broker) -> None:
    page = Page(console)
    assert page.call("GET", "/api/acl")[1] == {"aclEnable": False}
    assert page.login() == 200
    wait_for(lambda: page.call("GET", "/api/cluster")[1]["groups"], "a round")
    status, doc = page.change("/api/switchover", {"address": addr(broker), "confirm": "nope"})
    assert status == 400 and "confirm with the group's name (cons)" in doc["error"]
    status, doc = page.change("/api/switchover", {"address": "10.9.9.9:1", "confirm": "cons"})
    assert status == 400 and "not a member" in doc["error"]


def test_the_security_page_shows_the_accounts_and_the_refusals(
        make_broker: Callable[..., Broker], tmp_path: Any) -> None:
    import sys
    from pathlib import Path

    from common.client import Producer
    from common.core.errors import BrokerError

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
    from security_harness import Realm

    realm = Realm(tmp_path / "realm", ["app"])
    realm.write_acl([realm.account("broker", replica=True), realm.account("admin", admin=True),
                     realm.account("app", topicPerms=["orders=SUB"])])
    b = make_broker(real_store=True, brokerName="sec", **realm.broker_fields())
    admin = Admin([addr(b)], timeout_ms=3000, retries=0, **realm.curve("admin"))
    console = Console(Collector(admin, 0.5), Actions(admin, realm.curve("admin")), "127.0.0.1",
                      0, None)
    console.start()
    try:
        with Producer([addr(b)], **realm.curve("app")) as p, pytest.raises(BrokerError):
            p.send("orders", b"x")
        doc = Page(console).call("GET", "/api/acl")[1]
        assert doc["aclEnable"] is True
        accounts = {a["accessKey"]: a for a in doc["accounts"]}
        assert accounts["admin"]["admin"] and accounts["broker"]["replica"]
        assert "curvePublicKey" not in accounts["app"] and len(accounts["app"]["key"]) == 12
        assert accounts["app"]["topicPerms"] == {"orders": "SUB"}
        assert accounts["app"]["defaultTopicPerm"] == "DENY" and accounts["admin"]["unrestricted"]
        assert any(r["op"] == "PUB" and r["count"] >= 1 for r in doc["refusals"])
        [line] = [r for r in doc["recentRefusals"] if r["account"] == "app"]
        assert line["resource"] == "Topic:orders" and "SUB" in line["reason"]
    finally:
        console.stop()
        console.actions.close()
        admin.close()


def test_a_slaves_lag_in_time_is_how_long_ago_the_master_ended_at_its_offset() -> None:
    """From the master's end offset at each round: a slave acknowledged up to where the
    master's log ended 3 rounds ago is 3 rounds behind; one caught up, 0; one behind
    everything kept, unknown (None)."""
    collector = Collector(None, refresh_s=1.0)  # type: ignore[arg-type] - no cluster asked
    ends = [(1000, 100), (2000, 200), (3000, 300), (4000, 400)]

    def group(now_ms: int, end: int, acks: list[int]) -> dict[str, Any]:
        slaves = [{"address": f"s{i}", "ackOffset": a} for i, a in enumerate(acks)]
        return {"brokerName": "g", "master": "m", "members": [
            {"address": "m", "reachable": True, "maxPhyOffset": end, "slaves": slaves}]}

    for at, end in ends[:-1]:
        collector._lag_in_time(group(at, end, []), at)
    g = group(4000, 400, [400, 150, 50])
    collector._lag_in_time(g, 4000)
    slaves = g["members"][0]["slaves"]
    assert [s["lagMs"] for s in slaves] == [0, 3000, None]
    assert g["replicationLagMs"] is None  # the worst: behind everything kept
    g = group(5000, 500, [500, 350])
    collector._lag_in_time(g, 5000)
    assert [s["lagMs"] for s in g["members"][0]["slaves"]] == [0, 2000]
    assert g["replicationLagMs"] == 2000
    collector._pool.shutdown()


def test_a_topics_queues_and_its_messages_in_a_time_range(console: Console,
                                                          broker: Broker) -> None:
    from common.client import Producer

    with Producer([addr(broker)]) as p:
        early = [p.send("ranged", b"early %d" % i, queue_id=i % 2) for i in range(4)]
        time.sleep(0.05)
        middle = int(time.time() * 1000)
        time.sleep(0.05)
        late = [p.send("ranged", b"late %d" % i, queue_id=i % 2) for i in range(3)]
    page = Page(console)
    detail = page.call("GET", "/api/topic?topic=ranged")[1]
    assert detail["messages"] == 7 and detail["masters"] == {"cons": addr(broker)}
    assert sorted((q["queueId"], q["minOffset"], q["maxOffset"]) for q in detail["queues"]) \
        == [(0, 0, 4), (1, 0, 3)]
    found = page.call("GET", f"/api/messages?topic=ranged&fromMs={middle}")[1]["messages"]
    assert sorted(m["msgId"] for m in found) == sorted(r.msg_id for r in late)
    found = page.call("GET", f"/api/messages?topic=ranged&fromMs=0&toMs={middle}")[1]
    assert sorted(m["msgId"] for m in found["messages"]) == sorted(r.msg_id for r in early)
    assert page.call("GET", "/api/messages?topic=ranged&fromMs=soon")[0] == 400
    assert page.call("GET", "/api/topic?topic=no%20such")[0] == 400


def test_a_groups_members_are_listed_by_client_id(console: Console, broker: Broker) -> None:
    from common.client.group_consumer import GroupConsumer

    with GroupConsumer([addr(broker)], group="readers", topics=["orders"],
                       start="earliest") as c:
        c.poll(timeout_ms=200)
        page = Page(console)

        def readers() -> dict[str, Any]:
            groups = {g["group"]: g for g in page.call("GET", "/api/groups")[1]["groups"]}
            return groups.get("readers") or {}

        group = wait_for(lambda: readers().get("memberIds") and readers(), "the member")
        assert group["members"] == 1 and len(group["memberIds"]) == 1
    with Admin([addr(broker)]) as admin:
        assert admin.consumer_members("readers") == []  # it left


def test_with_the_brokers_acl_a_login_is_an_admin_accounts_secret_key(
        broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    """``--acl-file``: the console's admin is any enabled admin account of the brokers' ACL
    that has a secretKey; another account, a wrong secret, or a disabled admin is refused;
    every change is logged with the account that made it."""
    import logging

    from common.format.acl import parse_acl

    text = ("accounts:\n"
            "  - {accessKey: ops, secretKey: ops-secret-0123456789, admin: true}\n"
            "  - {accessKey: app, secretKey: app-secret-0123456789, topicPerms: [orders=PUB]}\n"
            "  - {accessKey: old, secretKey: old-secret-0123456789, admin: true, "
            "enabled: false}\n")
    snapshot = parse_acl(text.encode(), "acl.yml")
    admin = Admin([addr(broker)], timeout_ms=3000, retries=0)
    console = Console(Collector(admin, 0.5), Actions(admin), "127.0.0.1", 0, None,
                      lambda: snapshot)
    console.start()
    try:
        page = Page(console)
        session = page.call("GET", "/api/session")[1]
        assert session["login"] == "acl" and session["writable"]
        assert page.login("app-secret-0123456789", "app") == 403  # not an admin
        assert page.login("old-secret-0123456789", "old") == 403  # disabled
        assert page.login("wrong-secret-0123456789", "ops") == 403
        assert page.login("ops-secret-0123456789", "nobody") == 403
        assert page.login("ops-secret-0123456789", "ops") == 200
        assert page.call("GET", "/api/session")[1]["who"] == "ops"
        with caplog.at_level(logging.INFO, logger="replog.console"):
            assert page.change("/api/topics", {"topic": "by-ops", "queues": 1})[0] == 200
        assert any("event=console_action" in r.getMessage() and "who=ops" in r.getMessage()
                   for r in caplog.records)
    finally:
        console.stop()
        console.actions.close()
        admin.close()


def test_a_consumer_groups_lag_and_rate_are_charted(console: Console, broker: Broker) -> None:
    """From the masters' STATUS (``consumerLag``: each group's lag and committed total): a
    group 6 behind, then 2 behind after it commits 4 more, consumed at a rate above 0."""
    from common.client import Consumer, Producer

    with Producer([addr(broker)]) as p:
        for i in range(8):
            p.send("charted", b"%d" % i, queue_id=0)
    page = Page(console)
    with Consumer([addr(broker)], group="charts") as c:
        c.commit_offset("charted", 0, 2)
        wait_for(lambda: (page.call("GET", "/api/consumer-history")[1].get("charts") or
                          [{}])[-1].get("lag") == 6, "lag 6")
        c.commit_offset("charted", 0, 6)
        points = wait_for(lambda: [p for p in page.call("GET", "/api/consumer-history")[1]
                                   ["charts"] if p["lag"] == 2], "lag 2")
    assert points[0]["committed"] == 6 and points[0]["ratePerS"] > 0


def test_a_console_starts_before_its_brokers_and_says_none_answers(tmp_path: Any) -> None:
    """``replog console`` over brokers not up yet starts anyway (the compose cluster starts it
    beside them) and its cluster page says that no broker answers."""
    from helpers.brokers import free_port
    from helpers.children import replog_child

    port, nobody = free_port(), free_port()
    with replog_child("console", "-s", f"127.0.0.1:{nobody}", "--listen", f"127.0.0.1:{port}",
                      "--timeout-ms", "500", "--refresh-ms", "500", "--json", ready=str(port),
                      log=tmp_path / "console.err"):
        page = Page(f"127.0.0.1:{port}")
        doc = wait_for(lambda: (d := page.call("GET", "/api/cluster")[1])["error"].startswith(
            "no broker answered") and d, "the error")
        assert doc["groups"] == []
