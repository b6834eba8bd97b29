"""STOREHOST and msgIds carry the broker's IPv4 address, and a msgId finds only the record its
broker stored (docs/contract.md: brokerIP1; docs/protocol.md: QUERY_BY_MSG_ID).

In a container ``brokerIP1`` is a service name: it is resolved once when the store starts, a
name without an IPv4 address is refused naming the key, and a msgId lookup checks the
record's own STOREHOST (address and port), not only the offset the msgId names.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from common.core.config import BrokerConfig, load_config, resolve_ipv4
from common.core.errors import ConfigError
from common.core.message import Message, decode_msg_id, encode_msg_id
from common.store.message_store import MessageStore

pytestmark = pytest.mark.unit


def make_cfg(root: Path, **kw: Any) -> BrokerConfig:
    base: dict[str, Any] = {"storePathRootDir": str(root), "mappedFileSizeCommitLog": 64 * 1024,
                            "mappedFileSizeConsumeQueue": 20 * 64, "maxHashSlotNum": 64,
                            "maxIndexNum": 512}
    return load_config(env={}, **{**base, **kw})


@contextmanager
def running(cfg: BrokerConfig) -> Iterator[MessageStore]:
    store = MessageStore(cfg)
    store.start()
    try:
        yield store
    finally:
        store.shutdown()


def fake_getaddrinfo(table: dict[str, list[str]]) -> Any:
    """getaddrinfo answering from ``table`` (name -> IPv4 addresses) for AF_INET only."""

    def lookup(host: str, port: Any, family: int = 0, *_: Any) -> list[Any]:
        assert family == socket.AF_INET, "STOREHOST is IPv4: only IPv4 is asked for"
        if host not in table or not table[host]:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0)) for ip in table[host]]

    return lookup


def test_an_ipv4_literal_is_kept_and_never_looked_up() -> None:
    with mock.patch("socket.getaddrinfo", side_effect=AssertionError("looked up")):
        assert resolve_ipv4("10.1.2.3", "brokerIP1") == "10.1.2.3"
        assert resolve_ipv4(" 192.168.0.7 ", "brokerIP1") == "192.168.0.7"


def test_a_hostname_becomes_its_first_ipv4_address() -> None:
    table = {"broker-a-1.data": ["172.21.0.4", "172.21.0.9"]}
    with mock.patch("socket.getaddrinfo", fake_getaddrinfo(table)):
        assert resolve_ipv4("broker-a-1.data", "brokerIP1") == "172.21.0.4"
    assert resolve_ipv4("localhost", "brokerIP1") == "127.0.0.1"  # the real resolver


@pytest.mark.parametrize("host", ["no-such-broker.invalid", "::1", ""])
def test_a_name_without_an_ipv4_address_is_refused_naming_the_key(host: str) -> None:
    with mock.patch("socket.getaddrinfo", fake_getaddrinfo({})), \
            pytest.raises(ConfigError) as caught:
        resolve_ipv4(host, "brokerIP1")
    assert "'brokerIP1'" in str(caught.value)
    assert "IPv4" in str(caught.value)


def test_the_store_refuses_to_start_on_an_unresolvable_broker_ip(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, brokerIP1="no-such-broker.invalid")
    with mock.patch("socket.getaddrinfo", fake_getaddrinfo({})), \
            pytest.raises(ConfigError, match="brokerIP1"):
        MessageStore(cfg)
    assert cfg.brokerIP1 == "no-such-broker.invalid"  # the config is left as given


def test_records_of_a_store_named_by_host_carry_its_resolved_address(tmp_path: Path) -> None:
    table = {"broker-a-2.data": ["172.21.0.5"]}
    cfg = make_cfg(tmp_path, brokerIP1="broker-a-2.data", listenPort=10921)
    with mock.patch("socket.getaddrinfo", fake_getaddrinfo(table)), running(cfg) as store:
        r = store.put(Message("t", b"body"), 0)
        assert decode_msg_id(r.msg_id)[:2] == ("172.21.0.5", 10921)
        found = store.message_by_offset(r.phy_offset)
        assert found is not None and found.store_host == "172.21.0.5:10921"
        assert cfg.client_address == "broker-a-2.data:10921"  # what clients connect to


def test_a_msg_id_finds_only_the_record_its_broker_stored(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, brokerIP1="10.0.0.1", listenPort=10911)
    with running(cfg) as store:
        first = store.put(Message("t", b"one"), 0)
        second = store.put(Message("t", b"two"), 0)
        found = store.message_by_msg_id(second.msg_id)
        assert found is not None and found.body == b"two"
        assert store.message_by_msg_id(second.msg_id.lower()) is not None  # hex case is free
        ip = socket.inet_aton("10.0.0.1")
        # the same offsets named by another broker (address or port): not these records
        for other_ip, other_port in ((socket.inet_aton("10.0.0.2"), 10911), (ip, 10921)):
            for r in (first, second):
                assert store.message_by_msg_id(encode_msg_id(other_ip, other_port,
                                                             r.phy_offset)) is None
        # an offset where no record starts, and one past the end
        assert store.message_by_msg_id(encode_msg_id(ip, 10911, first.phy_offset + 1)) is None
        assert store.message_by_msg_id(encode_msg_id(ip, 10911, 1 << 40)) is None
