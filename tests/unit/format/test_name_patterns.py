"""Names checked by a pattern are checked whole: Python's ``$`` also matches before a final
newline, so ``^[a-z]+$`` took ``"orders\\n"`` for a valid topic (a ConsumeQueue directory and a
topics.json key with a newline in them). Every pattern ends with ``\\Z`` now."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from common.core.errors import PutStatus
from common.core.keys import new_key_pair
from common.core.message import Message
from common.format import acl
from common.format.protocol import (
    PROTOCOL_VERSION,
    Limits,
    ProtocolError,
    RequestCode,
    decode_request,
)
from common.store.commit_log import CommitLog
from tests.unit.format.test_acl import account, snapshot


def _request(code: RequestCode, fields: dict[str, object], bodies: int = 0) -> list[bytes]:
    return [msgpack.packb([PROTOCOL_VERSION, int(code), 7, fields]), *([b"x"] * bodies)]


@pytest.mark.parametrize("name", ["orders\n", "\norders", "ord\ners"])
def test_a_topic_with_a_newline_is_refused_on_the_wire(name: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_request(_request(RequestCode.SEND, {"topic": name, "queueId": 0}, 1), Limits())
    assert info.value.field == "topic"
    decode_request(_request(RequestCode.SEND, {"topic": "orders", "queueId": 0}, 1), Limits())


def test_a_group_with_a_final_newline_is_refused_on_the_wire() -> None:
    fields = {"topic": "orders", "queueId": 0, "group": "readers\n", "queueOffset": 0}
    with pytest.raises(ProtocolError) as info:
        decode_request(_request(RequestCode.PULL, fields), Limits())
    assert info.value.field == "group"


def test_the_commit_log_refuses_a_topic_with_a_final_newline(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "commitlog", 64 * 1024, max_message_size=4096)
    log.load()
    try:
        refused = log.put(Message("orders\n", b"body"), 0)
        assert refused.status == PutStatus.MESSAGE_ILLEGAL
        assert log.max_offset == 0
        assert log.put(Message("orders", b"body"), 0).status == PutStatus.PUT_OK
    finally:
        log.shutdown()


def test_an_access_key_with_a_final_newline_is_refused() -> None:
    with pytest.raises(acl.AclError):
        snapshot(account('"reader\\n"'))
    assert snapshot(account("reader")).accounts


def test_a_key_pair_name_with_a_final_newline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        new_key_pair(tmp_path, "broker\n")
    assert not list(tmp_path.iterdir())
