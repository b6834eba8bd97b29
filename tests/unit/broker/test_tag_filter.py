"""Tag subscriptions deliver exactly the subscribed tags (docs/guarantees.md, "Reads"): the
ConsumeQueue keeps only a tag's hash code, and two tags can share one ("Aa" and "BB" do under
Java's String.hashCode), so the broker checks the tag in the record it reads anyway, and the
client checks it again, as RocketMQ's clients do, also against a broker that trusts the hash."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from common.broker.broker import Broker
from common.client import Consumer, Producer
from common.core.config import load_config
from common.core.errors import GetStatus
from common.core.message import Message, subscribed_tags, tags_code
from common.store.message_store import MessageStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_two_tags_share_a_hash_code() -> None:
    assert tags_code("Aa") == tags_code("BB")
    assert subscribed_tags(" Aa || BB ") == {"Aa", "BB"}
    assert subscribed_tags("*") is None and subscribed_tags("") is None


def test_the_store_serves_only_the_subscribed_tag(tmp_path: Path) -> None:
    store = MessageStore(load_config(env={}, storePathRootDir=str(tmp_path)))
    store.start()
    try:
        for tag in ("Aa", "BB", "Aa", "C"):
            store.put(Message("t", tag.encode(), tags=tag), 0)
        assert store.wait_dispatched(store.max_phy_offset)
        got = store.get_message("g", "t", 0, 0, 32, {tags_code("Aa")}, tags=frozenset({"Aa"}))
        assert [m.tags for m in got.messages()] == ["Aa", "Aa"]
        assert got.next_begin_offset == 4
        none = store.get_message("g", "t", 0, 2, 32, {tags_code("BB")}, tags=frozenset({"BB"}))
        assert none.status is GetStatus.NO_MATCHED_MESSAGE and none.next_begin_offset == 4
    finally:
        store.shutdown()


def test_the_client_checks_the_tag_again(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()  # on helpers.fake_store.FakeStore, which filters by hash only
    address = f"127.0.0.1:{broker.cfg.listenPort}"
    with Producer([address]) as p:
        for tag in ("Aa", "BB", "Aa"):
            p.send("t", tag.encode(), tags=tag, queue_id=0)
    with Consumer([address]) as c:
        got = c.pull("t", 0, 0, 32, tags="BB")
        assert [m.tags for m in got.messages] == ["BB"]
        assert got.next_begin_offset == 3
        assert [m.tags for m in c.pull("t", 0, 0, 32).messages] == ["Aa", "BB", "Aa"]
